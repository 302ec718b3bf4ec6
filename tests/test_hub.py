"""Publishing: the folder `publish` writes is what a Hub repository would hold; it loads in fresh Python processes
with hf_xpress (AutoModel) and with remote code only (hf_xpress unimportable), and both generate exactly what the
original drafter generates, draft for draft."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from hf_xpress import XPressDrafterModel
from hf_xpress import hub
from hf_xpress.generation import XPressCandidateGenerator

from conftest import RecordingStreamer

REPO_ID = "tiny-org/Qwen3-tiny-xPress-b8"
PROMPTS = [[3, 17, 42, 8, 99, 5, 23], [7]]
MAX_NEW = 24
RESULTS = {"gsm8k": {"dFlash": 6.48, "dFlash + xPress": 10.11}}


def make_target():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen3ForCausalLM(config).eval()


def make_drafter(target):
    torch.manual_seed(1)
    drafter = XPressDrafterModel.from_target(
        target, refiner="xpress", num_hidden_layers=2, block_size=8, refiner_rank=16, mask_token_id=127, jacobi_passes=3
    ).eval()
    with torch.no_grad():
        for p in drafter.refiner.parameters():
            p.normal_(0.0, 0.3)  # a refiner that really changes the drafts
    return drafter


def reference_run(target, drafter, monkeypatch):
    """Greedy generate with hf_xpress in this process, recording every round's draft tokens."""
    drafts = []
    original = XPressCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        if ids.shape[1] > input_ids.shape[1]:
            drafts.append(ids[0, input_ids.shape[1] :].tolist())
        return ids, logits

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", recording)
    runs = []
    for prompt in PROMPTS:
        drafts.clear()
        out = target.generate(torch.tensor([prompt]), assistant_model=drafter, max_new_tokens=MAX_NEW, do_sample=False)
        runs.append({"tokens": out[0].tolist(), "accepted": list(drafter.stats.accepted), "drafts": list(drafts)})
    return runs


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    target = make_target()
    target.save_pretrained(tmp / "target")
    drafter = make_drafter(target)
    folder = hub.publish(
        drafter, tmp / "published", target="tiny/Qwen3-tiny", repo_id=REPO_ID, results=RESULTS,
        training="Random weights, for tests.",
    )
    return {"tmp": tmp, "target": target, "drafter": drafter, "folder": Path(folder)}


def test_published_folder_holds_weights_config_remote_code_card_and_custom_generate(published):
    folder = published["folder"]
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "config.json",
        "configuration_xpress.py",
        "custom_generate/configuration_xpress.py",
        "custom_generate/generate.py",
        "custom_generate/generation.py",
        "custom_generate/modeling_xpress.py",
        "custom_generate/requirements.txt",
        "custom_generate/tree_decoding.py",
        "model.safetensors",
        "modeling_xpress.py",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "xpress_drafter" and config["refiner"] == "xpress"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_xpress.XPressDrafterConfig",
        "AutoModel": "modeling_xpress.XPressDrafterModel",
    }
    state = load_file(folder / "model.safetensors")
    original = published["drafter"].state_dict()
    assert set(state) == set(original) and all(torch.equal(state[k], original[k]) for k in state)
    package = Path(hub.__file__).parent
    for name in ("modeling_xpress.py", "configuration_xpress.py"):
        assert (folder / name).read_text() == (package / name).read_text()
        assert (folder / "custom_generate" / name).read_text() == (package / name).read_text()
    card = (folder / "README.md").read_text()
    assert "base_model: tiny/Qwen3-tiny" in card and "block size 8" in card and "Random weights, for tests." in card
    assert "| gsm8k | 6.48 | 10.11 |" in card and f'AutoModel.from_pretrained("{REPO_ID}")' in card
    assert f'custom_generate="{REPO_ID}", trust_remote_code=True, max_new_tokens=256)' in card  # its own repo: no drafter argument
    generate_py = (folder / "custom_generate" / "generate.py").read_text()
    assert f"DRAFTER = {REPO_ID!r}" in generate_py
    imports = [line for line in generate_py.splitlines() if line.startswith(("import ", "from "))]
    allowed = {*sys.stdlib_module_names, "torch", "transformers", ""}  # "" = `from .modeling_xpress`; no other package
    assert all(line.split()[1].split(".")[0] in allowed for line in imports), imports


def _run(script: str, argv: list[str], cwd: Path, env_extra: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **env_extra)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


COMMON = """
    import json, sys
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoModelForCausalLM
    folder, target_dir, out = sys.argv[1:4]
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    PROMPTS, MAX_NEW = {prompts}, {max_new}
"""

WITH_PACKAGE = COMMON + """
    import hf_xpress
    drafter = AutoModel.from_pretrained(folder).eval()
    runs = []
    for prompt in PROMPTS:
        ids = target.generate(torch.tensor([prompt]), assistant_model=drafter, max_new_tokens=MAX_NEW, do_sample=False)
        runs.append({{"tokens": ids[0].tolist(), "accepted": list(drafter.stats.accepted)}})
    save_file(drafter.state_dict(), out + ".safetensors")
    json.dump({{"runs": runs, "module": type(drafter).__module__}}, open(out, "w"))
"""

REMOTE_ONLY = """
    import importlib.abc, sys

    class NoHfXpress(importlib.abc.MetaPathFinder):  # the package must not be used, even if installed
        def find_spec(self, name, path=None, target=None):
            if name == "hf_xpress" or name.startswith("hf_xpress."):
                raise ImportError("hf_xpress is blocked in this test")
            return None

    sys.meta_path.insert(0, NoHfXpress())
""" + COMMON + """
    drafter = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    runs, self_loaded = [], []
    for prompt in PROMPTS:
        ids = target.generate(torch.tensor([prompt]), assistant_model=drafter, custom_generate=folder,
                              trust_remote_code=True, max_new_tokens=MAX_NEW, do_sample=False)
        runs.append({{"tokens": ids[0].tolist(), "accepted": list(drafter.stats.accepted), "drafts": drafter.stats.drafts}})
        # no drafter given: custom_generate loads it (here from the folder, on the Hub from its own repo)
        ids = target.generate(torch.tensor([prompt]), custom_generate=folder, trust_remote_code=True,
                              xpress_drafter=folder, max_new_tokens=MAX_NEW, do_sample=False)
        self_loaded.append(ids[0].tolist())
    # tree verification through the same recipe
    tree = target.generate(torch.tensor([PROMPTS[0]]), custom_generate=folder, trust_remote_code=True,
                           xpress_drafter=folder, tree_width=2, max_new_tokens=MAX_NEW, do_sample=False)[0].tolist()
    plain = target.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=MAX_NEW, do_sample=False)[0].tolist()
    assert tree == plain, "tree verification through custom_generate must equal plain greedy"
    dynamic = target.generate(torch.tensor([PROMPTS[0]]), custom_generate=folder, trust_remote_code=True,
                              xpress_drafter=folder, tree_width=2, tree_budget=4, max_new_tokens=MAX_NEW,
                              do_sample=False)[0].tolist()
    assert dynamic == plain, "a dynamic tree through custom_generate must equal plain greedy"
    assert "_get_candidate_generator" not in vars(target), "the per-call hook must be removed"
    save_file(drafter.state_dict(), out + ".safetensors")
    json.dump({{"runs": runs, "self_loaded": self_loaded, "plain": plain, "module": type(drafter).__module__,
               "hf_xpress_imported": any(m.startswith("hf_xpress") for m in sys.modules)}}, open(out, "w"))
"""


def test_published_folder_loads_in_fresh_processes_and_generates_like_the_original(published, monkeypatch):
    tmp, folder = published["tmp"], published["folder"]
    work = tmp / "cwd"  # not the repository: `hf_xpress` is not importable from the working directory
    work.mkdir(exist_ok=True)
    fmt = dict(prompts=PROMPTS, max_new=MAX_NEW)
    args = {"HF_MODULES_CACHE": str(tmp / "modules"), "HF_HOME": str(tmp / "hf_home")}
    procs = {}
    for name, script in (("package", WITH_PACKAGE), ("remote", REMOTE_ONLY)):
        out = tmp / f"{name}.json"
        argv = [str(folder), str(tmp / "target"), str(out)]
        procs[name] = (_run(script.format(**fmt), argv, work, args), out)
    reference = reference_run(published["target"], published["drafter"], monkeypatch)  # meanwhile, in this process
    assert any(a > 0 for run in reference for a in run["accepted"])  # the drafter's tokens are really accepted

    results = {}
    for name, (proc, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{name} process failed:\n{stderr[-4000:]}"
        results[name] = json.loads(out.read_text())
        state = load_file(str(out) + ".safetensors")
        original = published["drafter"].state_dict()
        assert set(state) == set(original) and all(torch.equal(state[k], original[k]) for k in state), name

    package, remote = results["package"], results["remote"]
    assert package["module"] == "hf_xpress.modeling_xpress"
    assert remote["module"].startswith("transformers_modules.") and not remote["hf_xpress_imported"]
    for ref, pkg, rem, self_loaded in zip(reference, package["runs"], remote["runs"], remote["self_loaded"]):
        assert pkg["tokens"] == ref["tokens"] and pkg["accepted"] == ref["accepted"]
        assert rem["tokens"] == ref["tokens"] and rem["accepted"] == ref["accepted"] and rem["drafts"] == ref["drafts"]
        assert self_loaded == ref["tokens"]
    assert remote["plain"] == reference[0]["tokens"]  # greedy speculative decoding is lossless


def test_push_to_hub_uploads_exactly_the_published_folder(published, monkeypatch, tmp_path):
    import huggingface_hub

    calls = {}

    class FakeApi:
        def __init__(self, token=None):
            calls["token"] = token

        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls["create"] = (repo_id, private, exist_ok)

        def upload_folder(self, repo_id, folder_path, commit_message, delete_patterns=None):
            calls["delete_patterns"] = delete_patterns
            root = Path(folder_path)
            calls["files"] = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
            calls["repo_id"] = repo_id
            return type("Info", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/abc"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    url = hub.push_to_hub(
        published["drafter"], REPO_ID, target="tiny/Qwen3-tiny", results=RESULTS, training="Random weights, for tests.",
        private=True, token="hf_test",
    )
    assert url == f"https://huggingface.co/{REPO_ID}/commit/abc"
    assert calls["create"] == (REPO_ID, True, True) and calls["repo_id"] == REPO_ID and calls["token"] == "hf_test"
    # a re-push replaces the previous upload's weights and recipe (stale shards would otherwise stay), nothing else
    import fnmatch

    assert calls["delete_patterns"] == hub.PUBLISHED_PATTERNS
    for stale in ("model-00001-of-00002.safetensors", "model.safetensors.index.json", "custom_generate/old.py"):
        assert any(fnmatch.fnmatch(stale, pattern) for pattern in calls["delete_patterns"]), stale
    for kept in ("README.md", "eval_results.json", "config.json", "vllm/model.safetensors",
                 "checkpoints/step-1000/model.safetensors"):  # a user's sub-folders of weights stay
        assert not any(fnmatch.fnmatch(kept, pattern) for pattern in calls["delete_patterns"]), kept
    local = published["folder"]
    expected = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    assert calls["files"].keys() == expected.keys()
    for name, data in expected.items():
        assert calls["files"][name] == data, name
    # a repo id is recognised as such; an existing or explicit path is a folder
    assert hub._is_repo_id(REPO_ID) and not hub._is_repo_id(str(local)) and not hub._is_repo_id("./a/b")
    # a new folder inside an existing one is a folder, never an upload (not inside the shared published folder,
    # which other tests list)
    (tmp_path / "existing").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not hub._is_repo_id("existing/new-drafter") and hub._is_repo_id("someone/new-drafter")
    calls.clear()  # --repo-id names the repository in the card and the recipe; the upload goes to the destination
    hub.publish(published["drafter"], "someone/destination", repo_id="someone/card-name", target="t", push=True)
    assert calls["create"][0] == calls["repo_id"] == "someone/destination"
    assert 'custom_generate="someone/card-name"' in calls["files"]["README.md"].decode()
    calls.clear()
    where = hub.publish(published["drafter"], "existing/new-drafter", target="tiny/Qwen3-tiny")
    assert calls == {} and (tmp_path / "existing" / "new-drafter" / "config.json").exists()
    assert Path(where) == Path("existing") / "new-drafter"


def test_shipped_drafters_carry_the_packages_remote_code():
    """Each shipped folder's `configuration_xpress.py` / `modeling_xpress.py` (what `trust_remote_code=True` runs
    without the package) is the package's own file, byte for byte (`scripts/train_smollm2.sh` copies them)."""
    root = Path(__file__).resolve().parent.parent
    folders = sorted(p for p in (root / "drafters").iterdir() if (p / "config.json").is_file())
    assert len(folders) == 3, folders
    for folder in folders:
        for name in ("configuration_xpress.py", "modeling_xpress.py"):
            assert (folder / name).read_bytes() == (root / "hf_xpress" / name).read_bytes(), f"{folder.name}/{name}"


def test_hub_module_exports_what_it_names():
    namespace: dict = {}
    exec("from hf_xpress.hub import *", namespace)
    assert {"publish", "push_to_hub", "write_model_card"} <= namespace.keys()


def test_custom_generate_without_a_drafter_is_a_clear_error(published, tmp_path):
    folder = hub.publish(published["drafter"], tmp_path / "no-repo", target="tiny/Qwen3-tiny", push=False)
    text = (Path(folder) / "custom_generate" / "generate.py").read_text()
    assert 'DRAFTER = "__HF_XPRESS_DRAFTER__"' in text  # published without a repo id: nothing to load by default
    card = (Path(folder) / "README.md").read_text()  # ... so the card's example names the drafter itself
    assert 'custom_generate="no-repo", trust_remote_code=True, max_new_tokens=256, xpress_drafter="no-repo")' in card
    with pytest.raises(ValueError, match="names no drafter"):
        published["target"].generate(
            torch.tensor([PROMPTS[0]]), custom_generate=str(folder), trust_remote_code=True, max_new_tokens=3
        )
    with pytest.raises(ValueError, match="must be an xPress drafter"):
        published["target"].generate(
            torch.tensor([PROMPTS[0]]), custom_generate=str(folder), trust_remote_code=True, max_new_tokens=3,
            assistant_model=published["target"],
        )
    with pytest.raises(ValueError, match="tree_budget needs tree_width"):
        published["target"].generate(
            torch.tensor([PROMPTS[0]]), custom_generate=str(folder), trust_remote_code=True, max_new_tokens=3,
            assistant_model=published["drafter"], tree_budget=4,
        )
    with pytest.raises(ValueError, match="lookup_branch .* needs tree_width"):
        published["target"].generate(
            torch.tensor([PROMPTS[0]]), custom_generate=str(folder), trust_remote_code=True, max_new_tokens=3,
            assistant_model=published["drafter"], lookup_branch=True, prompt_lookup_num_tokens=3,
        )


def test_custom_generate_jacobi_passes_apply_to_that_call_only(published):
    """The recipe's `jacobi_passes=` sets the passes of its own call's generator; the drafter, shared by every call
    (and cached by the recipe), keeps its configured passes; a bad value is refused by name."""
    target, drafter, folder = published["target"], published["drafter"], str(published["folder"])
    ids = torch.tensor([PROMPTS[0]])
    plain = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    configured = drafter.config.jacobi_passes
    assert configured == 3
    out = target.generate(ids, custom_generate=folder, trust_remote_code=True, max_new_tokens=MAX_NEW, do_sample=False,
                          assistant_model=drafter, jacobi_passes=0)
    assert out.tolist() == plain.tolist() and set(drafter.stats.passes) == {0}
    assert drafter.config.jacobi_passes == configured
    target.generate(ids, custom_generate=folder, trust_remote_code=True, max_new_tokens=MAX_NEW, do_sample=False,
                    assistant_model=drafter)
    assert max(drafter.stats.passes) > 0  # the configured passes again (early stop may end a block sooner)
    with pytest.raises(ValueError, match="jacobi_passes must be an integer >= 0, got -2"):
        target.generate(ids, custom_generate=folder, trust_remote_code=True, max_new_tokens=MAX_NEW,
                        assistant_model=drafter, jacobi_passes=-2)
    assert "_get_candidate_generator" not in vars(target)


def test_custom_generate_tree_path_passes_on_the_streamer_and_stop_strings(published):
    """generate() hands a custom_generate callable neither `streamer` nor `tokenizer`; the Hub recipe gives them to
    tree_decoding (its `tree_streamer`, and stop strings as a stopping criterion), so both work as on chains."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    target, drafter = published["target"], published["drafter"]
    backend = Tokenizer(WordLevel({**{f"<{i}>": i for i in range(128)}, "abcdef": 128}, unk_token="<0>"))
    backend.pre_tokenizer, backend.decoder = Whitespace(), decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    ids = torch.tensor([PROMPTS[0]])
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
    stop = f"<{plain[4]}>"  # the fifth new token's text: plain generate stops at its first occurrence
    first = plain.index(plain[4])

    streamer = RecordingStreamer()
    out = target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, max_new_tokens=12,
                          assistant_model=drafter, tree_width=2, streamer=streamer, stop_strings=[stop],
                          tokenizer=tokenizer, do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == plain[: first + 1]
    assert streamer.puts[0] == PROMPTS[0] and sum(streamer.puts[1:], []) == plain[: first + 1] and streamer.ended
    # stop strings set in a generation config (generate, with no tokenizer here, failed on them), and a loaded
    # drafter given as xpress_drafter=
    from transformers import GenerationConfig

    config = GenerationConfig(stop_strings=[stop], max_new_tokens=12, do_sample=False)
    out = target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, tree_width=2,
                          xpress_drafter=drafter, generation_config=config, tokenizer=tokenizer)
    assert out[0, ids.shape[1]:].tolist() == plain[: first + 1] and config.stop_strings == [stop]
    for kwargs, error in ((dict(tree_width=2.7), "tree_width must be an integer, got 2.7"),
                          (dict(tree_width=2, tree_budget="4"), "tree_budget must be an integer or None, got '4'")):
        with pytest.raises(ValueError, match=error):
            target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, max_new_tokens=4,
                            assistant_model=drafter, **kwargs)
    with pytest.raises(ValueError, match="assistant_model= takes a loaded drafter; pass a folder or Hub id as xpress"):
        target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, max_new_tokens=4,
                        assistant_model=str(published["folder"]))
    # tree_decoding's drafter= (ignored: the recipe loaded its default repository) and two streamers (one dropped)
    with pytest.raises(ValueError, match="takes the drafter as assistant_model= .* or xpress_drafter= .*, not drafter="):
        target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, max_new_tokens=4,
                        drafter=drafter, tree_width=2)
    with pytest.raises(ValueError, match="either generate's streamer= or tree_decoding's tree_streamer=, not both"):
        target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True, max_new_tokens=4,
                        assistant_model=drafter, tree_width=2, streamer=RecordingStreamer(),
                        tree_streamer=RecordingStreamer())


def test_custom_generate_chain_path_checks_a_users_stopping_criteria_on_every_draft(published):
    """The recipe's chain path hands the user's `stopping_criteria` to its generator, which checks them on each draft
    (drafts end before a token at which one fires; transformers checks them only at a round's end): the output stops
    where plain generate stops, and the criterion saw many more sequences than the rounds' ends."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    target, drafter = published["target"], published["drafter"]
    ids = torch.tensor([PROMPTS[0]])
    new = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1]:].tolist()
    stop = next(token for i, token in enumerate(new) if i >= 12 and new.index(token) == i)  # first seen late
    seen = []

    class LastTokenIs(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            seen.append(input_ids.shape[1])
            return input_ids[:, -1] == stop

    plain = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                            stopping_criteria=StoppingCriteriaList([LastTokenIs()]))
    seen.clear()
    out = target.generate(ids, custom_generate=str(published["folder"]), trust_remote_code=True,
                          max_new_tokens=MAX_NEW, assistant_model=drafter, do_sample=False,
                          stopping_criteria=StoppingCriteriaList([LastTokenIs()]))
    assert out.tolist() == plain.tolist() and plain.shape[1] == ids.shape[1] + new.index(stop) + 1
    rounds = drafter.stats.rounds
    assert rounds >= 3 and len(seen) > 2 * rounds and len(set(seen)) > rounds, (len(seen), rounds)


def test_a_drafter_whose_config_was_edited_after_it_was_built_is_not_published(published, tmp_path):
    """Its folder would not load (weights of other shapes than the config says)."""
    drafter = make_drafter(published["target"])
    drafter.config.refiner_rank = 4
    with pytest.raises(ValueError, match="weights do not match its config .*would not load"):
        hub.publish(drafter, tmp_path / "out", target="t", push=False)
    assert not (tmp_path / "out").exists()


def test_a_failed_upload_is_one_line_naming_the_repository(published, monkeypatch, capsys):
    """No network (or no permission): `hf-xpress push` printed the HTTP client's whole traceback."""
    import huggingface_hub

    class Unreachable:
        def __init__(self, token=None):
            pass

        def create_repo(self, *args, **kwargs):
            raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "HfApi", Unreachable)
    from hf_xpress.cli import main

    assert main(["push", str(published["folder"]), REPO_ID, "--target", "t"]) == 1
    err = capsys.readouterr().err
    assert f"could not upload to the Hub repository {REPO_ID} (ConnectionError: [Errno -2]" in err
    assert "Traceback" not in err and err.count("could not upload") == 1
    with pytest.raises(hub.PublishError):
        hub.push_to_hub(published["drafter"], REPO_ID, target="t")


def test_push_command_writes_a_local_folder_with_the_training_text(published, tmp_path, capsys):
    from hf_xpress.cli import main

    about = tmp_path / "training.md"
    about.write_text("Trained for the test on nothing at all.")
    out = tmp_path / "local-copy"
    assert main(["push", str(published["folder"]), str(out), "--target", "tiny/Qwen3-tiny", "--local",
                 "--training", str(about), "--no-custom-generate"]) == 0
    assert "published to" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "Trained for the test on nothing at all." in card and not (out / "custom_generate").exists()
    reloaded = XPressDrafterModel.from_pretrained(out)
    original = published["drafter"].state_dict()
    assert all(torch.equal(v, original[k]) for k, v in reloaded.state_dict().items())
    assert main(["push", str(published["folder"]), str(tmp_path / "other"), "--target", "t", "--local",
                 "--training", "notes/missing.md"]) == 2  # one line naming the problem
    assert "hf-xpress push: error: --training 'notes/missing.md': no such file" in capsys.readouterr().err
    assert main(["push", str(published["folder"]), str(tmp_path / "text"), "--target", "t", "--local",
                 "--training", "Two hours on a laptop."]) == 0
    assert "Two hours on a laptop." in (tmp_path / "text" / "README.md").read_text()
    # convert's reading options (push had none: a checkpoint needing them could not be pushed in one step)
    assert main(["push", str(published["folder"]), str(tmp_path / "read"), "--target", "t", "--local", "--passes", "1",
                 "--dtype", "bfloat16"]) == 0
    pushed = XPressDrafterModel.from_pretrained(tmp_path / "read")
    assert pushed.config.jacobi_passes == 1 and pushed.dtype == torch.bfloat16
    for i, short in enumerate(("N/A", "v1.0")):  # one-word descriptions are text, not missing files
        assert main(["push", str(published["folder"]), str(tmp_path / f"short{i}"), "--target", "t", "--local",
                     "--training", short]) == 0
        assert short in (tmp_path / f"short{i}" / "README.md").read_text()
    # bad input, refused before anything is written
    bad_results = tmp_path / "results.json"
    bad_results.write_text(json.dumps({"xpress": 2.1}))  # a flat table, not {set: {method: tau}}
    assert main(["push", str(published["folder"]), str(tmp_path / "r"), "--target", "t", "--local",
                 "--results", str(bad_results)]) == 2
    assert "expected {set: {method: tau}} numbers" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    bad_results.write_text("{not json")  # json's own message named neither the flag nor the file
    assert main(["push", str(published["folder"]), str(tmp_path / "r"), "--target", "t", "--local",
                 "--results", str(bad_results)]) == 2
    assert f"--results {bad_results}: not a readable JSON file" in capsys.readouterr().err
    assert main(["push", str(published["folder"]), str(tmp_path / "short0"), "--target", "t", "--local"]) == 2
    assert "short0 exists and is not empty" in capsys.readouterr().err  # an earlier publish is never mixed into
    assert main(["push", str(published["folder"]), str(bad_results), "--target", "t", "--local"]) == 2  # was a traceback
    assert "results.json exists and is not a folder" in capsys.readouterr().err
    assert main(["push", str(published["folder"]), str(tmp_path / "bad-id"), "--target", "t", "--local",
                 "--repo-id", "org/team/name"]) == 2
    assert "'org/team/name' is not a Hub repo id" in capsys.readouterr().err


def test_concurrent_recipe_calls_on_one_target_keep_their_own_settings(published):
    """The recipe routes the target's candidate generator through an instance attribute while it runs. Each call used
    to set its own and remove it when done, so a call that ended while another was still running on the same target
    removed the other's (whose rounds then ran with the drafter's own settings, here 3 passes instead of 0)."""
    import copy
    import threading

    target, folder = published["target"], str(published["folder"])
    first, second = published["drafter"], copy.deepcopy(published["drafter"])
    started, release, result = threading.Event(), threading.Event(), {}

    class Gate:  # the first call's streamer: holds that call inside generate until the second call has ended
        def put(self, value):
            started.set()
            assert release.wait(timeout=120)

        def end(self):
            pass

    def call_first():
        result["first"] = target.generate(torch.tensor([PROMPTS[0]]), assistant_model=first, custom_generate=folder,
                                          trust_remote_code=True, jacobi_passes=0, max_new_tokens=MAX_NEW,
                                          do_sample=False, streamer=Gate())

    thread = threading.Thread(target=call_first)
    thread.start()
    assert started.wait(timeout=120)
    second_out = target.generate(torch.tensor([PROMPTS[1]]), assistant_model=second, custom_generate=folder,
                                 trust_remote_code=True, max_new_tokens=MAX_NEW, do_sample=False)
    release.set()
    thread.join(timeout=300)
    plain = [target.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False) for p in PROMPTS]
    assert torch.equal(result["first"], plain[0]) and torch.equal(second_out, plain[1])
    assert first.stats.rounds > 0 and set(first.stats.passes) == {0}  # the first call's own jacobi_passes
    assert set(second.stats.passes) - {0}  # the second call's: the drafter's (3)
    assert "_get_candidate_generator" not in vars(target)  # nothing left on the model


def test_push_keeps_the_source_cards_training_and_measurements_while_the_weights_are_its(published, tmp_path, caplog):
    """`hf-xpress ship` writes the card; a later push of that folder keeps its Training, Measured acceptance and
    Limitations (they were replaced by "Not documented."), unless given anew or the weights changed since."""
    from hf_xpress.cli import main
    from transformers.utils import logging as hf_logging

    source = published["folder"]
    sections = hub.card_sections(source)
    assert sections["Training"] == "Random weights, for tests."
    assert "| gsm8k | 6.48 | 10.11 |" in sections["Measured acceptance"]
    assert main(["push", str(source), str(tmp_path / "again"), "--target", "t", "--local"]) == 0
    assert hub.card_sections(tmp_path / "again") == sections
    assert main(["push", str(source), str(tmp_path / "new"), "--target", "t", "--local", "--training", "Retold."]) == 0
    assert hub.card_sections(tmp_path / "new") == {**sections, "Training": "Retold."}
    changed = XPressDrafterModel.from_pretrained(source)
    with torch.no_grad():
        changed.refiner.w1.weight.add_(1.0)  # trained further since the card was written
    hf_logging.enable_propagation()
    with caplog.at_level("WARNING"):
        hub.publish(changed, tmp_path / "changed", target="t")
    assert "weights are no longer the ones saved there" in caplog.text
    assert hub.card_sections(tmp_path / "changed") == {"Training": "Not documented.",
                                                       "Measured acceptance": "Not measured yet.",
                                                       "Limitations": "Trained on a small budget; see the training "
                                                                      "section."}
    # a training text with "## " headings of its own is carried whole (it was cut at its first one)
    notes = "Trained on ShareGPT.\n\n## Data\n\n1500 conversations.\n\n## Budget\n\nTwo hours."
    hub.publish(XPressDrafterModel.from_pretrained(source), tmp_path / "notes", target="t", training=notes)
    assert hub.card_sections(tmp_path / "notes")["Training"] == notes
    hub.publish(XPressDrafterModel.from_pretrained(tmp_path / "notes", dtype=torch.bfloat16), tmp_path / "cast",
                target="t")  # loaded in another dtype than saved: the same weights, the card carried
    assert hub.card_sections(tmp_path / "cast")["Training"] == notes
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("# Someone's model\n\n## Training\n\nTheirs.\n")
    assert hub.card_sections(tmp_path / "other") == {}  # another project's card is never read as ours


@pytest.mark.parametrize("refiner", ["xpress", "markov"])
def test_a_drafter_with_peft_adapters_drafts_with_its_refiner_and_is_not_published_unmerged(tmp_path, refiner):
    """A LoRA adapter that trains and saves the refiner (`modules_to_save=["refiner"]`, `hf-xpress train --lora`'s
    layout) puts a peft wrapper in the refiner's place. The drafter then drafted without any refiner, silently (its
    type checks failed on the wrapper), loaded with peft or through transformers' adapter support alike; publishing or
    exporting it crashed inside peft or on a missing key. It now drafts with the adapter's refiner, as the merged
    drafter does, and publishing / exporting it unmerged is refused by name."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModel

    from conftest import tiny_drafter
    from hf_xpress.conversion import export_vllm

    target = make_target()
    base = tiny_drafter(target, refiner)
    with torch.no_grad():
        for p in base.refiner.parameters():
            p.normal_(0.0, 0.3)  # a refiner that changes these drafts
    base.save_pretrained(tmp_path / "base")
    base = XPressDrafterModel.from_pretrained(tmp_path / "base").eval()
    wrapped = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["refiner"]))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():  # the adapter's own refiner and LoRA weights, not the base's
            if "modules_to_save" in name or "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.05)
    wrapped.eval().save_pretrained(tmp_path / "adapter")
    merged = PeftModel.from_pretrained(XPressDrafterModel.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
    merged = merged.merge_and_unload().eval()
    injected = AutoModel.from_pretrained(tmp_path / "adapter").eval()  # transformers' adapter support
    assert type(injected) is XPressDrafterModel and type(injected.refiner).__name__ == "ModulesToSaveWrapper"
    torch.manual_seed(0)
    hidden, lead = torch.randn(1, 16, 64), torch.tensor([[5, 9]])
    with torch.no_grad():
        scores, ids = merged.draft_scores(hidden[:, 1:], target.get_output_embeddings())
        expected = merged.propose(hidden, scores, lead).tokens
        assert ids is None and not torch.equal(expected, scores.argmax(-1))  # the refiner changes the drafter's own
        for model in (wrapped.base_model.model, injected):
            assert isinstance(model.active_refiner, type(merged.refiner))
            assert torch.equal(model.propose(hidden, scores, lead).tokens, expected)
        wrapped.base_model.model.refiner.enable_adapters(False)  # adapters off: the base refiner
        assert wrapped.base_model.model.active_refiner is wrapped.base_model.model.refiner.original_module
        wrapped.base_model.model.refiner.enable_adapters(True)
    ids = torch.randint(0, 126, (1, 7))
    plain = target.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=injected, max_new_tokens=20, do_sample=False), plain)
    for model in (wrapped, injected):
        with pytest.raises(ValueError, match="publish needs the drafter's own weights, but this .* carries peft "
                                             "adapters: merge them first"):
            hub.publish(model, tmp_path / "published", target="t", push=False)
        with pytest.raises(ValueError, match="export_vllm needs the drafter's own weights"):
            export_vllm(model, tmp_path / "vllm")
    assert not (tmp_path / "published").exists() and not (tmp_path / "vllm").exists()
    hub.publish(merged, tmp_path / "published", target="t", push=False)  # merged: a plain drafter


def test_publish_checks_the_results_before_writing_anything(published, tmp_path):
    """A results table of the wrong shape failed while the card was written, after the weights and the remote code:
    a half-written folder that a retry then refused as not empty. (And private=True without an upload is named.)"""
    drafter = make_drafter(published["target"])
    with pytest.raises(ValueError, match=r"private=True \(--private\) applies to an upload"):  # was ignored
        hub.publish(drafter, tmp_path / "out", target="t", private=True, push=False)
    for results in ({"humaneval": {"xpress": "1.6"}}, [1.6], {"humaneval": [1.6]}):
        with pytest.raises(ValueError, match=r"results: expected \{set: \{method: tau\}\} numbers"):
            hub.publish(drafter, tmp_path / "out", target="t", results=results, push=False)
        assert not (tmp_path / "out").exists()
    import numpy as np

    # numbers from numpy or torch (a mean over prompts) are numbers: not refused
    results = {"humaneval": {"xpress": np.float32(1.6), "markov": np.int64(2)}, "mtbench": {"xpress": torch.tensor(1.25)}}
    hub.publish(drafter, tmp_path / "out", target="t", results=results, push=False)
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| humaneval | 2.00 | 1.60 |" in card and "| mtbench | - | 1.25 |" in card
