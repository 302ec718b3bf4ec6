"""XPressDrafterConfig / XPressDrafterModel: shapes, the dFlash rules, the refiners and the Jacobi property."""

from __future__ import annotations

import json

import pytest
import torch
from transformers.cache_utils import DynamicCache

from hf_xpress import XPressDrafterConfig, XPressDrafterModel, default_target_layer_ids
from hf_xpress.modeling_xpress import XPressMarkovHead, XPressRefiner, _full_vocabulary

from conftest import TINY, tiny_drafter, tiny_target

VOCAB = TINY["vocab_size"]

B = 16


# ---- configuration ---------------------------------------------------------------------------------------------------


def test_default_target_layer_ids_follow_the_dflash_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab/Qwen3-8B-DFlash-b16
    assert default_target_layer_ids(30, 1) == [15]
    assert default_target_layer_ids(30, 2) == [1, 27]
    assert XPressDrafterConfig().target_layer_ids == [1, 9, 17, 25, 33]
    # shallow targets (L - 3 < 2): every drafter layer reads layer 1, a valid id (the spread gave 1, -1 for L = 2)
    assert default_target_layer_ids(2, 2) == [1, 1] and default_target_layer_ids(3, 3) == [1, 1, 1]
    assert default_target_layer_ids(5, 2) == [1, 2]
    for layers in range(1, 12):
        for drafts in range(1, 6):
            assert all(0 <= i < layers for i in default_target_layer_ids(layers, drafts)), (layers, drafts)
    shallow = tiny_target("qwen3", num_hidden_layers=2)
    assert XPressDrafterModel.from_target(shallow, num_hidden_layers=2).config.target_layer_ids == [1, 1]


def test_from_target_derives_every_target_field(target):
    drafter = XPressDrafterModel.from_target(target, num_hidden_layers=3, mask_token_id=5)
    text = target.config
    c = drafter.config
    assert (c.vocab_size, c.hidden_size, c.target_hidden_size) == (text.vocab_size, text.hidden_size, text.hidden_size)
    assert c.num_target_layers == text.num_hidden_layers == 6
    assert c.target_layer_ids == default_target_layer_ids(6, 3)
    assert c.target_model_type == text.model_type
    assert drafter.fc.weight.shape == (64, 3 * 64)
    assert not any("embed" in n or "lm_head" in n for n in drafter.state_dict())


@pytest.mark.parametrize("kind, rope", [
    ("llama", {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512}),
    ("qwen3", {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 4.0, "original_max_position_embeddings": 1024}),
    ("llama", {"rope_type": "default", "rope_theta": 20_000.0}),
])
def test_from_target_rotates_positions_as_the_target_does(tmp_path, kind, rope):
    """The drafter's RoPE is the target's, theta and scaling alike, also after a save/load round trip: its context
    keys come from the target's hidden states at the target's positions."""
    target = tiny_target(kind, rope_parameters=rope, max_position_embeddings=4096)
    drafter = XPressDrafterModel.from_target(target, num_hidden_layers=1, mask_token_id=5)
    drafter.save_pretrained(tmp_path)
    loaded = XPressDrafterModel.from_pretrained(tmp_path)
    x, positions = torch.zeros(1, 5, 64), torch.tensor([[0, 100, 1000, 3000, 4095]])
    expected = target.model.rotary_emb(x, positions)
    for model in (drafter, loaded):
        assert model.config.rope_parameters["rope_type"] == rope["rope_type"]
        for got, want in zip(model.rotary_emb(x, positions), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("rope_type", ["default", "linear"])
def test_drafter_rotates_whole_heads_under_a_partially_rotating_target(tmp_path, caplog, rope_type):
    """A target that rotates part of each head (Phi, GLM, StableLM) gets a drafter that rotates whole heads, as the
    drafter always did with the default RoPE: `partial_rotary_factor` is not copied (a scaled RoPE read it, built
    frequencies for fewer dimensions than the heads have and crashed in the drafter's attention), and a config that
    names one drops it with a warning."""
    import transformers as tf
    from transformers.utils import logging as hf_logging

    rope = {"rope_type": rope_type, "rope_theta": 10_000.0, "partial_rotary_factor": 0.5,
            **({"factor": 2.0} if rope_type == "linear" else {})}
    torch.manual_seed(0)
    target = tf.PhiForCausalLM(tf.PhiConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=256,
                                            rope_parameters=dict(rope))).eval()
    drafter = XPressDrafterModel.from_target(target, num_hidden_layers=1, mask_token_id=127)
    assert "partial_rotary_factor" not in drafter.config.rope_parameters
    assert drafter.rotary_emb.inv_freq.shape == (drafter.config.head_dim // 2,)
    ids = torch.randint(0, 127, (1, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False),
                       target.generate(ids, max_new_tokens=12, do_sample=False))
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = rope  # as a drafter built by an earlier version saved it
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_logging.enable_propagation()
    hf_logging.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        loaded = XPressDrafterModel.from_pretrained(tmp_path)
    assert "partial_rotary_factor 0.5 (rope_parameters) dropped" in caplog.text
    assert loaded.config.rope_parameters == drafter.config.rope_parameters
    torch.testing.assert_close(loaded.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq, rtol=0, atol=0)
    assert rope["partial_rotary_factor"] == 0.5  # the caller's dict is not changed


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hidden_size=64, target_hidden_size=32), "must equal target_hidden_size"),
        (dict(refiner="tree"), "refiner must be one of"),
        (dict(vocab_size=100, mask_token_id=100), "mask_token_id 100 is outside the vocabulary"),
        (dict(num_target_layers=6, target_layer_ids=[1, 6]), r"target_layer_ids \[6\] are outside"),
        (dict(block_size=1), "block_size must be >= 2"),
        (dict(jacobi_passes=-1), "jacobi_passes must be >= 0"),
        (dict(block_size=16, num_assistant_tokens=16), r"num_assistant_tokens must be None or in \[1, block_size - 1 = 15\]"),
        (dict(num_assistant_tokens=0), "num_assistant_tokens must be None or in"),
        (dict(num_assistant_tokens_schedule="adaptive"), "num_assistant_tokens_schedule must be one of"),
        (dict(assistant_confidence_threshold=1.0), r"assistant_confidence_threshold must be in \[0, 1\)"),
        (dict(assistant_confidence_threshold=None), "assistant_confidence_threshold must be int or float, got None"),
        (dict(jacobi_passes="2"), "jacobi_passes must be int, got '2'"),
        (dict(jacobi_early_stop=1), "jacobi_early_stop must be bool, got 1"),
        (dict(num_assistant_tokens=True), "num_assistant_tokens must be int or None, got True"),
        (dict(tree_temperature=0.0), "tree_temperature must be a positive number, got 0.0"),
        (dict(tree_temperature=float("nan")), "tree_temperature must be a positive number, got nan"),
        (dict(tree_temperature="1.5"), "tree_temperature must be int or float, got '1.5'"),
    ],
)
def test_config_rejects_inconsistent_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        XPressDrafterConfig(**kwargs)


def test_refiner_size_at_qwen3_8b_scale_matches_the_paper():
    """~80.5M parameters, 96.6% of them in w1 and w2 (spec section 4)."""
    config = XPressDrafterConfig()  # Qwen3-8B-DFlash-b16 sizes, r = 256
    with torch.device("meta"):
        refiner = XPressRefiner(config)
    total = sum(p.numel() for p in refiner.parameters())
    io = refiner.w1.weight.numel() + refiner.w2.weight.numel()
    assert abs(total / 1e6 - 80.5) < 0.1
    assert abs(io / total - 0.966) < 0.001


# ---- refiner ---------------------------------------------------------------------------------------------------------


def test_mixer_is_the_masked_sum_plus_residual():
    torch.manual_seed(0)
    refiner = XPressRefiner(XPressDrafterConfig(vocab_size=50, hidden_size=32, refiner_rank=8, block_size=5, mask_token_id=1))
    refiner.mix.L.data.normal_()
    x = torch.randn(3, 5, 8)
    L = refiner.mix.L.detach()
    expected = x.clone()
    for k in range(5):
        for j in range(k + 1):
            expected[:, k] += L[:, k, j] * x[:, j]
    torch.testing.assert_close(refiner.mix(x), expected)


def test_refiner_is_strictly_causal_in_tokens():
    """Slot k's bias depends on the tokens before slot k only: prev_tokens[:, :k+1]."""
    drafter = tiny_drafter(tiny_target("qwen3"))
    hidden = torch.randn(1, B, 64)
    prev = torch.randint(0, 128, (1, B))
    base = drafter.refiner(hidden, prev)
    for j in range(1, B):
        changed = prev.clone()
        changed[0, j] = (changed[0, j] + 1) % 128
        delta = drafter.refiner(hidden, changed)
        torch.testing.assert_close(delta[:, : j - 1], base[:, : j - 1])  # slots < j unchanged
        assert not torch.allclose(delta[:, j - 1], base[:, j - 1])  # slot j reads the token before it


def _sequential_xpress(drafter, hidden, base_logits, lead, noise=None):
    """Left-to-right decode of the xPress refiner, one slot at a time (the Jacobi fixed point)."""
    tokens = torch.zeros(1, B - 1, dtype=torch.long)
    for k in range(1, B):
        prev = torch.cat([lead, tokens[:, :-1]], dim=1)
        scores = base_logits[:, k - 1] + drafter.refiner(hidden, prev)[:, k - 1]
        if noise is not None:
            scores = scores + noise[:, k - 1]
        tokens[0, k - 1] = scores.argmax(-1)
    return tokens


@pytest.mark.parametrize("sample", [False, True])
def test_jacobi_reaches_the_sequential_decode_and_k0_is_the_drafter_argmax(sample):
    torch.manual_seed(3)
    drafter = tiny_drafter(tiny_target("llama"))
    hidden = torch.randn(1, B, 64)
    base_logits = torch.randn(1, B - 1, 128) * 2
    lead = torch.randint(0, 128, (1, 2))
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128))) if sample else None
    sequential = _sequential_xpress(drafter, hidden, base_logits, lead, noise)
    seed = (base_logits + (0 if noise is None else noise)).argmax(-1)
    k0 = drafter.propose(hidden, base_logits, lead, passes=0, noise=noise)
    assert torch.equal(k0.tokens, seed) and k0.passes == 0
    full = drafter.propose(hidden, base_logits, lead, passes=B - 1, early_stop=False, noise=noise)
    assert torch.equal(full.tokens, sequential)
    assert not torch.equal(sequential, seed)  # the refiner really changed the block
    # the returned logits are the ones the tokens were drawn from (q used in rejection sampling)
    assert torch.equal((full.logits + (0 if noise is None else noise)).argmax(-1), full.tokens)
    # after k passes the first k slots are exact
    for k in range(1, B - 1):
        partial = drafter.propose(hidden, base_logits, lead, passes=k, early_stop=False, noise=noise)
        assert torch.equal(partial.tokens[:, :k], sequential[:, :k])


@pytest.mark.parametrize(
    "refiner, shortlist, early_stop",
    [("xpress", None, True), ("xpress", None, False), ("xpress", 6, True), ("markov", None, True), ("markov", 6, True),
     (None, None, True)],
)
def test_a_proposal_for_the_first_s_slots_is_the_full_blocks_first_s(refiner, shortlist, early_stop):
    """Submitting fewer drafts (`num_assistant_tokens`) computes logits for S < B-1 slots only; the refiners are causal,
    so tokens and logits equal the first S slots of the full block's proposal (greedy and sampled)."""
    torch.manual_seed(21)
    drafter = tiny_drafter(tiny_target("llama"), refiner, refiner_shortlist=shortlist)
    hidden = torch.randn(1, B, 64)
    base_logits = torch.randn(1, B - 1, 128) * 2
    lead = torch.randint(0, 128, (1, 2))
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128)))
    for sample in (None, noise):
        full = drafter.propose(hidden, base_logits, lead, passes=4, early_stop=early_stop, noise=sample)
        for s in (1, 2, 5, B - 2):
            part = drafter.propose(
                hidden, base_logits[:, :s], lead, passes=4, early_stop=early_stop,
                noise=None if sample is None else sample[:, :s],
            )
            assert torch.equal(part.tokens, full.tokens[:, :s]), s
            torch.testing.assert_close(part.logits, full.logits[:, :s])
            if refiner == "xpress" and not early_stop:  # S slots are final after S passes (locking)
                assert part.passes == min(4, s)


@pytest.mark.parametrize("passes", [1, 2, 4, 6, 15])
def test_early_stop_and_lock_give_exactly_the_k_pass_result(passes):
    torch.manual_seed(passes)
    drafter = tiny_drafter(tiny_target("qwen3"))
    for _ in range(5):
        hidden = torch.randn(1, B, 64)
        base_logits = torch.randn(1, B - 1, 128) * 3
        lead = torch.randint(0, 128, (1, 2))
        plain = drafter.propose(hidden, base_logits, lead, passes=passes, early_stop=False)
        fast = drafter.propose(hidden, base_logits, lead, passes=passes, early_stop=True)
        assert torch.equal(plain.tokens, fast.tokens)
        torch.testing.assert_close(plain.logits, fast.logits)
        assert fast.passes <= plain.passes == passes


def test_markov_head_decodes_left_to_right():
    torch.manual_seed(4)
    drafter = tiny_drafter(tiny_target("qwen3"), refiner="markov")
    assert isinstance(drafter.refiner, XPressMarkovHead)
    base_logits = torch.randn(1, B - 1, 128)
    lead = torch.randint(0, 128, (1, 2))
    out = drafter.propose(torch.randn(1, B, 64), base_logits, lead)
    prev = lead[:, 1]
    for k in range(B - 1):
        expected = (base_logits[:, k] + drafter.refiner(prev[:, None])[:, 0]).argmax(-1)
        assert out.tokens[0, k] == expected[0]
        prev = expected
    assert out.passes == B - 1


# ---- drafter forward -------------------------------------------------------------------------------------------------


def _features(target, ids, layer_ids):
    out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def test_block_attends_bidirectionally_and_context_incrementally(target):
    """Feeding the context in pieces through the cache equals one forward over all of it."""
    drafter = tiny_drafter(target)
    ids = torch.randint(0, 127, (1, 20))
    feats = _features(target, ids, drafter.config.target_layer_ids)
    block = target.get_input_embeddings()(torch.tensor([[5] + [127] * (B - 1)]))
    one_shot = drafter(block, feats, position_ids=torch.arange(20 + B)[None]).last_hidden_state

    cache = DynamicCache()
    for lo, hi in [(0, 7), (7, 8), (8, 20)]:
        out = drafter(block, feats[:, lo:hi], position_ids=torch.arange(lo, hi + B)[None], cache=cache)
        cache.crop(-B)
    torch.testing.assert_close(out.last_hidden_state, one_shot, rtol=1e-4, atol=1e-5)

    # bidirectional inside the block: the last slot's input changes the first slot's output
    changed = block.clone()
    changed[:, -1] += 1.0
    again = drafter(changed, feats, position_ids=torch.arange(20 + B)[None]).last_hidden_state
    assert not torch.allclose(again[:, 0], one_shot[:, 0])


def test_boolean_mask_hides_what_it_masks(target):
    drafter = tiny_drafter(target)
    feats = _features(target, torch.randint(0, 127, (1, 12)), drafter.config.target_layer_ids)
    block = torch.randn(1, B, 64)
    mask = torch.ones(1, 1, B, 12 + B, dtype=torch.bool)
    mask[..., 6:12] = False  # hide context rows 6..11
    pos = torch.arange(12 + B)[None]
    ref = drafter(block, feats, attention_mask=mask, position_ids=pos).last_hidden_state
    noisy = feats.clone()
    noisy[:, 6:] += torch.randn_like(noisy[:, 6:])
    out = drafter(block, noisy, attention_mask=mask, position_ids=pos).last_hidden_state
    torch.testing.assert_close(out, ref)


def test_context_of_the_wrong_width_is_a_clear_error(target):
    drafter = tiny_drafter(target)
    with pytest.raises(ValueError, match="context_hidden_states has width 64"):
        drafter(torch.randn(1, B, 64), torch.randn(1, 3, 64))


# ---- graph-friendly fast path (issue: GPU latency) --------------------------------------------------------------------


@pytest.mark.parametrize("shortlist", [None, 5])
@pytest.mark.parametrize("sample", [False, True])
def test_fixed_pass_refinement_compiles_without_graph_breaks_and_matches_the_eager_loop(sample, shortlist):
    torch.manual_seed(9)
    drafter = tiny_drafter(tiny_target("qwen3"), refiner_shortlist=shortlist)
    hidden = torch.randn(1, B, 64)
    base_logits = torch.randn(1, B - 1, 128) * 2
    lead = torch.randint(0, 128, (1, 2))
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128))) if sample else None
    for passes, slots in ((1, B - 1), (4, B - 1), (6, B - 1), (4, 3)):  # 3: fewer drafts than the block has slots
        base_logits, noise = base_logits[:, :slots], None if noise is None else noise[:, :slots]
        eager = drafter.propose(hidden, base_logits, lead, passes=passes, early_stop=False, noise=noise)
        early = drafter.propose(hidden, base_logits, lead, passes=passes, early_stop=True, noise=noise)
        drafter.enable_fast_refine(mode=None, backend="aot_eager")  # fullgraph=True: a graph break is an error
        compiled, calls = drafter._fast_refine, []
        drafter._fast_refine = lambda *args: calls.append(1) or compiled(*args)
        try:
            fast = drafter.propose(hidden, base_logits, lead, passes=passes, early_stop=False, noise=noise)
        finally:
            drafter.disable_fast_refine()
        assert calls == [1] and fast.tokens.shape == (1, slots)  # the compiled loop ran
        assert torch.equal(eager.tokens, fast.tokens) and torch.equal(eager.tokens, early.tokens)
        torch.testing.assert_close(eager.logits, fast.logits)
        torch.testing.assert_close(eager.logits, early.logits)
        if shortlist:  # -inf outside each slot's shortlist, and the drafts inside it
            assert int(torch.isfinite(fast.logits).sum(-1).max()) == shortlist


@pytest.mark.parametrize("refiner", ["xpress", "markov", None])
@pytest.mark.parametrize("shortlist", [None, 4])
@pytest.mark.parametrize("sample", [False, True])
def test_proposals_on_the_draft_vocabulary_equal_those_on_the_whole_vocabulary(refiner, shortlist, sample):
    """Generation passes only the draft vocabulary's columns (`draft_scores`, `vocab_ids`): same tokens, same logits
    (-inf for every other token) and same log-probabilities as whole-vocabulary logits (`draft_logits`), on every
    path: seed, fixed and early-stopped Jacobi passes, the Markov head, shortlists, sampling, the compiled loop."""
    torch.manual_seed(5)
    drafter = tiny_drafter(tiny_target("llama"), refiner, refiner_shortlist=shortlist)
    for weight in [] if refiner is None else drafter.refiner.parameters():  # a bias large enough to move drafts
        weight.data.normal_(0, 0.5)
    ids = torch.arange(1, 128, 3)
    hidden, lead = torch.randn(1, B, 64), torch.randint(0, 128, (1, 2))
    scores = torch.randn(1, B - 1, len(ids)) * 2
    whole = _full_vocabulary(scores, ids, 128)
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128))) if sample else None
    compact_noise = None if noise is None else noise[..., ids]
    runs = [(0, False, False), (3, False, False), (15, True, False)]
    if refiner == "xpress":
        runs.append((4, False, True))
    for passes, early_stop, compiled in runs:
        if compiled:
            drafter.enable_fast_refine(mode=None, backend="aot_eager")
        try:
            a = drafter.propose(hidden, whole, lead, passes=passes, early_stop=early_stop, noise=noise)
            b = drafter.propose(hidden, scores, lead, passes=passes, early_stop=early_stop, noise=compact_noise,
                                vocab_ids=ids)
        finally:
            drafter.disable_fast_refine()
        assert torch.equal(a.tokens, b.tokens) and a.passes == b.passes, (passes, early_stop, compiled)
        assert set(b.tokens.flatten().tolist()) <= set(ids.tolist())
        torch.testing.assert_close(b.token_log_probs(), a.token_log_probs())
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)  # logits reach ~1e6 here
    if refiner is not None:  # the refiner really moved the drafts off the seed
        assert not torch.equal(b.tokens, ids[(scores + (0 if noise is None else compact_noise)).argmax(-1)])
    with pytest.raises(ValueError, match="logits processors need whole-vocabulary base logits"):
        drafter.propose(hidden, scores, lead, vocab_ids=ids, logits_hook=lambda s, start, cond: s)


def test_fast_refine_with_inductor_on_cpu():
    """The real compiler (C++ kernels on CPU): same drafts as the eager loop, full vocabulary and shortlist."""
    torch.manual_seed(9)
    drafter = tiny_drafter(tiny_target("qwen3"))
    hidden, base_logits, lead = torch.randn(1, B, 64), torch.randn(1, B - 1, 128) * 2, torch.randint(0, 128, (1, 2))
    for shortlist in (None, 5):
        drafter.config.refiner_shortlist = shortlist
        eager = drafter.propose(hidden, base_logits, lead, passes=4, early_stop=False)
        drafter.enable_fast_refine(mode=None)
        try:
            fast = drafter.propose(hidden, base_logits, lead, passes=4, early_stop=False)
        finally:
            drafter.disable_fast_refine()
        assert torch.equal(eager.tokens, fast.tokens)
        torch.testing.assert_close(eager.logits, fast.logits, rtol=1e-4, atol=1e-4)


def test_fast_refine_needs_an_xpress_refiner():
    with pytest.raises(ValueError, match="needs an xPress refiner"):
        tiny_drafter(tiny_target("qwen3"), refiner="markov").enable_fast_refine()


# ---- shortlist: the refiner's bias read for the drafter's top-M tokens only ----------------------------------------


@pytest.mark.parametrize("sample", [False, True])
def test_shortlisted_jacobi_reaches_the_shortlisted_sequential_decode(sample):
    torch.manual_seed(11)
    drafter = tiny_drafter(tiny_target("llama"), refiner_shortlist=8)
    hidden = torch.randn(1, B, 64)
    base_logits = torch.randn(1, B - 1, 128) * 2
    lead = torch.randint(0, 128, (1, 2))
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128))) if sample else None
    candidates = base_logits.topk(8, dim=-1).indices
    # left to right, each slot choosing among its 8 candidates
    tokens = torch.zeros(1, B - 1, dtype=torch.long)
    for k in range(1, B):
        prev = torch.cat([lead, tokens[:, :-1]], dim=1)
        scores = base_logits[:, k - 1] + drafter.refiner(hidden, prev)[:, k - 1]
        if noise is not None:
            scores = scores + noise[:, k - 1]
        tokens[0, k - 1] = candidates[0, k - 1, scores[0, candidates[0, k - 1]].argmax()]
    for early_stop in (False, True):
        out = drafter.propose(hidden, base_logits, lead, passes=B - 1, early_stop=early_stop, noise=noise)
        assert torch.equal(out.tokens, tokens)
        # logits: -inf outside the shortlist, and the tokens are their (Gumbel-)argmax
        assert torch.isinf(out.logits).sum() == (B - 1) * (128 - 8)
        assert torch.equal((out.logits + (0 if noise is None else noise)).argmax(-1), out.tokens)


def test_refine_shortlist_called_directly_with_autograd_on_matches_propose():
    """An inference method: called outside `propose` (autograd on, rows straight from `w2.weight`) it still runs."""
    from hf_xpress.modeling_xpress import _gather_shortlist

    torch.manual_seed(14)
    drafter = tiny_drafter(tiny_target("qwen3"), refiner_shortlist=8)
    refiner, tables = drafter.refiner, drafter.refiner.tables()
    hidden, base_logits, lead = torch.randn(1, B, 64), torch.randn(1, B - 1, 128) * 2, torch.randint(0, 128, (1, 2))
    columns = base_logits.topk(8, dim=-1).indices
    base, _, rows = _gather_shortlist(base_logits, None, columns, columns, refiner.w2.weight)
    assert rows.requires_grad
    tokens, scores, run = refiner.refine_shortlist(refiner.hidden_part(hidden, tables, B), base, rows.float(), columns,
                                                   lead, None, 3, True, tables)
    expected = drafter.propose(hidden, base_logits, lead, passes=3, early_stop=True)
    assert torch.equal(tokens, expected.tokens) and run == expected.passes
    torch.testing.assert_close(scores, expected.scores)


@pytest.mark.parametrize("sample", [False, True])
def test_shortlisted_markov_head_decodes_left_to_right_among_the_candidates(sample):
    torch.manual_seed(13)
    drafter = tiny_drafter(tiny_target("qwen3"), refiner="markov")
    hidden, base_logits, lead = torch.randn(1, B, 64), torch.randn(1, B - 1, 128) * 2, torch.randint(0, 128, (1, 2))
    noise = -torch.log(-torch.log(torch.rand(1, B - 1, 128))) if sample else None
    candidates = base_logits.topk(8, dim=-1).indices
    prev, tokens, rows = int(lead[0, 1]), [], []
    for k in range(B - 1):
        scores = base_logits[0, k] + drafter.refiner(torch.tensor([[prev]]))[0, 0]
        rows.append(scores)
        chosen = scores + (0 if noise is None else noise[0, k])
        prev = int(candidates[0, k, chosen[candidates[0, k]].argmax()])
        tokens.append(prev)
    drafter.config.refiner_shortlist = 8
    out = drafter.propose(hidden, base_logits, lead, noise=noise)
    assert out.tokens[0].tolist() == tokens
    expected = torch.full((B - 1, 128), float("-inf")).scatter(-1, candidates[0], torch.stack(rows).gather(-1, candidates[0]))
    torch.testing.assert_close(out.logits[0], expected)


def test_a_full_vocabulary_shortlist_is_the_plain_refiner():
    torch.manual_seed(12)
    drafter = tiny_drafter(tiny_target("qwen3"))
    hidden, base_logits, lead = torch.randn(1, B, 64), torch.randn(1, B - 1, 128) * 2, torch.randint(0, 128, (1, 2))
    plain = drafter.propose(hidden, base_logits, lead, passes=4)
    drafter.config.refiner_shortlist = 128
    full = drafter.propose(hidden, base_logits, lead, passes=4)
    assert torch.equal(plain.tokens, full.tokens)
    torch.testing.assert_close(plain.logits, full.logits)


def test_refiner_tables_compute_the_same_features_and_follow_weight_changes():
    """Inference folds Fuse's projections and stacks the MLP's gate/up (`XPressRefiner.tables`); same result as the
    training-time path, and the tables are rebuilt when a weight changes in place (e.g. an optimizer step)."""
    torch.manual_seed(3)
    refiner = tiny_drafter(tiny_target("qwen3")).refiner
    hidden, prev = torch.randn(2, B, 64), torch.randint(0, 128, (2, B))
    tables = refiner.tables()
    assert refiner.tables() is tables  # cached
    hp = refiner.hidden_part(hidden)
    torch.testing.assert_close(refiner.hidden_part(hidden, tables), hp, rtol=1e-5, atol=1e-5)
    # the first n rows only (a round drafting n - 1 tokens): the pooled term still averages the whole block
    torch.testing.assert_close(refiner.hidden_part(hidden, tables, 3), hp[:, :3], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(refiner.hidden_part(hidden, None, 3), hp[:, :3])  # the training path too
    torch.testing.assert_close(refiner.features(hp, prev, 3, tables=tables), refiner.features(hp, prev, 3), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        refiner.w1.weight.mul_(2.0)
    rebuilt = refiner.tables()
    assert rebuilt is not tables
    torch.testing.assert_close(refiner.features(hp, prev, tables=rebuilt), refiner.features(hp, prev), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab, k", [(49152, 64), (8192, 64), (50000, 64), (1003, 5), (151936, 64), (100, 64)])
def test_top_candidates_is_an_exact_top_k(vocab, k):
    from hf_xpress.modeling_xpress import top_candidates

    torch.manual_seed(vocab)
    logits = torch.randn(1, 15, vocab)
    logits[0, 3, -1] = 100.0  # the last id holds the best token (50000: in the ragged last bucket)
    logits[0, 4, :k] = 50.0 + torch.arange(k).float()  # the whole top k in consecutive ids
    logits[0, 5, torch.arange(8) * (vocab // 8)] = 70.0 + torch.arange(8).float()  # 8 of the top k at strided ids
    logits[0, 6] = 0.0  # ties everywhere: any k of them
    ids = top_candidates(logits, k)
    assert ids.shape == (1, 15, k)
    expected = logits.topk(k, dim=-1).indices
    assert torch.equal(ids[:, :6].sort(-1).values, expected[:, :6].sort(-1).values)
    assert torch.equal(ids[:, 7:].sort(-1).values, expected[:, 7:].sort(-1).values)
    assert ids[0, 6].unique().numel() == k  # k distinct ids of the tied row
    assert torch.equal(top_candidates(logits[0], k).sort(-1).values, ids[0].sort(-1).values)  # [S, V] as well


def test_a_transformers_release_before_the_cache_rename_is_refused_at_import():
    from hf_xpress.modeling_xpress import MIN_TRANSFORMERS, check_transformers_version

    with pytest.raises(ImportError, match=r"transformers >= 5\.24 \(installed: 5\.23\.0\)"):
        check_transformers_version("5.23.0")
    check_transformers_version(MIN_TRANSFORMERS + ".0")
    check_transformers_version("5.30.0.dev0")
    # the floor users install with is the one the code checks
    from pathlib import Path

    from hf_xpress.hub import CUSTOM_GENERATE_REQUIREMENTS

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"transformers>={MIN_TRANSFORMERS},<6"' in pyproject
    assert f"transformers>={MIN_TRANSFORMERS}\n" in CUSTOM_GENERATE_REQUIREMENTS


def test_rope_frequencies_stay_float32_however_the_drafter_is_cast(tmp_path):
    drafter = tiny_drafter(tiny_target(), refiner="xpress")
    reference = {name: b.clone() for name, b in drafter.rotary_emb.named_buffers()}
    assert reference and all(b.dtype == torch.float32 for b in reference.values())
    drafter.to(torch.bfloat16)
    assert drafter.fc.weight.dtype == torch.bfloat16  # the weights are cast ...
    for name, b in drafter.rotary_emb.named_buffers():  # ... the frequencies are not
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, reference[name], rtol=0, atol=0)
    drafter.save_pretrained(tmp_path)
    loaded = XPressDrafterModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for name, b in loaded.rotary_emb.named_buffers():
        torch.testing.assert_close(b, reference[name], rtol=0, atol=0)
    drafter.half().float()  # any cast, there and back
    for name, b in drafter.rotary_emb.named_buffers():
        torch.testing.assert_close(b, reference[name], rtol=0, atol=0)


def _tiny_architecture(kind: str):
    """Tiny random targets of architectures whose configs differ from Llama's where `from_target` reads them."""
    import transformers

    common = dict(vocab_size=VOCAB, num_hidden_layers=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "gpt2":  # no intermediate_size (its MLP is 4 x hidden), no rotary embedding
        config = transformers.GPT2Config(n_embd=64, n_head=4, **{**common, "n_layer": 4})
    elif kind == "olmo3":  # RoPE parameters per layer type
        config = transformers.Olmo3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                          num_key_value_heads=2, **common)
    elif kind == "gemma4":  # head_dim per layer: reading the global one raises
        if not hasattr(transformers, "Gemma4TextConfig"):
            pytest.skip("Gemma 4 needs a newer transformers")
        config = transformers.Gemma4TextConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                               num_key_value_heads=2, head_dim=16, sliding_window=8, **common)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # a trained model's logit scale: stable argmaxes, so drafts get accepted
        model.get_output_embeddings().weight.mul_(20.0)
    return model


@pytest.mark.parametrize("kind", ["gpt2", "olmo3", "gemma4"])
def test_from_target_serves_architectures_unlike_llama(kind):
    """From a review over 62 architectures: GPT-2-style configs (no intermediate_size), RoPE per layer type (OLMo 3,
    Gemma 3) and per-layer head_dim (Gemma 4) made from_target fail; each now builds a drafter that decodes exactly."""
    target = _tiny_architecture(kind)
    drafter = XPressDrafterModel.from_target(target, refiner="xpress", num_hidden_layers=1, mask_token_id=VOCAB - 1)
    for ids in (torch.tensor([[5]]), torch.tensor([[5, 6, 7, 8, 9, 10, 11]])):
        expected = target.generate(ids, max_new_tokens=16, do_sample=False)
        assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=16, do_sample=False), expected)
    if kind == "olmo3":  # the full-attention layers' RoPE
        assert drafter.config.rope_parameters == target.config.rope_parameters["full_attention"]


def test_targets_a_drafter_cannot_serve_are_refused_with_the_reason():
    import transformers

    opt = transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        word_embed_proj_dim=32)).eval()
    with pytest.raises(ValueError, match="token embeddings are 32 wide and lm_head are 32 wide but its hidden states 64"):
        XPressDrafterModel.from_target(opt, mask_token_id=VOCAB - 1)
    llama = tiny_target("llama")
    llama.config.altup_num_inputs = 4  # what marks Gemma 3n's stacked hidden-state streams
    with pytest.raises(ValueError, match="llama targets are not supported: their decoder carries 4 hidden-state streams"):
        XPressDrafterModel.from_target(llama, mask_token_id=VOCAB - 1)
