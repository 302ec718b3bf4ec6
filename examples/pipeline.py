"""xPress drafting inside `pipeline("text-generation")`, with a streamer.

    python examples/pipeline.py
"""

from pathlib import Path

import torch
from transformers import AutoModel, TextStreamer, pipeline

import hf_xpress  # noqa: F401
from hf_xpress.assets import load_target

target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
drafter = AutoModel.from_pretrained(Path(__file__).parent.parent / "drafters/smollm2-135m-xpress-b16", dtype=torch.float32)

pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
chat = [{"role": "user", "content": "Give me three tips for writing clear Python."}]
result = pipe(chat, max_new_tokens=96, do_sample=False, streamer=TextStreamer(tokenizer, skip_prompt=True))
print(f"\ntau {drafter.stats.tau:.2f}")
plain = pipeline("text-generation", model=target, tokenizer=tokenizer)(chat, max_new_tokens=96, do_sample=False)
assert result == plain  # exactly the plain pipeline's output
