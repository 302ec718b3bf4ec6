"""What a verify forward costs against one decode step, and what the extras `generate` asks for add.

    python scripts/verify_cost.py [--target qwen2.5-coder-1.5b-instruct] [--threads 2]

bf16 target, 300 tokens of context in a cache, then timed forwards (median of 3 after a warm-up): 1 new token with the
last logits only (a decode step); 16 new tokens with all logits, with the last only, and with all logits plus every
hidden state (what a speculative verify in `generate` computes).
"""

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from hf_xpress.assets import load_target

p = argparse.ArgumentParser()
p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)
target, _ = load_target(args.target, dtype=torch.bfloat16)
ids = torch.randint(100, 20000, (1, 316), generator=torch.Generator().manual_seed(0))
cache = DynamicCache(config=target.config)
with torch.inference_mode():
    target(ids[:, :300], cache=cache, use_cache=True, logits_to_keep=1)

    def run(n: int, keep: int, hidden: bool) -> float:
        times = []
        for _ in range(4):
            start = time.perf_counter()
            target(ids[:, 300 : 300 + n], cache=cache, use_cache=True, logits_to_keep=keep, output_hidden_states=hidden)
            times.append(time.perf_counter() - start)
            cache.crop(-n)
        return 1000 * statistics.median(times[1:])

    for n, keep, hidden in [(1, 1, False), (16, 0, False), (16, 1, False), (16, 0, True), (1, 1, False)]:
        print(f"new tokens {n:2d}, logits {'all' if keep == 0 else 'last'}, hidden states {hidden}: "
              f"{run(n, keep, hidden):.1f} ms", flush=True)
