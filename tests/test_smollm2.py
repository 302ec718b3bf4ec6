"""The real SmolLM2-135M-Instruct (from its PyPI wheel): exactness in fp32, pipelines, streamers, stop strings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModel, TextIteratorStreamer, pipeline

from hf_xpress import XPressDrafterModel
from hf_xpress.assets import apply_chat_template, load_prompts, load_target

SHIPPED = Path(__file__).resolve().parent.parent / "drafters"


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    return model, tokenizer


def _drafters(model):
    """Untrained drafters for every refiner, plus the shipped trained ones when present."""
    torch.manual_seed(0)
    found = {f"random-{r}": XPressDrafterModel.from_target(model, refiner=r, num_hidden_layers=2, mask_token_id=16)
             for r in (None, "markov", "xpress")}
    for folder in sorted(SHIPPED.glob("smollm2-135m-*")):
        if (folder / "config.json").exists():
            found[folder.name] = AutoModel.from_pretrained(folder, dtype=torch.float32)
    return found


def _chat_ids(tokenizer, records):
    return [torch.tensor([apply_chat_template(tokenizer, r.messages)]) for r in records]


def test_greedy_is_exactly_plain_generate_on_real_prompts(smollm2):
    model, tokenizer = smollm2
    prompts = _chat_ids(tokenizer, load_prompts("humaneval", limit=2) + load_prompts("mtbench", limit=2))
    prompts.append(torch.tensor([[tokenizer.bos_token_id or 1]]))  # a one-token prompt
    for name, drafter in _drafters(model).items():
        # untrained drafters accept almost nothing (one code path): a real prompt and the one-token prompt suffice
        for ids in prompts if not name.startswith("random-") else [prompts[0], prompts[-1]]:
            plain = model.generate(ids, max_new_tokens=24, do_sample=False)
            ours = model.generate(ids, assistant_model=drafter.eval(), max_new_tokens=24, do_sample=False)
            assert torch.equal(plain, ours), (name, tokenizer.decode(ids[0]))


def test_pipeline_streamer_and_stop_strings(smollm2):
    model, tokenizer = smollm2
    drafter = XPressDrafterModel.from_target(model, refiner="xpress", num_hidden_layers=2, mask_token_id=16).eval()
    chat = [{"role": "user", "content": "List three colours, one per line."}]
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, assistant_model=drafter)
    plain_pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    ours = pipe(chat, max_new_tokens=20, do_sample=False)
    plain = plain_pipe(chat, max_new_tokens=20, do_sample=False)
    assert ours == plain and drafter.stats.rounds > 0  # the pipeline really went through the drafter

    ids = torch.tensor([apply_chat_template(tokenizer, chat)])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False, streamer=streamer)
    assert "".join(streamer) == tokenizer.decode(out[0, ids.shape[1] :])

    plain = model.generate(ids, max_new_tokens=40, do_sample=False, stop_strings=["\n"], tokenizer=tokenizer)
    ours = model.generate(
        ids, assistant_model=drafter, max_new_tokens=40, do_sample=False, stop_strings=["\n"], tokenizer=tokenizer
    )
    assert torch.equal(plain, ours)
