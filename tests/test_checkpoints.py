"""save_pretrained / from_pretrained / AutoModel round trips, and clear errors for bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel

from hf_xpress import XPressDrafterConfig, XPressDrafterModel

from conftest import tiny_drafter, tiny_target


@pytest.mark.parametrize("refiner", [None, "markov", "xpress"])
def test_round_trip_through_automodel_gives_identical_candidates(tmp_path, refiner):
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target, refiner)
    drafter.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "xpress_drafter" and saved["refiner"] == refiner
    assert saved["auto_map"]["AutoModel"] == "modeling_xpress.XPressDrafterModel"  # for remote-code loading
    assert (tmp_path / "modeling_xpress.py").exists() and (tmp_path / "configuration_xpress.py").exists()

    loaded = AutoModel.from_pretrained(tmp_path)  # no trust_remote_code: the package registered the class
    assert type(loaded) is XPressDrafterModel and isinstance(AutoConfig.from_pretrained(tmp_path), XPressDrafterConfig)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    ids = torch.randint(0, 126, (1, 11))
    runs = []
    for model in (drafter, loaded):
        out = target.generate(ids, assistant_model=model, max_new_tokens=30, do_sample=False)
        runs.append((out, model.stats.accepted, model.stats.passes))
    assert runs[0][0].equal(runs[1][0]) and runs[0][1:] == runs[1][1:]


def test_a_foreign_checkpoint_is_refused_by_name(tmp_path):
    tiny_target("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is not an xPress drafter checkpoint .*model_type 'llama'"):
        XPressDrafterModel.from_pretrained(tmp_path)


def test_a_truncated_checkpoint_is_refused(tmp_path):
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="Could not load xPress drafter weights"):
        XPressDrafterModel.from_pretrained(tmp_path)


def test_a_checkpoint_with_missing_or_misshapen_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["refiner.w2.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"Incomplete or mismatched .*refiner\.w2\.weight"):
        XPressDrafterModel.from_pretrained(tmp_path)

    config = json.loads((tmp_path / "config.json").read_text())
    config["refiner_rank"] = 32  # a config that disagrees with the stored shapes
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Incomplete or mismatched|Could not load"):
        XPressDrafterModel.from_pretrained(tmp_path)


def test_an_unsupported_refiner_in_a_config_file_is_refused(tmp_path):
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["refiner"] = "medusa"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="refiner must be one of"):
        AutoModel.from_pretrained(tmp_path)
