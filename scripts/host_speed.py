"""How fast this host is right now: the check behind docs/benchmarks.md's note on slowed timing runs.

    python scripts/host_speed.py [--threads 2]

Prints a bf16 2048^3 matmul rate (compute) and SmolLM2-135M-Instruct's plain greedy bf16 decode rate after 300
tokens of context (the decode loop's memory traffic). Compare the decode rate with and without a large page cache
held (`sync; echo 3 > /proc/sys/vm/drop_caches` as root drops it).
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_xpress.assets import load_target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    a, b = torch.randn(2048, 2048, dtype=torch.bfloat16), torch.randn(2048, 2048, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, n = time.perf_counter(), 20
    for _ in range(n):
        a @ b
    seconds = (time.perf_counter() - start) / n
    print(f"bf16 matmul 2048^3: {seconds * 1e3:.1f} ms, {2 * 2048**3 / seconds / 1e9:.0f} GFLOP/s")

    model, _ = load_target("smollm2", dtype=torch.bfloat16)
    ids = torch.randint(100, 40000, (1, 300))
    model.generate(ids, max_new_tokens=3, do_sample=False)  # warm-up
    for _ in range(3):
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
        print(f"plain bf16 decode: {32 / (time.perf_counter() - start):.1f} tok/s")


if __name__ == "__main__":
    main()
