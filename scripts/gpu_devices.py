"""Device placements a GPU user meets, checked for exactness against plain greedy `generate` (no downloads).

CI has no GPU, so these paths are checked here, on the device machine (`scripts/gpu_check.sh`), with tiny random
fp32 models: a Qwen3 target on the GPU and

- a drafter left on the CPU (`AutoModel.from_pretrained` loads there): it drafts on the CPU, with a warning;
- prompt ids on the CPU (transformers' `generate` takes them there): chains and `tree_decoding`;
- the target's lm_head on another device than its embeddings (a target split over devices): chains and trees;
- `enable_fast_refine()` (torch.compile, CUDA graphs) over a generate call: exact, and how many graphs it compiled
  (one per block shape, not one per round).

Chain rounds get many drafts accepted (`plant`: their first drafts are made the target's own tokens); the tree
checks run on the random drafter's own drafts (tau near 1: few accepted drafts cross devices). Prints one line per
check and exits non-zero if any output differs from plain `generate`.

    python scripts/gpu_devices.py          # on the GPU machine
    python scripts/gpu_devices.py --cpu    # a smoke test of this script on the CPU (every device "cpu")
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import hf_xpress  # noqa: E402
from hf_xpress import XPressDrafterModel  # noqa: E402

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)


def build(device: str) -> tuple[Qwen3ForCausalLM, XPressDrafterModel]:
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(**TINY)).eval().to(device)
    drafter = XPressDrafterModel.from_target(target, refiner="xpress", num_hidden_layers=2, mask_token_id=511,
                                             jacobi_early_stop=False).eval()
    with torch.no_grad():
        for p in drafter.refiner.parameters():
            p.normal_(0.0, 0.08)
    return target, drafter


def plant(continuation: torch.Tensor) -> None:
    """A random drafter accepts nothing: make each chain round's first drafts (a varying number) the target's own
    `continuation` (prompt included), so that chain rounds accept many drafts (trees draft with propose_tree)."""
    from hf_xpress.generation import XPressCandidateGenerator

    get_candidates, propose, lengths = XPressCandidateGenerator.get_candidates, XPressDrafterModel.propose, []

    def remember(self, input_ids, *args, **kwargs):
        lengths.append(input_ids.shape[1])
        return get_candidates(self, input_ids, *args, **kwargs)

    def truthful(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        truth = continuation[lengths[-1] : lengths[-1] + proposal.tokens.shape[1]].to(proposal.tokens.device)
        good = len(lengths) % (len(truth) + 1)
        proposal.tokens = proposal.tokens.clone()
        proposal.tokens[0, :good] = truth[:good]
        return proposal

    XPressCandidateGenerator.get_candidates, XPressDrafterModel.propose = remember, truthful


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="every device the CPU (a smoke test of this script)")
    args = parser.parse_args()
    gpu = "cpu" if args.cpu else "cuda"
    if gpu == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu for a smoke test")
        return 2
    target, drafter = build(gpu)
    ids = torch.randint(0, 500, (1, 12))
    plain = target.generate(ids.to(gpu), max_new_tokens=40, do_sample=False).cpu()
    plant(plain[0])
    failures = 0

    def check(name: str, out: torch.Tensor, model=None) -> None:
        nonlocal failures
        same = torch.equal(out.cpu(), plain)
        failures += not same
        tau = getattr(model, "stats", None)
        print(f"{'OK  ' if same else 'FAIL'} {name}" + (f" (tau {tau.tau:.2f})" if tau is not None else ""), flush=True)

    def run(name: str, fn) -> None:
        nonlocal failures
        try:
            fn()
        except Exception as err:  # a crash is a failure of that check; the others still run
            failures += 1
            print(f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)

    on_cpu = copy.deepcopy(drafter)  # left where from_pretrained puts it
    run("drafter on the CPU, target on the GPU (chain)", lambda: check(
        "drafter on the CPU, target on the GPU (chain)",
        target.generate(ids.to(gpu), assistant_model=on_cpu, max_new_tokens=40, do_sample=False), on_cpu))
    drafter.to(gpu)
    run("prompt ids on the CPU (chain)", lambda: check(
        "prompt ids on the CPU (chain)", target.generate(ids, assistant_model=drafter, max_new_tokens=40,
                                                          do_sample=False), drafter))
    run("prompt ids on the CPU (tree)", lambda: check(
        "prompt ids on the CPU (tree)", target.generate(ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter,
                                                         tree_width=3, max_new_tokens=40, do_sample=False), drafter))
    if gpu == "cuda" and torch.cuda.device_count() > 1:  # the lm_head on a second GPU, as device_map splits a target
        split = copy.deepcopy(target)
        split.lm_head.to("cuda:1")
        split.lm_head.register_forward_pre_hook(lambda m, a: tuple(x.to("cuda:1") for x in a))
        split.lm_head.register_forward_hook(lambda m, a, out: out.to("cuda:0"))
        for name, kwargs in (("chain", {"assistant_model": drafter}),
                             ("tree", {"custom_generate": hf_xpress.tree_decoding, "drafter": drafter, "tree_width": 3})):
            run(f"lm_head on cuda:1 ({name})", lambda kwargs=kwargs, name=name: check(
                f"lm_head on cuda:1 ({name})", split.generate(ids.to(gpu), max_new_tokens=40, do_sample=False,
                                                              **kwargs), drafter))
    else:
        print("SKIP lm_head on another device: one device")

    def fast() -> None:
        import torch._dynamo.utils as dynamo_utils

        drafter.enable_fast_refine(mode="reduce-overhead" if gpu == "cuda" else None)
        dynamo_utils.counters.clear()
        out = target.generate(ids.to(gpu), assistant_model=drafter, max_new_tokens=40, do_sample=False)
        rounds = drafter.stats.rounds
        compiles = sum(dynamo_utils.counters["stats"].values()) if "stats" in dynamo_utils.counters else None
        check(f"enable_fast_refine over {rounds} rounds (dynamo stats {dict(dynamo_utils.counters['stats'])}, "
              f"compiles counted {compiles})", out, drafter)
        drafter.disable_fast_refine()

    run("enable_fast_refine", fast)
    print(f"{failures} check(s) failed" if failures else "all checks exact")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
