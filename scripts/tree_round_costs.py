"""Per-round costs of tree decoding for several drafters, measured alternately on the same prompts (bf16).

    python scripts/tree_round_costs.py [--drafters markov,xpress] [--tree 3] [--budget 6] [--drafts 4] [--repeats 3]

Each repeat runs every drafter on every prompt (the first pass is a warm-up, not counted) and prints the mean draft,
refine and verify milliseconds per round from `drafter.stats`: a check that a difference between two drafters' verify
times in a benchmark report comes from the drafters and not from the order the benchmark ran them in.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import AutoModel

import hf_xpress
from hf_xpress.assets import apply_chat_template, load_target

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Explain in three sentences why the sky is blue.", "Solve: what is 17 * 23? Show steps.")

p = argparse.ArgumentParser()
p.add_argument("--drafters", default="markov,xpress")
p.add_argument("--tree", type=int, default=3)
p.add_argument("--budget", type=int, default=6, help="dynamic tree nodes (0: the fixed tree of --tree branches)")
p.add_argument("--drafts", type=int, default=4)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)
target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
drafters = {name: AutoModel.from_pretrained(f"drafters/smollm2-135m-{name}-b16", dtype=torch.bfloat16).eval()
            for name in args.drafters.split(",")}
for drafter in drafters.values():
    drafter.config.num_assistant_tokens = args.drafts
ids = [torch.tensor([apply_chat_template(tokenizer, [{"role": "user", "content": text}])]) for text in PROMPTS]
costs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in drafters}
with torch.inference_mode():
    for repeat in range(args.repeats + 1):
        for name, drafter in drafters.items():
            for prompt in ids:
                target.generate(prompt, custom_generate=hf_xpress.tree_decoding, drafter=drafter,
                                tree_width=args.tree, tree_budget=args.budget or None, max_new_tokens=96,
                                do_sample=False)
                s = drafter.stats
                if repeat:
                    costs[name].append(tuple(t / s.rounds * 1e3 for t in (s.draft_time, s.refine_time, s.verify_time)))
print(f"tree width {args.tree}, budget {args.budget or 'fixed'}, {args.drafts} drafts deep, bf16, "
      f"{torch.get_num_threads()} threads; ms per round, mean over {args.repeats} x {len(ids)} runs")
for name, rows in costs.items():
    draft, refine, verify = (statistics.mean(r[j] for r in rows) for j in range(3))
    print(f"{name}: draft {draft:.2f}  refine {refine:.2f}  verify {verify:.2f}")
