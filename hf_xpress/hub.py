"""Model cards (from `model_cards/drafter.md`) for drafters saved or pushed to the Hub."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from .configuration_xpress import XPressDrafterConfig

_TEMPLATE_IN_REPO = Path(__file__).resolve().parent.parent / "model_cards" / "drafter.md"
_REFINER_TITLES = {"xpress": "dFlash + xPress", "markov": "dFlash + Markov head", None: "dFlash"}


def _template() -> str:
    if _TEMPLATE_IN_REPO.exists():
        return _TEMPLATE_IN_REPO.read_text()
    return resources.files("hf_xpress").joinpath("model_card_template.md").read_text()


def results_table(results: dict[str, dict[str, float]]) -> str:
    """`{set: {method: tau}}` -> a markdown table of tau (acceptance length, tokens per target forward)."""
    if not results:
        return "Not measured yet."
    methods = sorted({m for row in results.values() for m in row})
    lines = ["| set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.2f}" if m in row else "-" for m in methods) + " |")
    return "\n".join(lines)


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
        num_drafts=config.block_size - 1,
        training=training,
        results=results if isinstance(results, str) else results_table(results or {}),
        limitations=limitations,
    )


def write_model_card(folder: str | os.PathLike, **facts) -> Path:
    """Write `README.md` into a saved drafter folder; `facts` are `render_model_card`'s keyword arguments."""
    folder = Path(folder)
    config = XPressDrafterConfig.from_pretrained(folder)
    facts.setdefault("repo_id", folder.name)
    path = folder / "README.md"
    path.write_text(render_model_card(config, **facts))
    (folder / "xpress_card_facts.json").write_text(json.dumps(facts, indent=2, default=str))
    return path


__all__ = ["render_model_card", "results_table", "write_model_card"]
