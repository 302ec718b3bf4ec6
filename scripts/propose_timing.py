"""Median wall time of one block's `propose` (the refiner's work after the draft) for the shipped xPress folder at
K = 0, 1 and 4 Jacobi passes and for the shipped Markov head, shortlist 64, the draft vocabulary, bf16 target.

    python scripts/propose_timing.py [THREADS]          # default 1 thread
    PYTHONPATH=/path/to/older/checkout python scripts/propose_timing.py   # the same against older code

Five rounds of 300 timed calls each (after 20 warm-up calls), interleaved between the four settings; prints the
median of the round medians in ms and the K = 4 draft tokens (equal before and after an exact change). Run it on a
quiet machine, from the repository root (it reads drafters/).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from hf_xpress import assets
from hf_xpress.modeling_xpress import XPressDrafterModel


def timed(fn, n: int = 300) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    target, _ = assets.load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
    xpress = XPressDrafterModel.from_pretrained("drafters/smollm2-135m-xpress-b16", dtype=torch.bfloat16).eval()
    markov = XPressDrafterModel.from_pretrained("drafters/smollm2-135m-markov-b16", dtype=torch.bfloat16).eval()
    for drafter in (xpress, markov):
        drafter.config.refiner_shortlist = 64
    torch.manual_seed(0)
    hidden = torch.randn(1, xpress.config.block_size, xpress.config.hidden_size, dtype=torch.bfloat16)
    base, vocab_ids = xpress.draft_scores(hidden[:, 1:], target.get_output_embeddings())
    lead = torch.tensor([[100, 200]])
    calls = {
        "xpress K=4": lambda: xpress.propose(hidden, base, lead, passes=4, early_stop=False, vocab_ids=vocab_ids),
        "markov": lambda: markov.propose(hidden, base, lead, vocab_ids=vocab_ids),
        "xpress K=0": lambda: xpress.propose(hidden, base, lead, passes=0, early_stop=False, vocab_ids=vocab_ids),
        "xpress K=1": lambda: xpress.propose(hidden, base, lead, passes=1, early_stop=False, vocab_ids=vocab_ids),
    }
    rounds = {name: [] for name in calls}
    for _ in range(5):
        for name, fn in calls.items():
            rounds[name].append(timed(fn))
    print({name: round(statistics.median(values), 4) for name, values in rounds.items()})
    print("K=4 tokens", calls["xpress K=4"]().tokens.tolist())


if __name__ == "__main__":
    main()
