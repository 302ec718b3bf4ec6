"""`hf-xpress demo`: the embedded default target (SmolLM2-135M-Instruct, from its PyPI wheel) with our trained
xPress drafter, against plain greedy `generate` on the same prompts: text, acceptance length, speed, exactness."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from .assets import DEFAULT_TARGET, apply_chat_template, load_target
from .benchmarking import load_drafter
from .configuration_xpress import DRAFT_SCHEDULES

DEFAULT_DRAFTER = Path(__file__).resolve().parent.parent / "drafters" / "smollm2-135m-xpress-b16"
DEMO_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
    "What is the capital of France? Answer in one sentence.",
)


def run_demo(
    target: str = DEFAULT_TARGET,
    drafter: str | Path = DEFAULT_DRAFTER,
    prompts: tuple[str, ...] = DEMO_PROMPTS,
    max_new_tokens: int = 96,
    dtype: str = "float32",
    tree: int | None = None,
    tree_budget: int | None = None,
    drafts: int | None = None,
    lookup: int | None = None,
    schedule: str | None = None,
) -> list[dict]:
    """Generate each prompt with plain greedy decoding, then with the drafter (chain verification, or with `tree`
    tree verification of that many slot-1 branches, or with `tree_budget` of a dynamic tree of that many draft nodes);
    print and return the figures. `drafts`: drafts per round (a tree's depth), default the drafter's own. `lookup`:
    prompt lookup's drafts per round too (`prompt_lookup_num_tokens`): with a tree its continuation joins the tree as
    a branch (`lookup_branch`), with a chain it is tried first. `schedule`: the drafter's `num_assistant_tokens_schedule`
    for chains (`"cost"`: each round's drafts, up to `drafts`, from the costs measured as it runs)."""
    import hf_xpress  # noqa: F401  (the generate() hook)

    if tree_budget and not tree:
        raise ValueError("--tree-budget needs --tree W (the dynamic tree's children per node)")
    torch_dtype = getattr(torch, dtype)
    model, tokenizer = load_target(target, dtype=torch_dtype)
    if not Path(drafter).exists() and str(drafter) == str(DEFAULT_DRAFTER):
        raise FileNotFoundError(f"The shipped drafter is missing at {drafter}; pass --drafter PATH_OR_HUB_ID.")
    assistant = load_drafter(str(drafter), torch_dtype, model.device)  # a missing or foreign folder: one line
    if drafts is not None:
        assistant.config.num_assistant_tokens = int(drafts)
    if schedule is not None:
        assistant.config.num_assistant_tokens_schedule = schedule
        assistant.config.validate_xpress()
    moving = assistant.config.num_assistant_tokens_schedule != "constant"
    passes = f", K={assistant.config.jacobi_passes}" if assistant.config.refiner == "xpress" else ""  # Jacobi passes
    print(f"target {target} ({dtype}), drafter {drafter} (refiner={assistant.config.refiner}"
          f"{passes}), {_describe_tree(tree, tree_budget)} verification, "
          f"{'up to ' if moving else ''}{assistant.config.num_assistant_tokens or 'all'} drafts per round"
          f"{f' ({assistant.config.num_assistant_tokens_schedule} schedule)' if moving else ''}, "
          f"{_describe_lookup(lookup, tree)}"
          f"{torch.get_num_threads()} threads")
    if dtype == "float32":
        print("float32, so that every token can be checked against plain generate; on many CPUs verifying several "
              f"tokens at once is slow in float32 (speed: `hf-xpress demo {FASTEST}`)")
    print()
    speculative = dict(assistant_model=assistant)
    if tree:
        speculative = dict(custom_generate=hf_xpress.tree_decoding, drafter=assistant, tree_width=tree,
                           tree_budget=tree_budget, lookup_branch=bool(lookup))
    if lookup:
        speculative["prompt_lookup_num_tokens"] = int(lookup)
    rows = []
    for prompt in prompts:
        ids = torch.tensor([apply_chat_template(tokenizer, [{"role": "user", "content": prompt}])])
        start = time.perf_counter()
        plain = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        t_plain = time.perf_counter() - start
        start = time.perf_counter()
        fast = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **speculative)
        t_fast = time.perf_counter() - start
        new = fast.shape[1] - ids.shape[1]
        row = {
            "prompt": prompt,
            "identical": torch.equal(plain, fast),
            "tau": assistant.stats.tau,
            "plain_tok_s": (plain.shape[1] - ids.shape[1]) / t_plain,
            "xpress_tok_s": new / t_fast,
            "speedup": t_plain / t_fast,
            "plain_steps": assistant.stats.plain_steps,
        }
        rows.append(row)
        print(f"> {prompt}\n{tokenizer.decode(fast[0, ids.shape[1]:], skip_special_tokens=True).strip()}\n")
        print(f"  tau {row['tau']:.2f} | plain {row['plain_tok_s']:.1f} tok/s | speculative {row['xpress_tok_s']:.1f} tok/s "
              f"| speed-up {row['speedup']:.2f}x | identical to plain generate: {row['identical']}"
              + (f" | plain steps {row['plain_steps']}" if row["plain_steps"] else ""))
        if not row["identical"]:
            print(f"  {describe_divergence(model, tokenizer, plain[0], fast[0], ids.shape[1])}")
        print()
    note = slow_fp32_note(rows, dtype)
    if note:
        print(note)
    return rows


FASTEST = "--dtype bfloat16 --tree 3 --tree-budget 6 --drafts 4 --lookup 10"


@torch.no_grad()
def describe_divergence(model, tokenizer, plain: torch.LongTensor, fast: torch.LongTensor, prompt_len: int) -> str:
    """Where two outputs `[n]` first differ, and the target's logit gap between their two tokens there (one forward
    over the common prefix): in low precision a gap of a few hundredths is a near-tie that a multi-token verify
    forward can round the other way from one-token decoding."""
    n = min(len(plain), len(fast))
    differ = (plain[:n] != fast[:n]).nonzero()
    if len(differ) == 0:  # one output stopped earlier
        return f"the outputs agree for {n - prompt_len} new tokens, then one of them stops"
    at = int(differ[0])
    logits = model(plain[None, :at].to(model.device)).logits[0, -1].float()
    a, b = int(plain[at]), int(fast[at])
    top = float(logits.max())
    where = (f"first difference at new token {at - prompt_len + 1}: plain {tokenizer.decode([a])!r}, xPress "
             f"{tokenizer.decode([b])!r}, whose logits differ by {float(logits[a] - logits[b]):.4f} there (top logit "
             f"{top:.2f}")
    if model.dtype == torch.float32:
        return where + "): float32 greedy decoding should be token-exact; please report this"
    # the spacing of representable values at the top logit's magnitude: the rounding a different forward can flip
    ulp = torch.finfo(model.dtype).eps * 2.0 ** math.floor(math.log2(max(abs(top), 1e-30)))
    return (where + f"; {ulp:g} is one step of {str(model.dtype).removeprefix('torch.')} at that magnitude): a "
            "near-tie, rounded the other way by a multi-token verify forward; float32 is token-exact (README, Limits)")


def slow_fp32_note(rows: list[dict], dtype: str) -> str | None:
    """What to read into an fp32 speed-up below 1 (None when there is none): fp32 is what keeps the exactness check
    token for token, and on many CPUs fp32 matmuls over the few rows a round verifies cost far more than one row."""
    if dtype != "float32" or all(row["speedup"] >= 1 for row in rows):
        return None
    return (
        "Speed-ups below 1x in float32 are mostly this CPU's cost of verifying several tokens at once in fp32 (a 3-row "
        "fp32 matmul cost 2.4-3.4x a 1-row one on an AMD EPYC), not of drafting; fp32 is what lets the demo check every token "
        f"against plain generate. For speed, run `hf-xpress demo {FASTEST}` (bf16, the fastest setting measured; "
        "bf16 outputs may differ from plain bf16 generate at near-ties); in float32, `--schedule cost --drafts 15` drafts "
        "only where it pays on this host (24 prompts: 1.04x, where the shipped 2 drafts per round read 0.73x). Figures: "
        "docs/benchmarks.md."
    )


def _describe_lookup(lookup: int | None, tree: int | None) -> str:
    if not lookup:
        return ""
    return f"prompt lookup ({lookup} drafts) {'as one more branch' if tree else 'first'}, "


def _describe_tree(tree: int | None, budget: int | None) -> str:
    if not tree:
        return "chain"
    return f"dynamic tree of {budget} nodes (width {tree})" if budget else f"tree of {tree} branches"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the default target with the shipped xPress drafter")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target: 'smollm2-135m-instruct', a folder or a Hub id")
    parser.add_argument("--drafter", default=str(DEFAULT_DRAFTER), help="drafter folder or Hub id")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    parser.add_argument("--tree", type=int, default=None,
                        help="tree verification of this many slot-1 branches (hf_xpress.tree_decoding); default: chain")
    parser.add_argument("--tree-budget", type=int, default=None,
                        help="with --tree W: a dynamic tree of this many draft nodes (the drafter's most probable)")
    parser.add_argument("--drafts", type=int, default=None,
                        help="drafts per round (a tree's depth); default: the drafter's num_assistant_tokens")
    parser.add_argument("--lookup", type=int, default=None, metavar="N",
                        help="prompt lookup's N drafts per round too: with --tree they join the drafter's tree as a "
                        "branch, with a chain lookup is tried first")
    parser.add_argument("--schedule", default=None, choices=DRAFT_SCHEDULES,
                        help="drafts per round for a chain: 'cost' picks each round's count (up to --drafts) from the "
                        "acceptance and round times measured as it runs; default: the drafter's own")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    """Exit status 1 when an fp32 output differs from plain `generate` (a bug: fp32 greedy decoding is exact); bf16
    outputs may drift at near-ties of the target's logits, so there the demo only reports them."""
    for flag, value in (("--tree", args.tree), ("--tree-budget", args.tree_budget), ("--drafts", args.drafts),
                        ("--lookup", args.lookup), ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:  # 0 turned a feature off silently; negatives failed inside transformers
            raise ValueError(f"{flag} must be at least 1, got {value} (leave it out for the default)")
    rows = run_demo(args.target, args.drafter, tuple(args.prompt or DEMO_PROMPTS), args.max_new_tokens, args.dtype,
                    args.tree, args.tree_budget, args.drafts, args.lookup, args.schedule)
    return int(args.dtype == "float32" and not all(row["identical"] for row in rows))
