"""Side-by-side: official z-lab DFlashDraftModel / xPress XPressRefinerHead + xpress_par_k_refine / DeepSpec VanillaMarkov
vs hf-xpress (converted with hf_xpress.conversion). float32, random weights, tiny Qwen3 target."""
import argparse, json, os, sys, tempfile
from pathlib import Path

import torch

HERE = Path(__file__).parent
OFFICIAL = Path(os.environ.get("OFFICIAL", HERE / "official"))  # the official files: see README.md
sys.path.insert(0, str(OFFICIAL / "zlab"))
sys.path.insert(0, str(OFFICIAL / "xpress"))
import zlab_model as Z  # z-lab/dflash @ 44947fb dflash/model.py, unmodified
from refiners.xpress_head import XPressRefinerHead  # xPress @ 1b2b62b
from refiners.xpress import xpress_par_k_refine, load_xpress_refiner
from refiners.markov import load_markov_head
from transformers import Qwen3Config, Qwen3ForCausalLM, DynamicCache
from transformers.cache_utils import DFlashCache
sys.path.insert(0, str(HERE))  # compat.py
from compat import CompatDynamicCache

from hf_xpress import conversion as cv

torch.set_grad_enabled(False)
V, H, INTER, HEADS, KV, HD, TL = 128, 64, 160, 4, 2, 16, 6
MASK = V - 1
RESULTS = {}


def compare_cotrained(name, off, ours, target, block, context, seed):
    """The official and our co-trained drafter on one block: reports their hidden states' difference and returns the
    official hidden states with the inputs (features, block embeddings, token ids)."""
    feat, emb, ids = features_and_block(target, off.target_layer_ids, context, block, seed=seed)
    pos = torch.arange(feat.shape[1] + block)[None]
    h = off(position_ids=pos, noise_embedding=emb, target_hidden=feat, is_causal=False)
    hu = ours(noise_embeds=emb, context_hidden_states=feat, position_ids=pos).last_hidden_state
    report(f"{name}: co-trained drafter hidden max|diff|", (h - hu).abs().max().item())
    return h, feat, emb, ids


def report(name, diff, ok=None):
    ok = (diff < 1e-4) if ok is None else ok
    RESULTS[name] = (float(diff) if not isinstance(diff, bool) else diff, bool(ok))
    print(f"{'OK ' if ok else 'BAD'} {name}: {diff}")


def make_target(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=TL,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=1024,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    t = Qwen3ForCausalLM(cfg).eval()
    # make it a bit peaky/structured so greedy decoding loops and drafts can be accepted
    for p in t.parameters():
        p.data.normal_(0, 0.15) if p.dim() > 1 else p.data.uniform_(0.8, 1.2)
    return t


def official_drafter(layers, block, ids=None, attn="eager", seed=1, use_ids=True):
    dflash = {"mask_token_id": MASK}
    if use_ids:
        dflash["target_layer_ids"] = ids if ids is not None else Z.build_target_layer_ids(TL, layers)
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=40960,
                      rope_theta=1_000_000.0, tie_word_embeddings=False)
    cfg.block_size = block
    cfg.num_target_layers = TL
    cfg.dflash_config = dflash
    cfg.architectures = ["DFlashDraftModel"]
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    m = Z.DFlashDraftModel(cfg).eval()
    for n, p in m.named_parameters():
        if "norm" in n:
            p.data = 1 + 0.2 * torch.randn_like(p)
        else:
            p.data = 0.12 * torch.randn_like(p)
    return m


def save_official(m, folder):
    m.save_pretrained(folder, safe_serialization=True)
    raw = json.loads((Path(folder) / "config.json").read_text())
    return raw


def features_and_block(target, ids_layers, ctx_len, block, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (1, ctx_len + 1), generator=g)
    out = target(ids[:, :-1], output_hidden_states=True)
    feat = Z.extract_context_feature(out.hidden_states, ids_layers)  # official: hidden_states[id + 1]
    blk_ids = torch.cat([ids[:, -1:], torch.full((1, block - 1), MASK)], 1)
    emb = target.model.embed_tokens(blk_ids)
    return feat, emb, ids


def check_drafter(target, layers, block, attn, use_ids=True, tag=""):
    off = official_drafter(layers, block, attn=attn, use_ids=use_ids)
    with tempfile.TemporaryDirectory() as d:
        raw = save_official(off, d)
        ours = cv.load_checkpoint(d, target=target.config)
    name = f"drafter L{layers} B{block} {attn}{tag}"
    report(f"{name}: target_layer_ids equal {off.target_layer_ids} vs {ours.config.target_layer_ids}", 0.0,
           list(off.target_layer_ids) == list(ours.config.target_layer_ids))
    report(f"{name}: mask token", 0.0, ours.config.mask_token_id == off.mask_token_id)
    feat, emb, ids = features_and_block(target, off.target_layer_ids, 11, block)
    c = feat.shape[1]
    pos = torch.arange(c + block)[None]
    h_off = off(position_ids=pos, noise_embedding=emb, target_hidden=feat, is_causal=False)
    h_ours = ours(noise_embeds=emb, context_hidden_states=feat, position_ids=pos).last_hidden_state
    report(f"{name}: block hidden (no cache) max|diff|", (h_off - h_ours).abs().max().item())
    lo, lu = target.lm_head(h_off[:, 1:]), target.lm_head(h_ours[:, 1:])
    report(f"{name}: logits slots 1..B-1 max|diff|", (lo - lu).abs().max().item())
    # default positions (ours: arange(past, past + c + q)) == official's explicit positions
    h_def = ours(noise_embeds=emb, context_hidden_states=feat).last_hidden_state
    report(f"{name}: ours default position_ids == official arange", (h_off - h_def).abs().max().item())
    # with caches, 3 rounds (official: DynamicCache + crop(start); ours: DFlashCache + crop(-B), as in generation.py)
    full_ids = torch.randint(0, V - 1, (1, 40), generator=torch.Generator().manual_seed(5))
    out = target(full_ids, output_hidden_states=True)
    allfeat = Z.extract_context_feature(out.hidden_states, off.target_layer_ids)
    co, cu = CompatDynamicCache(), DFlashCache()
    ctx_len_ours = 0
    worst = 0.0
    for start in (9, 13, 20):  # anchor positions; context = rows [cache_len, start)
        blk_ids = torch.cat([full_ids[:, start:start + 1], torch.full((1, block - 1), MASK)], 1)
        e = target.model.embed_tokens(blk_ids)
        past = co.get_seq_length()
        f = allfeat[:, past:start]
        ho = off(target_hidden=f, noise_embedding=e, position_ids=torch.arange(past, start + block)[None],
                 past_key_values=co, use_cache=True, is_causal=False)
        co.crop(start)
        hu = ours(noise_embeds=e, context_hidden_states=f,
                  position_ids=torch.arange(ctx_len_ours, ctx_len_ours + f.shape[1] + block)[None], cache=cu
                  ).last_hidden_state
        cu.crop(-block)
        ctx_len_ours += f.shape[1]
        worst = max(worst, (ho[:, -block:] - hu).abs().max().item())
    report(f"{name}: 3 cached rounds max|diff|", worst)
    return off, ours


def rand_head(block, r=16, seed=3):
    torch.manual_seed(seed)
    head = XPressRefinerHead(V, H, block, markov_rank=r, mlp_ratio=2, initializer_range=0.3)
    head.mix.L.data = 0.3 * torch.randn_like(head.mix.L)  # L starts at zero in training; random here
    return head.eval()


def check_refiner(target, off, block, tmp):
    r = 16
    head = rand_head(block, r)
    args = argparse.Namespace(markov_rank=r, mlp_ratio=2, markov_only=False, no_hidden=False, no_perpos=False,
                              no_global=False, no_residual=True, no_mixer=False, no_mlp=False, input_mode="concat",
                              no_sublayer_norm=True, no_mix_out=True, lowrank_lmhead_shared_rank=0,
                              lowrank_base_rank=0, input_relu=False)
    # a co-trained drafter (different weights) in DFlashDraftModel names, as the official harness loads it
    cot = official_drafter(off.config.num_hidden_layers, block, seed=77)
    pt = Path(tmp) / f"xpress_b{block}.pt"
    torch.save({"args": args, "refiner_state_dict": head.state_dict(), "draft_state_dict": cot.state_dict(),
                "global_step": 1}, pt)
    base = Path(tmp) / f"zlab_b{block}"
    save_official(off, base)
    ours = cv.load_checkpoint(pt, base=base, target=target.config)
    # official harness: draft_model.load_state_dict(ck["draft_state_dict"], strict=False); load_xpress_refiner(fold)
    off.load_state_dict(torch.load(pt, weights_only=False)["draft_state_dict"], strict=False)
    head_f = load_xpress_refiner(pt, V, H, block, "cpu", dtype=torch.float32, fold_mixer=True)
    head_u = load_xpress_refiner(pt, V, H, block, "cpu", dtype=torch.float32, fold_mixer=False)
    name = f"xpress B{block}"
    h, feat, emb, ids = compare_cotrained(name, off, ours, target, block, 12, seed=2)
    g = h.mean(dim=1, keepdim=True).expand(-1, block, -1)
    worst_u = worst_f = worst_t = 0.0
    for s in range(5):
        prev = torch.randint(0, V, (1, block), generator=torch.Generator().manual_seed(100 + s))
        b_off_u = head_u.bias(h, g, prev)[:, 1:]
        b_off_f = head_f.bias(h, g, prev)[:, 1:]
        b_ours = ours.refiner(h, prev)  # teacher-forced, slots 1..B-1 (training path, unfolded mixer + I)
        x = ours.refiner
        tables = x.tables()
        b_ours_t = x.delta(x.hidden_part(h, tables), prev, 1, None, tables)  # inference path (float32 tables)
        worst_u = max(worst_u, (b_off_u - b_ours).abs().max().item())
        worst_f = max(worst_f, (b_off_f - b_ours).abs().max().item())
        worst_t = max(worst_t, (b_off_f - b_ours_t).abs().max().item())
        scale = b_off_u.abs().max().item()
    print(f"   (bias scale max|bias| = {scale:.1f}; float32 eps*scale = {scale * 1.2e-7:.2e}; "
          f"official unfolded vs folded: {(b_off_u - b_off_f).abs().max().item():.2e})")
    tol = max(1e-4, 2e-6 * scale)
    report(f"{name}: bias vs official unfolded head max|diff|", worst_u, worst_u < tol)
    report(f"{name}: bias vs official folded head max|diff|", worst_f, worst_f < tol)
    report(f"{name}: inference-table bias vs official folded max|diff|", worst_t, worst_t < tol)
    # mixer folding L*tril + I
    Lf_off = head_f.mix.L.detach()
    report(f"{name}: folded mixer (L*tril+I) max|diff|", (Lf_off - ours.refiner.mix.folded()).abs().max().item())
    # slot-0 / causality: official bias of slot k depends only on prev[:k+1]
    base_logits = target.lm_head(h[:, 1:])
    anchor, before = ids[0, -1:], ids[0, -2:-1]
    mism = []
    for K in (0, 1, 2, 3, block - 1):
        for lock in (False, True):
            ref = xpress_par_k_refine(head_f, h, base_logits, anchor, before, K, lambda lg: torch.argmax(lg, -1),
                                      lock=lock)
            for es in (False, True):
                p = ours.propose(h, base_logits, torch.stack([before, anchor], 1), passes=K, early_stop=es)
                if not torch.equal(p.tokens, ref):
                    mism.append((K, lock, es, ref.tolist(), p.tokens.tolist()))
    report(f"{name}: greedy Jacobi tokens K in 0,1,2,3,B-1 (lock/early-stop both ways) mismatches={len(mism)}", 0.0,
           not mism)
    if mism:
        print(mism[:3])
    ref_changed = not torch.equal(xpress_par_k_refine(head_f, h, base_logits, anchor, before, block - 1,
                                                      lambda lg: torch.argmax(lg, -1)), base_logits.argmax(-1))
    report(f"{name}: (sanity) refiner changes drafts", 0.0, ref_changed)
    # sequential left-to-right decode == K=B-1 (fixed point) on the official head
    seq = torch.zeros(1, block, dtype=torch.long)
    seq[0, 0] = anchor
    for k in range(1, block):
        prev = seq.roll(1, 1); prev[0, 0] = before
        lg = base_logits + head_f.bias(h, g, prev)[:, 1:]
        seq[0, k] = lg[0, k - 1].argmax()
    p = ours.propose(h, base_logits, torch.stack([before, anchor], 1), passes=block - 1, early_stop=False)
    report(f"{name}: ours K=B-1 == official-head sequential decode", 0.0, torch.equal(p.tokens, seq[:, 1:]))
    # sampling: shared Gumbel noise, temperature T; official q = last pass's refined logits (_QLogitsRecorder)
    from model.dflash import _QLogitsRecorder
    worst_q, tokbad = 0.0, 0
    for T in (0.7, 1.0, 1.6):
        for K in (1, 3, block - 1):
            rec = _QLogitsRecorder(T)
            torch.manual_seed(11)
            ref = xpress_par_k_refine(head_f, h, base_logits, anchor, before, K, rec, lock=True)
            torch.manual_seed(11)
            u = torch.rand(base_logits.shape)
            noise = -torch.log((-torch.log(u.clamp_min(1e-20))).clamp_min(1e-20))
            p = ours.propose(h, base_logits, torch.stack([before, anchor], 1), passes=K, early_stop=True,
                             noise=noise, logits_hook=lambda s, st, c: s / T)
            tokbad += int(not torch.equal(p.tokens, ref))
            worst_q = max(worst_q, (p.logits - rec.last_logits / T).abs().max().item())
    report(f"{name}: sampled Jacobi tokens (shared Gumbel, T=.7/1/1.6, K=1/3/B-1) mismatches={tokbad}", 0.0,
           tokbad == 0)
    report(f"{name}: sampled q (last pass refined logits / T) max|diff|", worst_q, worst_q < tol * 2)
    return ours, head_f, pt


def check_markov(target, off_base_folder, block, tmp, off):
    r = 16
    g = torch.Generator().manual_seed(9)
    sd = {"w1.weight": torch.randn(V, r, generator=g) * 0.6, "w2.weight": torch.randn(V, r, generator=g) * 0.6}
    cot = official_drafter(off.config.num_hidden_layers, block, seed=78)
    pt = Path(tmp) / f"markov_b{block}.pt"
    torch.save({"args": argparse.Namespace(markov_rank=r), "refiner_state_dict": sd,
                "draft_state_dict": cot.state_dict(), "global_step": 1}, pt)
    ours = cv.load_checkpoint(off_base_folder, refiner=pt, target=target.config)
    mk = load_markov_head(pt, V, "cpu", dtype=torch.float32)
    off.load_state_dict(cot.state_dict(), strict=False)
    name = f"markov B{block}"
    h, feat, emb, ids = compare_cotrained(name, off, ours, target, block, 10, seed=4)
    base_logits = target.lm_head(h[:, 1:])
    anchor, before = ids[0, -1:], ids[0, -2:-1]
    tok, lg = mk.sample_block_tokens(base_logits, first_prev_token_ids=anchor, hidden_states=None, temperature=0.0)
    p = ours.propose(h, base_logits, torch.stack([before, anchor], 1))
    report(f"{name}: greedy tokens equal", 0.0, torch.equal(p.tokens, tok))
    report(f"{name}: corrected logits max|diff|", (p.logits - lg).abs().max().item())
    report(f"{name}: (sanity) head changes drafts", 0.0, not torch.equal(tok, base_logits.argmax(-1)))
    return ours, mk, pt


def main():
    target = make_target()
    for layers, block, attn, use_ids in [(1, 8, "eager", True), (2, 16, "eager", True), (2, 16, "sdpa", True),
                                         (3, 8, "eager", False), (5, 16, "eager", True), (1, 16, "eager", False)]:
        check_drafter(target, layers, block, attn, use_ids, tag="" if use_ids else " (ids from rule)")
    with tempfile.TemporaryDirectory() as tmp:
        for block in (8, 16):
            off = official_drafter(2, block)
            check_refiner(target, off, block, tmp)
            off = official_drafter(2, block)
            base = Path(tmp) / f"zlab_b{block}"
            check_markov(target, base, block, tmp, off)
    bad = [k for k, (d, ok) in RESULTS.items() if not ok]
    print(f"\n{len(RESULTS) - len(bad)}/{len(RESULTS)} checks OK")
    for k in bad:
        print("FAILED:", k, RESULTS[k])


if __name__ == "__main__":
    main()
