"""Import of the published layouts (z-lab dFlash, official xPress / Markov `.pt`, transformers' MuseGlimmerAssistant),
export for vLLM and the round trip back, and clear refusals of corrupt or foreign checkpoints.

Every import test writes a checkpoint in the source's own layout (random weights, tiny sizes), converts it, and
compares our model with a forward written here from the spec in plain torch (it reads the *source* tensors by their
source names and never calls hf_xpress modules)."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from transformers.cache_utils import DFlashCache

from hf_xpress import XPressDrafterModel
from hf_xpress import conversion as cv
from hf_xpress.configuration_xpress import INFERENCE_SETTINGS

V, H, INTER, HEADS, KV, HD, TARGET_LAYERS, LAYERS, B, R = 128, 64, 128, 4, 2, 16, 6, 2, 16, 16
IDS = [1, 3]  # dFlash rule for a 2-layer drafter on a 6-layer target
MASK = V - 1
EPS = 1e-6
THETA = 1_000_000.0


# ---- fixtures: a tiny target and checkpoints in the published layouts -----------------------------------------------


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=TARGET_LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV, head_dim=HD, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen3ForCausalLM(config).eval()


def _rand(*shape, std=0.05, mean=0.0):
    return torch.randn(*shape) * std + mean


def zlab_weights(seed: int) -> dict[str, torch.Tensor]:
    """Tensors named as in z-lab/Qwen3-8B-DFlash-b16 (dflash/model.py, DFlashDraftModel)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.08, mean=0.0):
        return torch.randn(*shape, generator=g) * std + mean

    w = {"fc.weight": r(H, len(IDS) * H), "hidden_norm.weight": r(H, mean=1.0, std=0.1)}
    w["norm.weight"] = r(H, mean=1.0, std=0.1)
    for i in range(LAYERS):
        p = f"layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": r(HEADS * HD, H),
            p + "self_attn.k_proj.weight": r(KV * HD, H),
            p + "self_attn.v_proj.weight": r(KV * HD, H),
            p + "self_attn.o_proj.weight": r(H, HEADS * HD),
            p + "self_attn.q_norm.weight": r(HD, mean=1.0, std=0.1),
            p + "self_attn.k_norm.weight": r(HD, mean=1.0, std=0.1),
            p + "mlp.gate_proj.weight": r(INTER, H),
            p + "mlp.up_proj.weight": r(INTER, H),
            p + "mlp.down_proj.weight": r(H, INTER),
            p + "input_layernorm.weight": r(H, mean=1.0, std=0.1),
            p + "post_attention_layernorm.weight": r(H, mean=1.0, std=0.1),
        }
    return w


def zlab_config(**overrides) -> dict:
    """config.json of z-lab/Qwen3-8B-DFlash-b16, at tiny sizes."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": B,
        "bos_token_id": 5,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS},
        "dtype": "bfloat16",
        "eos_token_id": 6,
        "head_dim": HD,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "layer_types": ["full_attention"] * LAYERS,
        "max_position_embeddings": 40960,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV,
        "num_target_layers": TARGET_LAYERS,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": THETA,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": V,
        **overrides,
    }


def write_zlab(folder: Path, weights=None, **config_overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(zlab_config(**config_overrides), indent=2))
    save_file(weights if weights is not None else zlab_weights(0), str(folder / "model.safetensors"))
    return folder


def xpress_refiner_state(seed: int, block: int = B) -> dict[str, torch.Tensor]:
    """`refiner_state_dict` of the official XPressRefinerHead (refiners/xpress_head.py), persistent `mix.tril` included."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    return {
        "w1.weight": r(V, R),
        "w2.weight": r(V, R),
        "down_h.weight": r(R, H),
        "down_g.weight": r(R, H),
        "in_proj.weight": r(R, 3 * R),
        "mix.L": r(R, block, block),
        "mix.tril": torch.tril(torch.ones(block, block)),
        "mlp.gate_proj.weight": r(2 * R, R),
        "mlp.up_proj.weight": r(2 * R, R),
        "mlp.down_proj.weight": r(R, 2 * R),
    }


def released_args(**overrides) -> argparse.Namespace:
    """`args` as pickled by the official training script: an argparse.Namespace."""
    fields = dict(
        markov_rank=R, mlp_ratio=2, markov_only=False, no_hidden=False, no_perpos=False, no_global=False,
        no_residual=True, no_mixer=False, no_mlp=False, input_mode="concat", no_sublayer_norm=True, no_mix_out=True,
        lowrank_lmhead_shared_rank=0, lowrank_base_rank=0, input_relu=False, lr=6e-4, block_size=B,
    )
    return argparse.Namespace(**{**fields, **overrides})


def write_refiner_pt(path: Path, kind: str = "xpress", draft_seed: int | None = 7, args=None, **state_overrides) -> Path:
    if kind == "xpress":
        state = xpress_refiner_state(3)
    else:
        g = torch.Generator().manual_seed(4)
        state = {"w1.weight": torch.randn(V, R, generator=g) * 0.5, "w2.weight": torch.randn(V, R, generator=g) * 0.5}
    state.update(state_overrides)
    ckpt = {"args": args if args is not None else released_args(), "refiner_state_dict": state, "global_step": 403_000}
    if draft_seed is not None:
        ckpt["draft_state_dict"] = zlab_weights(draft_seed)  # the co-trained drafter
    torch.save(ckpt, path)
    return path


# ---- the independent forward, from the spec (section 2 and 4) ------------------------------------------------------


def rms(x, w, eps=EPS):
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, positions, theta):
    """x: [b, heads, n, d] rotated by absolute positions (rotate-half convention)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    freqs = positions.float()[:, None] * inv[None]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def zlab_visible(layer_types, window, causal):
    """z-lab's dflash/model.py `_attention_mask` per layer: returns visible(layer, q_pos, k_pos) -> bool matrix."""

    def visible(i, qp, kp):
        ok = torch.ones(len(qp), len(kp), dtype=torch.bool)
        if i in causal:
            ok &= kp[None] <= qp[:, None]
        if layer_types[i] == "sliding_attention":
            ok &= qp[:, None] - kp[None] < window
            if i not in causal:
                ok &= kp[None] - qp[:, None] < window
        return ok

    return visible


def reference_hidden(w, features, block, theta=THETA, fc="fc.weight", hidden_norm="hidden_norm.weight", visible=None):
    """dFlash drafter: queries from the block, keys/values from cat(context, block); no mask unless `visible`
    (a per-layer rule on absolute positions, see `zlab_visible`). Returns `[1, q, H]`."""
    ctx = rms(features @ w[fc].T, w[hidden_norm])
    c, q = ctx.shape[1], block.shape[1]
    pos = torch.arange(c + q)
    h = block.float()
    for i in range(LAYERS):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        kv = torch.cat([ctx, x], 1)
        Q = rms((x @ w[p + "self_attn.q_proj.weight"].T).view(1, q, HEADS, HD), w[p + "self_attn.q_norm.weight"])
        K = rms((kv @ w[p + "self_attn.k_proj.weight"].T).view(1, c + q, KV, HD), w[p + "self_attn.k_norm.weight"])
        Vv = (kv @ w[p + "self_attn.v_proj.weight"].T).view(1, c + q, KV, HD).transpose(1, 2)
        Q = rope(Q.transpose(1, 2), pos[c:], theta)
        K = rope(K.transpose(1, 2), pos, theta)
        K, Vv = K.repeat_interleave(HEADS // KV, 1), Vv.repeat_interleave(HEADS // KV, 1)
        scores = Q @ K.transpose(-1, -2) / math.sqrt(HD)
        if visible is not None:
            scores = scores.masked_fill(~visible(i, pos[c:], pos), float("-inf"))
        att = torch.softmax(scores, -1)
        h = h + (att @ Vv).transpose(1, 2).reshape(1, q, HEADS * HD) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up, down = (w[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
        h = h + (F.silu(x @ gate.T) * (x @ up.T)) @ down.T
    return rms(h, w["norm.weight"])


def reference_xpress_bias(r, h, prev):
    """Official head: in_proj([down_h(h), down_g(mean h), w1(prev)]) -> x + (L*tril) x -> x + SwiGLU(x) -> w2."""
    g = h.mean(1, keepdim=True).expand_as(h)
    x = torch.cat([h @ r["down_h.weight"].T, g @ r["down_g.weight"].T, r["w1.weight"][prev]], -1) @ r["in_proj.weight"].T
    block = h.shape[1]
    x = x + torch.einsum("ckj,bjc->bkc", r["mix.L"] * torch.tril(torch.ones(block, block)), x)
    x = x + (F.silu(x @ r["mlp.gate_proj.weight"].T) * (x @ r["mlp.up_proj.weight"].T)) @ r["mlp.down_proj.weight"].T
    return x @ r["w2.weight"].T


def reference_jacobi(r, h, base, anchor, before_anchor, passes):
    """refiners/xpress.py `xpress_par_k_refine` (greedy, no lock): seed with argmax, then K parallel passes."""
    base_full = torch.cat([base[:, :1], base], 1)
    block = torch.cat([torch.tensor([[anchor]]), base.argmax(-1)], 1)
    refined = base_full
    for _ in range(passes):
        prev = block.roll(1, 1)
        prev[:, 0] = before_anchor
        refined = base_full + reference_xpress_bias(r, h, prev)
        block = torch.cat([block[:, :1], refined[:, 1:].argmax(-1)], 1)
    return block[:, 1:], refined[:, 1:]


def reference_markov(r, base, anchor):
    """DeepSpec VanillaMarkov.sample_block_tokens (greedy): slot k gets w2(w1[token at k-1]), left to right."""
    prev, tokens, logits = anchor, [], []
    for k in range(base.shape[1]):
        step = base[0, k] + r["w2.weight"] @ r["w1.weight"][prev]
        prev = int(step.argmax())
        tokens.append(prev)
        logits.append(step)
    return torch.tensor([tokens]), torch.stack(logits)[None]


def inputs(target, context_len=9, seed=0):
    """Target features of a random context (layer outputs = hidden_states[id + 1]) and the block's embeddings."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (1, context_len + 1), generator=g)
    with torch.no_grad():
        out = target(ids[:, :-1], output_hidden_states=True)
    features = torch.cat([out.hidden_states[i + 1] for i in IDS], -1)
    embed = target.get_input_embeddings()
    block = embed(torch.cat([ids[:, -1:], torch.full((1, B - 1), MASK)], 1)).detach()
    return features, block, ids


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def reference_muse(state, features, block, window=None):
    """The same forward read from MuseGlimmerAssistantModel's names (its context projection is `encoder.*`).

    `window`: its sliding layers' rule, transformers' `sliding_window_bidirectional_overlay`: |q - k| <= window."""
    visible = None if window is None else (lambda i, qp, kp: (qp[:, None] - kp[None]).abs() <= window)
    return reference_hidden(
        state, features, block, 500_000.0, fc="encoder.fc.weight", hidden_norm="encoder.output_norm_enc.weight",
        visible=visible,
    )


def ours(drafter, features, block):
    with torch.no_grad():
        return drafter(noise_embeds=block, context_hidden_states=features).last_hidden_state


def logits(target, hidden):
    return hidden[:, 1:] @ target.get_output_embeddings().weight.T


# ---- z-lab dFlash ---------------------------------------------------------------------------------------------------


def test_zlab_dflash_folder_converts_to_the_same_logits(tmp_path, target):
    folder = write_zlab(tmp_path / "Qwen3-tiny-DFlash-b16")
    assert cv.detect_format(folder) == "dflash"
    drafter = cv.load_dflash(folder)
    c = drafter.config
    assert c.refiner is None and drafter.refiner is None
    assert (c.block_size, c.mask_token_id, c.target_layer_ids, c.num_target_layers) == (B, MASK, IDS, TARGET_LAYERS)
    assert (c.bos_token_id, c.eos_token_id, c.rope_parameters["rope_theta"]) == (5, 6, THETA)
    features, block, _ = inputs(target)
    w = zlab_weights(0)
    expected = reference_hidden(w, features, block)
    close(ours(drafter, features, block), expected)
    close(logits(target, ours(drafter, features, block)), logits(target, expected))
    # the natural entry point reads the folder too
    direct = XPressDrafterModel.from_pretrained(folder)
    close(ours(direct, features, block), expected)
    # a drafter with its own conversion target: depth and vocabulary come from / are checked against it
    with pytest.raises(cv.ConversionError, match="trained for a 6-layer target"):
        cv.load_dflash(folder, target=Qwen3Config(num_hidden_layers=8, vocab_size=V))


def test_newer_zlab_layout_and_rope_scaling(tmp_path, target):
    """Newer z-lab releases keep block_size inside dflash_config and write transformers-5 rope_parameters."""
    cfg = dict(block_size=None, rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
    raw = zlab_config(**cfg)
    del raw["block_size"], raw["rope_theta"]
    raw["dflash_config"]["block_size"] = B
    folder = tmp_path / "new"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(zlab_weights(0), str(folder / "model.safetensors"))
    drafter = cv.load_checkpoint(folder)
    features, block, _ = inputs(target)
    close(ours(drafter, features, block), reference_hidden(zlab_weights(0), features, block, 10_000.0))


# ---- official xPress / Markov refiners ----------------------------------------------------------------------------


def test_official_xpress_pt_attaches_with_the_cotrained_drafter(tmp_path, target):
    base = write_zlab(tmp_path / "zlab")
    pt = write_refiner_pt(tmp_path / "xpress_refiner_cotrain_403k.pt")
    drafter = cv.load_checkpoint(pt, base=base, jacobi_passes=B - 1)
    c = drafter.config
    assert (c.refiner, c.refiner_rank, c.refiner_mlp_ratio, c.jacobi_passes) == ("xpress", R, 2, B - 1)
    features, block, ids = inputs(target)
    cotrained, head = zlab_weights(7), xpress_refiner_state(3)
    h_ref = reference_hidden(cotrained, features, block)  # the .pt's draft_state_dict, as the official harness loads it
    h = ours(drafter, features, block)
    close(h, h_ref)
    base_logits = logits(target, h_ref).detach()
    anchor, before = int(ids[0, -1]), int(ids[0, -2])
    # teacher-forced bias for arbitrary previous tokens
    prev = torch.randint(0, V, (1, B))
    with torch.no_grad():
        bias = drafter.refiner(h, prev)
    torch.testing.assert_close(bias, reference_xpress_bias(head, h_ref, prev)[:, 1:], rtol=1e-4, atol=1e-4)
    # Jacobi decoding: K passes, with and without the early-stop lock, equal the official rollout
    for passes in (1, 3, B - 1):
        ref_tokens, ref_logits = reference_jacobi(head, h_ref, base_logits, anchor, before, passes)
        for early_stop in (False, True):
            lead = torch.tensor([[before, anchor]])
            proposal = drafter.propose(h, base_logits, lead, passes=passes, early_stop=early_stop)
            assert torch.equal(proposal.tokens, ref_tokens), (passes, early_stop)
        torch.testing.assert_close(proposal.logits, ref_logits.float(), rtol=1e-4, atol=1e-4)
    assert not torch.equal(ref_tokens, base_logits.argmax(-1)), "the refiner should change the drafts in this test"

    # the base drafter's own weights when asked (the z-lab ones)
    plain = cv.load_checkpoint(pt, base=base, use_cotrained_drafter=False)
    close(ours(plain, features, block), reference_hidden(zlab_weights(0), features, block))
    # and the converted folder reloads with AutoModel
    cv.convert(pt, tmp_path / "out", base=base)
    reloaded = XPressDrafterModel.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), drafter.state_dict().values()))


@pytest.mark.parametrize("deepspec_names", [False, True])
def test_official_markov_pt_attaches_and_decodes_left_to_right(tmp_path, target, deepspec_names):
    base = write_zlab(tmp_path / "zlab")
    pt = write_refiner_pt(tmp_path / "markov.pt", kind="markov", draft_seed=None, args=argparse.Namespace(markov_rank=R))
    if deepspec_names:  # DeepSpec's VanillaMarkov names
        ck = torch.load(pt, weights_only=False)
        ck["refiner_state_dict"] = {"markov_" + k: v for k, v in ck["refiner_state_dict"].items()}
        torch.save(ck, pt)
    drafter = cv.load_checkpoint(base, refiner=pt)
    assert (drafter.config.refiner, drafter.config.refiner_rank) == ("markov", R)
    head = {k.removeprefix("markov_"): v for k, v in torch.load(pt, weights_only=False)["refiner_state_dict"].items()}
    features, block, ids = inputs(target)
    h = ours(drafter, features, block)
    torch.testing.assert_close(h, reference_hidden(zlab_weights(0), features, block), rtol=1e-5, atol=1e-5)
    base_logits = logits(target, h).detach()
    ref_tokens, ref_logits = reference_markov(head, base_logits, int(ids[0, -1]))
    proposal = drafter.propose(h, base_logits, torch.tensor([[int(ids[0, -2]), int(ids[0, -1])]]))
    assert torch.equal(proposal.tokens, ref_tokens)
    torch.testing.assert_close(proposal.logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert not torch.equal(ref_tokens, base_logits.argmax(-1))


# ---- transformers' MuseGlimmerAssistantModel -----------------------------------------------------------------------


def write_muse(folder: Path, layer_types="full_attention", seed=11, window=32):
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    torch.manual_seed(seed)
    config = MuseGlimmerAssistantConfig(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV, head_dim=HD, rms_norm_eps=EPS, max_position_embeddings=512, sliding_window=window,
        layer_types=[layer_types] * LAYERS, target_layer_ids=IDS, block_size=B, mask_token_id=MASK,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    )
    model = MuseGlimmerAssistantModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1 if "norm" in name else 0.08)
    model.save_pretrained(folder)
    return model


def test_muse_glimmer_assistant_folder_converts_to_the_same_logits(tmp_path, target):
    folder = tmp_path / "muse"
    muse = write_muse(folder)
    state = load_file(folder / "model.safetensors")
    assert {"encoder.fc.weight", "encoder.output_norm_enc.weight"} <= set(state)  # the layout we convert from
    assert cv.detect_format(folder) == "muse_glimmer"
    with pytest.raises(cv.ConversionError, match="no vocab_size"):
        cv.load_checkpoint(folder)
    with pytest.raises(cv.ConversionError, match="from_pretrained takes no target: convert the folder first"):
        XPressDrafterModel.from_pretrained(folder)  # converted on load: its hint to pass target= cannot be followed
    drafter = cv.load_checkpoint(folder, target=target.config)
    assert (drafter.config.vocab_size, drafter.config.num_target_layers) == (V, TARGET_LAYERS)
    features, block, _ = inputs(target)
    expected = reference_muse(state, features, block)
    close(ours(drafter, features, block), expected)
    with torch.no_grad():  # and transformers' own implementation agrees
        native = muse(noise_embeds=block, context_hidden_states=features).last_hidden_state
    torch.testing.assert_close(native, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "overrides, causal",
    [
        # newer z-lab drafters: explicit layer types; their sliding layers are causal within the block
        ({"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True}, [0]),
        # dflash_config.causal switches every layer (vLLM reads the same key)
        ({"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
          "dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS, "causal": True}}, [0, 1]),
        # a top-level is_causal=False keeps the sliding layer bidirectional (window on both sides)
        ({"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": True, "is_causal": False}, []),
        # no layer_types: Qwen3Config's use_sliding_window + max_window_layers rule (layers >= 1 slide)
        ({"layer_types": None, "use_sliding_window": True, "max_window_layers": 1}, [1]),
    ],
)
def test_zlab_sliding_window_and_causal_layers_convert_exactly(tmp_path, target, overrides, causal):
    window = 8  # smaller than the context: the window and the causal block both change the result
    folder = write_zlab(tmp_path / "zlab-swa", sliding_window=window, **overrides)
    drafter = cv.load_dflash(folder)
    c = drafter.config
    types = overrides["layer_types"] or ["full_attention", "sliding_attention"]
    assert (c.layer_types, c.sliding_window, c.causal_layers) == (types, window, causal)
    features, block, _ = inputs(target, context_len=30)
    expected = reference_hidden(zlab_weights(0), features, block, visible=zlab_visible(types, window, causal))
    close(ours(drafter, features, block), expected)
    # the layout matters: the same weights with full bidirectional attention compute something else
    assert not torch.allclose(reference_hidden(zlab_weights(0), features, block), expected, atol=1e-3)
    # drafting through the context cache, one chunk at a time (as generate() does), gives the same block
    with torch.no_grad():
        cache = DFlashCache()
        drafter(noise_embeds=block, context_hidden_states=features[:, :13], cache=cache)  # an earlier round
        cache.crop(-B)  # its block keys/values are dropped; the context stays
        positions = torch.arange(13, 30 + B)[None]
        split = drafter(noise_embeds=block, context_hidden_states=features[:, 13:], position_ids=positions, cache=cache)
    close(split.last_hidden_state, expected)


def test_muse_glimmer_sliding_window_matches_transformers(tmp_path, target):
    """transformers' default MuseGlimmerAssistant layers are sliding-window; checked against its own model, run the
    way its generate() runs it (a DFlashCache told how many context rows come), with a context beyond the window."""
    from transformers.cache_utils import DFlashCache as NativeCache

    window = 8
    folder = tmp_path / "muse-swa"
    muse = write_muse(folder, layer_types="sliding_attention", window=window)
    drafter = cv.load_checkpoint(folder, target=target.config)
    assert drafter.config.layer_types == ["sliding_attention"] * LAYERS and drafter.config.causal_layers == []
    features, block, _ = inputs(target, context_len=30)
    state = load_file(folder / "model.safetensors")
    expected = reference_muse(state, features, block, window=window)
    close(ours(drafter, features, block), expected)
    cache = NativeCache(config=muse.config)
    cache.set_previous_accepted_tokens(features.shape[1])
    with torch.no_grad():
        native = muse(noise_embeds=block, context_hidden_states=features, cache=cache, use_cache=True).last_hidden_state
    close(native, expected)
    assert not torch.allclose(reference_muse(state, features, block), expected, atol=1e-3)


@pytest.mark.parametrize("causal", [None, True, False])
def test_sliding_window_layout_survives_the_vllm_export(tmp_path, target, causal):
    dflash = {"mask_token_id": MASK, "target_layer_ids": IDS} | ({} if causal is None else {"causal": causal})
    types = ["sliding_attention", "full_attention"]
    folder = write_zlab(tmp_path / "zlab", layer_types=types, use_sliding_window=True, sliding_window=8, dflash_config=dflash)
    drafter = cv.load_dflash(folder)
    cv.export_vllm(drafter, tmp_path / "vllm")
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert (cfg["layer_types"], cfg["sliding_window"], cfg["use_sliding_window"]) == (types, 8, True)
    assert cfg["dflash_config"].get("causal") == causal  # absent: readers make the sliding layers causal
    back = cv.load_checkpoint(tmp_path / "vllm")
    fields = ("layer_types", "sliding_window", "causal_layers")
    assert [getattr(back.config, f) for f in fields] == [getattr(drafter.config, f) for f in fields]
    features, block, _ = inputs(target, context_len=30)
    close(ours(back, features, block), ours(drafter, features, block), tol=0)
    # a mix the dFlash layout cannot say (one switch for all layers, or "the sliding ones") is refused
    drafter.config.causal_layers = [1]
    with pytest.raises(cv.ConversionError, match="causal_layers"):
        cv.export_vllm(drafter, tmp_path / "vllm-mixed")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"architectures": ["DFlash2DraftModel"]}, "DFlash2DraftModel"),
        ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS, "use_swa": True}}, "use_swa"),
        ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS, "conv_kernel_size": 4}}, "conv_kernel_size"),
        ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS, "input_embedding_scale": 8.0}},
         "input_embedding_scale=8.0"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ],
)
def test_zlab_features_we_do_not_implement_are_refused(tmp_path, overrides, message):
    with pytest.raises(cv.ConversionError, match=message):
        cv.load_dflash(write_zlab(tmp_path / "zlab-x", **overrides))


# ---- vLLM export ---------------------------------------------------------------------------------------------------


def _vllm_parameter(name: str) -> str:
    """vLLM's DFlash load_weights: prefix `model.`, stack q/k/v into qkv_proj and gate/up into gate_up_proj."""
    name = "model." + name
    for old, new in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                     (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
        if old in name and "xpress_head" not in name:
            return name.replace(old, new)
    return name


VLLM_DFLASH_PARAMETERS = {"model.fc.weight", "model.hidden_norm.weight", "model.norm.weight"} | {
    f"model.layers.{i}.{n}"
    for i in range(LAYERS)
    for n in ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
              "mlp.gate_up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The same drafter three ways: dFlash alone, + official xPress refiner, + official Markov head."""
    tmp = tmp_path_factory.mktemp("converted")
    base = write_zlab(tmp / "zlab")
    xpress = cv.load_checkpoint(write_refiner_pt(tmp / "x.pt"), base=base, jacobi_passes=4)
    markov_pt = write_refiner_pt(tmp / "m.pt", kind="markov", args=argparse.Namespace(markov_rank=R))
    markov = cv.load_checkpoint(markov_pt, base=base)
    return {None: cv.load_dflash(base), "xpress": xpress, "markov": markov}


@pytest.mark.parametrize("refiner", [None, "xpress", "markov"])
def test_vllm_export_layout_and_round_trip(tmp_path, target, converted, refiner, monkeypatch):
    import copy

    drafter = copy.deepcopy(converted[refiner])
    # inference settings the vLLM layout has no field for (round trips reset them to the defaults): kept in its
    # "hf_xpress" block
    settings = dict(num_assistant_tokens=3, assistant_confidence_threshold=0.2, tree_temperature=1.5,
                    num_assistant_tokens_schedule="cost", refiner_shortlist=None if refiner is None else 4)
    for name, value in settings.items():
        setattr(drafter.config, name, value)
    drafter.config.target_model_type = "qwen3"  # kept too (it was lost for a drafter without a refiner)
    monkeypatch.chdir(tmp_path)  # a relative output folder (stale shards were looked for at vllm/vllm/...)
    (tmp_path / "vllm").mkdir()  # an earlier sharded export there: its shards would be loaded with the new weights
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"):
        (tmp_path / "vllm" / name).write_text("stale")
    result = cv.export_vllm(drafter, "vllm")
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    assert sorted(p.name for p in (tmp_path / "vllm").iterdir()) == ["config.json", "model.safetensors"]

    # the z-lab / vLLM dflash fields
    assert cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": IDS}
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["vocab_size"], cfg["hidden_size"]) == (B, TARGET_LAYERS, V, H)
    shape_fields = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")
    assert [cfg[k] for k in shape_fields] == [LAYERS, HEADS, KV, HD]
    assert cfg["rope_theta"] == THETA and cfg["layer_types"] == ["full_attention"] * LAYERS and not cfg["use_sliding_window"]
    assert Qwen3Config.from_dict(cfg).rope_parameters["rope_theta"] == THETA  # what vLLM's AutoConfig reads
    drafter_names = {k for k in tensors if not k.startswith(("xpress_head.", "markov_head."))}
    assert {_vllm_parameter(k) for k in drafter_names} == VLLM_DFLASH_PARAMETERS
    assert set(drafter_names) == set(zlab_weights(0))
    assert tensors["fc.weight"].shape == (H, len(IDS) * H)
    assert result.num_speculative_tokens == B - 1

    if refiner is None:
        assert cfg["architectures"] == ["DFlashDraftModel"] and result.method == "dflash"
    elif refiner == "xpress":  # vllm_xpress/convert_xpress_to_vllm.py + the fork's Qwen3XPressForCausalLM.load_weights
        assert cfg["architectures"] == ["Qwen3XPressModel"] and result.method == "xpress"
        xpress_fields = ("xpress_rank", "xpress_mlp_hidden", "xpress_block_size", "xpress_num_passes")
        assert [cfg[k] for k in xpress_fields] == [R, 2 * R, B, 4]
        assert cfg["sample_from_anchor"] is False and cfg["xpress_candidate_topc"] == 0
        head = {k.removeprefix("xpress_head."): v for k, v in tensors.items() if k.startswith("xpress_head.")}
        official = xpress_refiner_state(3)
        assert set(head) == set(official) - {"mix.tril"}
        for key, value in head.items():
            assert torch.equal(value, official[key]), key  # raw training tensors; mix.L unfolded
        folded = official["mix.L"] * torch.tril(torch.ones(B, B)) + torch.eye(B)  # what the fork's fold_from_raw_ makes
        torch.testing.assert_close(drafter.refiner.mix.folded(), folded)
    else:  # vLLM's Qwen3DSparkModel
        assert cfg["architectures"] == ["Qwen3DSparkModel"] and result.method == "dspark"
        assert cfg["markov_rank"] == R and cfg["sample_from_anchor"] is False
        assert tensors["markov_head.markov_w1.weight"].shape == tensors["markov_head.markov_w2.weight"].shape == (V, R)

    back = cv.load_checkpoint(tmp_path / "vllm")
    assert back.config.refiner == refiner and back.config.jacobi_passes == drafter.config.jacobi_passes
    assert {name: getattr(back.config, name) for name in INFERENCE_SETTINGS} == \
        {name: getattr(drafter.config, name) for name in INFERENCE_SETTINGS}
    assert back.config.target_model_type == "qwen3"
    assert back.state_dict().keys() == drafter.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in drafter.state_dict().items())
    features, block, ids = inputs(target)
    h = ours(back, features, block)
    torch.testing.assert_close(h, ours(drafter, features, block), rtol=0, atol=0)
    lead = torch.tensor([[int(ids[0, -2]), int(ids[0, -1])]])
    base_logits = logits(target, h).detach()
    assert torch.equal(back.propose(h, base_logits, lead).tokens, drafter.propose(h, base_logits, lead).tokens)

    command = result.serve_command("Qwen/Qwen3-8B")
    assert command.startswith("vllm serve Qwen/Qwen3-8B")
    spec = json.loads(command.split("--speculative-config '")[1].split("'")[0])
    assert spec == {"method": result.method, "model": str(tmp_path.resolve() / "vllm"), "num_speculative_tokens": B - 1}
    assert ("--attention-backend flash_attn" in command) == (result.method != "dspark")  # as docs/interop.md shows

    # a config edited after the drafter was built: the export would be mislabelled or unreadable
    drafter.config.refiner = "markov" if refiner != "markov" else "xpress"
    with pytest.raises(ValueError, match="export_vllm: the drafter's weights do not match its config"):
        cv.export_vllm(drafter, tmp_path / "edited")
    assert not (tmp_path / "edited").exists()


def test_vllm_export_drops_the_draft_vocabulary_with_a_warning(tmp_path, converted, caplog):
    import copy

    drafter = copy.deepcopy(converted["xpress"])
    drafter.set_draft_vocab(torch.arange(0, V, 2))
    with caplog.at_level("WARNING"):
        cv.export_vllm(drafter, tmp_path / "vllm")
    assert "no draft vocabulary" in caplog.text
    assert "draft_vocab" not in load_file(tmp_path / "vllm" / "model.safetensors")
    back = cv.load_checkpoint(tmp_path / "vllm")
    assert back.draft_vocab is None and back.config.draft_vocab_size is None


@pytest.mark.parametrize("kind", ["xpress", "markov"])
def test_folders_written_by_the_official_vllm_converters_import(tmp_path, kind):
    """vllm_xpress/convert_xpress_to_vllm.py and convert_markov_to_vllm_dspark.py: z-lab config.json updated with the
    head fields; tensors = draft_state_dict + the head under `xpress_head.` / `markov_head.markov_w*`."""
    base = write_zlab(tmp_path / "zlab")
    args = released_args() if kind == "xpress" else argparse.Namespace(markov_rank=R)
    pt = write_refiner_pt(tmp_path / f"{kind}.pt", kind=kind, args=args)
    ck = torch.load(pt, weights_only=False)
    head = ck["refiner_state_dict"]
    tensors = dict(ck["draft_state_dict"])
    cfg = zlab_config()
    if kind == "xpress":
        tensors |= {"xpress_head." + k: v for k, v in head.items() if k != "mix.tril"}
        cfg.update(architectures=["Qwen3XPressModel"], xpress_rank=R, xpress_mlp_hidden=2 * R, xpress_block_size=B,
                   xpress_num_passes=6, sample_from_anchor=False)
    else:
        tensors |= {"markov_head.markov_w1.weight": head["w1.weight"], "markov_head.markov_w2.weight": head["w2.weight"]}
        cfg.update(architectures=["Qwen3DSparkModel"], markov_rank=R, sample_from_anchor=False)
    served = tmp_path / "served"
    served.mkdir()
    save_file(tensors, str(served / "model.safetensors"))
    (served / "config.json").write_text(json.dumps(cfg, indent=2))
    assert cv.detect_format(served) == ("vllm_xpress" if kind == "xpress" else "vllm_dspark")
    from_served, from_pt = cv.load_checkpoint(served), cv.load_checkpoint(pt, base=base, jacobi_passes=6)
    assert from_served.config.refiner == kind and from_served.config.jacobi_passes == 6
    assert from_served.state_dict().keys() == from_pt.state_dict().keys()
    assert all(torch.equal(from_served.state_dict()[k], v) for k, v in from_pt.state_dict().items())


def test_cli_convert_and_export(tmp_path, capsys):
    base = write_zlab(tmp_path / "zlab")
    pt = write_refiner_pt(tmp_path / "x.pt")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    cv.add_convert_parser(sub)
    cv.add_export_parser(sub)
    args = parser.parse_args(["convert", str(pt), str(tmp_path / "ours"), "--base", str(base), "--passes", "5"])
    assert args.func(args) == 0
    assert XPressDrafterModel.from_pretrained(tmp_path / "ours").config.jacobi_passes == 5
    args = parser.parse_args(["export", str(tmp_path / "ours"), str(tmp_path / "vllm"), "--serve-target", "Qwen/Qwen3-8B"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "vllm serve Qwen/Qwen3-8B" in out and '"method": "xpress"' in out
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["xpress_num_passes"] == 5
    # options only a refiner .pt reads, given for a folder: refused by name (they were ignored, exit status 0)
    for extra, named in ((["--base", str(base)], "base= (--base)"),
                         (["--base-drafter-weights"], "(--base-drafter-weights)"), (["--no-strict"], "(--no-strict)")):
        args = parser.parse_args(["convert", str(base), str(tmp_path / "unread"), *extra])
        with pytest.raises(cv.ConversionError, match=rf"{re.escape(named)} only apply to an official refiner .pt, "
                                                     r"but .*zlab is a dflash checkpoint"):
            args.func(args)
    args = parser.parse_args(["convert", str(base), str(tmp_path / "attached"), "--refiner", str(pt), "--no-strict"])
    assert args.func(args) == 0  # with a refiner .pt attached: read


def test_dtype_names_and_cli_errors(tmp_path, capsys):
    assert cv._dtype("fp16", torch.float32) is torch.float16 and cv._dtype("bf16", torch.float32) is torch.bfloat16
    assert cv._dtype("torch.float32", torch.bfloat16) is torch.float32 and cv._dtype("auto", torch.bfloat16) is torch.bfloat16
    with pytest.raises(cv.ConversionError, match="dtype 'Size' is not one of float32"):
        cv._dtype("Size", torch.float32)
    from hf_xpress.cli import main

    # bad input through the command line: one line naming the problem, exit status 2, no traceback
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-xpress convert: error: ") and "missing does not exist" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["convert", str(tmp_path / "missing"), str(tmp_path / "out"), "--dtype", "Size"])
    assert "invalid choice: 'Size'" in capsys.readouterr().err


def test_cli_refuses_a_target_the_checkpoint_was_not_trained_for_and_a_file_as_output(tmp_path, target, capsys):
    """`--target` whose vocabulary or width contradicts the checkpoint converted silently (its depth was checked);
    a missing target folder read as a malformed Hub id; an output path that is a file was reported as written."""
    from hf_xpress.cli import main

    base = write_zlab(tmp_path / "zlab")
    for name, changes in (("vocab", dict(vocab_size=2 * V)), ("width", dict(hidden_size=H // 2, head_dim=HD // 2))):
        other = Qwen3Config(**{**target.config.to_dict(), **changes})
        other.save_pretrained(tmp_path / name)
        assert main(["convert", str(base), str(tmp_path / f"out-{name}"), "--target", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert "built for another target" in err and ("vocab_size" in err if name == "vocab" else "hidden size" in err)
    assert main(["convert", str(base), str(tmp_path / "out"), "--target", str(tmp_path / "no-such-folder")]) == 2
    assert "no-such-folder' does not exist (a local path)" in capsys.readouterr().err  # was a Hub repo-id error
    (tmp_path / "a-file").write_text("x")
    for command in ("convert", "export"):
        assert main([command, str(base), str(tmp_path / "a-file")]) == 2
        assert "a-file exists and is not a folder" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == "x"
    # a non-empty folder: its files (another checkpoint's shards, card, code) would have been mixed into the output
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "model-00001-of-00002.safetensors").write_text("x")
    for command in ("convert", "export"):
        assert main([command, str(base), str(tmp_path / "used")]) == 2
        assert "used exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["model-00001-of-00002.safetensors"]
    (tmp_path / "clone" / ".git").mkdir(parents=True)  # a cloned Hub repository: hidden files only
    (tmp_path / "clone" / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert main(["convert", str(base), str(tmp_path / "clone")]) == 0


def test_a_hand_edited_zlab_config_is_a_malformed_checkpoint_not_a_crash(tmp_path, capsys):
    """Fields of another type (a list where an object belongs, text where a number does) raised AttributeError /
    TypeError / int() errors from inside the converter, as tracebacks from the command line."""
    from hf_xpress.cli import main

    for name, overrides in (("list", dict(dflash_config=[1, 2])), ("text", dict(rms_norm_eps="abc"))):
        folder = write_zlab(tmp_path / name, **overrides)
        with pytest.raises(cv.ConversionError, match="does not have the form its format needs .*the checkpoint is malformed"):
            cv.load_checkpoint(folder)
        assert main(["convert", str(folder), str(tmp_path / f"out-{name}")]) == 2
        assert "Traceback" not in capsys.readouterr().err
    # text where the layer ids or an integer belong: named (the ids were read character by character; "16" taken)
    for name, overrides, message in (
        ("ids", dict(dflash_config={"mask_token_id": MASK, "target_layer_ids": "1,3"}),
         "dflash_config.target_layer_ids must be a list of integers, got '1,3'"),
        ("block", dict(block_size="16"), "block_size must be an integer, got '16'"),
        ("width", dict(hidden_size=64.5), "hidden_size must be an integer, got 64.5"),  # was truncated to 64
        ("width-text", dict(hidden_size="abc"), "hidden_size must be an integer, got 'abc'"),
        ("mask", dict(dflash_config={"mask_token_id": 1.5, "target_layer_ids": IDS}), "mask_token_id must be an integer"),
    ):
        with pytest.raises(cv.ConversionError, match=message):
            cv.load_checkpoint(write_zlab(tmp_path / name, **overrides))


# ---- corrupt and foreign checkpoints -------------------------------------------------------------------------------


def test_refiner_pt_with_arbitrary_objects_is_refused(tmp_path):
    path = write_refiner_pt(tmp_path / "evil.pt", args=released_args(started=datetime.datetime(2026, 1, 1)))
    with pytest.raises(cv.ConversionError, match=r"Refusing to load .*datetime"):
        cv.load_refiner_checkpoint(path)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b"not a checkpoint at all"), "Could not read .* as a torch checkpoint"),
        (lambda p: torch.save({"model": {"w": torch.zeros(1)}}, p), "not an official xPress/Markov refiner checkpoint"),
        (lambda p: write_refiner_pt(p, args=released_args(no_mixer=True)), "head variant that is not the released one"),
        (lambda p: write_refiner_pt(p, **{"norm.weight": torch.ones(R)}), "unknown xpress refiner tensors"),
        (lambda p: write_refiner_pt(p, **{"mix.L": torch.zeros(R, 8, 7)}), r"mix.L has shape"),
        (lambda p: write_refiner_pt(p, **{"in_proj.weight": torch.zeros(R, 2 * R)}), "inconsistent xPress head shapes"),
        (lambda p: write_refiner_pt(p, **{"mix.tril": torch.ones(B, B)}), "mix.tril is not lower-triangular"),
        (lambda p: write_refiner_pt(p, args=released_args(markov_rank=32)), "args.markov_rank = 32"),
        (lambda p: write_refiner_pt(p, kind="markov", **{"markov_w1.weight": torch.zeros(V, R)}),
         r"under both its names \(markov_w1.weight / w1.weight\)"),
    ],
)
def test_corrupt_refiner_checkpoints_are_refused(tmp_path, make, message):
    path = tmp_path / "bad.pt"
    make(path)
    with pytest.raises(cv.ConversionError, match=message):
        cv.load_refiner_checkpoint(path)


def test_integer_weights_are_refused_not_cast(tmp_path, capsys):
    """A quantised (int8) checkpoint converted with exit status 0: its integers were copied as float values (a norm
    weight 100 became 100.0)."""
    from hf_xpress.cli import main

    weights = zlab_weights(0)
    weights["norm.weight"] = torch.full_like(weights["norm.weight"], 100, dtype=torch.int8)
    folder = write_zlab(tmp_path / "int8", weights=weights)
    with pytest.raises(cv.ConversionError, match=r"tensors of another kind .*\['norm.weight: torch.int8'\]"):
        cv.load_checkpoint(folder)
    assert main(["convert", str(folder), str(tmp_path / "out")]) == 2 and not (tmp_path / "out").exists()
    base = write_zlab(tmp_path / "zlab")
    for part in ("refiner_state_dict", "draft_state_dict"):
        path = write_refiner_pt(tmp_path / f"{part}.pt")
        ck = torch.load(path, weights_only=False)
        name = next(k for k, v in ck[part].items() if v.is_floating_point())
        ck[part][name] = ck[part][name].to(torch.int8)
        torch.save(ck, path)
        with pytest.raises(cv.ConversionError, match="tensors of another kind"):
            cv.load_checkpoint(path, base=base)


def test_truncated_refiner_checkpoint_is_refused(tmp_path):
    path = write_refiner_pt(tmp_path / "cut.pt")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(cv.ConversionError, match="Could not read"):
        cv.load_refiner_checkpoint(path)


def test_refiner_for_another_drafter_is_refused(tmp_path):
    base = write_zlab(tmp_path / "zlab")
    state = xpress_refiner_state(3, block=8)
    small = write_refiner_pt(tmp_path / "b8.pt", **{"mix.L": state["mix.L"], "mix.tril": state["mix.tril"]})
    with pytest.raises(cv.ConversionError, match="trained for block size 8"):
        cv.load_checkpoint(small, base=base)
    with pytest.raises(cv.ConversionError, match="pass the drafter it refines as base="):
        cv.load_checkpoint(small)
    other = write_refiner_pt(tmp_path / "other.pt")
    ck = torch.load(other, weights_only=False)
    ck["draft_state_dict"]["fc.weight"] = torch.zeros(H, 3 * H)
    torch.save(ck, other)
    with pytest.raises(cv.ConversionError, match="draft_state_dict does not fit the drafter"):
        cv.load_checkpoint(other, base=base)


def test_foreign_and_corrupt_folders_are_refused(tmp_path, target):
    target.save_pretrained(tmp_path / "qwen3")
    with pytest.raises(cv.ConversionError, match="not a dFlash/xPress drafter"):
        cv.load_checkpoint(tmp_path / "qwen3")
    with pytest.raises(cv.ConversionError, match="does not exist"):
        cv.load_checkpoint(tmp_path / "missing")
    weights = zlab_weights(0)
    del weights["layers.1.mlp.down_proj.weight"]
    with pytest.raises(cv.ConversionError, match=r"missing \['layers.1.mlp.down_proj.weight'\]"):
        cv.load_dflash(write_zlab(tmp_path / "incomplete", weights))
    broken = write_zlab(tmp_path / "broken")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(cv.ConversionError, match="Could not read the weights"):
        cv.load_dflash(broken)
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(cv.ConversionError, match="not valid JSON"):
        cv.load_dflash(broken)
    pickled = write_zlab(tmp_path / "pickled")  # a pytorch_model.bin that pickles objects: refused, never executed
    (pickled / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1), "when": datetime.datetime(2026, 1, 1)}, pickled / "pytorch_model.bin")
    with pytest.raises(cv.ConversionError, match="Refusing to load .*pytorch_model.bin: it pickles Python objects"):
        cv.load_dflash(pickled)
    sinks = write_zlab(tmp_path / "sinks", dflash_config={"mask_token_id": MASK, "target_layer_ids": IDS, "attention_sink_bias": True})
    with pytest.raises(cv.ConversionError, match="attention_sink_bias"):
        cv.load_dflash(sinks)
    # our loader converts a dFlash folder itself, and points the way for anything else
    assert XPressDrafterModel.from_pretrained(write_zlab(tmp_path / "zlab")).config.refiner is None
    with pytest.raises(ValueError, match="not an xPress drafter checkpoint .*use `hf_xpress.conversion`"):
        XPressDrafterModel.from_pretrained(tmp_path / "qwen3")


def test_a_config_missing_a_required_field_is_a_clear_error(tmp_path, capsys):
    folder = write_zlab(tmp_path / "zlab")
    raw = json.loads((folder / "config.json").read_text())
    del raw["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(cv.ConversionError, match=r"config.json has no 'intermediate_size'"):
        cv.load_checkpoint(folder)
    from hf_xpress.cli import main

    assert main(["convert", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has no 'intermediate_size'" in err and "Traceback" not in err


def test_refiner_pt_whose_args_are_not_a_namespace_is_refused(tmp_path):
    path = write_refiner_pt(tmp_path / "list-args.pt", args=["--xpress-rank", "16"])
    with pytest.raises(cv.ConversionError, match="'args' is a list"):
        cv.load_refiner_checkpoint(path)


def test_bfloat16_checkpoints_load_as_stored_with_float32_rope(tmp_path, target):
    """A bf16 z-lab folder converts to bf16 weights with float32 RoPE frequencies, and the converted folder loads the
    same way with dtype=None or "auto" (as stored), drafting exactly what the conversion drafted."""
    weights = {k: v.to(torch.bfloat16) for k, v in zlab_weights(0).items()}
    zlab = write_zlab(tmp_path / "zlab-bf16", weights)
    converted = cv.load_checkpoint(zlab, target=target)
    assert converted.fc.weight.dtype == torch.bfloat16
    assert all(b.dtype == torch.float32 for b in converted.rotary_emb.buffers())
    converted.save_pretrained(tmp_path / "ours")
    features, block, _ = inputs(target)
    expected = ours(converted, features.to(torch.bfloat16), block.to(torch.bfloat16))
    for dtype in (None, "auto"):
        loaded = cv.load_checkpoint(tmp_path / "ours", dtype=dtype)
        assert loaded.fc.weight.dtype == torch.bfloat16, dtype
        assert all(b.dtype == torch.float32 for b in loaded.rotary_emb.buffers())
        torch.testing.assert_close(ours(loaded, features.to(torch.bfloat16), block.to(torch.bfloat16)), expected,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("sharded", [False, True])
def test_pytorch_model_bin_folders_whole_or_sharded_convert_like_safetensors(tmp_path, target, sharded):
    weights = zlab_weights(0)
    reference = cv.load_checkpoint(write_zlab(tmp_path / "st", weights), target=target)
    folder = tmp_path / "bin"
    write_zlab(folder, weights)
    (folder / "model.safetensors").unlink()
    if sharded:
        names = sorted(weights)
        halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
        for shard, keys in halves.items():
            torch.save({k: weights[k] for k in keys}, folder / shard)
        weight_map = {k: shard for shard, keys in halves.items() for k in keys}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        torch.save(weights, folder / "pytorch_model.bin")
    converted = cv.load_checkpoint(folder, target=target)
    for (name, a), (_, b) in zip(reference.state_dict().items(), converted.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)


def test_from_pretrained_on_a_foreign_folder_honours_its_options(tmp_path):
    """`XPressDrafterModel.from_pretrained` converting a z-lab folder on load: subfolder, dtype (also the torch_dtype
    alias), device_map and attn_implementation apply; an option conversion can not honour is refused by name."""
    repo = tmp_path / "repo"
    write_zlab(repo / "drafter")
    with pytest.raises(ValueError, match="repo has no config.json: not a saved drafter folder"):
        XPressDrafterModel.from_pretrained(repo)  # the root holds no checkpoint
    model = XPressDrafterModel.from_pretrained(repo, subfolder="drafter", torch_dtype=torch.bfloat16,
                                               device_map="cpu", attn_implementation="eager")
    assert model.fc.weight.dtype == torch.bfloat16 and model.fc.weight.device.type == "cpu"
    assert model.config._attn_implementation == "eager"
    assert XPressDrafterModel.from_pretrained(repo / "drafter", dtype=torch.float16).fc.weight.dtype == torch.float16
    alias = XPressDrafterModel.from_pretrained(repo / "drafter", dtype=None, torch_dtype=torch.bfloat16)
    assert alias.fc.weight.dtype == torch.bfloat16  # an explicit dtype=None does not hide the alias
    with pytest.raises(ValueError, match="converted on load, .* not quantization_config"):
        XPressDrafterModel.from_pretrained(repo / "drafter", quantization_config={"load_in_8bit": True})
    with pytest.raises(ValueError, match="device_map dict"):
        XPressDrafterModel.from_pretrained(repo / "drafter", device_map={"": "cpu"})
