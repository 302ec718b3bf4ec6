"""Peak memory of the trainer's held-out evaluation, drafting all blocks of a batch at once vs in chunks.

    python scripts/eval_memory.py [--drafter drafters/smollm2-135m-xpress-b16] [--data data/smollm2-text]
        [--feature-cache ~/.cache/hf_xpress/features/smollm2-text-L1-14-27]

Runs `Trainer.evaluate()` once per setting, each in a fresh process (peak RSS is per process), with the target's
features read from the cache as in training (or computed on the fly without one), and prints the peak resident memory and the tau estimate (identical by construction).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def child(args: argparse.Namespace) -> None:
    from hf_xpress.training import Trainer, TrainConfig

    cfg = TrainConfig(data=args.data, out="/tmp/eval-memory-run", refiner=args.refiner, init_drafter=args.drafter,
                      train_vocab=8192, batch_size=4, heldout_every=25, heldout_seqs=args.heldout, eval_anchors=8,
                      max_steps=1, threads=2, feature_cache=args.feature_cache, layer_ids=[1, 14, 27])
    trainer = Trainer(cfg)
    trainer.EVAL_DRAFT_BLOCKS = args.chunk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = trainer.evaluate()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"chunk": args.chunk, "peak_rss_mb_before_eval": before / 1024, "peak_rss_mb": peak / 1024,
                      "tau_est": result["tau_est"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="drafters/smollm2-135m-xpress-b16")
    ap.add_argument("--refiner", default="xpress")
    ap.add_argument("--data", default="data/smollm2-text")
    ap.add_argument("--heldout", type=int, default=8)
    ap.add_argument("--feature-cache", default=None, help="the data's feature cache (as in training; default: none, "
                    "features computed on the fly)")
    ap.add_argument("--chunk", type=int, default=None, help="(internal) run one setting in this process")
    args = ap.parse_args()
    if args.chunk is not None:
        child(args)
        return
    for chunk in (10_000, 8):
        out = subprocess.run([sys.executable, __file__, "--drafter", args.drafter, "--refiner", args.refiner,
                              "--data", args.data, "--heldout", str(args.heldout), "--chunk", str(chunk),
                              *(["--feature-cache", args.feature_cache] if args.feature_cache else [])],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        row = json.loads(out)
        label = "all blocks at once" if chunk == 10_000 else f"{chunk} blocks at a time"
        print(f"{label:22s} peak RSS {row['peak_rss_mb']:.0f} MB (before evaluate {row['peak_rss_mb_before_eval']:.0f} MB), "
              f"tau_est {row['tau_est']:.4f}", flush=True)


if __name__ == "__main__":
    main()
