"""Median wall time of one block's `propose` (the refiner's work after the draft) for the shipped xPress folder at
K = 0, 1 and 4 Jacobi passes (fixed passes, no early stop) and for the shipped Markov head, shortlist 64, the draft
vocabulary, bf16 target, over all 15 slots of a block; both drafters at their shipped settings (2 drafts per round,
xPress K = 2 with early stop), as in generation; and the shortlist's exact top-64 (`top_candidates`) against one
`torch.topk`.

    python scripts/propose_timing.py [--threads N]                 # default 1 thread
    python scripts/propose_timing.py --against /path/to/older/checkout   # paired with older code, in one process

`--against` loads that checkout's `hf_xpress/modeling_xpress.py` (with its configuration) as a second module and
times its drafters too. Every setting is called once per iteration, in a shuffled order (1,500 timed iterations after
20 warm-up ones), so machine drift and the previous call's cache footprint hit all alike: on a shared VM timings
drift within seconds, and in a fixed order a call's time depends on the call before it. Prints each setting's median
in ms and the K = 4 draft tokens of each checkout (equal before and after an exact change). Run it on a quiet machine, from the repository
root (it reads drafters/).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
import types
from pathlib import Path

import torch

from hf_xpress import assets
from hf_xpress.modeling_xpress import XPressDrafterModel, top_candidates


def round_robin(calls: dict, iterations: int, warmup: int = 20, flush: torch.Tensor | None = None) -> dict[str, float]:
    """Median ms per call, every call timed once per iteration in a shuffled order, so drift and the previous call's
    cache footprint hit all alike. calls: name -> (fn, inputs). `flush`: a buffer written before every call, then the
    call's inputs read (both untimed), so each call starts as after a forward pass: its inputs in cache, every weight
    table cold."""
    times = {name: [] for name in calls}
    order, rng = list(calls), random.Random(0)
    for i in range(warmup + iterations):
        rng.shuffle(order)
        for name in order:
            fn, inputs = calls[name]
            if flush is not None:
                flush.add_(1.0)
                for tensor in inputs:
                    tensor.sum()
            start = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def load_modeling(checkout: Path) -> types.ModuleType:
    """`checkout`'s modeling module, as the package `xpress_baseline` (no Auto-class registration)."""
    package = types.ModuleType("xpress_baseline")
    package.__path__ = [str(checkout / "hf_xpress")]
    sys.modules["xpress_baseline"] = package
    for name in ("configuration_xpress", "modeling_xpress"):
        spec = importlib.util.spec_from_file_location(f"xpress_baseline.{name}", checkout / "hf_xpress" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["xpress_baseline.modeling_xpress"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--against", type=Path, help="an older checkout to time in the same process")
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--cold", action="store_true",
                        help="before every call (untimed) write a 64 MiB buffer, then read the call's inputs: as in generation, "
                        "where a block's refinement follows the target's and the drafter's forward passes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = assets.load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
    models, top_functions = {"": XPressDrafterModel}, {"": top_candidates}
    if args.against is not None:
        old = load_modeling(args.against.resolve())
        models["old "], top_functions["old "] = old.XPressDrafterModel, old.top_candidates
    torch.manual_seed(0)
    drafters = {}
    for label, cls in models.items():
        drafters[label] = [cls.from_pretrained(f"drafters/smollm2-135m-{kind}-b16", dtype=torch.bfloat16).eval()
                           for kind in ("xpress", "markov")]
        for drafter in drafters[label]:
            drafter.config.refiner_shortlist = 64
    xpress = drafters[""][0]
    hidden = torch.randn(1, xpress.config.block_size, xpress.config.hidden_size, dtype=torch.bfloat16)
    base, vocab_ids = xpress.draft_scores(hidden[:, 1:], target.get_output_embeddings())
    lead = torch.tensor([[100, 200]])
    calls = {}
    for passes in (4, 0, 1):
        for label, (xpress, _) in drafters.items():
            calls[f"{label}xpress K={passes}"] = (
                lambda x=xpress, k=passes: x.propose(hidden, base, lead, passes=k, early_stop=False, vocab_ids=vocab_ids),
                (hidden, base),
            )
    for label, (xpress, markov) in drafters.items():
        calls[f"{label}markov"] = (lambda m=markov: m.propose(hidden, base, lead, vocab_ids=vocab_ids), (hidden, base))
        # as in generation with the shipped settings: 2 drafts per round, K = 2 with early stop
        calls[f"{label}xpress shipped, 2 drafts"] = (
            lambda x=xpress: x.propose(hidden, base[:, :2], lead, vocab_ids=vocab_ids), (hidden, base)
        )
        calls[f"{label}markov shipped, 2 drafts"] = (
            lambda m=markov: m.propose(hidden, base[:, :2], lead, vocab_ids=vocab_ids), (hidden, base)
        )
    tops = {}  # timed apart: the largest rows evict the drafters' tables from the caches
    for vocab in (8192, 49152, 151936):
        logits = torch.randn(1, 15, vocab) * 3
        for label, top in top_functions.items():
            tops[f"{label}top_candidates 64 of {vocab}"] = (lambda x=logits, f=top: f(x, 64), (logits,))
        tops[f"torch.topk 64 of {vocab}"] = (lambda x=logits: x.topk(64, dim=-1), (logits,))
    for group in (calls, tops):
        flush = torch.zeros(16 << 20) if args.cold else None
        for name, ms in round_robin(group, args.iterations, flush=flush).items():
            print(f"{name:32s} {ms:.4f} ms")
    for label in models:
        print(f"{label}K=4 tokens", calls[f"{label}xpress K=4"][0]().tokens.tolist())


if __name__ == "__main__":
    main()
