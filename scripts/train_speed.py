"""Seconds per training step of the shipped SmolLM2 drafters' last run, per refiner, and page faults per step.

    python scripts/train_speed.py [--refiners none,markov,xpress] [--steps 8] [--threads 1] [--max-sequences 1344]
        [--feature-cache ~/.cache/hf_xpress/features/smollm2-mix7-L1-14-27] [--no-keep-freed-memory]
        [--set loss_slots=4 --set anchors_per_seq=48 ...]

Each refiner's shipped drafter continues with the settings its last run recorded (`training_history.json`: data,
sizes, batch, lr, mixed precision) from the cached features (a partly built cache works: `--max-sequences` at most
the sequences it covers) in a throwaway folder: 3 warm-up steps, then the median of `--steps`
timed `Trainer.train_step()` calls, one refiner after the other in this process; `--set` changes a recorded setting
(a `TrainConfig` field; the value is read as JSON, else as a string). It also prints the blocks per step and slot-1
training examples per second (valid slot-1 labels: what the fit gap found scarce). Run it on a quiet machine. To
time an older trainer, run this file with `PYTHONPATH` set to a checkout of that commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a recorded setting")
    args = ap.parse_args()
    overrides = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            overrides[field] = json.loads(value)
        except json.JSONDecodeError:
            overrides[field] = value
    if args.no_keep_freed_memory and hasattr(T, "keep_freed_memory"):
        T.keep_freed_memory = lambda *a, **k: False  # the trainer calls it through the module
    print(f"torch {torch.__version__}, trainer from {T.__file__}, {args.threads} thread(s), load {os.getloadavg()}, "
          f"settings changed: {overrides or 'none'}")
    for refiner in args.refiners.split(","):
        with tempfile.TemporaryDirectory() as out:
            folder = f"drafters/smollm2-135m-{FOLDER[refiner]}-b16"
            recorded = json.loads(open(f"{folder}/training_history.json").read())["config"]
            known = {f.name for f in dataclasses.fields(T.TrainConfig)}
            cfg = T.TrainConfig(**{
                **{k: v for k, v in recorded.items() if k in known}, "out": out, "init_drafter": folder,
                "feature_cache": args.feature_cache, "max_sequences": args.max_sequences, "threads": args.threads,
                **overrides,
            })
            trainer = T.Trainer(cfg)
            for _ in range(3):
                trainer.train_step()
            times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            blocks, slot1 = trainer.state["blocks"], 0
            loss = trainer._loss
            def counting(idx, generator):  # counts the valid slot-1 labels of each timed micro-batch
                nonlocal slot1
                out = loss(idx, generator)
                slot1 += int(out[2].blocks.valid[:, 0].sum())
                return out
            trainer._loss = counting
            for _ in range(args.steps):
                start = time.perf_counter()
                trainer.train_step()
                times.append(time.perf_counter() - start)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.steps
            blocks = (trainer.state["blocks"] - blocks) / args.steps
            print(f"{refiner:7s} {statistics.median(times):.3f} s/step (min {min(times):.3f}, max {max(times):.3f}), "
                  f"{faults:,.0f} page faults/step, {blocks:.0f} blocks/step, "
                  f"{slot1 / sum(times):.0f} slot-1 examples/s", flush=True)
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
