"""Raw costs behind docs/benchmarks.md and docs/training.md: a target and a drafter on this machine's CPU.

    python scripts/forward_cost.py [--threads 2] [--context 300] [--drafter drafters/smollm2-135m-xpress-b16]
    python scripts/forward_cost.py --target qwen2.5-coder-1.5b-instruct --dtypes bfloat16 --drafter untrained:2

1. Target prefill over 512 tokens in bf16 and fp32 (tokens/s): what labelling data costs per dtype.
2. Target forward over n new tokens after `--context` cached tokens, n = 1..16 (median ms): what verifying n
   candidates costs against one decode step.
3. One drafter step as in generation (2 new context features + a 16-row block, its cache cropped after), bf16, 1
   thread (median ms): the drafter's share of a round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DFlashCache

from hf_xpress import XPressDrafterModel
from hf_xpress.assets import resolve_target


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@torch.no_grad()
def target_costs(path: str, context: int, repeats: int, dtypes: list[torch.dtype]) -> None:
    ids = torch.randint(100, 40000, (1, 512))
    for dtype in dtypes:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        model(ids)  # warm-up
        print(f"{dtype}: prefill 512 tokens {512 / (median_ms(lambda: model(ids), 3) / 1e3):.0f} tok/s")
        costs = {}
        for n in (1, 2, 3, 4, 8, 16):
            times = []
            for _ in range(repeats):
                cache = DynamicCache(config=model.config)
                model(ids[:, :context], past_key_values=cache, use_cache=True)
                start = time.perf_counter()
                model(ids[:, context : context + n], past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - start)
            costs[n] = round(statistics.median(times) * 1e3, 1)
        print(f"{dtype}: forward over n new tokens after {context} cached (ms): {costs}")


@torch.no_grad()
def drafter_cost(folder: str, target_path: str, context: int, repeats: int) -> None:
    """`folder` is a saved drafter, or "untrained:N": N layers sized for the target (the cost needs no weights)."""
    torch.set_num_threads(1)
    if folder.startswith("untrained:"):
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.bfloat16)
        drafter = XPressDrafterModel.from_target(target, refiner="xpress", num_hidden_layers=int(folder[10:]))
        drafter = drafter.to(torch.bfloat16).eval()
        del target
    else:
        drafter = XPressDrafterModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    cfg = drafter.config
    width = len(cfg.target_layer_ids) * cfg.target_hidden_size
    block = torch.randn(1, cfg.block_size, cfg.hidden_size, dtype=torch.bfloat16)
    cache, cached = DFlashCache(), 0

    def step(new: int) -> None:  # as `XPressCandidateGenerator._draft_forward`: new context features + the block
        nonlocal cached
        drafter(noise_embeds=block, context_hidden_states=torch.randn(1, new, width, dtype=torch.bfloat16),
                position_ids=torch.arange(cached, cached + new + cfg.block_size)[None], cache=cache)
        cache.crop(-cfg.block_size)
        cached += new

    step(context)  # the prompt's features
    for _ in range(5):
        step(2)
    print(f"drafter step ({cfg.num_hidden_layers} layers, {cfg.block_size} rows, 2 new features, 1 thread): "
          f"{median_ms(lambda: step(2), repeats):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--target", default="smollm2-135m-instruct", help="alias, local folder or Hub id")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--drafter", default="drafters/smollm2-135m-xpress-b16",
                        help='a saved drafter, "untrained:N" (N layers sized for the target) or "none"')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = resolve_target(args.target)
    target_costs(target, args.context, args.repeats, [getattr(torch, d) for d in args.dtypes.split(",")])
    if args.drafter != "none":
        drafter_cost(args.drafter, target, args.context, 3 * args.repeats)


if __name__ == "__main__":
    main()
