"""Are the drafters' slot-1 probabilities calibrated? What a dynamic tree ranks by (`tree_temperature`) is the
drafter's probability of each draft; this measures, on the trainer's held-out blocks, how often the drafter's top
slot-1 token is the target's argmax against how probable the drafter said it was.

    python scripts/calibration.py [--data data/smollm2-mix7] [--drafters drafters/smollm2-135m-*-b16]
        [--heldout 48] [--anchors 24] [--temperatures 1,1.5,2] [--whole-vocabulary] [--train-neighbours]
        [--drafter-only] [--out results/calibration.json]

Per drafter and temperature T (scores divided by T, as the tree does): slot-1 accuracy, mean confidence (the top
token's probability), expected calibration error over 10 confidence bins (ECE; confidence above accuracy means
over-confident) and top-3 accuracy (what a 3-wide tree's first level catches). Probabilities are a softmax over the
drafter's draft vocabulary, or, with a `refiner_shortlist` of M (the shipped refiners), over the M tokens the refiner
re-scores, as `propose_dynamic_tree` computes them (`--whole-vocabulary`: over all of them, the refiner's bias on
each, as in training). `--train-neighbours` measures instead the training sequence that follows each held-out one
(seen in training): a drafter calibrated there but over-confident on the held-out split has fitted its training data
more closely than it generalises. The target runs in float32 on the fly; the held-out split and anchors are the
trainer's (every 25th sequence, seed 12345). `--drafter-only` measures a refiner drafter's own dFlash scores without
the refiner's bias (over its whole draft vocabulary): is the over-confidence in the bias or in the scores under it?
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import torch

from hf_xpress import XPressDrafterModel
from hf_xpress.assets import load_target
from hf_xpress.modeling_xpress import XPressMarkovHead, XPressRefiner
from hf_xpress.training import (Dataset, calibration_estimate, drafter_hidden, markov_delta, pack_blocks, refiner_delta,
                                sequences_with_features, train_neighbours, training_split)


@torch.no_grad()
def slot1_scores(drafter: XPressDrafterModel, target, data: Dataset, heldout: list[int], anchors: int,
                 batch: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's own slot-1 scores over its draft vocabulary `[N, V']`, the same with the refiner's bias added, the
    labels' columns `[N]` (-1: outside the draft vocabulary) and each block's validity `[N]`, for the held-out
    blocks."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids = drafter.draft_vocab if drafter.config.draft_vocab_size else torch.arange(drafter.config.vocab_size)
    column = torch.full((drafter.config.vocab_size,), -1, dtype=torch.long)
    column[ids] = torch.arange(len(ids))
    generator = torch.Generator().manual_seed(12345)
    bases, scores, labels, valid = [], [], [], []
    for s in range(0, len(heldout), batch):
        seqs, feats, finals = sequences_with_features(data, heldout[s : s + batch], target, drafter.config.target_layer_ids)
        packed = pack_blocks(drafter, embed, lm_head, seqs, feats, finals, anchors, generator, with_p_target=False)
        hidden = drafter_hidden(drafter, packed)  # [N, B, H]
        base = lm_head(hidden[:, 1]).float()[:, ids]  # slot 1, [N, V']
        refiner, prev, refined = drafter.refiner, packed.blocks.anchor_prev, base
        if isinstance(refiner, XPressRefiner):  # causal: slot 1 reads the anchor and the token before it only
            padded = torch.cat([prev, prev.new_zeros(len(prev), hidden.shape[1] - 2)], dim=1)
            refined = base + refiner_delta(refiner, refiner.hidden_part(hidden), padded, ids)[:, 0].float()
        elif isinstance(refiner, XPressMarkovHead):
            refined = base + markov_delta(refiner, prev[:, 1:], ids)[:, 0].float()
        bases.append(base)
        scores.append(refined)
        labels.append(column[packed.blocks.labels[:, 0]])
        valid.append(packed.blocks.valid[:, 0])
    return torch.cat(bases), torch.cat(scores), torch.cat(labels), torch.cat(valid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/smollm2-mix7")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafters", nargs="*", default=sorted(glob.glob("drafters/smollm2-135m-*-b16")))
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--heldout-every", type=int, default=25, help="the held-out split of the data's training runs")
    ap.add_argument("--temperatures", default="1,1.5,2")
    ap.add_argument("--train-neighbours", action="store_true",
                    help="the training sequence after each held-out one instead (seen in training)")
    ap.add_argument("--whole-vocabulary", action="store_true",
                    help="softmax over the whole draft vocabulary even with a refiner_shortlist (the refiner's bias on all)")
    ap.add_argument("--drafter-only", action="store_true",
                    help="the drafter's own scores, without the refiner's bias (whole draft vocabulary)")
    ap.add_argument("--out", default="results/calibration.json")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    data = Dataset.load(args.data)
    _, train, heldout = training_split(data.num_labelled, None, args.heldout_every)
    heldout = heldout[: args.heldout]
    if args.train_neighbours:
        heldout = train_neighbours(heldout, train)
    target, _ = load_target(args.target, dtype=torch.float32)
    report = {"data": args.data, "split": "train neighbours" if args.train_neighbours else "heldout",
              "drafter_only": args.drafter_only,
              "sequences": len(heldout), "anchors_per_sequence": args.anchors, "drafters": {}}
    print("| drafter | T | blocks | slot-1 accuracy | confidence | ECE | top-3 |\n|---|---|---|---|---|---|---|")
    for path in args.drafters:
        drafter = XPressDrafterModel.from_pretrained(path, dtype=torch.float32).eval()
        base, scores, labels, valid = slot1_scores(drafter, target, data, heldout, args.anchors)
        if args.drafter_only:
            scores = base
        plain = args.whole_vocabulary or args.drafter_only or drafter.refiner is None
        shortlist = None if plain else drafter.config.refiner_shortlist
        rows = report["drafters"][path] = {"refiner_shortlist": shortlist, "refiner_bias": not args.drafter_only}
        for t in map(float, args.temperatures.split(",")):
            r = rows[str(t)] = calibration_estimate(base[valid], scores[valid], labels[valid], shortlist, t)
            print(f"| {path} | {t:g} | {r['blocks']} | {r['acc1']:.3f} | {r['confidence']:.3f} | {r['ece']:.3f} | "
                  f"{r['top3']:.3f} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
