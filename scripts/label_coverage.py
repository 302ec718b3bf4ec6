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

from hf_xpress.training import Dataset, training_split


def seen_labels(ds: Dataset, num_sequences: int, heldout_every: int = 25) -> set[int]:
    """The labels at response positions of the training split of the first `num_sequences` sequences."""
    _, train_ids, _ = training_split(ds.num_labelled, num_sequences, heldout_every)
    seen: set[int] = set()
    for i in train_ids:
        seen.update(ds.labels[ds.offsets[i] + ds.prompt_lens[i] - 1 : ds.offsets[i + 1] - 1].tolist())
    return seen


def text_agreement(ds: Dataset, indices: range | list[int]) -> tuple[int, int]:
    """(positions where the response token equals the label of the position before it, response positions), over the
    sequences `indices`."""
    agree = total = 0
    for i in indices:
        a, b, p = ds.offsets[i], ds.offsets[i + 1], ds.prompt_lens[i]
        agree += int((ds.tokens[a + p : b] == ds.labels[a + p - 1 : b - 1]).sum())
        total += int(b - a - p)
    return agree, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/smollm2-label")
    parser.add_argument("--reference", default="results/training/greedy-reference.json")
    args = parser.parse_args()
    reference = json.loads(open(args.reference).read())
    ds = Dataset.load(args.data)
    labelled = ds.num_labelled
    for n in sorted({min(512, labelled), min(1836, labelled), labelled}):  # first run, second run, all
        seen = seen_labels(ds, n)
        shares = []
        for name, outputs in reference.items():
            if name.startswith("_"):  # "_settings": what the file was computed for
                continue
            tokens = [t for out in outputs.values() for t in out]
            shares.append(f"{name} {sum(t not in seen for t in tokens) / len(tokens):.1%} of {len(tokens)}")
        print(f"{n} sequences ({len(seen)} distinct labels): " + ", ".join(shares))
    for lo, hi in ((0, min(1836, labelled)), (1836, labelled)):
        if hi > lo:
            agree, total = text_agreement(ds, range(lo, hi))
            print(f"sequences {lo}-{hi - 1}: text == target argmax at {agree / total:.1%} of {total} response positions")
    names = ds.manifest.get("ids", [])[:labelled]
    for kind, regenerated in (("regenerated", True), ("existing text", False)):
        picked = [i for i, name in enumerate(names) if name.startswith("regen:") == regenerated]
        if picked:
            agree, total = text_agreement(ds, picked)
            print(f"{kind} ({len(picked)} sequences): text == target argmax at {agree / total:.1%} of {total} "
                  "response positions")


if __name__ == "__main__":
    main()
