"""Share of the benchmark reference outputs' tokens that never occur as a training label.

    python scripts/label_coverage.py [--data data/smollm2-label] [--reference results/training/greedy-reference.json]

Training labels are those of the training split (every 25th sequence is held out, as in `hf-xpress train`),
counted over the response positions; printed for the first 512 labelled sequences (the first run), the first
1,836 (the second run) and all. Also: how often the text's own next token equals the target's argmax label, over
the response positions of the second run's sequences and of those added after them, and of the regenerated
sequences (ids `regen:...`) and the others.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def seen_labels(data: str, num_sequences: int, heldout_every: int = 25) -> set[int]:
    labels = np.load(f"{data}/labels.npy")
    offsets = np.load(f"{data}/offsets.npy")
    prompt_lens = np.load(f"{data}/prompt_lens.npy")
    seen: set[int] = set()
    for i in range(num_sequences):
        if i % heldout_every:
            seen.update(labels[offsets[i] + prompt_lens[i] - 1 : offsets[i + 1] - 1].tolist())
    return seen


def text_agreement(data: str, indices: range | list[int]) -> tuple[int, int]:
    """(positions where the response token equals the label of the position before it, response positions), over the
    sequences `indices`."""
    tokens = np.load(f"{data}/tokens.npy")
    labels = np.load(f"{data}/labels.npy")
    offsets = np.load(f"{data}/offsets.npy")
    prompt_lens = np.load(f"{data}/prompt_lens.npy")
    agree = total = 0
    for i in indices:
        a, b, p = offsets[i], offsets[i + 1], prompt_lens[i]
        agree += int((tokens[a + p : b] == labels[a + p - 1 : b - 1]).sum())
        total += int(b - a - p)
    return agree, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/smollm2-label")
    parser.add_argument("--reference", default="results/training/greedy-reference.json")
    args = parser.parse_args()
    reference = json.loads(open(args.reference).read())
    manifest = json.loads(open(f"{args.data}/manifest.json").read())
    labelled = manifest["num_labelled"]
    for n in sorted({min(512, labelled), min(1836, labelled), labelled}):  # first run, second run, all
        seen = seen_labels(args.data, n)
        shares = []
        for name, outputs in reference.items():
            tokens = [t for out in outputs.values() for t in out]
            shares.append(f"{name} {sum(t not in seen for t in tokens) / len(tokens):.1%} of {len(tokens)}")
        print(f"{n} sequences ({len(seen)} distinct labels): " + ", ".join(shares))
    for lo, hi in ((0, min(1836, labelled)), (1836, labelled)):
        if hi > lo:
            agree, total = text_agreement(args.data, range(lo, hi))
            print(f"sequences {lo}-{hi - 1}: text == target argmax at {agree / total:.1%} of {total} response positions")
    names = manifest.get("ids", [])[:labelled]
    for kind, regenerated in (("regenerated", True), ("existing text", False)):
        picked = [i for i, name in enumerate(names) if name.startswith("regen:") == regenerated]
        if picked:
            agree, total = text_agreement(args.data, picked)
            print(f"{kind} ({len(picked)} sequences): text == target argmax at {agree / total:.1%} of {total} "
                  "response positions")


if __name__ == "__main__":
    main()
