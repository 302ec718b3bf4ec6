"""Targets of many architectures: a drafter built by `from_target` stays lossless on each (rounds made to accept
many drafts), and the trainer reads each target's features and logits as its own forward gives them.

One tiny random model per family whose layout differs in a way the drafter or the trainer depends on: attention
(grouped, multi-query, sliding-window, ALiBi, latent, none), partial rotary, MoE, logit scalings, tied and untied heads, decoders
stored under unusual attribute names, picked from a wider ad-hoc sweep (not committed).
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tf

from hf_xpress import training as T

from conftest import tiny_drafter

V, H = 256, 64
NONE = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, **NONE)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)


def _std(config: str, model: str, **kw):
    return lambda: getattr(tf, model)(getattr(tf, config)(**{**BASE, **kw}))


ARCHITECTURES = {
    "llama": _std("LlamaConfig", "LlamaForCausalLM"),
    "mistral (sliding window)": _std("MistralConfig", "MistralForCausalLM", sliding_window=8),
    "qwen3": _std("Qwen3Config", "Qwen3ForCausalLM", head_dim=16),
    "qwen3_moe": _std("Qwen3MoeConfig", "Qwen3MoeForCausalLM", head_dim=16, **MOE),
    "gemma2 (soft-capped logits)": _std("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=8,
                                        final_logit_softcapping=2.0),
    "gemma3": _std("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, sliding_window=8),
    "phi3": _std("Phi3Config", "Phi3ForCausalLM"),
    "phi (partial rotary, scaled RoPE)": _std("PhiConfig", "PhiForCausalLM", rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}),
    "granite (scaled logits)": _std("GraniteConfig", "GraniteForCausalLM", logits_scaling=4.0,
                                    embedding_multiplier=12.0),
    "cohere (scaled logits)": _std("CohereConfig", "CohereForCausalLM", logit_scale=0.25),
    "olmo2": _std("Olmo2Config", "Olmo2ForCausalLM"),
    "mixtral": _std("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": _std("GptOssConfig", "GptOssForCausalLM", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=8),
    "deepseek_v3 (latent attention)": _std(
        "DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4),
    "llama4 (decoder under .model)": _std("Llama4TextConfig", "Llama4ForCausalLM", head_dim=16,
                                          intermediate_size_mlp=128, num_local_experts=2, num_experts_per_tok=1,
                                          interleave_moe_layer_step=2),
    "gpt_neox": _std("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=H, n_layer=4, n_head=4, n_positions=512,
                                                      **NONE)),
    "falcon (multi-query)": lambda: tf.FalconForCausalLM(tf.FalconConfig(vocab_size=V, hidden_size=H,
                                                                          num_hidden_layers=4, num_attention_heads=4,
                                                                          **NONE)),
    "bloom (ALiBi)": lambda: tf.BloomForCausalLM(tf.BloomConfig(vocab_size=V, hidden_size=H, n_layer=4, n_head=4,
                                                                **NONE)),
    "mamba (no attention)": lambda: tf.MambaForCausalLM(tf.MambaConfig(vocab_size=V, hidden_size=H,
                                                                       num_hidden_layers=4, state_size=8, **NONE)),
}


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch_target(request):
    torch.manual_seed(0)
    model = ARCHITECTURES[request.param]().float().eval()
    with torch.no_grad():  # logits of a trained model's scale, so that TV / sampling see peaked distributions
        model.get_output_embeddings().weight.mul_(8.0)
    return model


@pytest.mark.parametrize("refiner", ["xpress", "markov"])
def test_lossless_with_many_accepted_drafts(arch_target, refiner, oracle):
    drafter = tiny_drafter(arch_target, refiner)
    ids = torch.randint(0, V - 2, (1, 11), generator=torch.Generator().manual_seed(1))
    plain = arch_target.generate(ids, max_new_tokens=48, do_sample=False)
    oracle["continuation"] = plain[0]
    ours = arch_target.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False)
    assert torch.equal(ours, plain)
    assert max(drafter.stats.accepted) >= 4  # rounds really accepted several drafts
    short = torch.tensor([[7]])  # a one-token prompt, the drafter's own (rarely accepted) drafts
    oracle["continuation"] = arch_target.generate(short, max_new_tokens=24, do_sample=False)[0]
    assert torch.equal(arch_target.generate(short, assistant_model=drafter, max_new_tokens=24, do_sample=False),
                       oracle["continuation"][None])


def test_trainer_reads_the_target_as_its_forward_does(arch_target):
    """Features from the target's decoder, p_target from the logits its own forward returns, one training step's
    losses finite with gradients for the drafter."""
    drafter = tiny_drafter(arch_target, "xpress", refiner_rank=16).train()
    T.check_target_logits(arch_target, T.target_logit_scaling(arch_target))
    tok = torch.randint(3, V - 2, (40,), generator=torch.Generator().manual_seed(2))
    layers = list(drafter.config.target_layer_ids)
    with torch.no_grad():
        feats, finals = T.target_features(arch_target, tok[None], layers)
        logits = arch_target(tok[None]).logits[0]
    assert feats.shape == (1, 40, len(layers) * H)
    packed = T.pack_blocks(drafter, arch_target.get_input_embeddings(), arch_target.get_output_embeddings(),
                           [(tok, logits.argmax(-1), 2)], [feats[0]], [finals[0]], anchors_per_seq=2,
                           generator=torch.Generator().manual_seed(0),
                           logit_scaling=T.target_logit_scaling(arch_target))
    valid = packed.blocks.valid
    p_argmax = packed.blocks.p_target.argmax(-1)
    assert torch.equal(p_argmax[valid], packed.blocks.labels[valid])  # p_target peaks at the label (the argmax)
    hidden, base = T.drafter_outputs(drafter, arch_target.get_output_embeddings(), packed)
    loss, _ = T.refiner_losses(drafter, hidden, base, packed.blocks, T.position_weights(15, 7.0))
    loss.backward()
    assert math.isfinite(loss.item()) and drafter.fc.weight.grad is not None
