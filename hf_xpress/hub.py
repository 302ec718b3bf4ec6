"""Model cards (from `model_cards/drafter.md`) and publishing drafters to the Hub.

`publish(drafter, folder_or_repo_id, target=...)` writes everything a Hub repository needs: the weights, `config.json`
with `auto_map`, the remote code (`configuration_xpress.py`, `modeling_xpress.py`), a model card, and a
`custom_generate/` folder so that a user without hf-xpress runs xPress decoding with
`target.generate(..., custom_generate=<repo>, trust_remote_code=True)`. A local folder is exactly what would be
uploaded; a repo id uploads it (`push_to_hub`).
"""

from __future__ import annotations

import json
import numbers
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging

from .configuration_xpress import XPressDrafterConfig
from .modeling_xpress import check_plain_weights

logger = logging.get_logger(__name__)

_TEMPLATE_IN_REPO = Path(__file__).resolve().parent.parent / "model_cards" / "drafter.md"
_REFINER_TITLES = {"xpress": "dFlash + xPress", "markov": "dFlash + Markov head", None: "dFlash"}


class PublishError(RuntimeError):
    """An upload to the Hub failed (network, authentication, permissions); the message names the repository."""


def _template() -> str:
    if _TEMPLATE_IN_REPO.exists():
        return _TEMPLATE_IN_REPO.read_text()
    return resources.files("hf_xpress").joinpath("model_card_template.md").read_text()


def _is_number(value) -> bool:
    """A tau the card's table can format: an int or float, numpy's too (they are Real), or a 0-d tensor; not a bool."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and value.dtype != torch.bool
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_results(results, what: str = "results") -> None:
    """Raise a `ValueError` naming `what` unless `results` is None, a text or `{set: {method: tau}}` numbers (what the
    model card's table reads)."""
    if results is None or isinstance(results, str):
        return
    if not (isinstance(results, dict) and all(isinstance(row, dict) and all(_is_number(v) for v in row.values())
                                              for row in results.values())):
        raise ValueError(f"{what}: expected {{set: {{method: tau}}}} numbers (or a text), as the model card's table "
                         f"reads them; got {str(results)[:80]}")


def results_table(results: dict[str, dict[str, float]]) -> str:
    """`{set: {method: tau}}` -> a markdown table of tau (acceptance length, tokens per target forward)."""
    if not results:
        return "Not measured yet."
    methods = sorted({m for row in results.values() for m in row})
    lines = ["| set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.2f}" if m in row else "-" for m in methods) + " |")
    return "\n".join(lines)


def _drafts_phrase(config: XPressDrafterConfig) -> str:
    """How many drafts a round proposes under the config's inference defaults, for the model card."""
    block = config.block_size - 1
    if config.num_assistant_tokens in (None, block):
        phrase = f"{block} tokens"
    else:
        phrase = f"up to {config.num_assistant_tokens} of its {block} draft tokens"
    if config.assistant_confidence_threshold:
        phrase += f" (fewer where a draft's probability falls below {config.assistant_confidence_threshold:g})"
    return phrase


def render_model_card(
    config: XPressDrafterConfig,
    *,
    target: str,
    repo_id: str,
    training: str = "Not documented.",
    results: dict[str, dict[str, float]] | str | None = None,
    limitations: str = "Trained on a small budget; see the training section.",
    license: str = "apache-2.0",
    name: str | None = None,
) -> str:
    """Fill the model card template with the drafter's facts and the measured tau table."""
    refiner = config.refiner
    if refiner == "xpress":
        sentence = (
            f", refined by an xPress causal refiner (rank {config.refiner_rank}) run as {config.jacobi_passes} "
            "parallel Jacobi passes."
        )
    elif refiner == "markov":
        sentence = f", with a Markov head (rank {config.refiner_rank}) decoded left to right."
    else:
        sentence = "."
    return _template().format(
        name=name or repo_id.split("/")[-1],
        license=license,
        target=target,
        repo_id=repo_id,
        refiner_title=_REFINER_TITLES[refiner],
        refiner_sentence=sentence,
        block_size=config.block_size,
        num_layers=config.num_hidden_layers,
        target_layer_ids=config.target_layer_ids,
        num_drafts=_drafts_phrase(config),
        training=training,
        results=results if isinstance(results, str) else results_table(results or {}),
        limitations=limitations,
    )


CARRIED_SECTIONS = ("Training", "Measured acceptance", "Limitations")
_CARD_MARKER = "made with [hf-xpress]"


def card_sections(folder: str | os.PathLike) -> dict[str, str]:
    """The Training / Measured acceptance / Limitations sections of the hf-xpress model card in `folder`'s
    `README.md` (`{heading: text}`); `{}` when there is no such card (none, or another project's)."""
    path = Path(folder) / "README.md"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    if _CARD_MARKER not in text:
        return {}
    # A section ends at the template's next heading only: a training text may have "## " headings of its own.
    headings = [*CARRIED_SECTIONS, "Without hf-xpress: `custom_generate`"]
    starts = {h: m for h in headings if (m := re.search(rf"^## {re.escape(h)}[ \t]*$", text, re.MULTILINE))}
    sections: dict[str, str] = {}
    for name in CARRIED_SECTIONS:
        if name in starts:
            ends = [m.start() for h, m in starts.items() if m.start() > starts[name].start()]
            sections[name] = text[starts[name].end() : min(ends, default=len(text))].strip()
    return sections


def _carried_sections(drafter) -> dict[str, str]:
    """`card_sections` of the folder `drafter` was loaded from, when its weights are still that folder's (a card's
    training and measured acceptance describe those weights, not a refiner attached or trained since)."""
    folder = Path(str(getattr(drafter, "name_or_path", "") or ""))
    sections = card_sections(folder) if folder.is_dir() else {}
    if not sections:
        return {}
    from .conversion import ConversionError, read_state_dict

    try:
        saved = read_state_dict(folder)
    except ConversionError:
        return {}
    state = drafter.state_dict()
    if saved.keys() != state.keys() or not all(  # compared in the loaded dtype: a float32 folder loaded in bf16 is it
        torch.equal(saved[k].to(state[k].dtype), state[k].detach().cpu()) for k in saved
    ):
        logger.warning("%s has a model card, but the drafter's weights are no longer the ones saved there: its "
                       "training and measured acceptance are not carried into the new card.", folder)
        return {}
    logger.info("Model card sections %s carried from %s.", ", ".join(sections), folder)
    return sections


def write_model_card(folder: str | os.PathLike, **facts) -> Path:
    """Write `README.md` into a saved drafter folder; `facts` are `render_model_card`'s keyword arguments."""
    folder = Path(folder)
    config = XPressDrafterConfig.from_pretrained(folder)
    facts.setdefault("repo_id", folder.name)
    path = folder / "README.md"
    path.write_text(render_model_card(config, **facts))
    return path


# --------------------------------------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------------------------------------

REMOTE_CODE_FILES = ("configuration_xpress.py", "modeling_xpress.py")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DRAFTER_MARKER = "__HF_XPRESS_DRAFTER__"

CUSTOM_GENERATE_REQUIREMENTS = "torch>=2.5\ntransformers>=5.24\n"

CUSTOM_GENERATE_CARD = """
## Without hf-xpress: `custom_generate`

This repository also ships a `custom_generate/` recipe, so the full xPress decoding (drafter + refiner) runs with
plain `transformers` (it executes this repository's code, hence `trust_remote_code=True`):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

target = AutoModelForCausalLM.from_pretrained("{target}")
tokenizer = AutoTokenizer.from_pretrained("{target}")
inputs = tokenizer("Write a haiku about rain.", return_tensors="pt")
out = target.generate(**inputs, custom_generate="{repo_id}", trust_remote_code=True, max_new_tokens=256{drafter_arg})
print(tokenizer.decode(out[0]))
```

Pass `assistant_model=AutoModel.from_pretrained("{repo_id}", trust_remote_code=True)` to reuse a loaded drafter, and
`jacobi_passes=K` to change the number of refinement passes; `tree_width=3` verifies a tree of the drafter's 3 best
first tokens, each continued on its own branch.
"""


# What a re-push replaces (fnmatch, as huggingface_hub matches them: "*" also crosses "/", so the weight patterns
# name the top-level files only, never a user's sub-folder of other weights).
PUBLISHED_PATTERNS = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
                      "custom_generate/*"]


def _check_repo_id(repo_id: str) -> None:
    """Raise a `ValueError` if `repo_id` is not a Hub repo id (`user/name`)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if "/" not in repo_id:
            raise HFValidationError("it has no user or organisation part")
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{repo_id!r} is not a Hub repo id (user/name): {err}") from None


def _is_repo_id(name: str) -> bool:
    """Whether a destination reads as a Hub repo id (`user/name`) rather than a local folder: not an existing path,
    and its first part not an existing local folder (`drafters/new-one` is a folder to create)."""
    if not _REPO_ID.match(name) or name.startswith((".", "/", "~")) or os.path.exists(name):
        return False
    return not os.path.isdir(name.split("/")[0])


def _ensure_remote_code(drafter, folder: Path) -> None:
    """`save_pretrained` writes `auto_map` and copies the modeling files when the classes are registered for the Auto
    classes (`import hf_xpress` does it). Make sure of both, whichever way the drafter was loaded."""
    package = Path(__file__).resolve().parent
    for name in REMOTE_CODE_FILES:
        if not (folder / name).is_file():
            shutil.copyfile(package / name, folder / name)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    auto_map = config.get("auto_map") or {}
    wanted = {"AutoConfig": "configuration_xpress.XPressDrafterConfig", "AutoModel": "modeling_xpress.XPressDrafterModel"}
    if any(auto_map.get(k) != v for k, v in wanted.items()):
        config["auto_map"] = {**auto_map, **wanted}
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_custom_generate(folder: str | os.PathLike, drafter_source: str | None) -> Path:
    """Write `custom_generate/` into a published folder: `generate.py` (a copy of `hf_xpress/custom_generate.py`),
    the files it imports (`generation.py`, `tree_decoding.py` and the modeling files) and `requirements.txt`.

    `drafter_source` is what the recipe loads when the caller passes no drafter: the Hub repo id it is published in.
    """
    folder = Path(folder)
    package = Path(__file__).resolve().parent
    target = folder / "custom_generate"
    target.mkdir(parents=True, exist_ok=True)
    text = (package / "custom_generate.py").read_text()
    if drafter_source is not None:
        text = text.replace(f'DRAFTER = "{_DRAFTER_MARKER}"', f"DRAFTER = {str(drafter_source)!r}")
    (target / "generate.py").write_text(text)
    for name in (*REMOTE_CODE_FILES, "generation.py", "tree_decoding.py"):
        shutil.copyfile(package / name, target / name)
    (target / "requirements.txt").write_text(CUSTOM_GENERATE_REQUIREMENTS)
    return target / "generate.py"


def publish(
    drafter,
    folder_or_repo_id: str | os.PathLike,
    *,
    target: str,
    repo_id: str | None = None,
    training: str | None = None,
    results: dict[str, dict[str, float]] | str | None = None,
    limitations: str | None = None,
    license: str = "apache-2.0",
    name: str | None = None,
    custom_generate: bool = True,
    push: bool | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload xPress drafter (hf-xpress)",
) -> Path | str:
    """Write (and optionally upload) everything a Hub repository of `drafter` needs.

    `folder_or_repo_id`: a local folder (written as it would be uploaded), or a Hub repo id (`user/name`; written to a
    temporary folder, then uploaded). `push` forces either reading. `repo_id` is the name used in the model card and
    by `custom_generate/` (defaults to the repo id, or the folder name). `target` names the target model (card,
    `base_model`). `training`, `results`, `limitations`: the card's sections; those not given come from the model card
    of the folder the drafter was loaded from (`hf-xpress ship` writes one) while its weights are unchanged, else
    "Not documented." / "Not measured yet." / a small-budget note. Returns the folder, or the repo URL after an upload.
    """
    destination = str(folder_or_repo_id)
    push = _is_repo_id(destination) if push is None else push
    if private and not push:
        raise ValueError(f"private=True (--private) applies to an upload, but {destination} is written as a local "
                         "folder: drop it, or publish to a Hub repo id (push=True, --push).")
    if push:
        _check_repo_id(destination)
        with tempfile.TemporaryDirectory(prefix="hf-xpress-publish-") as tmp:  # checks the rest, writes, then uploads
            publish(
                drafter, tmp, target=target, repo_id=repo_id or destination, training=training, results=results,
                limitations=limitations, license=license, name=name, custom_generate=custom_generate, push=False,
            )
            from huggingface_hub import HfApi

            api = HfApi(token=token)
            try:
                api.create_repo(destination, private=private, exist_ok=True)
                # what publish writes replaces its earlier upload: stale weight shards or recipe files of a previous
                # push go; anything else a user added to the repository stays
                info = api.upload_folder(repo_id=destination, folder_path=tmp, commit_message=commit_message,
                                         delete_patterns=PUBLISHED_PATTERNS)
            except Exception as err:  # huggingface_hub's HTTP errors, its HTTP client's network errors, ...
                raise PublishError(f"could not upload to the Hub repository {destination} "
                                   f"({type(err).__name__}: {err}); nothing of this push was kept locally: publish to a "
                                   "folder first (`hf-xpress push --local`) to keep it") from err
        return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{destination}")

    if repo_id is not None:
        _check_repo_id(repo_id)
    check_results(results)
    check_plain_weights(drafter, "publish")
    carried = _carried_sections(drafter) if None in (training, results, limitations) else {}
    training = training if training is not None else carried.get("Training", "Not documented.")
    results = results if results is not None else carried.get("Measured acceptance")
    limitations = limitations if limitations is not None else carried.get(
        "Limitations", "Trained on a small budget; see the training section.")
    folder = Path(destination).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} exists and is not a folder: publish writes a folder (what is uploaded) there.")
    if folder.is_dir() and any(folder.iterdir()):
        raise ValueError(f"{folder} exists and is not empty: publish writes exactly what is uploaded, into a new or "
                         "empty folder (files already there would be mixed in).")
    folder.mkdir(parents=True, exist_ok=True)
    card_repo_id = repo_id or folder.name
    drafter.save_pretrained(folder)
    _ensure_remote_code(drafter, folder)
    write_model_card(
        folder, target=target, repo_id=card_repo_id, training=training, results=results,
        limitations=limitations, license=license, name=name,
    )
    if custom_generate:
        write_custom_generate(folder, repo_id)
        drafter_arg = ""
        if repo_id is None:  # the recipe does not know which repository it will be uploaded to: the card says it
            logger.warning("Publishing %s without repo_id: its custom_generate/ recipe names no drafter, so callers "
                           "pass xpress_drafter= (the model card shows it); pass repo_id= to name the repository.",
                           folder)
            drafter_arg = f', xpress_drafter="{card_repo_id}"'
        card = folder / "README.md"
        card.write_text(card.read_text().rstrip() + "\n" + CUSTOM_GENERATE_CARD.format(
            target=target, repo_id=card_repo_id, drafter_arg=drafter_arg))
    return folder


def push_to_hub(drafter, repo_id: str, **kwargs) -> str:
    """`publish(drafter, repo_id, push=True, ...)`: upload weights, remote code, model card and `custom_generate/`."""
    return publish(drafter, repo_id, push=True, **kwargs)


TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst")  # a --training value ending so names a file, not a description


def _run_push(args) -> int:
    from .conversion import load_checkpoint, reading_options

    drafter = load_checkpoint(args.source, refiner=args.refiner, base=args.base, target=args.target_config,
                              **reading_options(args))
    try:
        results = json.loads(Path(args.results).read_text()) if args.results else None
    except (OSError, ValueError) as err:
        raise ValueError(f"--results {args.results}: not a readable JSON file ({err})") from err
    check_results(results, f"--results {args.results}")
    training = args.training
    if training and Path(training).is_file():
        training = Path(training).read_text()
    elif training and not any(c.isspace() for c in training) and Path(training).suffix.lower() in TEXT_SUFFIXES:
        raise ValueError(f"--training {training!r}: no such file (pass the description's text, or a "
                         "file that exists)")
    where = publish(
        drafter, args.destination, target=args.target, repo_id=args.repo_id, training=training or None,
        results=results, custom_generate=not args.no_custom_generate, private=args.private,
        push=True if args.push else (False if args.local else None),
    )
    print(f"published to {where}")
    return 0


def add_push_parser(subparsers) -> None:
    from .conversion import add_reading_options

    parser = subparsers.add_parser("push", help="publish a drafter to the Hub (or write the folder that would be uploaded)")
    parser.add_argument("source", help="drafter folder (any format `hf-xpress convert` reads)")
    parser.add_argument("destination", help="Hub repo id (user/name) or a local folder")
    parser.add_argument("--target", required=True, help="target model id, for the model card")
    parser.add_argument("--repo-id", help="the Hub repo id the card and custom_generate/ name (default: the destination "
                        "when it is a repo id; with --local the card uses the folder's name and the recipe names no "
                        "drafter, so pass xpress_drafter= or assistant_model= to it)")
    parser.add_argument("--refiner", help="official refiner .pt to attach before publishing")
    parser.add_argument("--base", help="drafter folder the refiner .pt belongs to, when SOURCE is a .pt")
    parser.add_argument("--target-config", help="target config folder / id when the checkpoint lacks vocabulary or depth")
    add_reading_options(parser)  # as `hf-xpress convert`: any checkpoint it reads publishes in one step
    parser.add_argument("--training", help="training description (text, or a file holding it); default: the source "
                        "folder's model card's, while the weights are the ones saved there")
    parser.add_argument("--results", help="JSON file {set: {method: tau}} for the card's table; default: as --training")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--no-custom-generate", action="store_true", help="do not write custom_generate/")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--push", action="store_true", help="destination is a repo id: upload")
    where.add_argument("--local", action="store_true", help="destination is a folder: write only")
    parser.set_defaults(func=_run_push)


__all__ = [
    "PublishError",
    "card_sections",
    "add_push_parser",
    "publish",
    "push_to_hub",
    "render_model_card",
    "results_table",
    "write_custom_generate",
    "write_model_card",
]

