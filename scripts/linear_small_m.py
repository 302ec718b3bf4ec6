"""Time of one `torch.nn.functional.linear` by the number of rows M, per dtype: how the CPU's matmul kernel treats the
few-token forwards of speculative verification (M = drafts + 1) against a one-token decode step (M = 1).

    python scripts/linear_small_m.py [--threads 2] [--rows 1,2,3,4,8,16] [--repeats 20]

Shapes are SmolLM2-135M's: its lm_head (49,152 x 576) and an MLP projection (1,536 x 576). Prints ms per call
(median of --repeats after 3 warm-up calls), also with oneDNN (mkldnn) disabled. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def time_linear(rows: int, out_features: int, dtype: torch.dtype, repeats: int) -> float:
    weight = torch.randn(out_features, 576, dtype=dtype)
    x = torch.randn(rows, 576, dtype=dtype)
    for _ in range(3):
        torch.nn.functional.linear(x, weight)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(x, weight)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,3,4,8,16")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}, {args.threads} threads; ms per call, median of {args.repeats}")
    print("| dtype | weight | oneDNN | " + " | ".join(f"M={m}" for m in rows) + " |")
    print("|---|---|---|" + "---|" * len(rows))
    for dtype in (torch.float32, torch.bfloat16):
        for out_features, name in ((49152, "lm_head 49152x576"), (1536, "mlp 1536x576")):
            for onednn in (True, False):
                with torch.backends.mkldnn.flags(enabled=onednn):
                    ms = [time_linear(m, out_features, dtype, args.repeats) for m in rows]
                print(f"| {str(dtype).removeprefix('torch.')} | {name} | {'on' if onednn else 'off'} | "
                      + " | ".join(f"{t:.3f}" for t in ms) + " |")


if __name__ == "__main__":
    main()
