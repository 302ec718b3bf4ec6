"""Held-out curves of several training runs side by side, from their `log.jsonl` (what `hf-xpress train` logs).

    python scripts/heldout_curves.py runs/smollm2-xpress-slots15 runs/smollm2-xpress-slots4

One markdown table per run: each held-out evaluation's step, training seconds so far (time-matched comparisons of
runs whose steps cost differently), slot-1 and slot-2 acceptance of the inference-time drafts (+- slot 1's standard
error), tau_est over the whole block and tau_est over the first 2 slots (`1 + a1 + a1 * a2`: what 2 drafts per round,
the shipped setting, can reach under the same independence approximation).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def evaluations(run: Path) -> list[dict]:
    """The `eval` records of a run folder's log, in order."""
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    return [r["eval"] for r in rows if "eval" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    for run in args.runs:
        print(f"\n{run}\n")
        print("| step | train seconds | slot 1 | slot 2 | tau_est | tau_est, 2 slots |")
        print("|---|---|---|---|---|---|")
        for ev in evaluations(run):
            a1, a2 = ev["slot_acc"][0], ev["slot_acc"][1]
            print(f"| {ev['step']} | {ev.get('train_seconds', 0):.0f} | {a1:.3f} +- {ev['acc1_se']:.3f} | {a2:.3f} | "
                  f"{ev['tau_est']:.3f} | {1 + a1 + a1 * a2:.3f} |")


if __name__ == "__main__":
    main()
