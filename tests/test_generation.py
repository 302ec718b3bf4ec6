"""`target.generate(..., assistant_model=drafter)`: losslessness against plain `generate`, acceptance bookkeeping,
the native DFlash path, other assistants untouched, streamers, sampling that keeps the target's distribution."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import (GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList)
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.streamers import BaseStreamer

import hf_xpress
from hf_xpress import XPressDrafterModel, generation
from hf_xpress.generation import XPressCandidateGenerator, check_generation_options
from hf_xpress.modeling_xpress import DraftProposal, _full_vocabulary

from conftest import FiresOnce, assert_drafter_context_is, plain_fired_once, tiny_drafter, tiny_target

REFINERS = [None, "markov", "xpress"]


def _prompts(n: int, seed: int = 0) -> list[torch.Tensor]:
    """Prompt lengths 1, 2, 3, ..., and one long prompt."""
    rng = random.Random(seed)
    lengths = [1, 2, 3, 7, 16, 31, 200][:n] + [rng.randint(4, 60) for _ in range(max(0, n - 7))]
    return [torch.randint(0, 126, (1, n_)) for n_ in lengths]


@pytest.mark.parametrize("refiner", REFINERS)
@pytest.mark.parametrize("max_new_tokens", [1, 5, 40])
def test_greedy_equals_plain_generate(target, refiner, max_new_tokens):
    drafter = tiny_drafter(target, refiner)
    torch.manual_seed(0)
    for ids in _prompts(9):
        plain = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        ours = target.generate(ids, assistant_model=drafter, max_new_tokens=max_new_tokens, do_sample=False)
        assert torch.equal(plain, ours), (refiner, ids.shape)
    assert drafter.stats.rounds > 0 or max_new_tokens == 1  # drafting rounds ran (one new token needs none)


def test_a_padded_prompt_stays_exact_and_is_named_in_a_warning(target):
    """The drafter places and attends to every position, padding included: still exact, but it drafts worse, so the
    generator says so once (it cannot know the padding from the tokens)."""
    from transformers.testing_utils import CaptureLogger

    drafter = tiny_drafter(target, "xpress")
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.randint(1, 126, (1, 9))], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], dim=1)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    generation.logger.warning_once.cache_clear()
    with CaptureLogger(generation.logger) as captured:
        ours = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    assert torch.equal(plain, ours)
    assert "the prompt is padded (its attention_mask has zeros)" in captured.out
    with CaptureLogger(generation.logger) as captured:
        target.generate(ids[:, 3:], assistant_model=drafter, max_new_tokens=5, do_sample=False)
    assert captured.out == ""


def test_sliding_window_and_causal_drafter_layers_are_lossless(target):
    """Converted z-lab drafters can have sliding-window, block-causal layers; drafting with them stays exact."""
    layout = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6, "causal_layers": [0]}
    drafter = tiny_drafter(target, "xpress", **layout)
    for ids in _prompts(8):
        plain = target.generate(ids, max_new_tokens=24, do_sample=False)
        ours = target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert torch.equal(plain, ours), ids.shape
    # transformers' own DFlash loop (its cache keeps only the window in sliding layers) runs it too
    drafter.refiner, drafter.config.refiner = None, None
    for ids in _prompts(4):
        plain = target.generate(ids, max_new_tokens=24, do_sample=False)
        assert drafter.stats is not None and drafter.stats.rounds > 0  # the xPress call before
        native = target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False, speculation_type="dflash")
        assert torch.equal(plain, native), ids.shape
        assert drafter.stats is None  # transformers' path records none: it held the previous call's
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)


def _repetitive_prompts(n: int) -> list[torch.Tensor]:
    """Prompts that repeat a phrase, so that prompt lookup finds continuations."""
    torch.manual_seed(1)
    prompts = []
    for i in range(n):
        phrase = torch.randint(0, 126, (1, 3 + i))
        prompts.append(torch.cat([phrase, torch.randint(0, 126, (1, 2)), phrase, phrase[:, :2]], dim=1))
    return prompts


@pytest.mark.parametrize("refiner", REFINERS)
def test_prompt_lookup_rounds_mix_with_drafter_rounds_and_stay_lossless(target, refiner):
    """`generate(..., assistant_model=drafter, prompt_lookup_num_tokens=n)`: rounds drafted by transformers' prompt
    lookup where it finds a continuation, by the drafter elsewhere; the output is plain greedy `generate`'s."""
    drafter = tiny_drafter(target, refiner)
    kinds = set()
    for ids in _repetitive_prompts(5) + _prompts(3):
        for max_new_tokens in (3, 40):
            plain = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
            ours = target.generate(ids, assistant_model=drafter, prompt_lookup_num_tokens=4,
                                   max_new_tokens=max_new_tokens, do_sample=False)
            assert torch.equal(plain, ours), (refiner, ids.shape, max_new_tokens)
            stats = drafter.stats
            assert len(stats.lookup) == stats.rounds
            assert all(n <= 4 for n, looked in zip(stats.proposed, stats.lookup) if looked)
            assert all(p == 0 for p, looked in zip(stats.passes, stats.lookup) if looked)
            kinds |= set(stats.lookup)
    assert kinds == {True, False}
    with pytest.raises(ValueError, match="cannot be combined with prompt_lookup_num_tokens"):
        target.generate(ids, assistant_model=drafter, prompt_lookup_num_tokens=4, assistant_ensemble_weight=0.5,
                        max_new_tokens=5, do_sample=False)
    with pytest.raises(ValueError, match="assistant_ensemble_weight with do_sample=True cannot be combined with stop"):
        target.generate(ids, assistant_model=drafter, assistant_ensemble_weight=0.5, max_new_tokens=5, do_sample=True,
                        stopping_criteria=StoppingCriteriaList([_LastTokenIs(0)]))


class _BanEvenAtOddLengths(LogitsProcessor):
    """Bans every even token id where the sequence so far has an odd length."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] % 2:
            scores = scores.clone()
            scores[:, ::2] = -float("inf")
        return scores


def test_sampling_ends_drafts_before_a_slot_that_allows_no_draft_token(target):
    """A drafter restricted to a draft vocabulary (even ids) under a processor that bans all of it at some slots (odd
    lengths) has no q to sample those slots from (all -inf): drafts end before such a slot (the cut depends on the
    slot's logits, not on its token, so sampling stays exact) instead of transformers' sampler failing on NaN
    probabilities. The slots in between are drafted and accepted."""
    drafter = tiny_drafter(target, "xpress")
    drafter.set_draft_vocab(torch.arange(0, 128, 2))
    ids = torch.randint(0, 126, (1, 8), generator=torch.Generator().manual_seed(0))
    processors = LogitsProcessorList([_BanEvenAtOddLengths()])
    torch.manual_seed(0)
    proposed = []
    for _ in range(3):
        out = target.generate(ids, assistant_model=drafter, do_sample=True, max_new_tokens=20,
                              logits_processor=processors)
        new = out[0, ids.shape[1]:].tolist()
        assert all(token % 2 for i, token in enumerate(new) if (ids.shape[1] + i) % 2), new
        proposed += drafter.stats.proposed
    assert proposed and set(proposed) == {1}  # one samplable slot per round: the cut fell before the second


def test_a_hybrid_target_keeps_the_recurrent_states_a_long_lookup_round_needs():
    """A linear-attention target's cache records recurrent states to roll rejected drafts back, as many as the
    generator says a round drafts; a prompt lookup round may submit more than a drafter block (here up to 30 against
    7), so the generator reports the larger count (with the block's, transformers' crop failed with an IndexError)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    target = Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"] * 2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )).eval()
    drafter = tiny_drafter(target, "xpress", block_size=8)
    phrase = torch.randint(0, 126, (1, 40), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([phrase, torch.tensor([[7, 7]]), phrase[:, :3]], dim=1)  # lookup continues the phrase
    plain = target.generate(ids, max_new_tokens=30, do_sample=False)
    ours = target.generate(ids, max_new_tokens=30, do_sample=False, assistant_model=drafter,
                           prompt_lookup_num_tokens=30)
    assert torch.equal(ours, plain)
    assert max(n for n, looked in zip(drafter.stats.proposed, drafter.stats.lookup) if looked) > 7


def test_prompt_lookup_first_with_logits_processors_stays_lossless(target):
    """Greedy with processors that look at the prefix: lookup drops the continuations they forbid (transformers'
    check), the drafter rounds apply them per slot; the output is plain `generate`'s."""
    drafter = tiny_drafter(target, "xpress")
    processing = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, do_sample=False)
    kinds = set()
    for ids in _repetitive_prompts(4):
        plain = target.generate(ids, max_new_tokens=30, **processing)
        ours = target.generate(ids, assistant_model=drafter, prompt_lookup_num_tokens=4, max_new_tokens=30, **processing)
        assert torch.equal(plain, ours), ids.shape
        kinds |= set(drafter.stats.lookup)
    assert kinds == {True, False}


def test_after_prompt_lookup_rounds_the_drafter_sees_every_verified_token(target, monkeypatch):
    """Lookup rounds run no drafter forward. The next drafter round adds all the tokens they verified: its block
    output equals a fresh drafter forward over the whole context's target features."""
    from transformers.cache_utils import DFlashCache

    drafter = tiny_drafter(target, "xpress")
    cfg = drafter.config
    seen = []
    original = XPressCandidateGenerator._draft_forward

    def spy(self, input_ids):
        hidden = original(self, input_ids)
        seen.append((input_ids.clone(), self.context_length, hidden.clone()))
        return hidden

    monkeypatch.setattr(XPressCandidateGenerator, "_draft_forward", spy)
    checked = 0
    for ids in _repetitive_prompts(4):
        target.generate(ids, assistant_model=drafter, prompt_lookup_num_tokens=4, max_new_tokens=40, do_sample=False)
        lookup, rounds = drafter.stats.lookup, iter(seen)
        for i, looked in enumerate(lookup):
            if looked:
                continue
            sequence, context_length, hidden = next(rounds)
            if i == 0 or not lookup[i - 1]:
                continue
            n = sequence.shape[1] - 1  # every verified token before the anchor
            assert context_length == n
            with torch.no_grad():
                out = target(sequence[:, :-1], output_hidden_states=True)
                features = torch.cat([out.hidden_states[j + 1] for j in cfg.target_layer_ids], dim=-1)
                block = torch.cat([sequence[:, -1:], torch.full((1, cfg.block_size - 1), cfg.mask_token_id)], dim=1)
                reference = drafter(noise_embeds=target.get_input_embeddings()(block), context_hidden_states=features,
                                    position_ids=torch.arange(n + cfg.block_size)[None], cache=DFlashCache())
            torch.testing.assert_close(hidden, reference.last_hidden_state, atol=1e-4, rtol=1e-4)
            checked += 1
        seen.clear()
    assert checked >= 2, checked


@pytest.mark.parametrize("refiner", REFINERS)
def test_multi_token_acceptance_eos_inside_a_block_and_context_bookkeeping(target, refiner, oracle):
    drafter = tiny_drafter(target, refiner)
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=80, do_sample=False)
    oracle["continuation"] = long_run[0]
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=80, do_sample=False)
    assert torch.equal(ours, long_run)
    stats = drafter.stats
    assert max(stats.accepted) >= 5 and stats.tau > 2  # many drafts really were accepted
    # every new token is an accepted draft or a round's bonus, except the prefill's token and a final plain step
    # (taken when only one token of budget is left)
    assert ours.shape[1] - ids.shape[1] - (sum(stats.accepted) + stats.rounds) in (1, 2)
    assert len(stats.slot_acceptance()) == 15 and stats.slot_acceptance()[0] >= stats.slot_acceptance()[-1]

    # the drafter's cache holds exactly the verified tokens' features, as one forward over them would
    generator = oracle["generators"][-1]
    n = generator.context_length
    assert n == oracle["last_draft_len"] - 1  # every verified token before the last anchor drafted from
    assert_drafter_context_is(generator, target, ours)

    # EOS inside an accepted block: the output stops exactly where plain generate stops
    eos = int(long_run[0, ids.shape[1] + 23])
    plain = target.generate(ids, max_new_tokens=80, do_sample=False, eos_token_id=eos)
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=80, do_sample=False, eos_token_id=eos)
    assert torch.equal(ours, plain) and plain.shape[1] < long_run.shape[1]


class _LastTokenIs(StoppingCriteria):
    """A user's criterion: stop once the last token is `token`."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return input_ids[:, -1] == self.token


def _plant_continuation(monkeypatch, continuation: torch.Tensor) -> list:
    """Make a random drafter's first drafts of each round (a random number of them) the target's `continuation`
    (`[n]`, prompt included), before the generator decides what to submit, so rounds accept many drafts. Returns the
    list of (generator, input length) of each `get_candidates` call."""
    calls = []
    get_candidates, propose, rng = XPressCandidateGenerator.get_candidates, XPressDrafterModel.propose, random.Random(0)

    def remember(self, input_ids, *args, **kwargs):
        calls.append((self, input_ids.shape[1]))
        return get_candidates(self, input_ids, *args, **kwargs)

    def truthful(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        start = calls[-1][1]
        truth = continuation[start : start + proposal.tokens.shape[1]]
        good = rng.randint(0, len(truth))
        proposal.tokens = proposal.tokens.clone()
        proposal.tokens[0, :good] = truth[:good]
        return proposal

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", remember)
    monkeypatch.setattr(XPressDrafterModel, "propose", truthful)
    return calls


def test_custom_stopping_criteria_stop_where_plain_generate_stops(target, monkeypatch):
    """transformers checks a user's `stopping_criteria` only at the end of a round: drafts end before a token at which
    one fires, so the output stops where plain generate stops, also when the rounds accept many drafts. The same runs
    without that cut run on past the stop. Under sampling such criteria make the generator hand transformers no
    logits (the target is sampled and drafts matched, as with stop strings); with none, nothing is checked per
    draft."""
    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)[0]
    new = long_run[ids.shape[1]:].tolist()
    generators = _plant_continuation(monkeypatch, long_run)

    def run(token: int, **kwargs) -> torch.Tensor:
        criteria = StoppingCriteriaList([_LastTokenIs(token)])
        return target.generate(ids, max_new_tokens=60, do_sample=False, stopping_criteria=criteria, **kwargs)

    tokens = [new[i] for i in (6, 13, 22, 35, 47)]
    outputs = {}
    for token in tokens:
        plain, outputs[token] = run(token), run(token, assistant_model=drafter)
        assert torch.equal(outputs[token], plain), token
        assert plain.shape[1] == ids.shape[1] + new.index(token) + 1
    assert max(drafter.stats.accepted) >= 5  # rounds accept many drafts

    draft_criteria = generators[-1][0].stop
    assert len(draft_criteria) == 1 and isinstance(draft_criteria[0], _LastTokenIs)  # max length is left out
    target.generate(ids, assistant_model=drafter, max_new_tokens=5, do_sample=False)
    assert generators[-1][0].stop is None
    target.generate(ids, assistant_model=drafter, max_new_tokens=5, do_sample=True,
                    stopping_criteria=StoppingCriteriaList([_LastTokenIs(tokens[0])]))
    assert generators[-1][0].stop is not None and not generators[-1][0].needs_logits

    monkeypatch.setattr(generation, "draft_stopping_criteria", lambda *args, **kwargs: None)  # the cut undone
    ran_on = sum(run(token, assistant_model=drafter).shape[1] > outputs[token].shape[1] for token in tokens)
    assert ran_on >= 2, ran_on


class _NoDeepCopy(torch.nn.Module):
    """What a criterion may hold besides its state (a tokenizer, a model): shared by the draft copies, never deep-copied
    (a deep copy of a tokenizer every round made generation 14x slower)."""

    def __deepcopy__(self, memo):
        raise TypeError("not to be deep-copied")


class _FiresOnceInADict(FiresOnce):
    """`FiresOnce` with its state in a dict (a shallow copy alone shares it), holding heavy objects beside it."""

    def __init__(self, token: int):
        self.token, self.state, self.model, self.tables = token, {"fired": False}, _NoDeepCopy(), [_NoDeepCopy()]

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        hit = not self.state["fired"] and int(input_ids[0, -1]) == self.token
        self.state["fired"] = self.state["fired"] or hit
        return torch.tensor([hit])


class _FiresOnceInATensor(FiresOnce):
    """`FiresOnce` with its state in a tensor updated in place."""

    def __init__(self, token: int):
        self.token, self.fired = token, torch.zeros(1, dtype=torch.bool)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        hit = ~self.fired & (input_ids[:, -1] == self.token)
        self.fired |= hit
        return hit


@pytest.mark.parametrize("criterion", [FiresOnce, _FiresOnceInADict, _FiresOnceInATensor])
def test_drafts_the_target_rejects_do_not_advance_a_users_stateful_criterion(target, monkeypatch, criterion):
    """Drafts are checked against a user's criteria before the target scores them. A criterion that keeps state (here:
    fires once) was advanced by those checks, so when the target then produced the token it no longer fired and
    generation ran on past where plain generate stops. Drafts are now checked on a copy of it: a shallow one whose
    containers and small tensors are copied too (a shallow copy alone shared a state kept in a dict, and generation
    ran on), with everything else it holds shared."""
    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)[0]
    new = long_run[ids.shape[1]:].tolist()
    _plant_continuation(monkeypatch, long_run)
    checked = 0
    for i in (6, 13, 22, 35, 47):
        token = new[i]
        plain = plain_fired_once(target, ids, new, token)
        ours = target.generate(ids, assistant_model=drafter, max_new_tokens=60, do_sample=False,
                               stopping_criteria=StoppingCriteriaList([criterion(token)]))
        assert torch.equal(ours, plain), token
        checked += 1
    assert checked == 5 and max(drafter.stats.accepted) >= 5


def test_draft_settings_given_to_generate_are_named_as_ignored(target, caplog):
    """transformers reads num_assistant_tokens / its schedule / the confidence threshold from a classic assistant's
    generation_config; an xPress drafter reads its own config. Given to generate() they changed nothing, silently."""
    from transformers.utils import logging as hf_logging

    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 6))
    hf_logging.warning_once.cache_clear()  # a warning given once per process: also under the other target
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
            # a bare GenerationConfig leaves them None (not set): not "given" either (it was warned about)
            check_generation_options(target, GenerationConfig(max_length=64, do_sample=False))
        assert "does not read" not in caplog.text
        with caplog.at_level("WARNING"):
            target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False, num_assistant_tokens=3,
                            assistant_confidence_threshold=0.9)
    finally:
        hf_logging.disable_propagation()
    assert "num_assistant_tokens=3, assistant_confidence_threshold=0.9, which an xPress drafter does not read" in caplog.text
    assert "drafter.config.num_assistant_tokens" in caplog.text


def test_inference_settings_changed_after_loading_are_checked_at_generate(target):
    """`drafter.config.<setting> = value` is how settings change after loading; a value validation would refuse
    (0 drafts per round was run as 1, negative passes as none), or a tree setting nothing reads there, is refused by
    name when generate starts."""
    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 6))
    for name, value in (("num_assistant_tokens", 0), ("jacobi_passes", -1), ("assistant_confidence_threshold", 2.0)):
        saved = getattr(drafter.config, name)
        setattr(drafter.config, name, value)
        with pytest.raises(ValueError, match=f"XPressDrafterConfig: {name}"):
            target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
        setattr(drafter.config, name, saved)
    drafter.config.tree_width = 3  # ran chains, silently: trees are asked for per call
    with pytest.raises(ValueError, match="config sets tree_width, which no drafter reads from its config"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    del drafter.config.tree_width
    target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    # shape fields are fixed when a drafter is built: another refiner was ignored (the built one ran), a larger block
    # crashed inside the xPress mixer (a smaller one works)
    drafter.config.refiner = "markov"
    with pytest.raises(ValueError, match="config.refiner is 'markov', but it was built with 'xpress'"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    drafter.config.refiner = "xpress"
    B = drafter.config.block_size
    drafter.config.block_size = B + 1
    with pytest.raises(ValueError, match=f"block_size is {B + 1}, but its xPress refiner's mixer was built for blocks "
                                         f"of {B}"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    drafter.config.block_size = B - 1
    assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False),
                       target.generate(ids, max_new_tokens=12, do_sample=False))
    drafter.config.block_size = B
    for kind in ("markov", None):  # no block-sized weights: any block
        other = tiny_drafter(target, kind)
        other.config.block_size = B + 3
        assert torch.equal(target.generate(ids, assistant_model=other, max_new_tokens=12, do_sample=False),
                           target.generate(ids, max_new_tokens=12, do_sample=False))
        other.config.refiner = "xpress"
        with pytest.raises(ValueError, match=f"config.refiner is 'xpress', but it was built with {kind!r}"):
            target.generate(ids, assistant_model=other, max_new_tokens=4, do_sample=False)


def test_a_drafters_generation_config_names_where_its_settings_are(target):
    """transformers' assistants are tuned through `assistant.generation_config`. A drafter has none: reading it named
    `import hf_xpress` as missing although it was imported, and one assigned was kept and ignored (15 drafts per
    round under num_assistant_tokens=3). Both now name the config fields."""
    drafter = tiny_drafter(target, "xpress")
    with pytest.raises(AttributeError, match=r"no generation_config: a drafter's settings are fields of its config, "
                                             r"e.g. drafter.config.num_assistant_tokens = 4"):
        drafter.generation_config
    assert not hasattr(drafter, "generation_config")
    with pytest.raises(AttributeError, match=r"no generation_config: .*jacobi_passes"):
        drafter.generation_config = GenerationConfig(num_assistant_tokens=3)
    drafter.generation_config = None  # nothing to ignore
    assert not hasattr(drafter, "generation_config")


def test_a_criterion_that_needs_the_targets_scores_is_named(target):
    """Drafts are checked against stopping criteria before the target scores them (scores=None). A user's criterion
    that reads the scores failed inside itself, with no hint why; it is now a clear error naming it."""

    class ScoreCapped(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            last = scores[-1] if isinstance(scores, tuple) else scores  # plain generate: the scores so far
            return last.max(-1).values > 100.0  # AttributeError on None

    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 9))
    target.generate(ids, max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True,
                    stopping_criteria=StoppingCriteriaList([ScoreCapped()]))  # plain generate passes it scores

    class PlainBool(StoppingCriteria):  # a criterion returning a Python bool, as StoppingCriteriaList allows
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids.shape[1] >= 12

    plain = target.generate(ids, max_new_tokens=8, do_sample=False, stopping_criteria=StoppingCriteriaList([PlainBool()]))
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=8, do_sample=False,
                           stopping_criteria=StoppingCriteriaList([PlainBool()]))
    assert torch.equal(ours, plain) and plain.shape[1] == 12
    with pytest.raises(ValueError, match=r"ScoreCapped failed on a draft token \(AttributeError: .*scores=None: it "
                                         r"must depend on the tokens only"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False, output_scores=True,
                        return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([ScoreCapped()]))


def test_a_users_eos_and_max_length_criteria_stop_where_plain_generate_stops(target, monkeypatch):
    """transformers ends a round at the generation config's EOS ids and max length only. A user's `EosTokenCriteria`
    for other ids, or a `MaxLengthCriteria` below max_length, are checked per draft like any criterion (plain
    generate stops there); one beyond max_length, which assisted decoding cannot reach, is a clear error."""
    from transformers import EosTokenCriteria, MaxLengthCriteria

    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)[0]
    new = long_run[ids.shape[1]:].tolist()
    _plant_continuation(monkeypatch, long_run)
    eos = max(set(new), key=new.index)  # the token first generated last
    assert new.index(eos) >= 5
    for criterion in (EosTokenCriteria(eos_token_id=eos), MaxLengthCriteria(max_length=ids.shape[1] + 30)):
        kwargs = dict(max_new_tokens=60, do_sample=False, pad_token_id=0,
                      stopping_criteria=StoppingCriteriaList([criterion]))
        plain = target.generate(ids, **kwargs)
        assert plain.shape[1] < long_run.shape[0], criterion  # the criterion stopped plain generate early
        assert torch.equal(target.generate(ids, assistant_model=drafter, **kwargs), plain), criterion
    assert max(drafter.stats.accepted) >= 5
    too_long = StoppingCriteriaList([MaxLengthCriteria(max_length=ids.shape[1] + 20)])
    with pytest.raises(ValueError, match=r"MaxLengthCriteria\(max_length=29\), beyond generate's max_length \(19\)"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=10, do_sample=False, stopping_criteria=too_long)


@pytest.mark.parametrize("refiner", REFINERS)
@pytest.mark.parametrize(
    "settings",
    [dict(num_assistant_tokens=1), dict(num_assistant_tokens=4), dict(assistant_confidence_threshold=0.05),
     dict(num_assistant_tokens=3, num_assistant_tokens_schedule="heuristic_transient"),
     dict(num_assistant_tokens=6, num_assistant_tokens_schedule="cost")],
)
def test_fewer_drafts_per_round_stay_lossless_and_respect_the_settings(target, refiner, settings):
    drafter = tiny_drafter(target, refiner, **settings)
    for ids in _prompts(7):
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        ours = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False)
        assert torch.equal(plain, ours), (settings, ids.shape)
        proposed = drafter.stats.proposed
        if settings.get("num_assistant_tokens_schedule") in (None, "cost"):  # "cost" keeps under its cap
            assert max(proposed) <= settings.get("num_assistant_tokens", 15)
        assert all(len(d) == n for d, n in zip(drafter.stats.drafts, proposed))
    if "assistant_confidence_threshold" in settings:
        assert min(drafter.stats.proposed) < 15  # the threshold really cut rounds short


@pytest.mark.parametrize("refiner", REFINERS)
def test_a_bf16_drafter_serves_an_fp32_target(target, refiner):
    """Shipped drafters are bf16 safetensors; loaded as saved, they draft for a float32 target (still exact)."""
    drafter = tiny_drafter(target, refiner).to(torch.bfloat16)
    for ids in _prompts(3):
        plain = target.generate(ids, max_new_tokens=20, do_sample=False)
        assert torch.equal(plain, target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False))


@pytest.mark.parametrize("refiner", REFINERS)
@pytest.mark.parametrize("shortlist", [None, 8])
def test_a_draft_vocabulary_stays_lossless_and_drafts_only_its_tokens(target, refiner, shortlist):
    drafter = tiny_drafter(target, refiner, refiner_shortlist=shortlist)
    vocab = torch.arange(0, 128, 3)  # a third of the vocabulary
    drafter.set_draft_vocab(vocab)
    hidden = torch.randn(1, 4, 64)
    logits = drafter.draft_logits(hidden, target.lm_head)
    torch.testing.assert_close(logits[..., vocab], target.lm_head(hidden)[..., vocab])
    assert torch.isinf(logits).sum() == 4 * (128 - len(vocab))
    for ids in _prompts(7):
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        assert torch.equal(plain, target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False))
        drafts = [t for d in drafter.stats.drafts for t in d]
        assert drafts and all(t % 3 == 0 for t in drafts), drafts


@pytest.mark.parametrize("draft_vocab", [None, torch.arange(0, 128, 3)])
def test_draft_logits_of_a_block_slice_read_the_head_as_one_matmul(target, draft_vocab):
    """The candidate generator passes `hidden[:, 1:1+n]`, a slice with a batch stride that keeps `linear` from
    folding it: torch then expands the head's weight into a batched matmul and copies all of it every round
    (on a CPU 10-20x the product itself). `draft_logits` must read the head with a plain 2-D matmul."""
    from torch.profiler import ProfilerActivity, profile

    drafter = tiny_drafter(target, "xpress")
    drafter.set_draft_vocab(draft_vocab)
    block = torch.randn(1, 16, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logits = drafter.draft_logits(block[:, 1:3], target.lm_head)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::bmm" not in ops, sorted(ops)
    assert logits.shape == (1, 2, 128)
    reference = target.lm_head(block[:, 1:3].contiguous().view(2, 64)).view(1, 2, 128)
    kept = slice(None) if draft_vocab is None else draft_vocab
    torch.testing.assert_close(logits[..., kept], reference[..., kept])


def test_draft_vocabulary_is_saved_checked_and_removable(target, tmp_path):
    from transformers import AutoModel

    drafter = tiny_drafter(target, "xpress")
    with pytest.raises(ValueError, match="within \\[0, vocab_size = 128\\)"):
        drafter.set_draft_vocab([3, 128])
    with pytest.raises(ValueError, match="1 token ids are repeated"):
        drafter.set_draft_vocab([3, 5, 3])
    drafter.set_draft_vocab([9, 2, 40])
    drafter.save_pretrained(tmp_path / "d")
    loaded = AutoModel.from_pretrained(tmp_path / "d", dtype=torch.bfloat16)
    assert loaded.config.draft_vocab_size == 3 and loaded.draft_vocab.tolist() == [2, 9, 40]
    loaded.set_draft_vocab(None)
    assert loaded.config.draft_vocab_size is None and "draft_vocab" not in loaded.state_dict()
    unset = tiny_drafter(target, "xpress", draft_vocab_size=5)  # a size in the config, but no ids
    with pytest.raises(ValueError, match="sets draft_vocab_size=5 but its checkpoint has no `draft_vocab` ids"):
        target.generate(torch.tensor([[1, 2, 3]]), assistant_model=unset, max_new_tokens=5, do_sample=False)
    with pytest.raises(ValueError, match="draft_vocab_size must be None or in \\[1, vocab_size = 128\\]"):
        tiny_drafter(target, "xpress", draft_vocab_size=129)


@pytest.mark.parametrize("refiner", REFINERS)
def test_confidence_threshold_ends_each_round_at_its_first_unconfident_draft(target, refiner, monkeypatch):
    """End to end: every round submits its drafts up to and including the first whose probability is below the
    threshold (the cap and the room left permitting), and the output stays plain generate's."""
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=6)
    probabilities = []  # per round, of each drafted token
    propose = XPressDrafterModel.propose

    def spy(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        probabilities.append(proposal.token_log_probs()[0].exp().tolist())
        return proposal

    monkeypatch.setattr(XPressDrafterModel, "propose", spy)
    ids = _prompts(5)[4]
    target.generate(ids, assistant_model=drafter, max_new_tokens=60, do_sample=False)
    threshold = sorted(p for row in probabilities for p in row)[len(probabilities) * 3]  # cuts some rounds, not all
    drafter.config.assistant_confidence_threshold = threshold
    probabilities.clear()
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=60, do_sample=False)
    assert torch.equal(ours, target.generate(ids, max_new_tokens=60, do_sample=False))
    expected = [next((k + 1 for k, p in enumerate(row) if p < threshold), len(row)) for row in probabilities]
    assert drafter.stats.proposed == expected
    assert len(set(expected)) >= 3 and min(expected) == 1  # rounds cut at different slots


def test_confidence_threshold_cuts_after_the_first_unconfident_draft(target):
    drafter = tiny_drafter(target, "xpress", assistant_confidence_threshold=0.3)
    generator = XPressCandidateGenerator(target, drafter, target.generation_config)
    tokens = torch.tensor([[3, 4, 5, 6]])
    logits = torch.full((1, 4, 8), -30.0)
    for slot, p in enumerate([0.9, 0.5, 0.2, 0.9]):  # probability of each slot's drafted token
        logits[0, slot, tokens[0, slot]] = 0.0
        logits[0, slot, 0] = torch.log(torch.tensor((1 - p) / p))  # the rest of the mass on token 0
    full = DraftProposal(tokens, logits, 0)
    assert generator._confident_prefix(full.token_log_probs()) == 3  # slot 3 (p 0.2) is the last one submitted
    generator.confidence_threshold = 0.1
    assert generator._confident_prefix(full.token_log_probs()) == 4
    # a shortlisted proposal (scores of 3 candidates per slot) gives the log-probabilities of its full logits
    candidates = torch.stack([torch.tensor([0, t, 7]) for t in tokens[0].tolist()])[None]
    shortlist = DraftProposal(tokens, logits.gather(-1, candidates), 0, candidates, 8)
    expected = torch.full_like(logits, float("-inf")).scatter(-1, candidates, logits.gather(-1, candidates))
    torch.testing.assert_close(shortlist.token_log_probs(), DraftProposal(tokens, expected, 0).token_log_probs())
    torch.testing.assert_close(shortlist.logits, expected)
    assert shortlist.candidates is None  # built once, then kept


@pytest.mark.parametrize("shortlist", [None, 4])
def test_candidate_logits_go_to_transformers_only_when_verification_reads_them(target, shortlist, monkeypatch):
    """Greedy verification compares tokens: no [1, S, V] logits are built (a shortlist's full logits are never
    spread out); sampling gets q, -inf outside the shortlist."""
    drafter = tiny_drafter(target, "xpress", refiner_shortlist=shortlist)
    seen = []
    original = XPressCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        if ids.shape[1] > input_ids.shape[1]:
            seen.append((ids.shape[1] - input_ids.shape[1], logits))
        return ids, logits

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", spy)
    ids = torch.randint(0, 126, (1, 9))
    target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    assert seen and all(logits is None for _, logits in seen)
    seen.clear()
    target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=True, top_k=0)  # no processors
    assert seen and all(logits.shape == (1, n, 128) for n, logits in seen)
    if shortlist:
        assert all(int(torch.isfinite(logits).sum(-1).max()) <= shortlist for _, logits in seen)


@pytest.mark.parametrize("schedule", ["heuristic", "heuristic_transient"])
def test_heuristic_schedule_follows_transformers_rule(target, schedule, oracle):
    """All drafts accepted: the cap grows by 2; otherwise it shrinks by 1 (never below 1). "heuristic" keeps the cap
    in the drafter's config for the next call, "heuristic_transient" does not."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=4, num_assistant_tokens_schedule=schedule)
    ids = torch.randint(0, 126, (1, 9))
    oracle["continuation"] = target.generate(ids, max_new_tokens=60, do_sample=False)[0]
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=60, do_sample=False)
    assert torch.equal(ours, oracle["continuation"][None])
    stats, cap = drafter.stats, 4
    for round_, (proposed, accepted) in enumerate(zip(stats.proposed, stats.accepted)):
        assert proposed == cap or round_ == stats.rounds - 1  # the last round may be cut by max_new_tokens
        cap = max(1, min(cap + 2 if accepted == proposed else cap - 1, 15))
    assert (drafter.config.num_assistant_tokens == cap) == (schedule == "heuristic")
    assert len(set(stats.proposed)) > 1  # the cap really moved


def _simulate_rounds(planner, rates, a, b, plain, rounds=300, seed=0) -> list[int]:
    """Drive a `DraftCountPlanner` with a simulated host: a drafter round of n drafts takes a + b n seconds and accepts
    slot k with probability rates[k-1] given slots < k accepted; a plain step takes `plain`. Returns the counts."""
    rng, now, counts = random.Random(seed), 0.0, []
    for _ in range(rounds):
        planner.round_started(now)
        n = planner.next_count()
        counts.append(n)
        planner.submitted(n, now)
        if n == 0:
            now += plain
            continue
        accepted = 0
        while accepted < n and rng.random() < rates[accepted]:
            accepted += 1
        planner.record_acceptance(n, accepted)
        now += a + b * n
    return counts


def _tokens_per_second(n: int, rates, a: float, b: float, plain: float) -> float:
    """The true expected tokens per second of a round of n drafts on the simulated host."""
    if n == 0:
        return 1.0 / plain
    expected, reach = 1.0, 1.0
    for p in rates[:n]:
        reach *= p
        expected += reach
    return expected / (a + b * n)


@pytest.mark.parametrize(
    "host, rates, a, b, plain, best",
    [("cpu", [0.45] * 15, 0.040, 0.002, 0.038, 3),  # every verified token costs: a few drafts
     ("cpu, refiner-shaped", [0.45, 0.55, 0.6] + [0.2] * 12, 0.040, 0.002, 0.038, 3),
     ("gpu", [0.8] * 15, 0.020, 0.00002, 0.019, 15),  # verifying more is nearly free: every slot
     ("weak drafter", [0.05] * 15, 0.060, 0.004, 0.040, 0)],  # drafting never pays: plain steps
)
def test_cost_schedule_finds_the_fastest_draft_count_for_the_host(host, rates, a, b, plain, best):
    """The "cost" planner, after trying `most`, 1, 0 and `most`, submits counts whose true throughput on the simulated
    host is within 5% of the best count's (`best`, which the parameters are chosen to make clear), and while plain
    steps win it still drafts every `probe`-th round (so it notices when the text gets easier)."""
    planner = generation.DraftCountPlanner(15)
    counts = _simulate_rounds(planner, rates, a, b, plain)
    assert counts[:4] == [15, 1, 0, 15]
    rate = {n: _tokens_per_second(n, rates, a, b, plain) for n in range(16)}
    assert max(rate, key=rate.get) == best
    achieved = sum(rate[n] for n in counts[20:]) / len(counts[20:])
    assert achieved > 0.95 * rate[best], (host, achieved / rate[best], sorted(set(counts[20:])))
    if best == 0:
        longest_plain_run = max(len(run) for run in "".join("0" if n == 0 else "d" for n in counts[4:]).split("d"))
        assert longest_plain_run == planner.probe and 0 < counts[20:].count(0) < len(counts[20:])


def test_cost_schedule_follows_a_change_in_acceptance():
    """Counts decay, so after the text turns easy (every draft accepted) the planner moves from plain steps to long
    drafts within a few dozen rounds."""
    planner = generation.DraftCountPlanner(15)
    _simulate_rounds(planner, [0.05] * 15, 0.060, 0.004, 0.040, rounds=200)
    assert planner.next_count() == 0
    later = _simulate_rounds(planner, [1.0] * 15, 0.060, 0.004, 0.040, rounds=80, seed=1)
    assert later[-10:] == [15] * 10, later


@pytest.mark.parametrize("drafting_over_plain, plain", [(0.95, False), (0.85, True)])
def test_cost_schedule_takes_plain_steps_only_by_a_margin(drafting_over_plain, plain):
    """A plain step teaches nothing about acceptance and the rates are noisy, so the planner takes one only where it
    beats the best draft count by `PLAIN_MARGIN` (1.1): drafting at 0.95x plain's speed still drafts, at 0.85x not."""
    planner = generation.DraftCountPlanner(1)
    planner.planned = len(planner.EXPLORE)  # past the opening rounds
    planner.reached[1], planner.accepted[1] = 100.0, 50.0  # E(1) = 1.5 tokens (with the prior: 1.5)
    plain_step = 0.040
    planner.times = {0: [plain_step, 1.0], 1: [1.5 * plain_step / drafting_over_plain, 1.0]}
    assert planner.best_drafting()[1] == pytest.approx(drafting_over_plain / plain_step)
    assert planner.next_count() == (0 if plain else 1)


@pytest.mark.parametrize("refiner", REFINERS)
def test_cost_schedule_plain_steps_keep_the_drafter_context_and_stay_exact(target, refiner, oracle, monkeypatch):
    """Rounds the planner makes plain steps (0 drafts) keep their verified tokens' target features for the drafter, so
    its cache matches one forward over every verified token, as without them; the output is plain generate's."""
    script = iter([15, 0, 0, 3, 0, 1, 0, 0, 0, 7] * 20)
    monkeypatch.setattr(generation.DraftCountPlanner, "next_count", lambda self: next(script))
    drafter = tiny_drafter(target, refiner, num_assistant_tokens_schedule="cost")
    ids = torch.randint(0, 126, (1, 9))
    oracle["continuation"] = target.generate(ids, max_new_tokens=60, do_sample=False)[0]
    ours = target.generate(ids, assistant_model=drafter, max_new_tokens=60, do_sample=False)
    assert torch.equal(ours[0], oracle["continuation"])
    generator = oracle["generators"][-1]
    assert generator.context_length == oracle["last_draft_len"] - 1
    assert_drafter_context_is(generator, target, ours)
    assert 0 not in drafter.stats.proposed and {1, 3, 7} <= set(drafter.stats.proposed)
    # every new token: the prefill's, a round's accepted drafts and bonus, a plain step's (the last may be one too,
    # taken when one token of budget is left)
    plain = drafter.stats.plain_steps
    assert plain > 5 and ours.shape[1] - ids.shape[1] - (sum(drafter.stats.accepted) + drafter.stats.rounds + plain) in (1, 2)


def test_native_dflash_path_runs_our_drafter(target):
    drafter = tiny_drafter(target, None)
    for ids in _prompts(4):
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        native = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False, speculation_type="dflash")
        assert torch.equal(plain, native)


def test_other_assistants_are_left_to_transformers(monkeypatch):
    target = tiny_target("llama")
    assistant = tiny_target("llama", seed=5, num_hidden_layers=1)
    made = []
    original = GenerationMixin._get_candidate_generator

    def spy(self, *args, **kwargs):
        generator = original(self, *args, **kwargs)
        made.append(type(generator))
        return generator

    monkeypatch.setattr(GenerationMixin, "_get_candidate_generator", spy)
    ids = torch.randint(0, 126, (1, 5))
    out = target.generate(ids, assistant_model=assistant, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, target.generate(ids, max_new_tokens=12, do_sample=False))
    target.generate(ids, assistant_model=tiny_drafter(target), max_new_tokens=12, do_sample=False)
    assert made == [AssistedCandidateGenerator, XPressCandidateGenerator]


def test_drafts_carry_their_logits_exactly_where_verification_reads_them(target, monkeypatch):
    """q goes to transformers for rejection sampling and for assistant_ensemble_weight; greedy verification compares
    tokens only, and sampling with stop strings samples the target and matches (see the stop-string test)."""
    drafter = tiny_drafter(target, "xpress")
    returned = []
    candidates = XPressCandidateGenerator.get_candidates

    def spy(self, *args, **kwargs):
        ids, logits = candidates(self, *args, **kwargs)
        if ids.shape[1] > args[0].shape[1]:  # a round with drafts
            returned.append(logits is not None)
        return ids, logits

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", spy)
    ids = torch.randint(0, 126, (1, 6))
    for kwargs, carried in ((dict(do_sample=False), False), (dict(do_sample=True), True),
                            (dict(do_sample=False, assistant_ensemble_weight=0.5), True)):
        returned.clear()
        target.generate(ids, assistant_model=drafter, max_new_tokens=12, **kwargs)
        assert returned and set(returned) == {carried}, kwargs


def test_uninstall_restores_transformers_and_install_is_idempotent():
    """`hf_xpress.uninstall()` gives generate() back every method `install()` wrapped (an xPress drafter then runs
    only through transformers' native DFlash path); `install()` twice wraps once."""
    import hf_xpress
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    from hf_xpress.generation import WRAPPED_METHODS

    target = tiny_target("llama")
    drafter = tiny_drafter(target, "xpress")
    wrapped = {name: getattr(GenerationMixin, name) for name in WRAPPED_METHODS}
    assert all(method._hf_xpress for method in wrapped.values()) and len(wrapped) == 3
    hf_xpress.install()
    assert {name: getattr(GenerationMixin, name) for name in WRAPPED_METHODS} == wrapped  # already installed
    originals = {name: method._hf_xpress_original for name, method in wrapped.items()}
    made = []
    try:
        for _ in range(2):  # a second uninstall has nothing to undo
            hf_xpress.uninstall()
            assert {name: getattr(GenerationMixin, name) for name in WRAPPED_METHODS} == originals
        # transformers' classic assistant path, which reads the drafter's generation_config first: named, not a bare
        # "object has no attribute"
        with pytest.raises(AttributeError, match=r"no generation_config: .* needs `import hf_xpress` .* "
                                                 r"speculation_type='dflash'"):
            target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=4, do_sample=False)
        assert not hasattr(drafter, "generation_config")
        original = originals["_get_candidate_generator"]

        def spy(self, *args, **kwargs):
            made.append(type(original(self, *args, **kwargs)))
            return original(self, *args, **kwargs)

        GenerationMixin._get_candidate_generator = spy
        target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=4, do_sample=False,
                        speculation_type="dflash")
        assert made and not issubclass(made[0], XPressCandidateGenerator)
        assert issubclass(made[0], DFlashTokenCandidateGenerator)
    finally:
        GenerationMixin._get_candidate_generator = originals["_get_candidate_generator"]
        hf_xpress.install()
    assert all(getattr(GenerationMixin, name)._hf_xpress for name in WRAPPED_METHODS)
    target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=4, do_sample=False)
    assert drafter.stats is not None and drafter.stats.rounds > 0


class _Collect(BaseStreamer):
    def __init__(self):
        self.tokens: list[int] = []
        self.ended = False

    def put(self, value):
        self.tokens.extend(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_exactly_the_generated_tokens(target):
    streamer = _Collect()
    ids = torch.randint(0, 126, (1, 6))
    out = target.generate(ids, assistant_model=tiny_drafter(target), max_new_tokens=25, streamer=streamer)
    assert streamer.ended and streamer.tokens == out[0].tolist()  # prompt first, then each accepted chunk


def test_options_drafting_would_get_wrong_are_refused_on_both_paths(target):
    """Classifier-free guidance and SynthID watermarking (their processors keep state that scoring drafts would
    advance: the output differed from plain generate even with no draft accepted), a cache already holding a prompt
    prefix and `inputs_embeds` without `input_ids` (the drafter would miss the prompt's features), and
    output_attentions without eager attention (transformers' assisted decoding fails on the missing weights) are clear
    errors, on chains and on trees."""
    from hf_xpress import tree_decoding

    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 9), generator=torch.Generator().manual_seed(0))
    for path in ({"assistant_model": drafter}, {"custom_generate": tree_decoding, "drafter": drafter, "tree_width": 2}):
        with pytest.raises(ValueError, match="guidance_scale=1.5 .* not supported with an xPress drafter"):
            target.generate(ids, max_new_tokens=6, do_sample=False, guidance_scale=1.5, **path)
    # SynthID's processor also keeps state (the contexts it has seen): the output differed from plain generate
    from transformers import DynamicCache, SynthIDTextWatermarkingConfig

    synthid = SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340, 443, 597, 160], ngram_len=3)
    prefix = DynamicCache(config=target.config)
    target(ids[:, :5], cache=prefix, use_cache=True)  # a cached prompt prefix: the drafter never sees its features
    embeds = target.get_input_embeddings()(ids)
    for path in ({"assistant_model": drafter}, {"custom_generate": tree_decoding, "drafter": drafter, "tree_width": 2}):
        with pytest.raises(ValueError, match="SynthID watermarking is not supported with an xPress drafter"):
            target.generate(ids, max_new_tokens=6, do_sample=False, watermarking_config=synthid, **path)
        with pytest.raises(ValueError, match="a cache that already holds 5 tokens"):
            target.generate(ids, max_new_tokens=6, do_sample=False, cache=prefix, **path)
        with pytest.raises(ValueError, match="needs the prompt's token ids: generate\\(inputs_embeds=...\\) was given"):
            target.generate(inputs_embeds=embeds, max_new_tokens=6, do_sample=False, **path)
    assert prefix.get_seq_length() == 5  # refused before anything ran
    assert target.config._attn_implementation != "eager"
    with pytest.raises(ValueError, match="output_attentions=True .* needs the target's attn_implementation='eager'"):
        target.generate(ids, max_new_tokens=6, do_sample=False, output_attentions=True, return_dict_in_generate=True,
                        assistant_model=drafter)
    attention = target.config._attn_implementation
    target.set_attn_implementation("eager")  # with eager attention the weights exist, and the output equals plain
    try:
        plain = target.generate(ids, max_new_tokens=6, do_sample=False, output_attentions=True,
                                return_dict_in_generate=True)
        ours = target.generate(ids, max_new_tokens=6, do_sample=False, output_attentions=True,
                               return_dict_in_generate=True, assistant_model=drafter)
        assert torch.equal(ours.sequences, plain.sequences) and len(ours.attentions) == len(plain.attentions)
    finally:
        target.set_attn_implementation(attention)


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "rope_theta": 10_000.0, "factor": 16.0},
    {"rope_type": "longrope", "rope_theta": 10_000.0, "original_max_position_embeddings": 12,
     "short_factor": [1.0] * 8, "long_factor": [4.0] * 8},
])
def test_a_target_whose_rope_depends_on_the_longest_position_is_exact_below_its_threshold(rope):
    """Dynamic and LongRoPE frequencies depend on the largest position in a forward, so verifying several tokens at
    once past the threshold rotates them unlike plain generate's one-token steps (the outputs differed): refused on
    both paths, with the threshold named; below it the output equals plain generate's."""
    from hf_xpress import tree_decoding

    target = tiny_target("llama", max_position_embeddings=8 if rope["rope_type"] == "dynamic" else 64,
                         rope_parameters=rope)
    drafter = tiny_drafter(target, "xpress")
    threshold = 8 if rope["rope_type"] == "dynamic" else 12
    ids = torch.randint(0, 126, (1, 4), generator=torch.Generator().manual_seed(0))
    for path in ({"assistant_model": drafter}, {"custom_generate": tree_decoding, "drafter": drafter, "tree_width": 2}):
        plain = target.generate(ids, max_length=threshold, do_sample=False)
        assert torch.equal(target.generate(ids, max_length=threshold, do_sample=False, **path), plain)
        with pytest.raises(ValueError, match=f"'{rope['rope_type']}' RoPE .* keep max_length <= {threshold}"):
            target.generate(ids, max_length=threshold + 1, do_sample=False, **path)


def test_batch_size_above_one_is_a_clear_error(target):
    with pytest.raises(ValueError, match="batch_size = 1|batch size 1"):
        target.generate(torch.randint(0, 126, (2, 5)), assistant_model=tiny_drafter(target), max_new_tokens=5)


def test_drafter_for_another_target_is_refused_by_generate():
    target = tiny_target("qwen3")
    other = tiny_target("qwen3", num_hidden_layers=4)
    with pytest.raises(ValueError, match="built for another target.*depth: target 6 layers, drafter expects 4"):
        target.generate(torch.tensor([[1, 2]]), assistant_model=tiny_drafter(other), max_new_tokens=5)
    wide = tiny_target("llama", hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="hidden size: target 64, drafter 32"):
        target.generate(torch.tensor([[1, 2]]), assistant_model=tiny_drafter(wide), max_new_tokens=5)


def test_stats_never_describe_an_earlier_call(target):
    """`drafter.stats` is the latest call's: a call that did not draft (beam search, which transformers runs without
    the assistant; a refused call; a refused tree) leaves None, not the call before's figures."""
    drafter, ids = tiny_drafter(target), torch.randint(0, 126, (1, 6), generator=torch.Generator().manual_seed(3))

    def drafting_call():
        target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False)
        assert drafter.stats is not None and drafter.stats.rounds > 0

    drafting_call()
    target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False, num_beams=2)
    assert drafter.stats is None
    drafting_call()
    with pytest.raises(ValueError, match="built for another target"):
        tiny_target("qwen3", num_hidden_layers=4).generate(ids, assistant_model=drafter, max_new_tokens=4)
    assert drafter.stats is None
    drafting_call()
    with pytest.raises(ValueError, match="tree_width must be at least 1"):
        target.generate(ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter, tree_width=0, max_new_tokens=4)
    assert drafter.stats is None


def test_output_hidden_states_with_return_dict(target):
    ids = torch.randint(0, 126, (1, 4))
    out = target.generate(
        ids, assistant_model=tiny_drafter(target), max_new_tokens=10, return_dict_in_generate=True,
        output_hidden_states=True, output_scores=True,
    )
    plain = target.generate(ids, max_new_tokens=10, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, plain.sequences)
    assert len(out.scores) == 10 and len(out.hidden_states) == 10


# ---- sampling --------------------------------------------------------------------------------------------------------

V = 4  # tiny vocabulary, so the exact distribution of several tokens can be enumerated


def _peaky_pair(seed: int, refiner: str = "xpress", refiner_std: float = 0.5):
    # 2 layers: the sampling tests call generate ~2,000 times each, and the target's forward is most of a call
    target = tiny_target("llama", seed=seed, vocab_size=V, num_hidden_layers=2)
    with torch.no_grad():
        target.lm_head.weight.mul_(5.0)  # several likely tokens per step: ~70 cells hold 5+ expected samples
    torch.manual_seed(seed + 1)
    drafter = XPressDrafterModel.from_target(target, refiner=refiner, num_hidden_layers=1, mask_token_id=V - 1).eval()
    # std 0.5: a large bias, so the refiner moves the drafts a lot; xPress's then reaches ~1e6 and its q is one-hot
    # (test_sampled_xpress_drafts_are_samples_of_a_spread_q takes a smaller one)
    with torch.no_grad():
        for p in drafter.refiner.parameters():
            p.normal_(0.0, refiner_std)
    return target, drafter


@torch.no_grad()
def _exact_joint(target, prompt: torch.Tensor, n: int, **processing) -> torch.Tensor:
    """p(x1..xn | prompt) after the generation's temperature / top-k, by enumeration: `[V] * n`."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, **processing)
    processors = target._get_logits_processor(config, input_ids_seq_length=prompt.shape[1])
    joint = torch.ones([1])
    seqs = prompt
    for _ in range(n):
        logits = target(seqs).logits[:, -1].float()
        probs = torch.softmax(processors(seqs, logits), dim=-1)  # [V^i, V]
        joint = (joint[:, None] * probs).reshape(-1)
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(seqs.shape[0])[:, None]], dim=1)
    return joint.reshape([V] * n)


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square, cells with expected count < 5 merged into one; returns (statistic, degrees of freedom)."""
    expected = probs.flatten() * counts.sum()
    counts = counts.flatten().float()
    small = expected < 5
    e = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    c = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
    keep = e > 0
    return float(((c[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum()) - 1


def _sample_counts(target, drafter, prompt, n_new, samples, proposed=None, **processing) -> torch.Tensor:
    """Counts of the generated n_new-token sequences, `[V] * n_new`; `proposed` (a list) collects drafts per round."""
    counts = torch.zeros([V] * n_new)
    torch.manual_seed(123)
    for _ in range(samples):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=n_new, do_sample=True, **processing)
        counts[tuple(out[0, prompt.shape[1] :].tolist())] += 1
        if proposed is not None:
            proposed.extend(drafter.stats.proposed)
    return counts


# chi-square acceptance bound: dof + 6 * sqrt(2 dof) (p < 1e-6 for these dof); deterministic seeds, so no flakes.
def _bound(dof: int) -> float:
    return dof + 6 * (2 * dof) ** 0.5


@pytest.mark.parametrize(
    "processing, shortlist, refiner, threshold, draft_vocab",
    [(dict(top_k=0), None, "xpress", 0.0, None), (dict(temperature=0.7, top_k=3), None, "xpress", 0.0, None),
     (dict(top_k=0), 2, "xpress", 0.0, None), (dict(top_k=0), 2, "markov", 0.0, None),
     (dict(top_k=0), None, "xpress", 0.5, None), (dict(temperature=0.7, top_k=3), None, "xpress", 0.0, [0, 2]),
     (dict(top_k=0), None, "xpress", 0.0, [0, 2]), (dict(top_k=0), None, "markov", 0.0, [0, 2])],
)
def test_sampling_keeps_the_target_distribution_and_a_biased_q_is_caught(
    processing, shortlist, refiner, threshold, draft_vocab, monkeypatch
):
    """4 new tokens: the first from the prefill, then 2 drafts (slot 2's q depends on slot 1's token through the
    refiner) and a bonus/correction. 1500 samples; the joint of the 4 tokens (256 cells, ~70 with 5+ expected
    samples) must match the target's exact joint; 500 samples (1000 with a draft vocabulary) from a sampler with the
    wrong q fail the same bound. Without logits processors a draft vocabulary is drafted on its columns only.
    With a confidence threshold, whether slot 2 is proposed depends on the sampled slot 1: still exact."""
    target, drafter = _peaky_pair(seed=7, refiner=refiner)
    drafter.config.refiner_shortlist = shortlist  # 2 of the 4 tokens: drafts restricted to the drafter's top 2
    drafter.config.assistant_confidence_threshold = threshold
    drafter.set_draft_vocab(draft_vocab)  # [0, 2]: tokens 1 and 3 are never drafted, only reached by correction
    prompt = torch.tensor([[1, 2, 0]])
    exact = _exact_joint(target, prompt, 4, **processing)
    proposed = []
    counts = _sample_counts(target, drafter, prompt, 4, 1500, proposed, **processing)
    stat, dof = _chi2(counts, exact)
    assert stat < _bound(dof), (stat, dof)
    accepted = sum(drafter.stats.accepted)
    assert drafter.stats.rounds > 0
    if threshold:  # the threshold cut some rounds to one draft, not all
        assert 1 in proposed and 2 in proposed, sorted(set(proposed))
    if draft_vocab:
        assert {t for d in drafter.stats.drafts for t in d} <= set(draft_vocab)

    # Power check: the same test rejects a sampler whose q is not the distribution the drafts were drawn from
    original = XPressDrafterModel.propose
    columns = []  # whether each round drafted on the draft vocabulary's columns only (no logits processor)

    def biased(self, hidden, base_logits, lead_tokens, vocab_ids=None, **kwargs):
        proposal = original(self, hidden, base_logits, lead_tokens, vocab_ids=vocab_ids, **kwargs)
        columns.append(vocab_ids is not None)
        unrefined = base_logits.float() if vocab_ids is None else _full_vocabulary(base_logits.float(), vocab_ids, V)
        proposal.logits = unrefined  # claims the unrefined logits as q
        return proposal

    monkeypatch.setattr(XPressDrafterModel, "propose", biased)
    # two draftable tokens leave q less room to be wrong: more samples to see it
    counts = _sample_counts(target, drafter, prompt, 4, 500 if draft_vocab is None else 1000, **processing)
    stat_biased, dof_biased = _chi2(counts, exact)
    assert stat_biased > _bound(dof_biased), (stat_biased, dof_biased, accepted)
    processors = "temperature" in processing  # top_k=0 alone adds no logits processor
    assert set(columns) == {draft_vocab is not None and not processors}


def test_sampling_with_counts_from_earlier_rounds_keeps_the_target_distribution(monkeypatch):
    """The "cost" schedule sets each round's count, plain steps included, from earlier rounds only, so sampling stays
    exact. Here the count is scripted from the previous round alone (a plain step after a round whose draft was
    rejected, else 1 draft; the real planner's choices are tested above), so that within 4 new tokens both kinds of
    round occur, the plain step only where the first draft was rejected; the joint of the 4 tokens must still be the
    target's."""
    original = generation.DraftCountPlanner.record_acceptance

    def remember(self, drafts: int, accepted: int) -> None:
        self.last = (drafts, accepted)
        original(self, drafts, accepted)

    monkeypatch.setattr(generation.DraftCountPlanner, "record_acceptance", remember)
    monkeypatch.setattr(generation.DraftCountPlanner, "next_count",  # a plain step after a rejected draft
                        lambda self: 0 if getattr(self, "last", (1, 1))[1] == 0 and not self.plain_in_a_row else 1)
    target, drafter = _peaky_pair(seed=7)
    drafter.config.num_assistant_tokens_schedule = "cost"
    prompt = torch.tensor([[1, 2, 0]])
    exact = _exact_joint(target, prompt, 4, top_k=0)
    counts, plain = torch.zeros([V] * 4), 0
    torch.manual_seed(123)
    for _ in range(1500):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=4, do_sample=True, top_k=0)
        counts[tuple(out[0, prompt.shape[1] :].tolist())] += 1
        plain += drafter.stats.plain_steps
    stat, dof = _chi2(counts, exact)
    assert stat < _bound(dof), (stat, dof)
    assert 100 < plain < 1400, plain  # plain steps happened in some calls, after a rejected draft


def test_sampled_xpress_drafts_are_samples_of_a_spread_q(monkeypatch):
    """With a bias small enough that q stays spread (its top token under 0.95 in every round here), the xPress drafts
    must be samples of q: the output matches the target's joint, and the same test fails when the drafts are the
    greedy choice while q stays as it is (a Gumbel draw dropped)."""
    target, drafter = _peaky_pair(seed=7, refiner="xpress", refiner_std=0.07)
    prompt = torch.tensor([[1, 2, 0]])
    exact = _exact_joint(target, prompt, 4, top_k=0)
    top_q = []
    candidates = XPressCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        ids, logits = candidates(self, input_ids, *args, **kwargs)
        if logits is not None:
            top_q.extend(logits[0].softmax(-1).max(-1).values.tolist())
        return ids, logits

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", spy)
    stat, dof = _chi2(_sample_counts(target, drafter, prompt, 4, 1500, top_k=0), exact)
    assert stat < _bound(dof), (stat, dof)
    assert top_q and max(top_q) < 0.95, max(top_q)
    original = XPressDrafterModel.propose

    def greedy_drafts(self, hidden, base_logits, lead_tokens, noise=None, **kwargs):
        return original(self, hidden, base_logits, lead_tokens, noise=None, **kwargs)

    monkeypatch.setattr(XPressDrafterModel, "propose", greedy_drafts)
    stat_greedy, dof_greedy = _chi2(_sample_counts(target, drafter, prompt, 4, 1500, top_k=0), exact)
    assert stat_greedy > _bound(dof_greedy), (stat_greedy, dof_greedy)


def _letters_tokenizer():
    """A real fast tokenizer for the V = 4 test vocabulary: tokens "a" "b" "c" "d" (ids 0..3), text = their letters
    (StopStringCriteria also reads the vocabulary's strings; "abcdef" is its probe and never generated)."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"a": 0, "b": 1, "c": 2, "d": 3, "abcdef": 4}, unk_token="a"))
    backend.pre_tokenizer, backend.decoder = Whitespace(), decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_sampling_with_stop_strings_keeps_the_target_distribution(monkeypatch):
    """Drafts end before a token that would complete a stop string, so whether a draft is submitted depends on the
    draft itself. Verified against its logits that skews the output, most for a drafter whose q is the target's p (a
    draft "d" is dropped and the target samples again: P("d") = q("d") p("d")). With stop strings the generator hands
    transformers no logits, so the target is sampled and matching drafts kept. Here the drafter samples the target's
    own conditionals; the outputs (cut after the first "d") must follow the target's distribution, and the same test
    fails when the logits are handed over."""
    target, drafter = _peaky_pair(seed=7)
    tokenizer = _letters_tokenizer()
    prompt = torch.tensor([[1, 2, 0]])
    joint = _exact_joint(target, prompt, 4, top_k=0)
    exact: dict[tuple, float] = {}
    for index in torch.cartesian_prod(*[torch.arange(V)] * 4).tolist():
        cut = tuple(index[: index.index(3) + 1] if 3 in index else index)  # generation stops after "d"
        exact[cut] = exact.get(cut, 0.0) + float(joint[tuple(index)])
    outputs = list(exact)

    context = {}
    get_candidates = XPressCandidateGenerator.get_candidates

    def remember_context(self, input_ids, *args, **kwargs):
        context["ids"] = input_ids
        return get_candidates(self, input_ids, *args, **kwargs)

    @torch.no_grad()
    def sample_the_target(self, hidden, base_logits, lead_tokens, **kwargs):  # q = p: the drafter a cut skews most
        sequence, tokens, logits = context["ids"], [], []
        for _ in range(base_logits.shape[1]):
            step = target(sequence).logits[:, -1].float()
            token = torch.multinomial(step.softmax(-1), 1)
            sequence = torch.cat([sequence, token], dim=1)
            tokens.append(token)
            logits.append(step)
        return DraftProposal(tokens=torch.cat(tokens, 1), scores=torch.stack(logits, 1), passes=0)

    monkeypatch.setattr(XPressCandidateGenerator, "get_candidates", remember_context)
    monkeypatch.setattr(XPressDrafterModel, "propose", sample_the_target)
    drafter.config.num_assistant_tokens = 3
    accepted = []

    def statistic(samples: int) -> tuple[float, int]:
        counts = torch.zeros(len(outputs))
        torch.manual_seed(123)
        for _ in range(samples):
            out = target.generate(prompt, assistant_model=drafter, max_new_tokens=4, do_sample=True, top_k=0,
                                  stop_strings=["d"], tokenizer=tokenizer)
            counts[outputs.index(tuple(out[0, prompt.shape[1]:].tolist()))] += 1
            accepted.extend(drafter.stats.accepted)
        return _chi2(counts, torch.tensor([exact[o] for o in outputs]))

    stat, dof = statistic(1000)
    assert stat < _bound(dof), (stat, dof)
    assert sum(accepted) > 300, sum(accepted)  # drafts were accepted, not only corrected

    init = XPressCandidateGenerator.__init__

    def with_logits(self, *args, **kwargs):  # the biased way: drafts cut by stop strings, verified against q
        init(self, *args, **kwargs)
        self.needs_logits = True

    monkeypatch.setattr(XPressCandidateGenerator, "__init__", with_logits)
    stat_biased, dof_biased = statistic(1000)
    assert stat_biased > _bound(dof_biased), (stat_biased, dof_biased)


def test_sampling_with_prompt_lookup_rounds_keeps_the_target_distribution():
    """Lookup rounds carry no q: transformers samples the target and keeps the drafts that match, exact like the
    drafter rounds' speculative sampling. The joint of 4 tokens over rounds of both kinds matches the target's."""
    target, drafter = _peaky_pair(seed=7)
    prompt = torch.tensor([[1, 2, 0, 1, 2, 0]])  # lookup continues every anchor but 3 (until 3 recurs)
    processing = dict(top_k=0, prompt_lookup_num_tokens=2)
    exact = _exact_joint(target, prompt, 4, **processing)
    counts, kinds = torch.zeros([V] * 4), []
    torch.manual_seed(123)
    for _ in range(1500):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=4, do_sample=True, **processing)
        counts[tuple(out[0, prompt.shape[1] :].tolist())] += 1
        kinds += drafter.stats.lookup
    stat, dof = _chi2(counts, exact)
    assert stat < _bound(dof), (stat, dof)
    assert 0.1 < sum(kinds) / len(kinds) < 0.9, (sum(kinds), len(kinds))  # both kinds of rounds, often


@pytest.mark.parametrize("kind", ["bloom", "mamba"])
def test_targets_without_attention_heads_or_a_position_limit_get_a_lossless_drafter(kind):
    """BLOOM's config has no max_position_embeddings (ALiBi), Mamba's no attention heads: from_target crashed with
    transformers' AttributeError on them (overrides did not help: read before they apply)."""
    from transformers import BloomConfig, BloomForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    none = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = (BloomForCausalLM(BloomConfig(vocab_size=128, hidden_size=64, n_layer=4, n_head=4, **none)) if kind == "bloom"
              else MambaForCausalLM(MambaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=4, state_size=8, **none)))
    target.eval()
    for refiner in REFINERS:
        drafter = tiny_drafter(target, refiner)
        assert drafter.config.num_attention_heads == (4 if kind == "bloom" else 1)  # Mamba: one head of width 64
        for ids in _prompts(7)[::5]:  # lengths 1 and 31
            assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False),
                               target.generate(ids, max_new_tokens=24, do_sample=False))
    assert tiny_drafter(target, None, num_attention_heads=2, max_position_embeddings=64).config.num_attention_heads == 2


def test_drafting_runs_on_the_drafters_device(target, caplog):
    """A GPU user's target may put its lm_head on another device than its embeddings (a target split over GPUs), and
    `AutoModel.from_pretrained` leaves a drafter on the CPU: the refiner's inputs came from the lm_head's device and
    crashed inside torch against the drafter's weights. The head's scores now go to the drafter's device (here a
    "meta" device stands in for another one), and a drafter elsewhere than the target's embeddings is named.
    `scripts/gpu_devices.py` checks these placements for exactness on a GPU machine."""
    from transformers.utils import logging as hf_logging

    drafter = tiny_drafter(target, "xpress")
    drafter.set_draft_vocab(list(range(0, 128, 2)))
    generator = XPressCandidateGenerator(target, drafter, target.generation_config)
    generator.device = torch.device("meta")
    hidden = torch.randn(1, 3, 64)
    for whole in (False, True):
        scores, ids = generator.head_scores(hidden, whole)
        assert scores.device.type == "meta" and scores.shape == (1, 3, 128 if whole else 64)
        assert (ids is None) == whole and (whole or ids.device.type == "meta")
    hf_logging.warning_once.cache_clear()
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            XPressCandidateGenerator(target, copy.deepcopy(drafter).to("meta"), target.generation_config)
    finally:
        hf_logging.disable_propagation()
    assert "The drafter is on meta and the target's embeddings on cpu: drafting runs on meta" in caplog.text
    assert "drafter.to('cpu')" in caplog.text


def test_the_lead_tokens_are_a_fresh_tensor_each_round(target, monkeypatch):
    """The lead tokens were a view of the growing sequence, whose row stride changed every round: a compiled refiner
    (enable_fast_refine, CUDA graphs) took each stride for a new input and compiled again (a copy with `.to` or
    `.contiguous()` keeps the view's strides)."""
    drafter = tiny_drafter(target, "xpress")
    strides = []
    propose = XPressDrafterModel.propose

    def recording(self, hidden, base_logits, lead_tokens, *args, **kwargs):
        strides.append(lead_tokens.stride())
        return propose(self, hidden, base_logits, lead_tokens, *args, **kwargs)

    monkeypatch.setattr(XPressDrafterModel, "propose", recording)
    target.generate(torch.randint(0, 126, (1, 9)), assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert len(strides) >= 3 and set(strides) == {(2, 1)}, strides
