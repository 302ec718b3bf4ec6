"""How often the target's next token is among the drafter's top-k for slots 1 and 2, in real chain decoding.

    python scripts/topk_coverage.py drafters/smollm2-135m-xpress-b16 6   # 6 prompts per set (HumanEval, MT-Bench, MATH-500)

Greedy fp32 `generate(..., assistant_model=drafter)` with SmolLM2-135M-Instruct, 128 new tokens; every `propose`
call's final logits for slots 1..2 are recorded, and each round is scored against the committed output: the
fraction of rounds whose slot-1 token is within the drafter's top-k (k = 1..4), and jointly slot 1 within top-a and
slot 2 within top-b (slot 2's logits conditioned on slot 1's top-1 draft, so the joint is a lower bound for other
branches). This is what motivated tree verification (docs/benchmarks.md, "Tree verification").
"""

from __future__ import annotations

import sys

import torch

import hf_xpress  # noqa: F401  (the generate() hook)
from hf_xpress.assets import apply_chat_template, load_prompts, load_target
from hf_xpress.modeling_xpress import XPressDrafterModel

K = 4


def main(drafter_path: str, limit: int) -> None:
    torch.set_num_threads(2)
    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    drafter = XPressDrafterModel.from_pretrained(drafter_path, dtype=torch.float32).eval()
    recorded: list[list[list[int]]] = []
    original = XPressDrafterModel.propose

    def propose(self, *args, **kwargs):
        proposal = original(self, *args, **kwargs)
        recorded.append(proposal.logits[0, :2].topk(K, dim=-1).indices.tolist())
        return proposal

    XPressDrafterModel.propose = propose
    rounds = 0
    slot1 = [0] * K
    joint = [[0] * K for _ in range(K)]
    for name in ("humaneval", "mtbench", "math500"):
        for record in load_prompts(name, limit):
            ids = torch.tensor([apply_chat_template(tokenizer, record)])
            recorded.clear()
            out = target.generate(ids, assistant_model=drafter, max_new_tokens=128, do_sample=False)
            out = out[0, ids.shape[1] :].tolist()
            position = 1  # the prefill's token is out[0]; round r's slot 1 is out[position]
            for accepted, top in zip(drafter.stats.accepted, recorded):
                if position + 1 >= len(out) or len(top) < 2:
                    break
                first, second = out[position], out[position + 1]
                rounds += 1
                for a in range(K):
                    slot1[a] += first in top[0][: a + 1]
                    for b in range(K):
                        joint[a][b] += first in top[0][: a + 1] and second in top[1][: b + 1]
                position += accepted + 1
            print(f"{name} {record.id}: tau {drafter.stats.tau:.3f}", flush=True)
    print(f"rounds {rounds}")
    print("slot 1 within top-k, k = 1..4:", [round(h / rounds, 3) for h in slot1])
    print("slot 1 within top-a (rows) and slot 2 within top-b (columns):")
    for a in range(K):
        print(a + 1, [round(h / rounds, 3) for h in joint[a]])


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
