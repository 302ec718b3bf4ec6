"""Seconds per training step of the SmolLM2 recipe (the eighth run's settings), per refiner, and page faults per step.

    python scripts/train_speed.py [--refiners none,markov,xpress] [--steps 8] [--threads 1] [--max-sequences 1344]
        [--feature-cache ~/.cache/hf_xpress/features/smollm2-mix7-L1-14-27] [--no-keep-freed-memory]

Each refiner's shipped drafter continues on `data/smollm2-mix7` from its cached features (a partly built cache works:
`--max-sequences` at most the sequences it covers) in a throwaway folder: 3 warm-up steps, then the median of `--steps`
timed `Trainer.train_step()` calls, one refiner after the other in this process. Run it on a quiet machine. To time
an older trainer, run this file with `PYTHONPATH` set to a checkout of that commit.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time

import torch

from hf_xpress import training as T

FOLDER = {"none": "dflash", "markov": "markov", "xpress": "xpress"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refiners", default="none,markov,xpress")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="per trainer, as the recipe runs three side by side")
    ap.add_argument("--max-sequences", type=int, default=1344)
    ap.add_argument("--feature-cache", default=os.path.expanduser("~/.cache/hf_xpress/features/smollm2-mix7-L1-14-27"))
    ap.add_argument("--no-keep-freed-memory", action="store_true", help="glibc's default allocator behaviour")
    args = ap.parse_args()
    if args.no_keep_freed_memory and hasattr(T, "keep_freed_memory"):
        T.keep_freed_memory = lambda *a, **k: False  # the trainer calls it through the module
    print(f"torch {torch.__version__}, trainer from {T.__file__}, {args.threads} thread(s), load {os.getloadavg()}")
    for refiner in args.refiners.split(","):
        with tempfile.TemporaryDirectory() as out:
            cfg = T.TrainConfig(
                data="data/smollm2-mix7", out=out, refiner=None if refiner == "none" else refiner,
                init_drafter=f"drafters/smollm2-135m-{FOLDER[refiner]}-b16", layers=2, layer_ids=[1, 14, 27],
                mask_token_id=16, refiner_rank=128, train_vocab=8192, anchors_per_seq=16, batch_size=4, lr=6e-4,
                max_steps=2400, mixed_precision="bf16", heldout_every=25, heldout_seqs=48, eval_anchors=24,
                feature_cache=args.feature_cache, max_sequences=args.max_sequences, threads=args.threads,
            )
            trainer = T.Trainer(cfg)
            for _ in range(3):
                trainer.train_step()
            times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(args.steps):
                start = time.perf_counter()
                trainer.train_step()
                times.append(time.perf_counter() - start)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.steps
            print(f"{refiner:7s} {statistics.median(times):.3f} s/step (min {min(times):.3f}, max {max(times):.3f}), "
                  f"{faults:,.0f} page faults/step", flush=True)
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
