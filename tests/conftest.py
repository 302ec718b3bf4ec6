"""Shared fixtures: tiny randomly initialised targets (Qwen3 and Llama) and drafters built for them."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM, StoppingCriteria

import hf_xpress  # noqa: F401  (registers the Auto classes and the generate() hook)
from hf_xpress import XPressDrafterModel
from hf_xpress.generation import XPressCandidateGenerator

torch.set_num_threads(1)  # tiny models: more threads only add overhead (and thrash under load)

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def tiny_target(kind: str = "qwen3", seed: int = 0, **overrides):
    """A tiny random target in fp32, eval mode. EOS is left unset unless given (random models rarely emit it)."""
    torch.manual_seed(seed)
    cfg = {**TINY, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **overrides}
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **cfg))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    else:
        raise ValueError(kind)
    return model.eval()


def tiny_drafter(target, refiner: str | None = "xpress", seed: int = 1, **overrides) -> XPressDrafterModel:
    """A drafter for `target` whose refiner weights are scaled up so the refiner really changes the drafts."""
    torch.manual_seed(seed)
    drafter = XPressDrafterModel.from_target(
        target, refiner=refiner, num_hidden_layers=2, mask_token_id=target.config.vocab_size - 1, **overrides
    ).eval()
    if refiner is not None:
        with torch.no_grad():
            for name, p in drafter.refiner.named_parameters():
                p.normal_(0.0, 0.08)  # bias of a few logits, like a trained refiner
    return drafter


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request):
    return tiny_target(request.param)


def assert_drafter_context_is(generator, target, tokens: torch.Tensor) -> None:
    """The candidate generator's drafter cache holds exactly the target features of `tokens[:, :n]` (n: its context
    length), as one drafter forward over them would: every verified token before the last anchor, in order."""
    from transformers.cache_utils import DynamicCache

    drafter, n = generator.assistant_model, generator.context_length
    out = target(tokens[:, :n], output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], dim=-1)
    fresh = DynamicCache()
    drafter(torch.zeros(1, drafter.config.block_size, target.config.hidden_size), feats, cache=fresh)
    fresh.crop(-drafter.config.block_size)
    for mine, theirs in zip(generator.cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)


class FiresOnce(StoppingCriteria):
    """A user's criterion that keeps state: fires the first time the last token is `token`, never again."""

    def __init__(self, token: int):
        self.token, self.fired = token, False

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        hit = not self.fired and int(input_ids[0, -1]) == self.token
        self.fired = self.fired or hit
        return torch.tensor([hit])


def plain_fired_once(target, ids: torch.LongTensor, new: list[int], token: int) -> torch.LongTensor:
    """Plain greedy `generate` (60 new tokens at most) with `FiresOnce(token)`: it stops at the first `token` of the
    continuation `new` (checked), where a speculative run with its own `FiresOnce(token)` must stop too."""
    from transformers import StoppingCriteriaList

    plain = target.generate(ids, max_new_tokens=60, do_sample=False, stopping_criteria=StoppingCriteriaList([FiresOnce(token)]))
    assert plain.shape[1] == ids.shape[1] + new.index(token) + 1
    return plain


class RecordingStreamer:
    """A streamer that keeps what it is given: `puts` (each a list of ids) and whether `end()` came."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.fixture
def oracle(monkeypatch):
    """Replace the first `good` drafts of each round by the target's true continuation (random `good`), so that
    rounds accept many tokens. Records the generator instance for inspection."""
    state = {"continuation": None, "generators": []}
    original = XPressCandidateGenerator.get_candidates
    rng = random.Random(0)

    def get_candidates(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        state["generators"].append(self)
        if ids.shape[1] == input_ids.shape[1]:  # no drafts this round (logits are None under greedy anyway)
            return ids, logits
        state["last_draft_len"] = input_ids.shape[1]
        start, n = input_ids.shape[1], ids.shape[1] - input_ids.shape[1]
        truth = state["continuation"][start : start + n]
        good = min(rng.randint(0, n), len(truth))
        ids = ids.clone()
        ids[0, start : start + good] = truth[:good]
        if good < n:
            ids[0, start + good] = (ids[0, start + good] + 1) % 126 if good >= len(truth) else (truth[good] + 1) % 126
        return ids, logits

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", get_candidates)
    return state
