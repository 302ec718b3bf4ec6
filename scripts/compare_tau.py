"""Compare `hf-xpress tau` results (json from `python -m hf_xpress.training tau`) on the same prompts.

    python scripts/compare_tau.py --first 6 results/data-mix/tau-shipped-dflash.json results/training/tau-none-4.json

Prints, per set and pooled over the sets, tau = accepted drafts / rounds + 1 over the first N prompts of each file
(default: all the prompts every file has), with a standard error from the spread between prompts (prompts are
the sampling unit: rounds within one prompt are not independent), and the paired difference of each file from the
first one over the same prompts. Files measured at different inference settings are flagged. A second table gives
each file's per-slot acceptance over all its prompts: how often slot k's draft was accepted, and how often given that
slot k - 1's was (the refiners condition slot k on the drafts before it; slot 1 follows the verified anchor).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SETTINGS = ("num_assistant_tokens", "assistant_confidence_threshold", "jacobi_passes", "jacobi_early_stop",
            "refiner_shortlist", "draft_vocab_size", "max_new_tokens", "target_dtype", "tree_width", "tree_budget",
            "prompt_lookup", "lookup_branch", "tree_temperature", "skip")
DEFAULTS = {"tree_temperature": 1.0, "skip": 0}  # what files written before these settings were recorded ran at


def pooled(prompts: list[dict]) -> float:
    """tau over several prompts' rounds: accepted drafts / rounds + 1."""
    return sum(p["accepted"] for p in prompts) / max(sum(p["rounds"] for p in prompts), 1) + 1.0


def ratio_se(prompts: list[dict]) -> float:
    """Standard error of the pooled tau, treating prompts as the sampling unit (ratio estimator)."""
    n = len(prompts)
    if n < 2:
        return float("nan")
    t = pooled(prompts) - 1.0
    mean_rounds = sum(p["rounds"] for p in prompts) / n
    resid = [(p["accepted"] - t * p["rounds"]) / mean_rounds for p in prompts]
    return math.sqrt(sum(r * r for r in resid) / (n - 1) / n)


def paired_se(a: list[dict], b: list[dict]) -> float:
    """Standard error of tau(b) - tau(a) over the same prompts (per-prompt taus, paired)."""
    d = [pb["tau"] - pa["tau"] for pa, pb in zip(a, b)]
    n = len(d)
    if n < 2:
        return float("nan")
    mean = sum(d) / n
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--first", type=int, default=None, help="only the first N prompts of each set")
    args = ap.parse_args()
    runs = [json.loads(Path(f).read_text()) for f in args.files]
    sets = [s for s in runs[0] if not s.startswith("_") and all(s in r for r in runs)]
    setups = [{k: r.get("_setup", {}).get(k, DEFAULTS.get(k)) for k in SETTINGS} for r in runs]
    for f, s in zip(args.files, setups):
        flag = "" if s == setups[0] else "   <-- other inference settings than the first file"
        print(f"{f}: {s}{flag}")
    per_file = []
    for r in runs:
        chosen = {}
        for s in sets:
            n = min(len(x[s]["per_prompt"]) for x in runs)
            n = min(n, args.first) if args.first else n
            chosen[s] = r[s]["per_prompt"][:n]
            ids = [p["id"] for p in chosen[s]]
            if ids != [p["id"] for p in runs[0][s]["per_prompt"][:n]]:
                raise SystemExit(f"{s}: the files measured different prompts")
        per_file.append(chosen)
    header = "| file | " + " | ".join(f"{s} (n={len(per_file[0][s])})" for s in sets) + " | all | vs first (paired) |"
    print("\n" + header + "\n|" + "---|" * (len(sets) + 3))
    first = [p for s in sets for p in per_file[0][s]]
    for f, chosen in zip(args.files, per_file):
        everything = [p for s in sets for p in chosen[s]]
        cells = [f"{pooled(chosen[s]):.3f} +- {ratio_se(chosen[s]):.3f}" for s in sets]
        diff = pooled(everything) - pooled(first)
        cells += [f"{pooled(everything):.3f} +- {ratio_se(everything):.3f}",
                  f"{diff:+.3f} +- {paired_se(first, everything):.3f}" if f != args.files[0] else "-"]
        ident = sum(p["identical"] for p in everything)
        print(f"| {Path(f).name} ({ident}/{len(everything)} identical) | " + " | ".join(cells) + " |")
    print_slots(args.files, runs, sets)


def print_slots(files: list[str], runs: list[dict], sets: list[str], most: int = 4) -> None:
    """Per file, pooled over `sets` (all of each set's prompts): P(slot k accepted) and P(slot k | slot k - 1), for
    the slots up to the last one any file accepted (at most `most`)."""
    slots = min(most, max(max((k + 1 for k, a in enumerate(r[s]["slot_acceptance"]) if a > 0), default=1)
                          for r in runs for s in sets))
    print("\n| file (all prompts) | " + " | ".join(f"slot {k + 1}" for k in range(slots)) + " |")
    print("|" + "---|" * (slots + 1))
    for f, r in zip(files, runs):
        rounds = sum(r[s]["rounds"] for s in sets)
        hits = [sum(r[s]["slot_acceptance"][k] * r[s]["rounds"] for s in sets) if k < len(r[sets[0]]["slot_acceptance"])
                else 0.0 for k in range(slots)]
        cells = [f"{hits[0] / rounds:.3f}"] + [
            f"{hits[k] / rounds:.3f} ({hits[k] / hits[k - 1]:.2f} given slot {k})" if hits[k - 1] else "0"
            for k in range(1, slots)]
        print(f"| {Path(f).name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
