"""`generate(custom_generate=hf_xpress.tree_decoding, drafter=...)`: tree verification is plain greedy `generate`
token for token, keeps exactly the accepted path in the target's cache and the drafter's context, and refuses what it
does not support with a clear error."""

from __future__ import annotations

import importlib
import random

import pytest
import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicCache
from transformers.generation.stopping_criteria import MaxLengthCriteria

import hf_xpress
from hf_xpress import XPressDrafterModel, tree_decoding
from hf_xpress.generation import XPressCandidateGenerator
from hf_xpress.tree_decoding import _walk, add_branch, chain_parents, keep_cache_rows, node_depths, tree_attention_mask

from conftest import FiresOnce, RecordingStreamer, assert_drafter_context_is, plain_fired_once, tiny_drafter, tiny_target
from test_generation import V, _bound, _chi2, _exact_joint, _peaky_pair

REFINERS = [None, "markov", "xpress"]


def _tree_generate(target, ids, drafter, width, **kwargs):
    return target.generate(ids, custom_generate=tree_decoding, drafter=drafter, tree_width=width, do_sample=False,
                           **kwargs)


def _assert_cache_matches_a_fresh_forward(target, cache, tokens: torch.Tensor) -> None:
    """The target's cache holds every committed token but the last, as one forward over them would give."""
    fresh = DynamicCache(config=target.config)
    target(tokens[:, :-1], cache=fresh, use_cache=True)
    assert cache.get_seq_length() == tokens.shape[1] - 1
    for mine, theirs in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-5)


def _capture_generators(monkeypatch) -> list[XPressCandidateGenerator]:
    """Every candidate generator built from now on (tree decoding builds one per `generate` call), in order."""
    generators = []
    original_init = XPressCandidateGenerator.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        generators.append(self)

    monkeypatch.setattr(XPressCandidateGenerator, "__init__", init)
    return generators


def _prompts(n: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randint(0, 126, (1, length)) for length in [1, 2, 3, 7, 16, 31, 90][:n]]


@pytest.mark.parametrize("refiner", REFINERS)
@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("max_new_tokens", [1, 5, 40])
def test_tree_equals_plain_generate(target, refiner, width, max_new_tokens):
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=3)
    for ids in _prompts(7):
        plain = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        assert torch.equal(_tree_generate(target, ids, drafter, width, max_new_tokens=max_new_tokens), plain)
    if max_new_tokens > 2:
        assert drafter.stats.rounds > 0 and set(drafter.stats.proposed) <= {1, 2, 3}
        assert all(len(d) == width * p for d, p in zip(drafter.stats.drafts, drafter.stats.proposed))


@pytest.mark.parametrize("refiner", ["xpress", "markov"])
def test_trees_honour_the_refiner_shortlist_as_chains_do(target, refiner):
    """With refiner_shortlist = M the refiner re-scores only each slot's M best drafter tokens: a fixed tree's first
    branch is then the shortlisted chain's proposal, and every node of either tree is among its slot's M best."""
    drafter = tiny_drafter(target, refiner, jacobi_passes=6, jacobi_early_stop=False, refiner_shortlist=8)
    with torch.no_grad():  # a refiner strong enough to pull tokens from outside the shortlist if it were not applied
        for p in drafter.refiner.parameters():
            p.mul_(6.0)
    torch.manual_seed(4)
    hidden, base, lead = torch.randn(1, 16, 64), torch.randn(1, 5, 128) * 3, torch.tensor([[4, 9]])
    allowed = base[0].topk(8, dim=-1).indices  # [S, 8]
    tree = drafter.propose_tree(hidden, base, lead, width=3)
    assert torch.equal(tree[0], drafter.propose(hidden, base, lead).tokens[0])
    assert all(int(t) in allowed[k].tolist() for row in tree for k, t in enumerate(row))
    tokens, parents = drafter.propose_dynamic_tree(hidden, base, lead, budget=10, width=3)
    for token, depth in zip(tokens.tolist(), node_depths(parents)):
        assert token in allowed[depth - 1].tolist()
    assert len(tokens) == 10


def test_propose_tree_branches_are_the_drafters_top_tokens_each_continued_on_its_own_branch(target):
    """Row w: slot 1 = the w-th best refined token; slot k: the refiner's greedy choice given that branch's tokens,
    which for branch 0 with enough Jacobi passes is exactly the chain proposal."""
    drafter = tiny_drafter(target, "xpress", jacobi_passes=6, jacobi_early_stop=False)
    torch.manual_seed(3)
    hidden = torch.randn(1, 16, 64)
    base = torch.randn(1, 5, 128) * 3
    lead = torch.tensor([[4, 9]])
    tree = drafter.propose_tree(hidden, base, lead, width=4)
    chain = drafter.propose(hidden, base, lead)
    assert tree.shape == (4, 5) and torch.equal(tree[0], chain.tokens[0])
    full = base[0, 0] + drafter.refiner(hidden, torch.tensor([[4, 9] + [0] * 14]))[0, 0]
    assert torch.equal(tree[:, 0], full.topk(4).indices)
    for w in range(4):  # each branch's slot k: the teacher-forced refined argmax given its own slots < k
        prev = torch.tensor([[4, 9] + tree[w, :-1].tolist() + [0] * 10])
        logits = base[0] + drafter.refiner(hidden, prev)[0, :5]
        assert torch.equal(tree[w, 1:], logits[1:].argmax(-1))
    # without a refiner every branch repeats the drafter's per-slot choice after slot 1
    plain = tiny_drafter(target, None).propose_tree(hidden, base, lead, width=3)
    assert torch.equal(plain[:, 1:], base[0, 1:].argmax(-1).expand(3, -1))


@pytest.mark.parametrize("refiner", REFINERS)
@pytest.mark.parametrize("budget, width", [(1, 1), (4, 2), (12, 3)])
def test_dynamic_tree_equals_plain_generate(target, refiner, budget, width):
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=4)
    for ids in _prompts(5):
        for max_new_tokens in (3, 30):
            plain = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
            ours = _tree_generate(target, ids, drafter, width, tree_budget=budget, max_new_tokens=max_new_tokens)
            assert torch.equal(ours, plain)
    assert all(len(d) <= budget for d in drafter.stats.drafts) and max(map(len, drafter.stats.drafts)) == budget
    # the slots a round drafts: its deepest node, not the depth cap (a 1-node tree drafts 1 slot, never 4)
    assert all(p <= min(budget, 4) for p in drafter.stats.proposed) and max(drafter.stats.proposed) >= 1
    if width == 1:
        assert set(drafter.stats.proposed) == {min(budget, 4)}  # one child per node: a chain to the budget's depth


@pytest.mark.parametrize("temperature", [0.5, 3.0])
def test_dynamic_tree_with_a_tree_temperature_equals_plain_generate(target, temperature):
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=4, tree_temperature=temperature)
    for ids in _prompts(4):
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        assert torch.equal(_tree_generate(target, ids, drafter, 3, tree_budget=6, max_new_tokens=30), plain)


def _path_log_prob(drafter, hidden, base, lead, path):
    """log p of a path of draft tokens under the drafter, slot by slot, from the refiner read teacher-forced on the
    full-length input (the reference the dynamic tree's incremental scores must agree with)."""
    prev = torch.tensor([lead + list(path[:-1]) + [0] * (14 - len(path) + 1)])
    logits = base[0, : len(path)] + drafter.refiner(hidden, prev)[0, : len(path)]
    return sum(float(torch.log_softmax(logits[k], -1)[t]) for k, t in enumerate(path))


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_dynamic_tree_keeps_the_most_probable_paths(target, temperature):
    """Against brute force over every 1- and 2-token path: with the whole vocabulary as width the candidates are all
    of them, and the tree must be exactly the `budget` paths of highest probability (each slot's probabilities a
    softmax of the drafter's scores divided by `tree_temperature`)."""
    drafter = tiny_drafter(target, "xpress", tree_temperature=temperature)
    torch.manual_seed(5)
    hidden, base, lead = torch.randn(1, 16, 64), torch.randn(1, 2, 128) * 2, [4, 9]
    tokens, parents = drafter.propose_dynamic_tree(hidden, base, torch.tensor([lead]), budget=9, width=128)
    paths = []
    for i in range(len(tokens)):
        assert parents[i] < i  # parents first
        paths.append((*(paths[parents[i]] if parents[i] >= 0 else ()), int(tokens[i])))
    everything = [(a,) for a in range(128)] + [(a, b) for a in range(128) for b in range(128)]
    slot1 = base[0, 0] + drafter.refiner(hidden, torch.tensor([lead + [0] * 14]))[0, 0]
    prev = torch.tensor([lead + [a] + [0] * 13 for a in range(128)])
    slot2 = base[0, 1] + drafter.refiner(hidden.expand(128, -1, -1), prev)[:, 1]
    slot1, slot2 = (torch.log_softmax(s / temperature, -1) for s in (slot1, slot2))
    score = {p: float(slot1[p[0]] + (slot2[p[0], p[1]] if len(p) == 2 else 0.0)) for p in everything}
    best = sorted(everything, key=lambda p: (-score[p], len(p)))[:9]
    assert set(paths) == set(best)
    if temperature == 1.0:
        for p in paths[:3]:  # the incremental scores are the full-input reference's
            assert abs(score[p] - _path_log_prob(drafter, hidden, base, lead, p)) < 1e-4
    else:  # the temperature changed the tree (else this case would prove nothing about it)
        drafter.config.tree_temperature = 1.0
        other, other_parents = drafter.propose_dynamic_tree(hidden, base, torch.tensor([lead]), budget=9, width=128)
        assert (other.tolist(), other_parents) != (tokens.tolist(), parents)


def test_tree_temperature_trades_depth_for_width(target):
    """An over-confident slot 1 (one token far ahead) gets a deep chain at T = 1; a higher temperature flattens it
    and spends the same budget on slot-1 alternatives. Chains and fixed trees rank within a slot and ignore T."""
    drafter = tiny_drafter(target, None)
    scores = torch.full((1, 3, 128), -10.0)
    scores[0, 0, :3] = torch.tensor([4.0, 1.0, 1.0])  # slot 1: 0.90 / 0.04 / 0.04 at T = 1
    scores[0, 1:, 5] = 6.0  # slots 2-3: sure of token 5
    lead, hidden = torch.tensor([[1, 2]]), torch.zeros(1, 16, 64)
    tokens, parents = drafter.propose_dynamic_tree(hidden, scores, lead, 3, 3)
    assert tokens.tolist() == [0, 5, 5] and parents == [-1, 0, 1]
    fixed = drafter.propose_tree(hidden, scores, lead, width=3)
    drafter.config.tree_temperature = 8.0
    tokens, parents = drafter.propose_dynamic_tree(hidden, scores, lead, 3, 3)
    assert tokens.tolist() == [0, 1, 2] and parents == [-1, -1, -1]
    assert torch.equal(drafter.propose_tree(hidden, scores, lead, width=3), fixed)


def test_dynamic_tree_is_a_chain_where_the_drafter_is_sure_and_a_bush_where_it_is_not(target):
    drafter = tiny_drafter(target, None)
    sure = torch.full((1, 3, 128), -20.0)
    sure[0, torch.arange(3), torch.tensor([7, 8, 9])] = 20.0  # one token per slot, certain
    tokens, parents = drafter.propose_dynamic_tree(torch.zeros(1, 16, 64), sure, torch.tensor([[1, 2]]), 3, 3)
    assert tokens.tolist() == [7, 8, 9] and parents == [-1, 0, 1]
    flat = torch.zeros(1, 3, 128)
    flat[0, 0, :4] = torch.tensor([3.0, 2.9, 2.8, 2.7])  # slot 1 unsure; later slots flat over 128 tokens
    tokens, parents = drafter.propose_dynamic_tree(torch.zeros(1, 16, 64), flat, torch.tensor([[1, 2]]), 3, 3)
    assert tokens.tolist() == [0, 1, 2] and parents == [-1, -1, -1]


@pytest.fixture
def oracle(monkeypatch):
    """Put the target's true continuation into a random branch (random accepted length), so that rounds accept
    drafts from branches other than the first and the cache must be compacted."""
    state = {"continuation": None, "generators": [], "branches": []}
    rng = random.Random(0)
    original_tree = XPressDrafterModel.propose_tree

    def propose_tree(self, hidden, base_logits, lead_tokens, width, vocab_ids=None):
        tree = original_tree(self, hidden, base_logits, lead_tokens, width, vocab_ids).clone()
        generator = state["generators"][-1]
        start = generator.context_length + 1  # position of slot 1 in the sequence
        truth = state["continuation"][start : start + tree.shape[1]]
        branch, good = rng.randrange(tree.shape[0]), rng.randint(0, min(len(truth), tree.shape[1]))
        for w in range(tree.shape[0]):  # no other branch may start with the true token
            if tree[w, 0] == truth[0]:
                tree[w, 0] = (truth[0] + 1 + w) % 126
        tree[branch, :good] = truth[:good]
        if good < tree.shape[1] and good < len(truth):
            tree[branch, good] = (truth[good] + 1) % 126
        state["branches"].append((branch, good))
        return tree

    state["generators"] = _capture_generators(monkeypatch)
    monkeypatch.setattr(XPressDrafterModel, "propose_tree", propose_tree)
    return state


def test_logits_processors_see_each_nodes_own_prefix(target, oracle):
    """Processors that read the tokens before a position (repetition penalty, no-repeat n-grams) score each node after
    its own path. The true continuation is planted in a random branch, so rounds accept drafts, often from side
    branches: scoring a node after the wrong prefix would change the output (a random drafter alone is almost never
    accepted, and would not show it)."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=4)
    settings = dict(max_new_tokens=40, repetition_penalty=1.3, no_repeat_ngram_size=3)
    accepted = []
    for ids in _prompts(5):
        plain = target.generate(ids, do_sample=False, **settings)
        oracle["continuation"] = plain[0]
        assert torch.equal(_tree_generate(target, ids, drafter, 3, **settings), plain)
        accepted += drafter.stats.accepted
    side = sum(1 for (branch, good), a in zip(oracle["branches"], accepted) if branch > 0 and a > 1)
    assert sum(accepted) > 40 and side > 5, (sum(accepted), side)


class _CallRecorder(StoppingCriteria):
    """Never stops; records each call's sequence length and the scores it was handed."""

    def __init__(self):
        self.calls = []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.shape[1], scores))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_stopping_criteria_are_called_as_plain_generate_calls_them(target, oracle):
    """After every committed token, in order, with the scores plain `generate` hands them (None without
    output_scores), also inside rounds that commit several tokens."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=4)
    settings = dict(max_new_tokens=30, repetition_penalty=1.3)
    ids = _prompts(5)[4]
    plain_calls, tree_calls = _CallRecorder(), _CallRecorder()
    plain = target.generate(ids, stopping_criteria=StoppingCriteriaList([plain_calls]), do_sample=False, **settings)
    oracle["continuation"] = plain[0]
    ours = _tree_generate(target, ids, drafter, 3, stopping_criteria=StoppingCriteriaList([tree_calls]), **settings)
    assert torch.equal(ours, plain) and max(drafter.stats.accepted) > 1  # rounds that commit several tokens
    assert tree_calls.calls == plain_calls.calls and len(plain_calls.calls) == 30


def test_a_criterion_that_fires_inside_a_round_is_not_asked_again(target, oracle, monkeypatch):
    """A criterion that fired on a token inside a round was called once more on the same sequence by the loop's test;
    one that fires only once then said no, and generation ran on past where plain generate stops."""
    module = importlib.import_module("hf_xpress.tree_decoding")
    fired_inside = []
    first_stop = module.first_stop
    monkeypatch.setattr(module, "first_stop", lambda *a: fired_inside.append(first_stop(*a)) or fired_inside[-1])
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=5)
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)
    oracle["continuation"] = long_run[0]
    new = long_run[0, ids.shape[1]:].tolist()
    inside = 0
    for i in (7, 15, 24, 33, 41):
        token = new[i]
        plain = plain_fired_once(target, ids, new, token)
        ours = _tree_generate(target, ids, drafter, 3, max_new_tokens=60,
                              stopping_criteria=StoppingCriteriaList([FiresOnce(token)]))
        assert torch.equal(ours, plain), token
        inside += fired_inside[-1] is not None  # the criterion fired before the round's last token
    assert inside >= 2, inside


def test_model_inputs_the_tree_would_drop_are_refused(target):
    """tree_decoding runs the target on token ids alone: another model input (a vision-language target's
    pixel_values, say) was dropped silently."""
    drafter = tiny_drafter(target, "xpress")
    ids = torch.randint(0, 126, (1, 6))
    # generate() refuses inputs a text-only target's forward does not take; a vision-language target's it passes on
    config = GenerationConfig(max_length=10, do_sample=False, num_beams=1, num_return_sequences=1)
    with pytest.raises(ValueError, match="would drop these inputs: image_grid_thw, pixel_values"):
        tree_decoding(target, ids, LogitsProcessorList(), StoppingCriteriaList([MaxLengthCriteria(10)]), config, drafter=drafter,
                      tree_width=2, pixel_values=torch.zeros(1, 3, 4, 4), image_grid_thw=torch.ones(1, 3),
                      attention_mask=torch.ones_like(ids), rope_deltas=None)


@pytest.mark.parametrize("refiner", REFINERS)
def test_accepted_side_branches_keep_exactly_the_path_in_both_caches(target, refiner, oracle):
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=5)
    ids = torch.randint(0, 126, (1, 9))
    long_run = target.generate(ids, max_new_tokens=80, do_sample=False)
    oracle["continuation"] = long_run[0]
    cache = DynamicCache(config=target.config)
    ours = _tree_generate(target, ids, drafter, 3, max_new_tokens=80, cache=cache)
    assert torch.equal(ours, long_run)
    stats = drafter.stats
    side = sum(1 for (branch, good), a in zip(oracle["branches"], stats.accepted) if branch > 0 and a > 0)
    assert side >= 5 and max(stats.accepted) == 5 and stats.tau > 2

    # the target's cache: every committed token but the last, as one forward over them would give
    _assert_cache_matches_a_fresh_forward(target, cache, ours)

    # the drafter's cache: the target features of the verified tokens before the last anchor, in order
    generator = oracle["generators"][-1]
    assert_drafter_context_is(generator, target, ours)

    # EOS inside an accepted branch: the output stops exactly where plain generate stops
    eos = int(long_run[0, ids.shape[1] + 23])
    plain = target.generate(ids, max_new_tokens=80, do_sample=False, eos_token_id=eos)
    assert torch.equal(_tree_generate(target, ids, drafter, 3, max_new_tokens=80, eos_token_id=eos), plain)
    assert plain.shape[1] < long_run.shape[1]

    # any stopping criterion fires at the same token as in plain generate, also in the middle of a branch
    stop = StopAt(int(long_run[0, ids.shape[1] + 31]))
    plain = target.generate(ids, max_new_tokens=80, do_sample=False, stopping_criteria=StoppingCriteriaList([stop]))
    ours = _tree_generate(target, ids, drafter, 3, max_new_tokens=80, stopping_criteria=StoppingCriteriaList([stop]))
    assert torch.equal(ours, plain) and plain.shape[1] < long_run.shape[1]


def test_random_trees_with_the_truth_anywhere_keep_exactly_the_path_in_both_caches(target, monkeypatch):
    """Dynamic trees of any shape (random parents), the target's true continuation planted along the path to a random
    node: every round accepts that whole path, wherever its rows lie in the block, and both caches stay exact."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=4)
    ids = torch.randint(0, 126, (1, 6))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)
    rng, planted, generators = random.Random(1), [], _capture_generators(monkeypatch)

    def propose_dynamic_tree(self, hidden, base_logits, lead_tokens, budget, width, vocab_ids=None):
        depth, size = base_logits.shape[1], rng.randint(1, budget)
        parents, depths = [], []
        for i in range(size):
            options = [-1] + [j for j in range(i) if depths[j] < depth]
            parents.append(rng.choice(options))
            depths.append(1 if parents[-1] < 0 else depths[parents[-1]] + 1)
        tokens = [rng.randrange(126) for _ in range(size)]
        node, path = rng.randrange(size), []
        while node >= 0:
            path.insert(0, node)
            node = parents[node]
        start = generators[-1].context_length + 1
        truth = long_run[0, start : start + len(path)].tolist()
        for node, token in zip(path, truth):
            tokens[node] = token
        on_path = set(path)
        for i in range(size):  # no other child of a path node (or of the anchor) may carry the true next token
            parent_depth = 0 if parents[i] < 0 else depths[parents[i]]
            if i not in on_path and (parents[i] < 0 or parents[i] in on_path) and parent_depth < len(truth) \
                    and tokens[i] == truth[parent_depth]:
                tokens[i] = (tokens[i] + 1) % 126
        planted.append(min(len(path), len(truth)))
        return torch.tensor(tokens), parents

    monkeypatch.setattr(XPressDrafterModel, "propose_dynamic_tree", propose_dynamic_tree)
    cache = DynamicCache(config=target.config)
    ours = _tree_generate(target, ids, drafter, 3, tree_budget=7, max_new_tokens=60, cache=cache)
    assert torch.equal(ours, long_run)
    accepted = drafter.stats.accepted
    assert accepted[:-1] == planted[: len(accepted) - 1] and sum(a >= 2 for a in accepted) >= 5
    _assert_cache_matches_a_fresh_forward(target, cache, ours)
    assert_drafter_context_is(generators[-1], target, ours)


class StopAt(StoppingCriteria):
    """Stops once `token` has been generated (a stand-in for stop strings and other custom criteria)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("refiner", REFINERS)
def test_prompt_lookup_rounds_verify_one_branch_and_stay_lossless(target, refiner):
    """With prompt_lookup_num_tokens, a round whose n-gram recurs verifies lookup's continuation as one branch (no
    drafter forward); the drafter's tree runs elsewhere and its context catches up on the lookup rounds' tokens."""
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=2)
    torch.manual_seed(1)
    looked = drafted = 0
    for i in range(5):
        phrase = torch.randint(0, 126, (1, 3 + i))
        ids = torch.cat([phrase, torch.randint(0, 126, (1, 2)), phrase, phrase[:, :2]], dim=1)
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        ours = _tree_generate(target, ids, drafter, 3, max_new_tokens=30, prompt_lookup_num_tokens=5)
        assert torch.equal(ours, plain)
        stats = drafter.stats
        for tokens, proposed, lookup in zip(stats.drafts, stats.proposed, stats.lookup):
            assert len(tokens) == proposed * (1 if lookup else 3) and (proposed <= 5 if lookup else proposed <= 2)
        looked, drafted = looked + sum(stats.lookup), drafted + stats.lookup.count(False)
    assert looked > 0 and drafted > 0


@pytest.mark.parametrize("refiner, budget", [(None, None), ("markov", 5), ("xpress", None), ("xpress", 5)])
def test_lookup_branch_joins_the_drafters_tree_every_round_and_stays_lossless(target, refiner, budget, monkeypatch):
    """With lookup_branch=True the drafter drafts every round; where lookup finds a continuation, the round verifies
    the drafter's tree plus lookup's branch, and the drafter's context stays exact."""
    drafter = tiny_drafter(target, refiner, num_assistant_tokens=2)
    generators = _capture_generators(monkeypatch)

    forwards = [0]
    original_forward = XPressCandidateGenerator._draft_forward

    def draft_forward(self, input_ids):
        forwards[-1] += 1
        return original_forward(self, input_ids)

    monkeypatch.setattr(XPressCandidateGenerator, "_draft_forward", draft_forward)
    torch.manual_seed(1)
    looked = 0
    for i in range(4):
        phrase = torch.randint(0, 126, (1, 3 + i))
        ids = torch.cat([phrase, torch.randint(0, 126, (1, 2)), phrase, phrase[:, :2]], dim=1)
        plain = target.generate(ids, max_new_tokens=30, do_sample=False)
        ours = _tree_generate(target, ids, drafter, 3, tree_budget=budget, max_new_tokens=30,
                              prompt_lookup_num_tokens=5, lookup_branch=True)
        assert torch.equal(ours, plain)
        stats = drafter.stats
        assert forwards[-1] == stats.rounds > 0  # the drafter drafted every round, lookup or not
        tree_size = 3 * 2 if budget is None else budget  # the drafter's nodes (2 drafts deep)
        for tokens, proposed, lookup in zip(stats.drafts, stats.proposed, stats.lookup):
            assert len(tokens) <= tree_size + (5 if lookup else 0) and proposed <= (5 if lookup else 2)
        looked += sum(stats.lookup)
        forwards.append(0)
        assert_drafter_context_is(generators[-1], target, ours)
    assert looked > 0
    with pytest.raises(ValueError, match="needs prompt_lookup_num_tokens"):
        _tree_generate(target, ids, drafter, 3, max_new_tokens=4, lookup_branch=True)


def test_a_round_accepts_the_longer_of_the_drafters_path_and_lookups_branch(target, monkeypatch):
    """The target's continuation planted along a random tree path (random length) and as a random prefix of lookup's
    branch: every round accepts the longer of the two, and both caches match fresh forwards."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=3)
    ids = torch.randint(0, 126, (1, 6))
    long_run = target.generate(ids, max_new_tokens=60, do_sample=False)
    truth_all = long_run[0].tolist()
    rng, expected, generators = random.Random(2), [], _capture_generators(monkeypatch)

    def wrong(token: int) -> int:
        return (token + 1 + rng.randrange(120)) % 126

    def propose_dynamic_tree(self, hidden, base_logits, lead_tokens, budget, width, vocab_ids=None):
        start = generators[-1].context_length + 1  # slot 1's position in the sequence
        truth = truth_all[start : start + base_logits.shape[1]]
        good = rng.randint(0, len(truth))
        chain = truth[:good] + [wrong(t) for t in truth[good:]]  # the drafter's path: right for `good` slots
        side = wrong(truth[0])  # and a wrong slot-1 sibling
        tokens, parents = (chain, chain_parents(1, len(chain))) if side == chain[0] else \
            (chain + [side], chain_parents(1, len(chain)) + [-1])
        state["tree_good"] = good
        return torch.tensor(tokens), parents

    state = {}

    def lookup_continuation(self, input_ids):
        start = input_ids.shape[1]
        room = self.main_model_max_length - start - 1
        truth = truth_all[start : start + min(5, room)]
        if not truth or rng.random() < 0.3:  # no n-gram found
            state["lookup_good"] = 0
            return []
        good = rng.randint(0, len(truth))
        state["lookup_good"] = good
        return truth[:good] + [wrong(t) for t in truth[good:]]

    original_record = XPressCandidateGenerator._record_round

    def record(self, drafts, passes, lookup, end, proposed=None):
        expected.append(max(state["tree_good"], state["lookup_good"]))
        return original_record(self, drafts, passes, lookup, end, proposed)

    monkeypatch.setattr(XPressCandidateGenerator, "lookup_continuation", lookup_continuation)
    monkeypatch.setattr(XPressCandidateGenerator, "_record_round", record)
    monkeypatch.setattr(XPressDrafterModel, "propose_dynamic_tree", propose_dynamic_tree)
    cache = DynamicCache(config=target.config)
    ours = _tree_generate(target, ids, drafter, 3, tree_budget=4, max_new_tokens=60, cache=cache,
                          prompt_lookup_num_tokens=5, lookup_branch=True)
    assert torch.equal(ours, long_run)
    accepted = drafter.stats.accepted
    assert accepted[:-1] == expected[: len(accepted) - 1]
    assert sum(a > 3 for a in accepted) >= 3  # lookup's branch, deeper than the drafter's tree, was accepted
    _assert_cache_matches_a_fresh_forward(target, cache, ours)
    assert_drafter_context_is(generators[-1], target, ours)


def test_add_branch_shares_the_nodes_it_agrees_with():
    tokens, parents = [5, 8, 6, 7], [-1, -1, 0, 0]  # anchor -> 5 -> {6, 7}; anchor -> 8
    assert add_branch(tokens, parents, [5, 7, 9, 4]) == ([5, 8, 6, 7, 9, 4], [-1, -1, 0, 0, 3, 4])
    assert add_branch(tokens, parents, [8]) == (tokens, parents)  # already there
    assert add_branch(tokens, parents, [3, 5]) == ([5, 8, 6, 7, 3, 5], [-1, -1, 0, 0, -1, 4])
    assert add_branch([], [], [1, 2]) == ([1, 2], [-1, 0])
    assert tokens == [5, 8, 6, 7] and parents == [-1, -1, 0, 0]  # the inputs are left alone
    merged = add_branch(tokens, parents, [5, 6, 1])
    assert merged == ([5, 8, 6, 7, 1], [-1, -1, 0, 0, 2])
    assert _walk(*merged, [5, 6, 0, 1, 0, 9]) == ([0, 1, 3, 5], [5, 6, 1, 9])


def _tree_sample_counts(target, drafter, prompt, width, samples, budget=None, **processing):
    counts, accepted, looked = torch.zeros([V] * 4), 0, 0
    torch.manual_seed(123)
    for _ in range(samples):
        out = target.generate(prompt, custom_generate=tree_decoding, drafter=drafter, tree_width=width,
                              tree_budget=budget, max_new_tokens=4, do_sample=True, **processing)
        counts[tuple(out[0, prompt.shape[1] :].tolist())] += 1
        accepted += sum(drafter.stats.accepted)
        looked += sum(drafter.stats.lookup)
    return counts, accepted, looked


@pytest.mark.parametrize("processing, width, refiner, budget", [
    (dict(top_k=0), 2, "xpress", None),
    (dict(temperature=0.7, top_k=3), 3, "markov", None),
    (dict(top_k=0), 2, "xpress", 5),
    (dict(top_k=0, prompt_lookup_num_tokens=2, lookup_branch=True), 2, "xpress", 3),  # + lookup's branch
])
def test_sampling_from_a_tree_keeps_the_target_distribution_and_a_wrong_sampler_is_caught(
    processing, width, refiner, budget, monkeypatch
):
    """4 new tokens (the prefill's, then rounds of branches of 2 drafts) sampled 1500 times: their joint (256 cells)
    must match the target's exact joint; the same test rejects a sampler that draws from a sharper distribution."""
    module = importlib.import_module("hf_xpress.tree_decoding")  # the package attribute of that name is the function

    target, drafter = _peaky_pair(seed=7, refiner=refiner)
    drafter.config.num_assistant_tokens = 2
    lookup = "lookup_branch" in processing
    prompt = torch.tensor([[1, 2, 0, 1, 2]] if lookup else [[1, 2, 0]])  # with lookup: n-grams that recur
    sampling = {k: v for k, v in processing.items() if k not in ("prompt_lookup_num_tokens", "lookup_branch")}
    exact = _exact_joint(target, prompt, 4, **sampling)
    counts, accepted, looked = _tree_sample_counts(target, drafter, prompt, width, 1500, budget, **processing)
    stat, dof = _chi2(counts, exact)
    assert stat < _bound(dof), (stat, dof)
    assert accepted > 100  # drafts really were accepted, from several branches
    assert (looked > 300) == lookup  # lookup's branch joined the tree in many rounds

    pick = module._pick
    monkeypatch.setattr(module, "_pick", lambda scores, sample: pick(scores * 1.5, sample))
    counts, _, _ = _tree_sample_counts(target, drafter, prompt, width, 500, budget, **processing)
    stat, dof = _chi2(counts, exact)
    assert stat > _bound(dof), (stat, dof)


def test_keep_cache_rows_moves_the_path_and_drops_the_rest():
    cache = DynamicCache()
    keys = torch.arange(10.0).view(1, 1, 10, 1).expand(1, 2, 10, 3).contiguous()
    cache.update(keys, keys + 100, 0)
    keep_cache_rows(cache, 4, [0, 3, 4])  # entries 4, 7, 8 -> 4, 5, 6
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 7, 8]
    assert cache.layers[0].values[0, 1, :, 0].tolist() == [100, 101, 102, 103, 104, 107, 108]
    keep_cache_rows(cache, 2, [0, 1])  # contiguous: a crop
    assert cache.get_seq_length() == 4


def test_tree_attention_mask_lets_a_token_see_only_its_ancestors():
    assert chain_parents(2, 2) == [-1, 0, -1, 2]
    mask = tree_attention_mask(chain_parents(2, 2), past=3, dtype=torch.float32)
    seen = (mask[0, 0] == 0).int().tolist()
    assert seen == [
        [1, 1, 1, 1, 0, 0, 0, 0],  # anchor: the cache and itself
        [1, 1, 1, 1, 1, 0, 0, 0],  # branch 0, slot 1
        [1, 1, 1, 1, 1, 1, 0, 0],  # branch 0, slot 2
        [1, 1, 1, 1, 0, 0, 1, 0],  # branch 1, slot 1
        [1, 1, 1, 1, 0, 0, 1, 1],  # branch 1, slot 2
    ]
    # any tree: node 2 hangs from node 0 beside node 1, node 3 from node 2
    parents = [-1, 0, 0, 2]
    assert node_depths(parents) == [1, 2, 2, 3]
    seen = (tree_attention_mask(parents, past=0, dtype=torch.bfloat16)[0, 0] == 0).int().tolist()
    assert seen == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]


def test_walk_follows_the_target_through_the_matching_branch():
    tokens, parents = [5, 6, 7, 8, 9, 10], chain_parents(2, 3)
    # rows: 0 anchor, 1-3 branch 0, 4-6 branch 1; the target picks 8 after the anchor, then 9, then 11
    choices = [8, 0, 0, 0, 9, 11, 0]
    assert _walk(tokens, parents, choices) == ([0, 4, 5], [8, 9, 11])
    assert _walk(tokens, parents, [3, 0, 0, 0, 0, 0, 0]) == ([0], [3])
    assert _walk(tokens, parents, [5, 6, 7, 2, 0, 0, 0]) == ([0, 1, 2, 3], [5, 6, 7, 2])
    # a bush: the anchor's children 5 and 8, node 0's children 6 and 7; the target goes 5 -> 7 -> its own 4
    assert _walk([5, 8, 6, 7], [-1, -1, 0, 0], [5, 0, 0, 0, 0]) == ([0, 1], [5, 0])
    assert _walk([5, 8, 6, 7], [-1, -1, 0, 0], [5, 7, 0, 0, 4]) == ([0, 1, 4], [5, 7, 4])


def test_unsupported_requests_are_clear_errors(target):
    drafter = tiny_drafter(target)
    ids = torch.randint(0, 126, (1, 5))
    with pytest.raises(ValueError, match="tree_budget must be at least 1"):
        _tree_generate(target, ids, drafter, 3, tree_budget=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="batch size 1"):
        _tree_generate(target, torch.randint(0, 126, (2, 5)), drafter, 2, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_beams and num_return_sequences must be 1, got 1 / 2"):
        target.generate(ids, custom_generate=tree_decoding, drafter=drafter, do_sample=True, num_return_sequences=2,
                        max_new_tokens=4)  # one prompt, expanded to two rows by generate: not a batch error
    with pytest.raises(ValueError, match="num_beams and num_return_sequences must be 1, got 2 / 1"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="needs drafter="):
        target.generate(ids, custom_generate=tree_decoding, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs drafter="):
        _tree_generate(target, ids, tiny_target("llama"), 2, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree_width must be at least 1"):
        _tree_generate(target, ids, drafter, 0, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree_width must be an integer, got None"):  # was int(None) inside
        _tree_generate(target, ids, drafter, None, max_new_tokens=4)
    # numpy / torch integers are integers (they were refused as "must be an integer, got np.int64(2)")
    assert torch.equal(_tree_generate(target, ids, drafter, np.int64(2), max_new_tokens=4, tree_budget=torch.tensor(4)),
                       _tree_generate(target, ids, drafter, 2, max_new_tokens=4, tree_budget=4))
    for bad in (torch.tensor(2.0), torch.tensor([2]), True):
        with pytest.raises(ValueError, match="tree_width must be an integer, got"):
            _tree_generate(target, ids, drafter, bad, max_new_tokens=4)
    with pytest.raises(ValueError, match="return_dict_in_generate"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, return_dict_in_generate=True)
    for schedule in ("cost", "heuristic"):  # a tree's depth is fixed: a moving draft count would be ignored
        drafter.config.num_assistant_tokens_schedule = schedule
        with pytest.raises(ValueError, match=f"its num_assistant_tokens_schedule '{schedule}' applies to chains"):
            _tree_generate(target, ids, drafter, 2, max_new_tokens=4)
    drafter.config.num_assistant_tokens_schedule = "constant"
    with pytest.raises(ValueError, match="assistant_ensemble_weight"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, assistant_ensemble_weight=0.5)
    with pytest.raises(ValueError, match="unpadded"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, attention_mask=torch.tensor([[0, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="pad_token_id occurring in the prompt"):  # transformers' mask, not the user's
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, pad_token_id=int(ids[0, 2]))
    for mode, options in (("contrastive_search", dict(penalty_alpha=0.6, top_k=4)),
                          ("dola_generation", dict(dola_layers="high"))):  # plain generate would load them from the Hub
        with pytest.raises(ValueError, match=f"decodes greedily or by sampling; .* ask for {mode}"):
            _tree_generate(target, ids, drafter, 2, max_new_tokens=4, **options)
    with pytest.raises(ValueError, match="does not take position_ids"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, position_ids=torch.tensor([[0, 0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="inputs_embeds is not supported"):  # a soft prompt with the ids: ignored
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, inputs_embeds=torch.randn(1, 5, 64))
    other = tiny_target("qwen3", num_hidden_layers=4)
    with pytest.raises(ValueError, match="built for another target"):
        _tree_generate(target, ids, tiny_drafter(other), 2, max_new_tokens=4)


def test_tree_streamer_gets_the_prompt_every_token_and_the_end(target):
    """generate() does not hand its `streamer` to a custom_generate callable; `tree_streamer=` is fed as `generate`
    feeds one (the prompt, then the new tokens in order, then `end()`), also when decoding fails."""
    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=3)
    ids = _prompts(4)[3]
    streamer = RecordingStreamer()
    out = _tree_generate(target, ids, drafter, 2, max_new_tokens=20, tree_streamer=streamer)
    assert torch.equal(out, target.generate(ids, max_new_tokens=20, do_sample=False))
    assert streamer.puts[0] == ids[0].tolist() and streamer.ended
    assert sum(streamer.puts[1:], []) == out[0, ids.shape[1]:].tolist() and len(streamer.puts) > 2
    from transformers import TextIteratorStreamer

    class Tokenizer:  # what TextIteratorStreamer reads of a tokenizer
        def decode(self, ids, **kwargs):
            return " ".join(map(str, ids))

    text = TextIteratorStreamer(Tokenizer(), skip_prompt=True)
    _tree_generate(target, ids, drafter, 2, max_new_tokens=6, tree_streamer=text)
    assert "".join(text).split() == [str(t) for t in target.generate(ids, max_new_tokens=6)[0, ids.shape[1]:].tolist()]
    broken = RecordingStreamer()
    with pytest.raises(ValueError, match="return_dict_in_generate"):  # refused before decoding: nothing to end
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, tree_streamer=broken, return_dict_in_generate=True)
    original = XPressDrafterModel.propose_tree

    def failing(*args, **kwargs):
        raise RuntimeError("drafter failed")

    XPressDrafterModel.propose_tree = failing
    try:
        with pytest.raises(RuntimeError, match="drafter failed"):
            _tree_generate(target, ids, drafter, 2, max_new_tokens=4, tree_streamer=broken)
    finally:
        XPressDrafterModel.propose_tree = original
    assert broken.ended  # a consumer iterating the streamer is released


def test_generates_own_streamer_and_stop_strings_reach_the_tree(target):
    """transformers hands a custom_generate callable neither `streamer` nor `tokenizer`; hf_xpress's install() hook
    passes them to tree_decoding, so `streamer=` (prompt once, every token, `end()`) and `stop_strings=` with
    `tokenizer=` behave as for plain generate. Without the hook the streamer would get the prompt and never end."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    drafter = tiny_drafter(target, "xpress", num_assistant_tokens=3)
    ids = _prompts(4)[3]
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)
    streamer = RecordingStreamer()
    out = _tree_generate(target, ids, drafter, 2, max_new_tokens=16, streamer=streamer)
    assert torch.equal(out, plain)
    assert streamer.puts[0] == ids[0].tolist() and streamer.ended
    assert sum(streamer.puts[1:], []) == out[0, ids.shape[1]:].tolist()
    with pytest.raises(ValueError, match="either generate's streamer= or tree_decoding's tree_streamer="):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4, streamer=RecordingStreamer(),
                       tree_streamer=RecordingStreamer())

    # (StopStringCriteria decodes each token after a fixed prefix, "abcdef", which must be a token of its own)
    backend = Tokenizer(WordLevel({**{f"<{i}>": i for i in range(128)}, "abcdef": 128}, unk_token="<0>"))
    backend.pre_tokenizer, backend.decoder = Whitespace(), decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    new = plain[0, ids.shape[1]:].tolist()
    stop = f"<{new[5]}>"  # plain generate stops at this token's first occurrence
    expected = target.generate(ids, max_new_tokens=16, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    assert expected.shape[1] < plain.shape[1]
    out = _tree_generate(target, ids, drafter, 2, max_new_tokens=16, stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(out, expected)


def test_a_sliding_window_target_is_refused_where_the_window_bites():
    """A sequence longer than the window is refused, also when the caller passes a plain DynamicCache(), whose layers
    are full-attention whatever the model: the tree's 4D mask then replaced the sliding-window mask and verify
    forwards attended past the window (other tokens than plain generate, gaps far from ties; found by a helper's
    sweep)."""
    target = tiny_target("qwen3", layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=8,
                         use_sliding_window=True)
    drafter = tiny_drafter(target)
    for cache in ({}, {"cache": DynamicCache()}):
        with pytest.raises(ValueError, match="DynamicCache of full-attention layers.*max_length 9 is past window 8"):
            _tree_generate(target, torch.randint(0, 126, (1, 5)), drafter, 2, max_new_tokens=4, **cache)
        assert cache.get("cache", DynamicCache()).get_seq_length() == 0  # refused before the prefill


def test_a_refused_callers_cache_is_left_as_it_was():
    """A cache the tree refuses is not changed: its covering sliding layers were turned into full ones before the
    check refused another layer, and a later plain generate with it crashed (a helper's review)."""
    target = tiny_target("qwen3", layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=8,
                         use_sliding_window=True)
    cache = DynamicCache(config=target.config)
    empty = torch.zeros(1, 2, 0, 16)
    cache.layers[2].lazy_initialization(empty, empty)  # started, still empty: a layer the tree cannot take
    before = [type(layer) for layer in cache.layers]
    with pytest.raises(ValueError, match="DynamicCache of full-attention layers"):
        _tree_generate(target, torch.randint(0, 126, (1, 3)), tiny_drafter(target), 2, max_new_tokens=4, cache=cache)
    assert [type(layer) for layer in cache.layers] == before


@pytest.mark.parametrize("own_cache", [False, True])
def test_a_sliding_window_target_is_served_while_the_sequence_fits_its_window(oracle, own_cache):
    """Mistral, Gemma 2 / 3, Qwen2 with a window: trees ran on none of them. While max_length fits the window, a query
    sees every earlier key under either mask, so their layers are kept as full-attention ones: exact, with rounds that
    accept drafts from side branches, and both caches hold exactly the accepted path."""
    target = tiny_target("qwen3", layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=64,
                         use_sliding_window=True)
    drafter = tiny_drafter(target, num_assistant_tokens=5)
    ids = torch.randint(0, 126, (1, 9), generator=torch.Generator().manual_seed(4))
    plain = target.generate(ids, max_new_tokens=55, do_sample=False)  # 64 tokens: the whole window
    oracle["continuation"] = plain[0]
    cache = DynamicCache(config=target.config) if own_cache else None  # the model's own layout: sliding layers
    ours = _tree_generate(target, ids, drafter, 3, max_new_tokens=55, **({"cache": cache} if own_cache else {}))
    assert torch.equal(ours, plain) and max(drafter.stats.accepted) >= 3
    if own_cache:  # the caller's object holds the path (its empty sliding layers became full ones)
        _assert_cache_matches_a_fresh_forward(target, cache, ours)
    assert_drafter_context_is(oracle["generators"][-1], target, ours)


@pytest.mark.parametrize("kind", ["bloom", "falcon", "mpt"])
def test_an_alibi_target_is_refused_with_the_reason(kind):
    """ALiBi biases come from a 2D padding mask (BLOOM, Falcon) or each key's index in the cache (MPT), not from the
    tree's 4D mask and depth positions: trees crashed inside transformers on the first two and silently returned other
    tokens than plain generate on MPT. Chains on BLOOM / Falcon stay exact (MPT has no cache for any assistant)."""
    from transformers import (BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig,
                              MptForCausalLM)

    torch.manual_seed(0)
    none = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = {
        "bloom": lambda: BloomForCausalLM(BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4, **none)),
        "falcon": lambda: FalconForCausalLM(FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, alibi=True, **none)),
        "mpt": lambda: MptForCausalLM(MptConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=256,
                                                **none)),
    }[kind]().eval()
    ids = torch.randint(0, 126, (1, 5))
    drafter = tiny_drafter(target)
    with pytest.raises(ValueError, match=f"which {kind}'s ALiBi attention does not take"):
        _tree_generate(target, ids, drafter, 2, max_new_tokens=4)
    if kind != "mpt":
        assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False),
                           target.generate(ids, max_new_tokens=12, do_sample=False))


def test_a_callers_static_cache_is_refused_before_the_prefill(target):
    """The refusal came after the prefill had already filled the caller's cache."""
    from transformers import StaticCache

    cache = StaticCache(config=target.config, max_cache_len=64)
    with pytest.raises(ValueError, match="tree decoding needs a DynamicCache of full-attention layers"):
        _tree_generate(target, torch.randint(0, 126, (1, 5)), tiny_drafter(target), 2, max_new_tokens=4, cache=cache)
    assert cache.get_seq_length() == 0


def test_package_exports_tree_decoding():
    assert hf_xpress.tree_decoding is tree_decoding


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_dynamic_tree_with_a_shortlist_ranks_by_the_shortlists_own_softmax(target, temperature):
    """With `refiner_shortlist` = M the refiner re-scores each slot's M best drafter tokens, and each slot's
    probabilities are a softmax over those M (renormalised): the tree is the `budget` most probable shortlisted paths
    under it (brute force over all of them; width = M makes every shortlisted path a candidate). Keeping the rest of
    the vocabulary's mass at the drafter's own scores instead ranks differently, and measured worse for xPress
    (docs/benchmarks.md, twenty-second session), so this pins the ranking down."""
    M = 8
    drafter = tiny_drafter(target, "xpress", tree_temperature=temperature, refiner_shortlist=M)
    torch.manual_seed(0)
    hidden, base, lead = torch.randn(1, 16, 64), torch.randn(1, 2, 128), [4, 9]
    tokens, parents = drafter.propose_dynamic_tree(hidden, base, torch.tensor([lead]), budget=12, width=M)
    paths = []
    for i in range(len(tokens)):
        paths.append((*(paths[parents[i]] if parents[i] >= 0 else ()), int(tokens[i])))
    short = [base[0, k].topk(M).indices for k in range(2)]

    def log_probs(k: int, prev: list[int], renormalised: bool) -> torch.Tensor:  # slot k + 1's, over all 128 tokens
        delta = drafter.refiner(hidden, torch.tensor([prev + [0] * (16 - len(prev))]))[0, k]
        scores = base[0, k] if not renormalised else torch.full_like(base[0, k], float("-inf"))
        scores = scores.clone()
        scores[short[k]] = base[0, k, short[k]] + delta[short[k]]
        return torch.log_softmax(scores / temperature, -1)

    def best_paths(renormalised: bool) -> set:
        slot1 = log_probs(0, lead, renormalised)
        score = {(a,): float(slot1[a]) for a in short[0].tolist()}
        for a in short[0].tolist():
            slot2 = log_probs(1, lead + [a], renormalised)
            score.update({(a, b): float(slot1[a] + slot2[b]) for b in short[1].tolist()})
        return set(sorted(score, key=lambda p: (-score[p], len(p)))[:12])

    assert set(paths) == best_paths(True)
    assert best_paths(False) != best_paths(True)  # the whole vocabulary's mass would pick another tree
