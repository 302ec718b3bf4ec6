"""The xPress drafter: a dFlash block-diffusion drafter with an optional causal refiner.

Read top to bottom:

1. `XPressAttention` / `XPressDecoderLayer`: Qwen3-type layers whose keys/values are `cat(context, block)`. The
   block (anchor + B-1 masks) attends to all of the context and bidirectionally within itself; no causal mask.
   (Converted checkpoints may also have sliding-window and block-causal layers: `config.layer_types`,
   `config.causal_layers`.)
2. `XPressRefiner` (xPress: Fuse / Mix / Trans / Read) and `XPressMarkovHead` (DSpark's sequential bigram bias).
3. `XPressDrafterModel`: the fused target context (`fc` -> `hidden_norm`), the layers, the final `norm`, the
   refiner, and `propose()`, which turns one drafter forward into B-1 draft tokens and their logits (seed,
   then K parallel Jacobi passes of the refiner, or the Markov head's left-to-right decode).

The drafter owns no embedding and no lm_head: callers pass the target's (`target.get_input_embeddings()`,
`target.get_output_embeddings()`). This file imports only torch and transformers so that it also runs as
Hub remote code without the `hf_xpress` package.
"""

from __future__ import annotations

import logging as std_logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)
from transformers.utils import logging

from .configuration_xpress import INFERENCE_SETTINGS, XPressDrafterConfig

logger = logging.get_logger(__name__)


class _DropLoadReport(std_logging.Filter):
    """Drops transformers' weight-loading table: `XPressDrafterModel.from_pretrained` names what is wrong itself."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


_DROP_LOAD_REPORT = _DropLoadReport()

MIN_TRANSFORMERS = "5.24"  # model outputs and generate's model kwargs name the KV cache `cache` from 5.24 on


def check_transformers_version(installed: str) -> None:
    """Refuse a transformers release older than `MIN_TRANSFORMERS`, which would fail deep inside `generate`."""
    from packaging.version import Version

    if Version(installed) < Version(MIN_TRANSFORMERS):
        raise ImportError(f"xPress drafters need transformers >= {MIN_TRANSFORMERS} (installed: {installed}); "
                          f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")


check_transformers_version(transformers.__version__)


# --------------------------------------------------------------------------------------------------------------------
# dFlash layers
# --------------------------------------------------------------------------------------------------------------------


class XPressRMSNorm(Qwen3RMSNorm):
    pass


class XPressRotaryEmbedding(Qwen3RotaryEmbedding):
    """Qwen3's RoPE, whose frequencies stay float32 under `model.to(dtype)`, as `from_pretrained(dtype=...)` leaves
    them: a bfloat16 `inv_freq` shifts the rotation angles by up to ~0.4% (more at longer distances), so the same
    checkpoint would draft differently depending on how it was cast."""

    def _apply(self, fn, recurse: bool = True):
        kept = {name: b for name, b in self._buffers.items() if b is not None and b.dtype == torch.float32}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after is not None and after.dtype != torch.float32:
                self._buffers[name] = before.to(after.device)
        return self


class XPressAttention(nn.Module):
    """Qwen3 attention (q_norm/k_norm, GQA, RoPE) where keys/values come from `cat(context, block)`."""

    def __init__(self, config: XPressDrafterConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        # Layouts of converted checkpoints (the dFlash default: neither): a window on |q_pos - k_pos|, a causal block.
        self.sliding_window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None
        self.causal_block = layer_idx in config.causal_layers
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = XPressRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = XPressRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        position_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """hidden_states: `[b, q, H]` (the block); context: `[b, c, H]` new context rows, or None.

        `position_embeddings` cover the `c + q` new positions (`position_ids`, needed by sliding-window and causal
        layers). Returns `[b, q, H]`.
        """
        b, q, _ = hidden_states.shape
        kv_input = hidden_states if context is None else torch.cat([context, hidden_states], dim=1)
        query = self.q_norm(self.q_proj(hidden_states).view(b, q, -1, self.head_dim)).transpose(1, 2)
        key = self.k_norm(self.k_proj(kv_input).view(b, kv_input.shape[1], -1, self.head_dim)).transpose(1, 2)
        value = self.v_proj(kv_input).view(b, kv_input.shape[1], -1, self.head_dim).transpose(1, 2)

        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        query = query * cos[:, :, -q:] + rotate_half(query) * sin[:, :, -q:]
        key = key * cos + rotate_half(key) * sin
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        if self.sliding_window is not None or self.causal_block:
            attention_mask = self._layout_mask(attention_mask, position_ids, key.shape[-2], q, query.dtype)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, _ = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
        )
        return self.o_proj(out.reshape(b, q, -1).contiguous())


    def _layout_mask(
        self, attention_mask: torch.Tensor | None, position_ids: torch.LongTensor, kv: int, q: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """`attention_mask` (additive, over the last `kv` keys or more) with this layer's window / causal block.

        The new rows sit at `position_ids` `[b, c + q]`; the `kv - c - q` keys before them come from the cache and are
        the context rows just before the first new row (a sliding-window cache layer may keep only the last ones).
        """
        cached = kv - position_ids.shape[-1]
        keys = position_ids
        if cached:
            before = position_ids[:, :1] - cached + torch.arange(cached, device=keys.device)
            keys = torch.cat([before, keys], dim=1)
        distance = position_ids[:, None, -q:, None] - keys[:, None, None, :]  # q_pos - k_pos, [b, 1, q, kv]
        visible = torch.ones_like(distance, dtype=torch.bool)
        if self.causal_block:
            visible &= distance >= 0
        if self.sliding_window is not None:
            visible &= distance < self.sliding_window
            if not self.causal_block:
                visible &= -distance < self.sliding_window
        bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)
        return bias if attention_mask is None else torch.where(visible, attention_mask[..., -kv:], bias)


class XPressDecoderLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer; the fused context is shared by every layer and is not re-normalised."""

    def __init__(self, config: XPressDrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = XPressAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = XPressRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = XPressRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        position_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states), context, position_embeddings, attention_mask, cache, position_ids
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


# --------------------------------------------------------------------------------------------------------------------
# Refiners
# --------------------------------------------------------------------------------------------------------------------


class XPressCausalMixer(nn.Module):
    """Channel-wise causal mixer over the block: `u[k, c] = sum_{j<=k} L[c, k, j] x[j, c]`, output `x + u`."""

    def __init__(self, rank: int, block_size: int):
        super().__init__()
        self.L = nn.Parameter(torch.zeros(rank, block_size, block_size))
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)), persistent=False)

    def folded(self) -> torch.Tensor:
        """`L * tril + I`, shape `[r, B, B]`: the whole mixer (residual included) as one batched matmul."""
        eye = torch.eye(self.tril.shape[0], dtype=self.L.dtype, device=self.L.device)
        return self.L * self.tril.to(self.L.dtype) + eye

    def forward(self, x: torch.Tensor, folded: torch.Tensor | None = None) -> torch.Tensor:
        """x: `[N, n, r]` -> `[N, n, r]`, the first n <= B slots (causal: exactly those rows of a whole block's result).
        `folded`: `self.folded()`, when the caller computed it once for many calls."""
        n = x.shape[1]
        folded = (self.folded() if folded is None else folded)[:, :n, :n]
        mixed = torch.bmm(folded, x.permute(2, 1, 0).contiguous())  # [r, B, N]; contiguous: faster bmm (and grad)
        return mixed.permute(2, 1, 0)


class XPressRefinerMLP(nn.Module):
    """SwiGLU in r dims, no bias (the residual is added by the caller)."""

    def __init__(self, rank: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(rank, hidden, bias=False)
        self.up_proj = nn.Linear(rank, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, rank, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Training; inference uses `RefinerTables.gate_up` / `down` (`XPressRefiner.features`)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class RefinerTables:
    """Products of the refiner's weights that inference reuses for every block (see `XPressRefiner.tables`).

    Everything but the token table is float32: these matrices are tiny (r x r-sized), so float32 costs nothing on a
    GPU and is faster than bfloat16 for such small matmuls on a CPU."""

    key: tuple
    hidden_own: torch.Tensor  # [H, r]: (in_proj[:, :r] @ down_h).T
    hidden_pool: torch.Tensor  # [H, r]: (in_proj[:, r:2r] @ down_g).T
    token_in: torch.Tensor  # [V, r] (model dtype): w1 @ in_proj[:, 2r:].T, the Fuse input of every token
    mixer: torch.Tensor  # [B, B, r]: the folded mixer (`mix.folded()`), indexed [k, j, channel]
    gate_up: torch.Tensor  # [r, 2 * hidden]: the Trans MLP's gate and up projections, stacked and transposed
    down: torch.Tensor  # [hidden, r]: the Trans MLP's down projection, transposed


class XPressRefiner(nn.Module):
    """xPress: a learned logit bias `delta_k` for the drafter's logits `s_k`, causal in the block's tokens.

    Fuse `[down_h(h_k), down_g(mean(h)), w1(x_{k-1})]` -> `in_proj`; Mix (causal over slots); Trans (residual
    SwiGLU); Read (`w2`, r -> V). Slot k's input carries the token at k-1, so slot k depends only on tokens < k.
    """

    def __init__(self, config: XPressDrafterConfig):
        super().__init__()
        r = config.refiner_rank
        self.rank = r
        self.w1 = nn.Embedding(config.vocab_size, r)
        self.down_h = nn.Linear(config.hidden_size, r, bias=False)
        self.down_g = nn.Linear(config.hidden_size, r, bias=False)
        self.in_proj = nn.Linear(3 * r, r, bias=False)
        self.mix = XPressCausalMixer(r, config.block_size)
        self.mlp = XPressRefinerMLP(r, config.refiner_mlp_ratio * r)
        self.w2 = nn.Linear(r, config.vocab_size, bias=False)

    def tables(self) -> RefinerTables:
        """Weight products for inference, computed (in float32) once and rebuilt whenever a weight changes.

        They fold Fuse's projections: `in_proj(cat(down_h h, down_g g, w1 x))` = `h @ hidden_own + g @ hidden_pool +
        token_in[x]`, so a Jacobi pass reads one row per token instead of an embedding and a matmul. The token table is
        as large as `w1`.
        """
        mlp = self.mlp
        params = (self.w1.weight, self.in_proj.weight, self.down_h.weight, self.down_g.weight, self.mix.L,
                  mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        cached = getattr(self, "_tables", None)
        if cached is not None and cached.key == key:
            return cached
        r, w = self.rank, self.in_proj.weight.detach().float()
        with torch.no_grad():
            tables = RefinerTables(
                key=key,
                hidden_own=(w[:, :r] @ self.down_h.weight.float()).T.contiguous(),
                hidden_pool=(w[:, r : 2 * r] @ self.down_g.weight.float()).T.contiguous(),
                token_in=(self.w1.weight.float() @ w[:, 2 * r :].T).to(self.w1.weight.dtype),
                mixer=self.mix.folded().detach().float().permute(1, 2, 0).contiguous(),
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().float().T.contiguous(),
                down=mlp.down_proj.weight.detach().float().T.contiguous(),
            )
        self._tables = tables
        return tables

    def hidden_part(self, hidden: torch.Tensor, tables: RefinerTables | None = None, slots: int | None = None) -> torch.Tensor:
        """The token-independent part of `in_proj`, computed once per block. hidden: `[N, B, H]` -> `[N, B, r]`
        (float32 with `tables`). `slots` = n: the first n rows only, `[N, n, r]` (the pooled term still averages the
        whole block): a round that drafts S tokens reads S + 1."""
        if tables is not None:
            hidden = hidden.float()
        own = hidden if slots is None else hidden[:, :slots]
        if tables is not None:  # the pooled part from the mean's projection: B times fewer products than its mean
            return own @ tables.hidden_own + hidden.mean(dim=1, keepdim=True) @ tables.hidden_pool
        pooled = hidden.mean(dim=1, keepdim=True)
        r = self.rank
        w = self.in_proj.weight
        return self.down_h(own) @ w[:, :r].T + self.down_g(pooled) @ w[:, r : 2 * r].T

    def delta(
        self, hidden_part: torch.Tensor, prev_tokens: torch.LongTensor, start: int = 1, mixer: torch.Tensor | None = None,
        tables: RefinerTables | None = None, read: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logit bias for slots `start..B-1`.

        hidden_part: `[N, B, r]` from `hidden_part()`; prev_tokens: `[N, B]`, the token before each slot
        (slot 0: the token before the anchor). read: rows of `w2.weight` `[V', r]` (the draft vocabulary's), None: all.
        Returns `[N, B - start, V']` (the model's dtype).
        """
        x = self.features(hidden_part, prev_tokens, start, mixer, tables)
        weight = self.w2.weight if read is None else read
        return F.linear(x.to(weight.dtype), weight)

    def features(
        self, hidden_part: torch.Tensor, prev_tokens: torch.LongTensor, start: int = 1, mixer: torch.Tensor | None = None,
        tables: RefinerTables | None = None,
    ) -> torch.Tensor:
        """Fuse, Mix and Trans: the r-dim input of the read-out `w2` for slots `start..B-1`, `[N, B - start, r]`.

        Training: `mixer` may be `self.mix.folded()` computed once for many calls. Inference: `tables` (`self.tables()`,
        `mixer` unused); then the whole computation is float32, for blocks of up to `block_size` slots
        (`B` = prev_tokens.shape[1])."""
        if tables is None:
            tokens = self.w1(prev_tokens) @ self.in_proj.weight[:, 2 * self.rank :].T
            x = self.mix(hidden_part + tokens, mixer)[:, start:]
            return x + self.mlp(x)
        n = prev_tokens.shape[1]
        x = F.embedding(prev_tokens, tables.token_in).float() + hidden_part  # [N, B, r]
        # Mix: row k = sum_j mixer[k, j, c] x[j, c]; an elementwise product and a sum are far cheaper than r tiny
        # matmuls (`XPressCausalMixer.forward`) on a CPU.
        x = (tables.mixer[start:n, :n] * x.unsqueeze(-3)).sum(-2)  # [N, B - start, r]
        flat = x.flatten(0, 1)
        gate, up = (flat @ tables.gate_up).chunk(2, dim=-1)
        return torch.addmm(flat, F.silu(gate) * up, tables.down).view_as(x)  # residual + down projection, one op

    def delta_shortlist(
        self, hidden_part: torch.Tensor, prev_tokens: torch.LongTensor, rows: torch.Tensor, start: int = 1,
        mixer: torch.Tensor | None = None, tables: RefinerTables | None = None,
    ) -> torch.Tensor:
        """`delta` read for a shortlist only. rows: `w2.weight[candidates]` `[N, B - start, M, r]` (gathered once per
        block; float32 with `tables`) for candidate token ids `[N, B - start, M]`. Returns `[N, B - start, M]`."""
        x = self.features(hidden_part, prev_tokens, start, mixer, tables)
        return (x.unsqueeze(-2) @ rows.transpose(-1, -2)).squeeze(-2)

    @torch.no_grad()
    def refine_shortlist(
        self, hidden_part: torch.Tensor, base: torch.Tensor, rows: torch.Tensor, candidates: torch.LongTensor,
        lead_tokens: torch.LongTensor, noise: torch.Tensor | None, passes: int, early_stop: bool, tables: RefinerTables,
    ) -> tuple[torch.LongTensor, torch.Tensor, int]:
        """Inference: the Jacobi passes of one block among each slot's shortlist (see `XPressDrafterModel.propose`).

        hidden_part: `[1, S + 1, r]` float32 (`hidden_part(hidden, tables)`); base: `[1, S, M]` float32 scores of the
        candidates `[1, S, M]` (token ids); rows: their `w2` rows `[1, S, M, r]` float32; lead_tokens: `[1, 2]`; noise:
        `[1, S, M]` or None. Returns the drafts `[1, S]`, their scores `[1, S, M]` and the passes run.

        `features` and `delta_shortlist` plus the base scores, written for one block: every view a pass needs is taken
        once, the token rows are promoted to float32 by the add that fuses them, and the read-out writes straight into
        the scores.
        """
        S = base.shape[1]
        choices = candidates[0]  # [S, M]
        base3, rows_t = base[0].unsqueeze(1), rows[0].transpose(-1, -2)  # [S, 1, M]; [S, r, M], a view (see below)
        noise3 = None if noise is None else noise[0].unsqueeze(1)
        mixer = tables.mixer[1 : S + 1, : S + 1]  # slots 1..S
        hidden_part = hidden_part[0]  # [S + 1, r]
        # [token before the anchor, anchor, drafts]: the first S + 1 are the token before each slot (the refiner's
        # input), the last S the drafts, so a pass needs no concatenation. The seed: the drafter's own choice.
        seed = (base if noise is None else base + noise)[0].argmax(-1, keepdim=True)  # [S, 1] columns
        sequence = torch.cat([lead_tokens[0], choices.gather(-1, seed)[:, 0]])  # [S + 2]
        prev = sequence[:-1]
        scores = torch.empty_like(base)  # the first pass writes every row, later ones rows start..
        scores3 = scores[0].unsqueeze(1)

        def step(start: int) -> torch.LongTensor:  # slots start+1.. from the current drafts: their new tokens
            # Fuse (the token's row, promoted to float32 by the add) and Mix: [S - start, r]
            x = (mixer[start:] * torch.add(hidden_part, F.embedding(prev, tables.token_in))).sum(-2)
            gate, up = (x @ tables.gate_up).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate) * up, tables.down)  # Trans: residual + down projection, one op
            # Read: base + x @ rows.T per slot, one op. The rows as a transposed view: BLAS reads it as is, where a
            # contiguous copy per block cost more than all passes' strided reads.
            new = torch.baddbmm(base3[start:], x.unsqueeze(1), rows_t[start:], out=scores3[start:])  # [S - start, 1, M]
            if noise3 is not None:
                new = new + noise3[start:]
            return choices[start:].gather(-1, new.argmax(-1))[:, 0]  # [S - start] token ids

        run = _jacobi_passes(step, sequence[2:], passes, early_stop)
        return sequence[None, 2:], scores, run

    def forward(self, hidden: torch.Tensor, prev_tokens: torch.LongTensor) -> torch.Tensor:
        """Teacher-forced bias for slots 1..B-1: hidden `[N, B, H]`, prev_tokens `[N, B]` -> `[N, B-1, V]`."""
        return self.delta(self.hidden_part(hidden), prev_tokens)

    def refine_fixed(
        self,
        hidden_part: torch.Tensor,
        base_logits: torch.Tensor,
        lead_tokens: torch.LongTensor,
        noise: torch.Tensor | None,
        passes: int,
        candidates: torch.LongTensor | None = None,
        tables: RefinerTables | None = None,
        vocab_ids: torch.LongTensor | None = None,
        read: torch.Tensor | None = None,
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """Exactly `passes` Jacobi passes with static shapes, no host syncs and no data-dependent control flow, so
        the whole loop can be compiled (`torch.compile`) and captured in a CUDA graph (`mode="reduce-overhead"`).

        hidden_part `[N, B, r]` (from `hidden_part(hidden, tables)` when `tables` is given), base_logits `[N, B-1, V']`
        float32 over the token ids `vocab_ids` `[V']` (None: the whole vocabulary), lead_tokens `[N, 2]`, noise
        `[N, B-1, V']` (None for greedy); candidates `[N, B-1, M]`: score only these columns of `base_logits`
        (`refiner_shortlist`); tables: `self.tables()`; read: `w2.weight[vocab_ids]` (for the whole-`V'` read-out).
        Returns token ids `[N, B-1]` and their scores: logits `[N, B-1, V']`, or `[N, B-1, M]` for the candidates.
        """
        mixer = self.mix.folded() if tables is None else None
        if candidates is None:
            logits = base_logits
            tokens = _token_ids(_noisy(logits, noise).argmax(dim=-1), vocab_ids)
            for _ in range(passes):
                prev = torch.cat([lead_tokens, tokens[:, :-1]], dim=1)
                logits = base_logits + self.delta(hidden_part, prev, 1, mixer, tables, read).float()
                tokens = _token_ids(_noisy(logits, noise).argmax(dim=-1), vocab_ids)
            return tokens, logits
        ids = _token_ids(candidates, vocab_ids)
        base, cand_noise, rows = _gather_shortlist(base_logits, noise, candidates, ids, self.w2.weight)
        candidates = ids
        rows = rows if tables is None else rows.float()
        scores = base
        tokens = _pick_among(candidates, _noisy(scores, cand_noise))
        for _ in range(passes):
            prev = torch.cat([lead_tokens, tokens[:, :-1]], dim=1)
            scores = base + self.delta_shortlist(hidden_part, prev, rows, 1, mixer, tables).float()
            tokens = _pick_among(candidates, _noisy(scores, cand_noise))
        return tokens, scores


class XPressMarkovHead(nn.Module):
    """DSpark's Markov head: bias `w2(w1[x_{k-1}])`, decoded left to right (B-1 serial steps)."""

    def __init__(self, config: XPressDrafterConfig):
        super().__init__()
        self.w1 = nn.Embedding(config.vocab_size, config.refiner_rank)
        self.w2 = nn.Linear(config.refiner_rank, config.vocab_size, bias=False)

    def forward(self, prev_tokens: torch.LongTensor, read: torch.Tensor | None = None) -> torch.Tensor:
        """prev_tokens: `[N, n]` -> bias `[N, n, V']` for the slots that follow them. read: rows of `w2.weight`
        `[V', r]` (the draft vocabulary's); None: all, V' = V."""
        return F.linear(self.w1(prev_tokens), self.w2.weight if read is None else read)


# --------------------------------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------------------------------


LogitsHook = Callable[[torch.Tensor, int, "torch.LongTensor | None"], torch.Tensor]
"""`hook(scores [1, n, V], start, cond)`: process the scores of slots `start+1 .. start+n` (1-based slot numbers),
where `cond[:, :j]` are the draft tokens slot `j+1` was conditioned on (None: conditioned on no draft token)."""


@dataclass
class DraftProposal:
    """What `XPressDrafterModel.propose` returns: S draft tokens and the float32 logits they are (Gumbel-)argmaxes of.

    A shortlisted refinement (`refiner_shortlist`) scores only M candidates per slot, and a drafter with a draft
    vocabulary only its V' tokens; the proposal keeps those scores and builds the full logits (-inf for every other
    token) when `logits` is first read. On a CPU that `[1, S, V]` buffer costs more than the whole shortlisted
    refinement, and greedy verification never reads it.
    """

    tokens: torch.LongTensor  # [1, S] draft tokens
    scores: torch.Tensor  # [1, S, V] logits, or [1, S, M] scores of `candidates`
    passes: int  # refinement passes run (Jacobi passes, or Markov steps)
    candidates: torch.LongTensor | None = None  # [1, S, M] the token ids `scores` are for; None: the whole vocabulary
    vocab_size: int | None = None  # V, with `candidates`

    @property
    def logits(self) -> torch.Tensor:
        """`[1, S, V]` float32; -inf outside the shortlist."""
        if self.candidates is not None:
            full = self.scores.new_full((*self.scores.shape[:-1], self.vocab_size), float("-inf"))
            self.scores, self.candidates = full.scatter_(-1, self.candidates, self.scores), None
        return self.scores

    @logits.setter
    def logits(self, value: torch.Tensor) -> None:
        self.scores, self.candidates = value, None

    def token_log_probs(self) -> torch.Tensor:
        """`[1, S]`: log-softmax of `logits` at each draft token (without building the full logits)."""
        log_probs = self.scores.float().log_softmax(-1)
        if self.candidates is None:
            return log_probs.gather(-1, self.tokens[..., None])[..., 0]
        chosen = self.candidates == self.tokens[..., None]  # exactly one candidate per slot
        return log_probs.masked_fill(~chosen, float("-inf")).amax(-1)


def check_compatible(target_config, drafter_config: XPressDrafterConfig) -> None:
    """Raise a `ValueError` if `drafter_config` was not built for a target with `target_config`."""
    text = target_config.get_text_config()
    problems = []
    if text.vocab_size != drafter_config.vocab_size:
        problems.append(f"vocab_size: target {text.vocab_size}, drafter {drafter_config.vocab_size}")
    if text.hidden_size != drafter_config.target_hidden_size:
        problems.append(f"hidden size: target {text.hidden_size}, drafter {drafter_config.target_hidden_size}")
    if text.num_hidden_layers != drafter_config.num_target_layers:
        problems.append(f"depth: target {text.num_hidden_layers} layers, drafter expects {drafter_config.num_target_layers}")
    beyond = [i for i in drafter_config.target_layer_ids if i >= text.num_hidden_layers]
    if beyond:
        problems.append(f"target_layer_ids {beyond} are past the target's {text.num_hidden_layers} layers")
    if problems:
        raise ValueError(
            f"This xPress drafter was built for another target ({drafter_config.target_model_type or 'unknown'}), "
            f"not this {text.model_type}: " + "; ".join(problems) + "."
        )


def check_plain_weights(drafter, action: str) -> None:
    """Raise a `ValueError` unless `drafter` is a drafter whose weights are the ones its config describes, as `action`
    (publishing, exporting) writes them: not one carrying peft adapters (a `PeftModel`, or adapters loaded through
    transformers), nor one whose config was edited after it was built (the written folder would not load)."""
    if getattr(drafter, "peft_config", None):
        raise ValueError(
            f"{action} needs the drafter's own weights, but this {type(drafter).__name__} carries peft adapters: merge "
            "them first, drafter = PeftModel.from_pretrained(base_drafter, adapter_folder).merge_and_unload() (a LoRA "
            "run of `hf-xpress train` saves merged drafters already)."
        )
    if getattr(getattr(drafter, "config", None), "model_type", None) != XPressDrafterConfig.model_type:
        raise ValueError(f"{action} takes an XPressDrafterModel, got a {type(drafter).__name__}.")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in type(drafter)(drafter.config).state_dict().items()}
    actual = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    if expected != actual:
        differ = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
        raise ValueError(f"{action}: the drafter's weights do not match its config (edited after the model was "
                         f"built?): {differ[:6]}{'...' if len(differ) > 6 else ''}. The written folder would not load.")


def check_supported_target(target: PreTrainedModel) -> None:
    """Raise a `ValueError` naming why a dFlash drafter cannot serve `target`: its decoder does not carry one hidden
    state per token (Gemma 3n's AltUp streams), or its token embeddings and lm_head are narrower than its hidden states
    (a projected embedding, e.g. OPT-350m's `word_embed_proj_dim`), while the drafter embeds its block with the
    target's embeddings and reads its hidden states out through the target's lm_head."""
    text = target.config.get_text_config()
    streams = getattr(text, "altup_num_inputs", None)
    if streams:
        raise ValueError(f"{text.model_type} targets are not supported: their decoder carries {streams} hidden-state "
                         "streams per token (AltUp), not the one hidden state a dFlash drafter reads.")
    width = text.hidden_size
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    widths = {"token embeddings": getattr(embed, "embedding_dim", width), "lm_head": getattr(head, "in_features", width)}
    narrower = {name: w for name, w in widths.items() if w != width}
    if narrower:
        raise ValueError(f"This {text.model_type} target's " + " and ".join(f"{k} are {v} wide" for k, v in narrower.items())
                         + f" but its hidden states {width} (a projected embedding): not supported, since the drafter "
                         "embeds its block with the target's embeddings and reads out through its lm_head.")


def _target_field(text, name: str, default=None):
    """`text.name`, or `default` where the config has none or holds one per layer (transformers raises for some of
    those, e.g. Gemma 4's head_dim; a list, e.g. Gemma 3n's per-layer MLP widths, gives its largest)."""
    try:
        value = getattr(text, name, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
        return default
    if isinstance(value, (list, tuple)):
        value = max(value) if value and all(isinstance(v, int) for v in value) else None
    return default if value is None else value


_NO_GENERATION_CONFIG = (
    "{} has no generation_config: a drafter's settings are fields of its config, e.g. drafter.config."
    f"num_assistant_tokens = 4, or from_pretrained(path, num_assistant_tokens=4) ({', '.join(INFERENCE_SETTINGS)})."
)


class XPressPreTrainedModel(PreTrainedModel):
    config: XPressDrafterConfig
    config_class = XPressDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "noise_embeds"
    _no_split_modules = ["XPressDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_attention_backend = True
    _keys_to_ignore_on_load_unexpected = [r"mix\.tril"]

    def __getattr__(self, name: str):
        # A drafter is not a model transformers' classic assisted decoding can run: without the routing `import
        # hf_xpress` installs (a remote-code copy loaded without the package, or after `hf_xpress.uninstall()`),
        # `generate(assistant_model=drafter)` takes that path, whose first step reads `generation_config`. An
        # AttributeError keeps `hasattr` False for everyone else, and names the ways out for that caller.
        if name == "generation_config":
            if getattr(GenerationMixin._get_candidate_generator, "_hf_xpress", False):  # `import hf_xpress` routes it
                raise AttributeError(_NO_GENERATION_CONFIG.format(type(self).__name__))
            raise AttributeError(
                f"{type(self).__name__} has no generation_config: it is not an autoregressive assistant. "
                "generate(assistant_model=drafter) needs `import hf_xpress` (it routes the drafter to its candidate "
                "generator; hf_xpress.uninstall() undoes that); without the package pass speculation_type='dflash' "
                "(transformers' native DFlash path: the drafter without its refiner) or "
                "custom_generate=<the drafter's folder or Hub id>/custom_generate where it has one."
            )
        return super().__getattr__(name)

    def __setattr__(self, name: str, value) -> None:
        # transformers' assistants are tuned through `assistant.generation_config`; a drafter's settings are on its
        # config, and one set here would be ignored without a word (None: nothing to ignore, nor to keep)
        if name == "generation_config":
            if value is not None:
                raise AttributeError(_NO_GENERATION_CONFIG.format(type(self).__name__))
            return
        super().__setattr__(name, value)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, XPressCausalMixer):
            init.zeros_(module.L)
            init.copy_(module.tril, torch.tril(torch.ones_like(module.tril)))
        if getattr(module, "draft_vocab", None) is not None:  # not in the checkpoint: "not set", refused when used
            init.constant_(module.draft_vocab, -1)


class XPressDrafterModel(XPressPreTrainedModel):
    """dFlash drafter + refiner. Use it as `target.generate(..., assistant_model=drafter)` after `import hf_xpress`.

    `forward` has the signature of transformers' native DFlash drafters, so `speculation_type="dflash"` also
    runs it (drafter alone, no refiner).
    """

    def __init__(self, config: XPressDrafterConfig):
        super().__init__(config)
        num_context = len(config.target_layer_ids)
        self.fc = nn.Linear(num_context * config.target_hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = XPressRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(XPressDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = XPressRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = XPressRotaryEmbedding(config)
        if config.refiner == "xpress":
            self.refiner = XPressRefiner(config)
        elif config.refiner == "markov":
            self.refiner = XPressMarkovHead(config)
        else:
            self.refiner = None
        # The token ids this drafter drafts among (`config.draft_vocab_size`), saved with the weights; -1 until set.
        size = config.draft_vocab_size
        self.register_buffer("draft_vocab", None if size is None else torch.full((size,), -1, dtype=torch.long))
        self._draft_rows = None  # (key, ids, (lm_head rows, bias rows)) of draft_vocab, see draft_scores()
        self._read_rows = None  # (key, refiner w2 rows) of the draft vocabulary, see _refiner_read()
        self.stats = None  # set by the candidate generator at each generate() call
        self._fast_refine = None  # set by enable_fast_refine()
        self.post_init()

    @property
    def active_refiner(self) -> XPressRefiner | XPressMarkovHead | None:
        """The refiner that drafts: `refiner`, or the module a peft `ModulesToSaveWrapper` in its place runs (a LoRA
        adapter that trains and saves the refiner, `hf-xpress train --lora`, loaded with peft or with transformers'
        adapter support): its active adapter's copy, or the original while adapters are disabled. Read by duck
        typing (no peft import). Drafting from `self.refiner` itself drafted without any refiner, silently."""
        refiner = self.refiner
        copies = getattr(refiner, "modules_to_save", None)
        if copies is None or not hasattr(refiner, "original_module"):
            return refiner
        active = list(getattr(refiner, "active_adapters", None) or ["default"])
        if getattr(refiner, "disable_adapters", False) or any(name not in copies for name in active):
            return refiner.original_module
        return copies[active[0]]

    def set_draft_vocab(self, token_ids: torch.Tensor | list[int] | None) -> None:
        """Draft among `token_ids` only (see `XPressDrafterConfig.draft_vocab_size`); None: the whole vocabulary.

        Stored in `draft_vocab` (sorted) and `config.draft_vocab_size`, so `save_pretrained` keeps both."""
        self._draft_rows = self._read_rows = None
        if token_ids is None:
            self.config.draft_vocab_size = None
            self.draft_vocab = None
            return
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        V = self.config.vocab_size
        if ids.numel() == 0 or ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"set_draft_vocab: token ids must be a non-empty set within [0, vocab_size = {V}).")
        unique = ids.unique()  # sorted
        if unique.numel() != ids.numel():
            raise ValueError(f"set_draft_vocab: {ids.numel() - unique.numel()} token ids are repeated.")
        self.config.draft_vocab_size = unique.numel()
        self.draft_vocab = unique.to(self.device)

    def draft_scores(self, hidden: torch.Tensor, lm_head: nn.Module) -> tuple[torch.Tensor, torch.LongTensor | None]:
        """Base logits `s_k` of the draft vocabulary only, through the target's lm_head, float32, in the head's device
        and dtype: hidden `[N, S, H]` -> (`[N, S, V']`, the token ids of the columns `[V']`). Without a draft
        vocabulary: (`[N, S, V]`, None). `propose(..., vocab_ids=ids)` takes them as they are, so no step of a round
        spends time on the tokens a draft can never be (`draft_logits` is the full-vocabulary form).

        Only the draft vocabulary's rows of the head are read (gathered once per head weight). The head reads
        `[N*S, H]` rows: a `[1, S, H]` slice of a longer block (the candidate generator's) has a batch stride that
        keeps `linear` from folding it into one matmul, and torch then copies the whole weight into a batched matmul
        on every call (on a CPU, 10-20x the product itself)."""
        lead = hidden.shape[:-1]
        hidden = hidden.to(lm_head.weight.device, lm_head.weight.dtype).reshape(-1, hidden.shape[-1])
        if self.draft_vocab is None:
            return lm_head(hidden).float().view(*lead, -1), None
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, self.draft_vocab.data_ptr())
        if self._draft_rows is None or self._draft_rows[0] != key:
            if bool((self.draft_vocab < 0).any()):
                raise ValueError(
                    f"This drafter's config sets draft_vocab_size={self.config.draft_vocab_size} but its checkpoint has "
                    "no `draft_vocab` ids (a truncated or hand-edited checkpoint?). Call set_draft_vocab(ids), or "
                    "set_draft_vocab(None) to draft over the whole vocabulary."
                )
            ids = self.draft_vocab.to(weight.device)
            with torch.no_grad():
                rows = (weight[ids].detach(), None if bias is None else bias[ids].detach())
            self._draft_rows = (key, ids, rows)
        _, ids, (w, b) = self._draft_rows
        return F.linear(hidden, w, b).float().view(*lead, -1), ids

    def draft_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """`draft_scores` over the whole vocabulary: hidden `[N, S, H]` -> `[N, S, V]` float32, -inf for every token
        outside the draft vocabulary (what logits processors and full-vocabulary callers need)."""
        scores, ids = self.draft_scores(hidden, lm_head)
        return scores if ids is None else _full_vocabulary(scores, ids, lm_head.weight.shape[0])

    def _refiner_read(self, vocab_ids: torch.LongTensor | None) -> torch.Tensor | None:
        """The refiner's read-out rows `w2.weight[vocab_ids]` `[V', r]` (gathered once per weight and id set), for a
        whole-`V'` read-out; None for the whole vocabulary."""
        if vocab_ids is None:
            return None
        weight = self.active_refiner.w2.weight
        if torch.compiler.is_compiling():  # a compiled caller (torch.compile of propose) gathers inside its graph
            return weight[vocab_ids]
        key = (weight.data_ptr(), weight._version, weight.dtype, vocab_ids.data_ptr(), vocab_ids.shape[0])
        if self._read_rows is None or self._read_rows[0] != key:
            self._read_rows = (key, weight.detach()[vocab_ids])
        return self._read_rows[1]

    def enable_fast_refine(self, mode: str | None = "reduce-overhead", backend: str = "inductor") -> None:
        """Run xPress refinement through `XPressRefiner.refine_fixed` compiled with `torch.compile(fullgraph=True)`.

        Used by `propose()` when early stop is off and no logits processor is active (greedy or plain sampling):
        fixed K passes without host syncs, captured as one CUDA graph with `mode="reduce-overhead"` (on a CPU use
        `mode=None`: C++ kernels). Same tokens and logits as the eager loop. `disable_fast_refine()` undoes it.

        Each combination of K, the number of drafts S (`num_assistant_tokens`; fewer near `max_length`), shortlist,
        greedy/sampling and batch size is its own graph, so this raises torch's per-function recompile limit
        (`torch._dynamo.config.recompile_limit`) to at least 64.
        """
        refiner = self.active_refiner
        if not isinstance(refiner, XPressRefiner):
            raise ValueError(f"enable_fast_refine needs an xPress refiner; this drafter has refiner={self.config.refiner!r}.")
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        self._fast_refine = torch.compile(refiner.refine_fixed, fullgraph=True, mode=mode, backend=backend)

    def disable_fast_refine(self) -> None:
        self._fast_refine = None

    # ---- building -------------------------------------------------------------------------------------------------

    @classmethod
    def from_target(
        cls, target: PreTrainedModel, refiner: str | None = "xpress", **overrides
    ) -> "XPressDrafterModel":
        """An untrained drafter sized for `target`: every target-dependent field is read from its config.

        Defaults: the target's width, heads, MLP size, RoPE and special tokens; 1 decoder layer per 6 target layers
        (at least 1, at most 5). Any `XPressDrafterConfig` field can be overridden.
        """
        check_supported_target(target)
        text = target.config.get_text_config()
        # Targets without attention heads (Mamba) or a position limit (BLOOM's ALiBi) still get a drafter: heads of
        # width 64 (one head for narrower ones), and the default RoPE's 32768 positions; overrides come first.
        heads = (overrides.get("num_attention_heads") or _target_field(text, "num_attention_heads")
                 or (text.hidden_size // 64 if text.hidden_size % 64 == 0 else 1))
        kwargs = dict(
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            target_hidden_size=text.hidden_size,
            # GPT-2-style configs have no intermediate_size (their MLP is 4 x hidden)
            intermediate_size=_target_field(text, "intermediate_size") or 4 * text.hidden_size,
            num_hidden_layers=max(1, min(5, text.num_hidden_layers // 6)),
            num_attention_heads=heads,
            num_key_value_heads=_target_field(text, "num_key_value_heads", heads),
            head_dim=_target_field(text, "head_dim", text.hidden_size // heads),
            rms_norm_eps=_target_field(text, "rms_norm_eps", 1e-6),
            max_position_embeddings=_target_field(text, "max_position_embeddings", 32768),
            num_target_layers=text.num_hidden_layers,
            target_model_type=text.model_type,
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            pad_token_id=text.pad_token_id,
            mask_token_id=default_mask_token_id(text),
            refiner=refiner,
        )
        rope = getattr(text, "rope_parameters", None)
        if rope and all(isinstance(v, dict) for v in rope.values()):  # one per layer type (Gemma 3, OLMo 3, ...)
            rope = rope.get("full_attention") or next(iter(rope.values()))  # the drafter's layers attend fully
        if rope:  # theta and any scaling (llama3, YaRN, ...): drafter and target rotate each position alike; the
            # drafter rotates whole heads, so a partial rotation (Phi, GLM, ...) stays the target's
            kwargs["rope_parameters"] = {k: v for k, v in rope.items() if k != "partial_rotary_factor"}
        if "mask_token_id" not in overrides and kwargs["mask_token_id"] == text.vocab_size - 1:
            logger.warning(
                "XPressDrafterModel.from_target: mask_token_id defaults to the last vocabulary id (%d). It must be an "
                "id the target never sees in text; in a vocabulary without spare rows it is a real token. Pass "
                "mask_token_id= (an unused special token; `hf-xpress train` picks one absent from its data).",
                kwargs["mask_token_id"],
            )
        kwargs.update(overrides)
        config = XPressDrafterConfig(**kwargs)
        check_compatible(target.config, config)
        model = cls(config)
        return model.to(device=target.device, dtype=target.dtype)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs) -> "XPressDrafterModel":
        """`PreTrainedModel.from_pretrained`, refusing foreign or incomplete checkpoints with a clear error."""
        config = kwargs.get("config")
        if config is None:
            config_kwargs = {
                k: kwargs[k] for k in ("cache_dir", "revision", "token", "local_files_only", "subfolder") if k in kwargs
            }
            try:
                raw, _ = XPressDrafterConfig.get_config_dict(pretrained_model_name_or_path, **config_kwargs)
            except (TypeError, AttributeError):  # JSON that is not an object (null, a list, ...)
                raw = None
            if not isinstance(raw, dict):
                raise ValueError(f"The config.json of {pretrained_model_name_or_path} does not hold a JSON object.")
            model_type = raw.get("model_type")
            local = Path(pretrained_model_name_or_path, config_kwargs.get("subfolder", ""))
            if not raw and local.is_dir() and not (local / "config.json").is_file():  # transformers reads that as {}
                raise ValueError(f"{local} has no config.json: not a saved drafter folder (save_pretrained writes one).")
            if model_type != XPressDrafterConfig.model_type:
                converted = _convert_foreign_folder(pretrained_model_name_or_path, kwargs)
                if converted is not None:
                    return converted
                raise ValueError(
                    f"{pretrained_model_name_or_path} is not an xPress drafter checkpoint (config model_type "
                    f"{model_type!r}, expected 'xpress_drafter'). To import z-lab dFlash or official xPress/Markov "
                    "checkpoints, use `hf_xpress.conversion` (`hf-xpress convert`)."
                )
        want_info = kwargs.pop("output_loading_info", False)
        # transformers' table of missing / unexpected / mismatched weights ("newly initialized: consider training")
        # would come just before the refusal below, which names them
        report_logger = std_logging.getLogger("transformers.modeling_utils")
        report_logger.addFilter(_DROP_LOAD_REPORT)
        try:
            # mismatched shapes are loaded as "mismatched" (not raised by transformers without naming them), refused below
            kwargs["ignore_mismatched_sizes"] = True
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        except Exception as err:  # safetensors, torch and transformers raise unrelated exception types
            raise ValueError(f"Could not load xPress drafter weights from {pretrained_model_name_or_path}: {err}") from err
        finally:
            report_logger.removeFilter(_DROP_LOAD_REPORT)
        missing = [k for k in info.get("missing_keys", []) if not k.endswith("mix.tril")]
        unexpected = [k for k in info.get("unexpected_keys", []) if not k.endswith("mix.tril")]
        mismatched = info.get("mismatched_keys", [])
        if missing or unexpected or mismatched:
            def first(keys) -> str:
                return f"{sorted(keys)[:8]}{'...' if len(keys) > 8 else ''}"

            raise ValueError(
                f"Incomplete or mismatched xPress drafter checkpoint at {pretrained_model_name_or_path}: "
                f"missing {first(missing)}, unexpected {first(unexpected)} (weights its config does not describe), "
                f"mismatched {[m[0] if isinstance(m, tuple) else m for m in mismatched][:8]}."
            )
        model.config.validate_xpress()  # also the overrides given here (`jacobi_passes=...`), set after the config's checks
        model.check_draft_vocab()
        return (model, info) if want_info else model

    def check_draft_vocab(self) -> None:
        """Raise a `ValueError` if a loaded `draft_vocab` is not what `set_draft_vocab` stores: sorted, distinct ids of
        the vocabulary, as many as `config.draft_vocab_size` (-1 everywhere: not set, refused when used)."""
        ids = self.draft_vocab
        if ids is None or bool((ids == -1).all()):
            return
        if ids.numel() != self.config.draft_vocab_size or not bool(((ids >= 0) & (ids < self.config.vocab_size)).all()) \
                or not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError(
                f"This drafter's draft_vocab ({ids.numel()} ids) is not {self.config.draft_vocab_size} sorted, distinct "
                f"token ids within [0, vocab_size = {self.config.vocab_size}) (a hand-edited checkpoint?). Call "
                "set_draft_vocab(ids), or set_draft_vocab(None) to draft over the whole vocabulary."
            )

    def check_built_shape(self) -> None:
        """Raise a `ValueError` naming a config field changed since the modules were built where they cannot follow
        it: another `refiner` (the built one would still run) or a `block_size` beyond the xPress mixer's (a crash
        inside torch). A drafter's shape is fixed when it is built; `from_target(target, **fields)` builds another."""
        refiner = self.active_refiner
        built = "xpress" if isinstance(refiner, XPressRefiner) else "markov" if isinstance(refiner, XPressMarkovHead) \
            else None
        if self.config.refiner != built:
            raise ValueError(
                f"The drafter's config.refiner is {self.config.refiner!r}, but it was built with {built!r} (whose "
                f"weights it holds): a drafter's refiner is fixed when it is built. Put config.refiner back to {built!r}, "
                "or build a drafter with the other refiner (XPressDrafterModel.from_target(target, refiner=...), "
                "untrained)."
            )
        if built == "xpress" and self.config.block_size > refiner.mix.L.shape[1]:
            raise ValueError(
                f"The drafter's config.block_size is {self.config.block_size}, but its xPress refiner's mixer was built "
                f"for blocks of {refiner.mix.L.shape[1]}: a smaller block works, a larger one needs a drafter "
                "built for it (XPressDrafterModel.from_target(target, block_size=...), untrained)."
            )

    # ---- forward --------------------------------------------------------------------------------------------------

    def fuse_context(self, context_hidden_states: torch.Tensor) -> torch.Tensor:
        """`[b, c, n*H_target]` (target layer outputs, concatenated) -> `[b, c, H]` via `fc` and `hidden_norm`."""
        expected = self.fc.in_features
        if context_hidden_states.shape[-1] != expected:
            raise ValueError(
                f"context_hidden_states has width {context_hidden_states.shape[-1]}, but this drafter expects "
                f"{expected} = {len(self.config.target_layer_ids)} target layers x {self.config.target_hidden_size}."
            )
        return self.hidden_norm(self.fc(context_hidden_states.to(self.fc.weight.dtype)))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        r"""
        noise_embeds: `[b, q, H]` target input embeddings of the block(s): `[anchor, mask, ..., mask]`.
        context_hidden_states: `[b, c, n*H_target]` target layer outputs of the `c` new context tokens, or None.
        attention_mask: None (everything visible), a 2D padding mask `[b, past + c + q]`, or a boolean mask
            `[b, 1, q, past + c + q]` (True = may attend), e.g. the packed-blocks mask used in training.
        position_ids: `[b, c + q]` absolute positions of the new context rows then the block; defaults to
            consecutive positions after the cache.
        cache: a `DynamicCache` (e.g. `DFlashCache`) holding context keys/values; the block's are appended too and
            must be cropped by the caller after drafting.
        Returns `last_hidden_state` `[b, q, H]` after the final norm.
        """
        b, q, _ = noise_embeds.shape
        context = None if context_hidden_states is None else self.fuse_context(context_hidden_states)
        c = 0 if context is None else context.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + c + q, device=noise_embeds.device).unsqueeze(0).expand(b, -1)
        if position_ids.shape[-1] != c + q:
            raise ValueError(f"position_ids must cover the {c} context rows and {q} block rows, got {position_ids.shape[-1]}.")
        hidden_states = noise_embeds.to(self.fc.weight.dtype)  # a target of another dtype: the drafter's
        mask = _attention_bias(attention_mask, q, past + c + q, hidden_states.dtype)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, context, position_embeddings, mask, cache, position_ids)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), cache=cache)

    # ---- drafting -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(
        self,
        hidden: torch.Tensor,
        base_logits: torch.Tensor,
        lead_tokens: torch.LongTensor,
        passes: int | None = None,
        early_stop: bool | None = None,
        noise: torch.Tensor | None = None,
        logits_hook: LogitsHook | None = None,
        vocab_ids: torch.LongTensor | None = None,
    ) -> DraftProposal:
        """Draft tokens for one block.

        hidden: `[1, B, H]` drafter output; base_logits: `[1, S, V']` float32 logits `s_k` of slots 1..S (S <= B-1:
        the refiner is causal, so the first S slots of a shorter proposal equal those of the full block's) over the
        token ids `vocab_ids` `[V']` (`draft_scores`' output: the draft vocabulary), or over the whole vocabulary
        (`vocab_ids` None, `draft_logits`' output); lead_tokens: `[1, 2]` the token before the anchor, then the anchor.
        `noise` (`[1, S, V']` Gumbel noise, drawn once per block) turns every argmax into a sample; `logits_hook`
        applies logits processors (whole-vocabulary logits only).

        xPress: seed with the drafter's (Gumbel-)argmax, then `passes` Jacobi passes updating every slot at once from
        the previous pass's tokens. Slots whose inputs are final are locked (pass p skips the first p-1 slots; with
        early stop also every slot up to the first one that changed, and the loop ends when nothing changes): the
        result equals `passes` full passes.
        Markov head: left-to-right, slot k biased by the token chosen at k-1. No refiner: the seed.
        """
        passes = self.config.jacobi_passes if passes is None else passes
        early_stop = self.config.jacobi_early_stop if early_stop is None else early_stop
        if passes < 0:
            raise ValueError(f"propose: passes must be >= 0, got {passes}.")
        if vocab_ids is not None and logits_hook is not None:
            raise ValueError("propose: logits processors need whole-vocabulary base logits (draft_logits), not vocab_ids.")
        hook = logits_hook or (lambda scores, start, cond: scores)

        def pick(scores: torch.Tensor, start: int) -> torch.LongTensor:  # token ids
            return _token_ids(_noisy(scores, noise, start).argmax(dim=-1), vocab_ids)

        base_logits = base_logits.float()  # no copy when already float32; never written to
        shortlist = self.config.refiner_shortlist if logits_hook is None else None
        refiner = self.active_refiner
        if isinstance(refiner, XPressMarkovHead):
            if shortlist is not None:
                return self._propose_markov_shortlist(base_logits, lead_tokens[:, 1:], shortlist, noise, vocab_ids)
            return self._propose_markov(base_logits, lead_tokens[:, 1:], pick, hook, vocab_ids)

        logits = hook(base_logits, 0, None)
        if not isinstance(refiner, XPressRefiner) or passes == 0:
            return self._proposal(pick(logits, 0), logits, 0, None, vocab_ids)

        tables = refiner.tables()
        num_slots = base_logits.shape[1]
        # Once per block: from the whole block (g pools it), then cut to the S slots. float32 (see RefinerTables).
        hidden_part = refiner.hidden_part(hidden, tables, num_slots + 1)
        # What one pass scores: every token (the paper), or a per-slot shortlist of the drafter's top-M tokens
        # (`columns` of the base logits; `candidates` their token ids).
        columns = None if shortlist is None else top_candidates(logits, min(shortlist, logits.shape[-1]))
        if not early_stop and self._fast_refine is not None and logits_hook is None:
            read = None if columns is not None else self._refiner_read(vocab_ids)
            tokens, scores = self._fast_refine(
                hidden_part, base_logits, lead_tokens, noise, passes, columns, tables, vocab_ids, read
            )
            # clone: graph outputs are reused buffers
            candidates = None if columns is None else _token_ids(columns, vocab_ids)
            return self._proposal(tokens.clone(), scores.clone(), passes, candidates, vocab_ids)

        if columns is not None:  # among each slot's shortlist
            candidates = _token_ids(columns, vocab_ids)
            base, cand_noise, rows = _gather_shortlist(base_logits, noise, columns, candidates, refiner.w2.weight)
            tokens, scores, run = refiner.refine_shortlist(
                hidden_part, base, rows.float(), candidates, lead_tokens, cand_noise, passes, early_stop, tables
            )
            return self._proposal(tokens, scores, run, candidates, vocab_ids)

        read = self._refiner_read(vocab_ids)

        def rescore(prev: torch.LongTensor, start: int) -> torch.Tensor:  # slots start+1.., into `scores`
            delta = refiner.delta(hidden_part, prev, start + 1, None, tables, read)
            if logits_hook is None:  # straight into `scores`: no new [S, V'] buffer per pass
                return torch.add(base_logits[:, start:], delta, out=scores[:, start:])
            scores[:, start:] = hook(base_logits[:, start:] + delta.float(), start, tokens)
            return scores[:, start:]

        # The seed: the drafter's own choice.
        # `sequence` = [token before the anchor, anchor, drafts]: its first S + 1 entries are the token before each slot
        # (the refiner's input) and its last S the drafts, so a pass needs no concatenation.
        sequence = torch.cat([lead_tokens, pick(logits, 0)], dim=1)  # [1, S + 2]
        prev, tokens = sequence[:, :-1], sequence[:, 2:]
        scores = torch.empty_like(base_logits)  # the first pass writes every row; later ones rows start.. (early stop)
        # every slot from the previous pass's tokens (Jacobi)
        run = _jacobi_passes(lambda start: pick(rescore(prev, start), start)[0], tokens[0], passes, early_stop)
        return self._proposal(tokens, scores, run, None, vocab_ids)

    @torch.no_grad()
    def propose_tree(
        self,
        hidden: torch.Tensor,
        base_logits: torch.Tensor,
        lead_tokens: torch.LongTensor,
        width: int,
        vocab_ids: torch.LongTensor | None = None,
    ) -> torch.LongTensor:
        """Greedy draft tree for tree verification (`hf_xpress.tree_decoding`): the `width` best tokens for slot 1,
        each continued greedily over slots 2..S conditioned on its own branch (xPress and the Markov head read the
        tokens before a slot; a drafter without a refiner repeats its own per-slot choices on every branch).

        hidden: `[1, B, H]`; base_logits: `[1, S, V']` float32 over `vocab_ids` (`draft_scores`); lead_tokens: `[1, 2]`
        the token before the anchor, then the anchor. Returns token ids `[W, S]`: row w is branch w, by slot 1's score
        (row 0 is the chain's greedy proposal when the refiner's passes cover the S slots). The refiner is read once per
        slot for all branches, teacher-forced on each branch's tokens, so no Jacobi passes are needed.
        """
        scorer, num_slots, columns = self._slot_scorer(hidden, base_logits, vocab_ids)
        width = min(int(width), columns)
        # prefix: [token before the anchor, anchor, slot 1, ..., slot S] per branch; prefix[:, k] precedes slot k.
        prefix = lead_tokens.to(base_logits.device).expand(width, 2)
        first, ids = scorer(prefix[:1], 1)
        prefix = torch.cat([prefix, ids[first[0].topk(width).indices][:, None]], dim=1)
        for k in range(2, num_slots + 1):
            scores, ids = scorer(prefix, k)
            prefix = torch.cat([prefix, ids[scores.argmax(dim=-1)][:, None]], dim=1)
        return prefix[:, 2:]

    @torch.no_grad()
    def propose_dynamic_tree(
        self,
        hidden: torch.Tensor,
        base_logits: torch.Tensor,
        lead_tokens: torch.LongTensor,
        budget: int,
        width: int,
        vocab_ids: torch.LongTensor | None = None,
    ) -> tuple[torch.LongTensor, list[int]]:
        """A draft tree shaped by the drafter's own confidence (EAGLE-2's dynamic tree): the `budget` nodes of highest
        path probability (the product of the drafter's probabilities along the path from the anchor, each a softmax of
        its scores divided by `config.tree_temperature`) over slots 1..S.

        Candidates grow slot by slot: the `width` nodes of highest path probability at slot k - 1 (the anchor for slot
        1) each get their `width` most probable tokens at slot k, scored with the refiner conditioned on the node's own
        path (teacher-forced, as in `propose_tree`). Of all candidates the `budget` best are kept; a node's path
        probability is never above its parent's, so they form a tree. Where the drafter is sure of slot 1 the tree is
        a deep chain, where it is unsure a wide bush, for the same verify width.

        hidden, base_logits, lead_tokens as in `propose_tree`. Returns (token ids `[N]`, parents): node i's parent is
        node `parents[i]` (-1: the anchor), and parents come before their children.
        """
        scorer, num_slots, columns = self._slot_scorer(hidden, base_logits, vocab_ids)
        width = min(int(width), columns)
        temperature = float(self.config.tree_temperature)
        prefix = lead_tokens.to(base_logits.device)  # frontier nodes' paths, [F, 2 + k - 1] (as in `propose_tree`)
        frontier_score = torch.zeros(1, device=base_logits.device)  # their path log-probabilities
        frontier = [-1]  # their candidate indices (-1: the anchor)
        tokens, parents, scores, depths = [], [], [], []
        for k in range(1, num_slots + 1):
            slot_scores, slot_ids = scorer(prefix, k)
            top = torch.log_softmax(slot_scores / temperature, dim=-1).clamp_max(0.0).topk(width, dim=-1)  # [F, width]
            path = (frontier_score[:, None] + top.values).reshape(-1)  # [F * width]
            ids = slot_ids[top.indices].reshape(-1)
            first = len(tokens)
            tokens += ids.tolist()
            parents += [frontier[i // width] for i in range(ids.numel())]
            scores += path.tolist()
            depths += [k] * ids.numel()
            best = path.topk(min(width, path.numel())).indices
            prefix = torch.cat([prefix[best // width], ids[best, None]], dim=1)
            frontier_score, frontier = path[best], [first + int(i) for i in best]
        # The best `budget`, ties to the shallower node so that a parent always ranks before its children.
        kept = sorted(sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i]))[: max(int(budget), 1)])
        index = {old: new for new, old in enumerate(kept)}
        return (torch.tensor([tokens[i] for i in kept], dtype=torch.long, device=base_logits.device),
                [-1 if parents[i] < 0 else index[parents[i]] for i in kept])

    def _slot_scorer(self, hidden: torch.Tensor, base_logits: torch.Tensor, vocab_ids: torch.LongTensor | None):
        """For the tree proposals: `scorer(prefix, k)` -> slot k's draft scores given each row's path, `[N, C]` float32
        (the drafter's base scores plus the refiner's bias; prefix `[N, >= k + 1]`: the token before the anchor, the
        anchor, slots 1..), and the token ids of their C columns `[C]`. As for chains, with `config.refiner_shortlist`
        = M the refiner re-scores only the drafter's M best tokens of each slot (C = M), else the whole draft
        vocabulary (C = V'). Also returns the number of slots S and C."""
        base = base_logits[0].float()  # [S, V']
        shortlist = self.config.refiner_shortlist
        refiner = self.active_refiner
        if shortlist and refiner is not None and shortlist < base.shape[-1]:
            columns = top_candidates(base, shortlist)  # [S, M]
            ids = _token_ids(columns, vocab_ids)
            base, _, reads = _gather_shortlist(base, None, columns, ids, refiner.w2.weight)  # reads: [S, M, r]
        else:
            ids = (vocab_ids if vocab_ids is not None else torch.arange(base.shape[-1], device=base.device))
            ids = ids.expand(base.shape[0], -1)
            reads = self._refiner_read(vocab_ids) if refiner is not None else None
            reads = None if reads is None else reads.expand(base.shape[0], -1, -1)

        def read(k: int) -> torch.Tensor | None:
            return None if reads is None else reads[k - 1]

        if isinstance(refiner, XPressRefiner):
            tables = refiner.tables()
            hidden_part = refiner.hidden_part(hidden, tables, base.shape[0] + 1)

            def bias(prefix: torch.LongTensor, k: int) -> torch.Tensor:
                part = hidden_part[:, : k + 1].expand(prefix.shape[0], -1, -1)
                return refiner.delta(part, prefix[:, : k + 1], k, None, tables, read(k))[:, 0].float()
        elif isinstance(refiner, XPressMarkovHead):

            def bias(prefix: torch.LongTensor, k: int) -> torch.Tensor:
                return refiner(prefix[:, k : k + 1], read(k))[:, 0].float()
        else:

            def bias(prefix: torch.LongTensor, k: int) -> torch.Tensor:
                return base.new_zeros(prefix.shape[0], 1)

        def scorer(prefix: torch.LongTensor, k: int) -> tuple[torch.Tensor, torch.LongTensor]:
            return base[k - 1] + bias(prefix, k), ids[k - 1]

        return scorer, base.shape[0], base.shape[-1]

    def _proposal(self, tokens, scores, passes: int, candidates, vocab_ids) -> DraftProposal:
        """A proposal from scores over the columns `vocab_ids` (or the whole vocabulary) or over per-slot shortlists
        `candidates` `[1, S, M]` (token ids)."""
        if candidates is None and vocab_ids is not None:  # every slot's candidates: the draft vocabulary
            candidates = vocab_ids.expand(*scores.shape)
        return DraftProposal(tokens, scores, passes, candidates, None if candidates is None else self.config.vocab_size)

    def _propose_markov_shortlist(self, base_logits, anchor, shortlist: int, noise, vocab_ids) -> DraftProposal:
        """The Markov head scoring each slot's top-M drafter tokens only (`refiner_shortlist`), left to right."""
        columns = top_candidates(base_logits, min(shortlist, base_logits.shape[-1]))  # [1, B-1, M]
        candidates = _token_ids(columns, vocab_ids)
        refiner = self.active_refiner
        scores, noise, rows = _gather_shortlist(base_logits, noise, columns, candidates, refiner.w2.weight)
        rows = rows.float()  # float32 like xPress's passes: faster than bfloat16 for these tiny products on a CPU
        tokens = torch.empty(scores.shape[:2], dtype=torch.long, device=scores.device)
        prev = anchor
        for k in range(scores.shape[1]):
            scores[:, k] += (rows[:, k] @ refiner.w1(prev)[:, 0, :, None].float())[..., 0]
            tokens[:, k : k + 1] = prev = _pick_among(candidates[:, k : k + 1], _noisy(scores[:, k : k + 1], noise, k))
        return self._proposal(tokens, scores, base_logits.shape[1], candidates, vocab_ids)

    def _propose_markov(self, base_logits, anchor, pick, hook, vocab_ids) -> DraftProposal:
        """Left-to-right: slot k's logits are `s_k + w2(w1[token at k-1])`, one serial step per slot."""
        read = self._refiner_read(vocab_ids)
        refiner = self.active_refiner
        logits = torch.empty_like(base_logits)
        tokens = torch.empty(base_logits.shape[:2], dtype=torch.long, device=base_logits.device)
        prev = anchor
        for k in range(base_logits.shape[1]):
            logits[:, k : k + 1] = hook(base_logits[:, k : k + 1] + refiner(prev, read), k, tokens)
            tokens[:, k : k + 1] = prev = pick(logits[:, k : k + 1], k)
        return self._proposal(tokens, logits, base_logits.shape[1], None, vocab_ids)


def _jacobi_passes(
    step: Callable[[int], torch.LongTensor], drafts: torch.LongTensor, passes: int, early_stop: bool
) -> int:
    """Up to `passes` Jacobi passes over one block's drafts `[S]` (a view of the refiner's input tokens, updated in
    place); `step(start)` scores slots start+1..S from the current drafts and returns their new tokens `[S - start]`.
    Returns the passes run.

    Locking: after `run` passes the first `run` slots are final (slot k's input, the token at k-1, is final after k-1
    passes), so later passes skip them. Early stop also locks every slot up to the first one that changed (their
    inputs no longer change) and ends the loop when nothing changed: the result equals `passes` full passes."""
    start, run = 0, 0
    while run < passes and start < drafts.shape[0]:
        new = step(start)
        run += 1
        changed = (new != drafts[start:]).nonzero() if early_stop else None
        drafts[start:] = new
        if changed is None:
            start = run
        elif changed.numel() == 0:
            break
        else:
            start += int(changed[0]) + 1
    return run


def _gather_shortlist(
    base_logits: torch.Tensor, noise: torch.Tensor | None, columns: torch.LongTensor, candidates: torch.LongTensor,
    w2: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The shortlist's share of a block: base logits `[N, S, M]`, noise `[N, S, M]` (or None) and the read-out rows
    `w2[candidates]` `[N, S, M, r]`, gathered once per block for the shortlist's columns of `base_logits` and their
    token ids (`[N, S, M]` each; the same tensor when the columns are the whole vocabulary)."""
    noise = None if noise is None else noise.gather(-1, columns)
    return base_logits.gather(-1, columns), noise, F.embedding(candidates, w2)  # faster than w2[ids] on a CPU


def _full_vocabulary(scores: torch.Tensor, vocab_ids: torch.LongTensor, vocab_size: int) -> torch.Tensor:
    """Scores `[..., V']` over the token ids `vocab_ids` `[V']` -> `[..., vocab_size]`, -inf for every other token."""
    full = scores.new_full((*scores.shape[:-1], vocab_size), float("-inf"))
    return full.index_copy_(-1, vocab_ids, scores)


def _token_ids(columns: torch.LongTensor, vocab_ids: torch.LongTensor | None) -> torch.LongTensor:
    """Token ids of columns of draft scores over `vocab_ids` `[V']` (None: the whole vocabulary, columns are ids)."""
    return columns if vocab_ids is None else vocab_ids[columns]


def _noisy(scores: torch.Tensor, noise: torch.Tensor | None, start: int = 0) -> torch.Tensor:
    """Scores `[N, n, ...]` of slots `start..start+n-1` plus those slots' Gumbel noise (sampling; `noise` covers the
    whole block), or the scores themselves (greedy, `noise` None)."""
    return scores if noise is None else scores + noise[:, start : start + scores.shape[1]]


def _pick_among(candidates: torch.LongTensor, scores: torch.Tensor) -> torch.LongTensor:
    """The candidate id with the highest score per row: `[..., M]` ids and scores -> `[...]`."""
    return candidates.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]


def top_candidates(logits: torch.Tensor, k: int, bucket: int = 64) -> torch.LongTensor:
    """Indices of the `k` largest logits along the last dim (any order among ties), `[..., V]` -> `[..., k]`.

    For a large vocabulary, first the `k` buckets of `bucket` consecutive ids with the largest maxima, then the top
    `k` among their members: exact (a token of the top k has fewer than k larger tokens, so fewer than k buckets with a
    larger maximum) and about twice as fast on CPU as one `topk` over the vocabulary (as fast as an argmax).
    """
    vocab = logits.shape[-1]
    buckets = vocab // bucket
    if buckets < 4 * k:
        return logits.topk(k, dim=-1).indices
    head = logits[..., : buckets * bucket].unflatten(-1, (buckets, bucket))
    best = head.amax(dim=-1).topk(k, dim=-1).indices  # [..., k] buckets
    ids = (best.unsqueeze(-1) * bucket + torch.arange(bucket, device=logits.device)).flatten(-2)  # [..., k * bucket]
    if buckets * bucket < vocab:  # the ragged last bucket is always examined
        tail = torch.arange(buckets * bucket, vocab, device=logits.device).expand(*ids.shape[:-1], -1)
        ids = torch.cat([ids, tail], dim=-1)
    return ids.gather(-1, logits.gather(-1, ids).topk(k, dim=-1).indices)


FOREIGN_LOAD_OPTIONS = ("dtype", "torch_dtype", "device_map", "attn_implementation", "subfolder", "cache_dir",
                        "revision", "token", "local_files_only")


def _convert_foreign_folder(path, options: dict) -> "XPressDrafterModel | None":
    """A local z-lab dFlash, MuseGlimmer or vLLM-export folder (`path`, or its `subfolder`), converted with
    `hf_xpress.conversion` when the package is installed (this file also runs as remote code without it), with the
    `from_pretrained` options that apply to it (dtype, device_map, attn_implementation; the Hub's options mean nothing
    for a local folder). None when that does not apply."""
    try:
        from hf_xpress.conversion import ConversionError, detect_format, load_checkpoint
    except ImportError:
        return None
    folder = os.path.join(path, options["subfolder"]) if options.get("subfolder") else path
    try:
        fmt = detect_format(folder)
    except ConversionError:
        return None
    if fmt not in ("dflash", "muse_glimmer", "vllm_xpress", "vllm_dspark"):
        return None
    other = sorted(k for k in options if k not in FOREIGN_LOAD_OPTIONS and options[k] is not None)
    if other:
        raise ValueError(f"{folder} is a {fmt} checkpoint, converted on load, which supports the from_pretrained "
                         f"options {', '.join(FOREIGN_LOAD_OPTIONS)}, not {', '.join(other)}: convert it first "
                         "(`hf-xpress convert`) and load the converted folder.")
    dtype = options.get("dtype") if options.get("dtype") is not None else options.get("torch_dtype")  # or its alias
    try:
        model = load_checkpoint(folder, dtype=dtype).eval()
    except ConversionError as err:
        if "target=" not in str(err):
            raise
        raise ConversionError(f"{err} from_pretrained takes no target: convert the folder first, `hf-xpress convert "
                              f"{folder} OUT --target TARGET`, and load OUT.") from err
    device = options.get("device_map")
    if isinstance(device, dict):
        raise ValueError(f"{folder}: a device_map dict can not split a drafter converted on load; pass one device.")
    if device is not None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model.to(torch.device(device))
    if options.get("attn_implementation") is not None:
        model.set_attn_implementation(options["attn_implementation"])
    return model


def _attention_bias(attention_mask: torch.Tensor | None, q: int, kv: int, dtype: torch.dtype) -> torch.Tensor | None:
    """None, 2D padding or 4D boolean mask -> None or an additive float mask `[b, 1, q, kv]`."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        if attention_mask.shape[-1] != kv:
            raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions, expected {kv}.")
        if bool(attention_mask.all()):
            return None
        attention_mask = attention_mask[:, None, None, :].bool().expand(-1, 1, q, -1)
    if attention_mask.dtype != torch.bool:
        return attention_mask.to(dtype)
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    return bias.masked_fill(~attention_mask, torch.finfo(dtype).min)


def default_mask_token_id(text_config) -> int:
    """Qwen vocabularies reserve `<|MASK|>` (151669); other targets use their last vocabulary id."""
    if text_config.vocab_size >= 151670 and text_config.model_type.startswith("qwen"):
        return 151669
    return text_config.vocab_size - 1


__all__ = [
    "DraftProposal",
    "XPressDrafterModel",
    "XPressMarkovHead",
    "XPressPreTrainedModel",
    "XPressRefiner",
    "check_compatible",
    "check_supported_target",
]
