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


def test_a_folder_without_config_json_is_named(tmp_path):
    """transformers reads a missing config.json as {}: it was reported as "config model_type None"."""
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path / "sub")
    (tmp_path / "sub" / "config.json").unlink()
    for folder, kwargs in ((tmp_path / "sub", {}), (tmp_path, {"subfolder": "sub"})):
        with pytest.raises(ValueError, match="sub has no config.json: not a saved drafter folder"):
            XPressDrafterModel.from_pretrained(folder, **kwargs)


def test_a_truncated_checkpoint_is_refused(tmp_path):
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="Could not load xPress drafter weights"):
        XPressDrafterModel.from_pretrained(tmp_path)


def test_a_checkpoint_with_missing_or_misshapen_weights_is_refused(tmp_path, caplog):
    from safetensors.torch import load_file, save_file
    from transformers.utils import logging as hf_logging

    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["refiner.w2.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"), pytest.raises(ValueError, match=r"Incomplete or mismatched .*refiner\.w2\.weight"):
            XPressDrafterModel.from_pretrained(tmp_path)
    finally:
        hf_logging.disable_propagation()
    # transformers' table ("newly initialized ... consider training") no longer comes before the refusal
    assert "LOAD REPORT" not in caplog.text and "Consider training" not in caplog.text

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


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, error", [
    (dict(refiner=None), r"unexpected \['refiner\.down_g\.weight'"),  # its refiner's weights would be dropped
    (dict(refiner="markov"), r"unexpected \['refiner\.down_g\.weight'"),  # or half of them read as a Markov head
    (dict(num_hidden_layers=1, layer_types=["full_attention"]), r"unexpected \['layers\.1\."),
    (dict(block_size=8), r"mismatched \['refiner\.mix\.L'"),  # a folded mixer for another block size
])
def test_weights_the_config_does_not_describe_are_refused(tmp_path, changes, error):
    """A config edited to describe fewer weights than the checkpoint holds loaded before, dropping the rest (the shipped
    xPress drafter with one layer fewer accepted fewer drafts): now it names the weights left over."""
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=error):
        XPressDrafterModel.from_pretrained(tmp_path)


def test_settings_given_to_from_pretrained_are_checked_like_the_config_files(tmp_path):
    """`from_pretrained(path, jacobi_passes=-1)` sets the value after the config's own checks: it loaded and drafted
    from unwritten logits; now every override is checked, and propose refuses a negative pass count itself."""
    drafter = tiny_drafter(tiny_target("qwen3"))
    drafter.save_pretrained(tmp_path)
    for override, error in ((dict(jacobi_passes=-1), "jacobi_passes must be >= 0, got -1"),
                            (dict(mask_token_id=10**6), "mask_token_id 1000000 is outside the vocabulary"),
                            (dict(assistant_confidence_threshold=5.0), "must be in \\[0, 1\\), got 5.0")):
        with pytest.raises(ValueError, match=error):
            XPressDrafterModel.from_pretrained(tmp_path, **override)
    hidden, base = torch.randn(1, 16, 64), torch.randn(1, 15, 128)
    with pytest.raises(ValueError, match="passes must be >= 0, got -2"):
        drafter.propose(hidden, base, torch.tensor([[1, 2]]), passes=-2)


@pytest.mark.parametrize("field, value, error", [
    ("hidden_size", "64", "hidden_size must be an integer, got '64'"),
    ("block_size", 16.0, "block_size must be an integer, got 16.0"),
    ("target_layer_ids", [1.7, 3], r"target_layer_ids must be a list of integers, got \[1.7, 3\]"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a positive number, got '1e-6'"),
    ("num_key_value_heads", 0, "num_key_value_heads must be at least 1, got 0"),
    ("hidden_act", "bogus", "hidden_act 'bogus' is not an activation transformers knows"),
    ("rope_parameters", {"rope_type": "nope", "rope_theta": 1e4}, "rope_type 'nope' is not one of"),
])
def test_a_config_file_with_a_field_of_the_wrong_type_or_size_names_it(tmp_path, field, value, error):
    """Hand-edited config.json values that crashed far from the cause (a TypeError in a comparison, a KeyError in the
    activation table, a ZeroDivisionError) or were silently rounded (layer ids 1.7 -> 1) are refused by name."""
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    _edit_config(tmp_path, **{field: value, **({"target_hidden_size": value} if field == "hidden_size" else {})})
    for load in (XPressDrafterModel.from_pretrained, AutoModel.from_pretrained):
        with pytest.raises(ValueError, match=error):
            load(tmp_path)


def test_a_draft_vocabulary_that_set_draft_vocab_would_refuse_is_refused_on_load(tmp_path):
    """A repeated id made the drafts' frequencies differ from the logits handed to rejection sampling; an id past the
    vocabulary failed with an IndexError at generate time."""
    from safetensors.torch import load_file, save_file

    drafter = tiny_drafter(tiny_target("qwen3"))
    drafter.set_draft_vocab(torch.arange(0, 128, 2))
    drafter.save_pretrained(tmp_path)
    for bad in (torch.tensor([0, 2, 2, *range(6, 128, 2)]), torch.tensor([*range(0, 126, 2), 500])):
        weights = load_file(tmp_path / "model.safetensors")
        weights["draft_vocab"] = bad
        save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError, match="draft_vocab \\(64 ids\\) is not 64 sorted, distinct token ids"):
            XPressDrafterModel.from_pretrained(tmp_path)


def test_a_config_file_that_is_not_a_json_object_is_refused(tmp_path):
    tiny_drafter(tiny_target("qwen3")).save_pretrained(tmp_path)
    for text in ("[1, 2]", "null"):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match="does not hold a JSON object"):
            XPressDrafterModel.from_pretrained(tmp_path)


def test_generate_names_the_vocabulary_mismatch_before_transformers_blames_the_tokenizers():
    """transformers' own check of an assistant with another vocabulary asks for tokenizers; an xPress drafter for
    another target is named as such first."""
    drafter = tiny_drafter(tiny_target("qwen3"))
    other = tiny_target("qwen3", vocab_size=256)
    with pytest.raises(ValueError, match="built for another target .*vocab_size: target 256, drafter 128"):
        other.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=3)
