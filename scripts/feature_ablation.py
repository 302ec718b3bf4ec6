"""How much do the shipped drafters use the target's features? Held-out per-slot greedy acceptance of each drafter
with the true context features, with the features shuffled over positions (same sequence, alignment destroyed) and
with zero features, next to n-gram lookup baselines for slot 1 (the target's argmax after the anchor, predicted from
the anchor token, or from the token before it and the anchor, counted on the training split's labels).

    python scripts/feature_ablation.py [--data data/smollm2-label] [--drafters drafters/smollm2-135m-*-b16]
        [--heldout 24] [--heldout-every 25] [--anchors 8] [--modes true,shuffled,zero] [--out results/feature-ablation.json]
        [--train-neighbours]

`--train-neighbours` also scores, the same way, the training sequence that follows each held-out one (same part of
the data, seen in training): a drafter that scores much higher there than on the held-out split is limited by its
data (it fits what it saw), one that scores the same is limited by capacity or steps.

The held-out split and anchors are the trainer's (every 25th labelled sequence, the first 24; 8 anchors each, seed
12345); the target runs in float32 on the fly (no feature cache needed).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
from pathlib import Path

import torch

from hf_xpress import XPressDrafterModel
from hf_xpress.assets import load_target
from hf_xpress.training import (Dataset, acceptance_estimate, heldout_drafts, pack_blocks, sequences_with_features,
                                train_neighbours, training_split)


def ngram_baselines(data: Dataset, train: list[int], heldout: list[int]) -> dict[str, float]:
    """Slot-1 accuracy of predicting label[a] (the target's argmax after anchor x_a) from x_a, or (x_{a-1}, x_a)
    with back-off to x_a, by the most frequent label in the training split; over every held-out response anchor."""
    bi, tri = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for i in train:
        tok, lab, p = data.sequence(i)
        for a in range(max(p - 1, 1), len(tok) - 1):
            bi[int(tok[a])][int(lab[a])] += 1
            tri[(int(tok[a - 1]), int(tok[a]))][int(lab[a])] += 1
    best_bi = {k: c.most_common(1)[0][0] for k, c in bi.items()}
    best_tri = {k: c.most_common(1)[0][0] for k, c in tri.items()}
    n = hit_bi = hit_tri = 0
    for i in heldout:
        tok, lab, p = data.sequence(i)
        for a in range(max(p - 1, 1), len(tok) - 1):
            n += 1
            b = best_bi.get(int(tok[a]), -1)
            hit_bi += b == lab[a]
            hit_tri += best_tri.get((int(tok[a - 1]), int(tok[a])), b) == lab[a]
    return {"positions": n, "bigram_acc1": hit_bi / n, "trigram_backoff_acc1": hit_tri / n}


@torch.no_grad()
def ablations(drafter: XPressDrafterModel, target, data: Dataset, heldout: list[int], anchors: int,
              modes: list[str], batch: int = 4) -> dict[str, dict]:
    """Per-slot acceptance and tau_est of `drafter`'s inference-time drafts with true / shuffled / zero features."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    layer_ids = drafter.config.target_layer_ids
    results = {}
    for mode in modes:
        generator = torch.Generator().manual_seed(12345)
        shuffle = torch.Generator().manual_seed(0)
        correct, valid = [], []
        for s in range(0, len(heldout), batch):
            seqs, feats, finals = sequences_with_features(data, heldout[s : s + batch], target, layer_ids)
            if mode == "shuffled":
                feats = [f[torch.randperm(len(f), generator=shuffle)] for f in feats]
            elif mode == "zero":
                feats = [torch.zeros_like(f) for f in feats]
            packed = pack_blocks(drafter, embed, lm_head, seqs, feats, finals, anchors, generator, with_p_target=False)
            correct.append(heldout_drafts(drafter, lm_head, packed, drafter.draft_vocab))
            valid.append(packed.blocks.valid)
        est = acceptance_estimate(torch.cat(correct), torch.cat(valid))
        results[mode] = {"acc1": est["slot_acc"][0], "acc2": est["slot_acc"][1], "tau_est": est["tau_est"],
                         "slot_acc": est["slot_acc"]}
        print(f"  {mode:9s} acc1 {est['slot_acc'][0]:.3f} acc2 {est['slot_acc'][1]:.3f} tau_est {est['tau_est']:.3f}",
              flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/smollm2-label")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafters", nargs="*", default=sorted(glob.glob("drafters/smollm2-135m-*-b16")))
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--anchors", type=int, default=8)
    ap.add_argument("--heldout-every", type=int, default=25, help="the held-out split of the data's training runs")
    ap.add_argument("--modes", default="true,shuffled,zero", help="features: true, shuffled, zero (comma-separated)")
    ap.add_argument("--out", default="results/feature-ablation.json")
    ap.add_argument("--train-neighbours", action="store_true",
                    help="also score the training sequence after each held-out one (fit gap: train vs held-out)")
    ap.add_argument("--no-ngram", action="store_true", help="skip the n-gram baselines")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    data = Dataset.load(args.data)
    _, train, heldout = training_split(data.num_labelled, None, args.heldout_every)
    heldout = heldout[: args.heldout]
    report = {"data": args.data, "heldout_sequences": len(heldout), "heldout_every": args.heldout_every,
              "anchors_per_sequence": args.anchors}
    if not args.no_ngram:
        report["ngram"] = ngram_baselines(data, train, heldout)
        print("n-gram baselines (slot 1):", json.dumps(report["ngram"]), flush=True)
    splits = {"heldout": heldout}
    if args.train_neighbours:
        splits["train"] = train_neighbours(heldout, train)
        report["train_sequences"] = len(splits["train"])
    target, _ = load_target(args.target, dtype=torch.float32)
    report["drafters"] = {}
    for path in args.drafters:
        print(path, flush=True)
        drafter = XPressDrafterModel.from_pretrained(path, dtype=torch.float32).eval()
        for split, seqs in splits.items():
            print(f" {split} ({len(seqs)} sequences)", flush=True)
            key = path if split == "heldout" else f"{path} [train]"
            report["drafters"][key] = ablations(drafter, target, data, seqs, args.anchors, args.modes.split(","))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
