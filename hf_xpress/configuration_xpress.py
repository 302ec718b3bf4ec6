"""Configuration of the xPress drafter: a dFlash block-diffusion drafter plus an optional causal refiner."""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging

logger = logging.get_logger(__name__)


# Integer fields, all of them sizes that must be at least 1 (the first 8: the model's, checked together), and those
# that may also be None.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "block_size", "refiner_rank",
               "refiner_mlp_ratio", "num_target_layers")
OPTIONAL_SIZE_FIELDS = ("target_hidden_size", "sliding_window")
REFINERS = ("xpress", "markov", None)
LAYER_TYPES = ("full_attention", "sliding_attention")
DRAFT_SCHEDULES = ("constant", "heuristic", "heuristic_transient", "cost")
# Settings that change how a drafter drafts, not what it is: safe to change on a trained drafter.
INFERENCE_SETTINGS = ("jacobi_passes", "jacobi_early_stop", "refiner_shortlist", "num_assistant_tokens",
                      "num_assistant_tokens_schedule", "assistant_confidence_threshold", "tree_temperature")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The dFlash rule: one target layer per drafter layer, spread uniformly from layer 1 to layer L-3 (layer 1 alone
    for targets of at most 4 layers, where L-3 < 2).

    A 1-layer drafter reads the middle layer ``L // 2``.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    first = min(1, num_target_layers - 1)
    last = max(num_target_layers - 3, first)  # a target of 4 layers or fewer: every drafter layer reads layer 1
    return [int(round(first + i * (last - first) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@strict
class XPressDrafterConfig(PreTrainedConfig):
    r"""
    Configuration of [`XPressDrafterModel`]: a dFlash drafter (Qwen3-type decoder layers whose keys/values also see
    fused hidden states of the target) and an optional refiner that adds a learned, causal bias to its logits.

    The drafter has no embedding and no lm_head: it uses the target's, so `hidden_size` must equal the target's.

    Args:
        vocab_size (`int`): vocabulary size of the target (the drafter predicts target tokens).
        hidden_size (`int`): width of the drafter, equal to the target's hidden size.
        target_hidden_size (`int`, *optional*): hidden size of the target; defaults to `hidden_size`.
        num_target_layers (`int`): depth of the target; bounds `target_layer_ids`.
        target_layer_ids (`list[int]`, *optional*): target layers (0-based) whose outputs form the context
            feature. Defaults to the dFlash rule ([`default_target_layer_ids`]).
        block_size (`int`): B, the drafted block: the anchor plus B-1 mask slots, i.e. B-1 drafts per round.
        mask_token_id (`int`): a token id of the target's vocabulary used for the mask slots.
        refiner (`str` or `None`): `"xpress"` (parallel causal refiner), `"markov"` (sequential bigram head) or
            `None` (dFlash alone).
        refiner_rank (`int`): r, the refiner's width (256 in the paper).
        refiner_mlp_ratio (`int`): hidden width of the refiner's SwiGLU MLP, in multiples of r.
        jacobi_passes (`int`): K, the number of parallel refinement passes per block.
        jacobi_early_stop (`bool`): lock the converged prefix and stop once a pass changes nothing. Both are
            exact: the result equals that of `jacobi_passes` full passes, for less work.
        refiner_shortlist (`int`, *optional*): if set to M, the refiner scores only the M tokens the drafter ranks
            highest at each slot (each Jacobi pass of xPress, each step of the Markov head), and drafts (and their
            logits, -inf elsewhere) are chosen among them. Cuts a pass from (B-1) x r x V to (B-1) x r x M
            multiply-adds (what bounds it on CPUs); still lossless (tokens are exact samples of the returned logits).
            None (default): the full vocabulary, as in the paper. Applies when no logits processor is active.
        num_assistant_tokens (`int`, *optional*): drafts submitted for verification per round, at most B-1 (the
            default, None). Fewer drafts make a round cheaper (the drafter's lm_head, the refiner and the target's
            verify forward all shrink) and lose only what the later slots would have been accepted: the right choice
            for a drafter whose later slots are rarely accepted. These three settings carry the names and rules of
            transformers' assisted-decoding knobs and, as there, belong to the assistant (set them on
            `drafter.config`; they are saved with it).
        num_assistant_tokens_schedule (`str`): `"constant"` (default); `"heuristic"`: after a round whose drafts were
            all accepted the cap grows by 2, otherwise it shrinks by 1 (down to 1), kept across `generate` calls in
            this config's `num_assistant_tokens`; `"heuristic_transient"`: the same, restarted at every call.
            Transformers' schedules for assisted decoding, with the same names and rules. `"cost"` (ours): each
            round submits the count, up to `num_assistant_tokens` (B-1 if None), that maximises the expected tokens
            per second, from the acceptance per slot and the round times this call has measured
            (`generation.DraftCountPlanner`): many drafts where verifying them is nearly free (GPUs), few on a CPU,
            none (plain target steps) where drafting does not pay. Per call; chains only (`tree_decoding` refuses it).
        assistant_confidence_threshold (`float`): a round's drafts end at the first slot whose draft probability
            (under the returned, processed logits) is below this value, that slot included (transformers'
            `AssistantConfidenceCriteria` rule, here with a fixed threshold). 0 (default): never.
        tree_temperature (`float`): a dynamic draft tree (`tree_decoding` with `tree_budget`) keeps the draft nodes of
            highest path probability, computed from the drafter's scores divided by this temperature. Above 1 it
            corrects a drafter that is over-confident in its first choices (the tree then spends fewer nodes deep
            down its best path and more on alternatives); 1 (default): the scores as they are. It changes which nodes
            are verified, never the output; chains and fixed trees rank within a slot only and ignore it.
        draft_vocab_size (`int`, *optional*): if set to N, the drafter drafts among N fixed token ids only (the
            model's `draft_vocab` buffer, saved with the weights: by default the most frequent target labels of its
            training data, which its losses covered). Its base logits then read N rows of the target's lm_head
            instead of all V (FR-Spec's frequency-ranked draft vocabulary): on CPUs that read bounds the draft step.
            Other tokens get -inf draft logits. Lossless like every setting here: the target verifies every draft,
            and sampled drafts are exact samples of the returned logits. None (default): the full vocabulary.
        target_model_type (`str`, *optional*): `model_type` of the target, recorded for error messages.
        layer_types (`list[str]`, *optional*): per drafter layer, `"full_attention"` (the whole context, as in the
            dFlash paper; the default) or `"sliding_attention"`: a block token at position p sees a key at position k
            only if `p - k < sliding_window` (and, in a bidirectional layer, `k - p < sliding_window`), the
            convention of transformers' causal sliding-window masks and of z-lab's drafters.
        sliding_window (`int`, *optional*): the window of the `"sliding_attention"` layers.
        causal_layers (`list[int]`, *optional*): drafter layers (0-based) whose block attends causally (slot k sees
            the context and block slots <= k) instead of bidirectionally. Newer z-lab drafters make their
            sliding-window layers causal. Default: none.
    """

    model_type = "xpress_drafter"
    default_theta = 1_000_000.0
    keys_to_ignore_at_inference = ["cache"]

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 5
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    causal_layers: list[int] | None = None
    tie_word_embeddings: bool = False

    target_hidden_size: int | None = None
    num_target_layers: int = 36
    target_layer_ids: list[int] | None = None
    target_model_type: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    block_size: int = 16
    mask_token_id: int = 151669
    refiner: str | None = "xpress"
    refiner_rank: int = 256
    refiner_mlp_ratio: int = 2
    jacobi_passes: int = 6
    jacobi_early_stop: bool = True
    refiner_shortlist: int | None = None
    draft_vocab_size: int | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str = "constant"
    assistant_confidence_threshold: float = 0.0
    tree_temperature: float = 1.0

    def __post_init__(self, **kwargs: Any) -> None:
        self._check_types()  # before the defaults below compute with them
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.target_layer_ids is None:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        self.causal_layers = sorted(int(i) for i in self.causal_layers or [])
        super().__post_init__(**kwargs)
        self._drop_partial_rotary()
        self._check_values()  # the types were checked first, above

    def _drop_partial_rotary(self) -> None:
        """The drafter's Qwen3 layers rotate whole heads (as z-lab's drafters and vLLM's dFlash model do), whatever
        the target does: a `partial_rotary_factor` (Phi, StableLM, GLM, GPT-NeoX targets) is removed, with a warning
        when it said anything but 1. A default-RoPE drafter always ignored it (the same rotation as before); a scaled
        RoPE (linear, YaRN, longrope, ...) read it and rotated fewer dimensions than the heads have (a crash)."""
        rope = self.rope_parameters
        factors = {"config": self.__dict__.pop("partial_rotary_factor", None)}
        if isinstance(rope, dict) and "partial_rotary_factor" in rope:  # a copy: the caller's dict stays as it was
            factors["rope_parameters"] = rope["partial_rotary_factor"]
            self.rope_parameters = {k: v for k, v in rope.items() if k != "partial_rotary_factor"}
        said = [f"{v!r} ({where})" for where, v in factors.items() if v is not None and v != 1]
        if said:
            logger.warning_once(
                f"XPressDrafterConfig: partial_rotary_factor {', '.join(said)} dropped: the drafter's layers rotate "
                "whole heads (the target's own partial rotation is unaffected).")

    def _check_types(self) -> None:
        """Raise a `ValueError` naming the first field of the wrong type (a size or id that is not an integer, a list
        of ids that is not integers, a setting of another type), as in a config.json edited by hand or a `--set`:
        computing with it would fail far from the cause, or silently round."""
        def is_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        for name in SIZE_FIELDS + ("mask_token_id",) + OPTIONAL_SIZE_FIELDS:
            value = getattr(self, name)
            if not (is_int(value) or (value is None and name in OPTIONAL_SIZE_FIELDS)):
                raise ValueError(f"XPressDrafterConfig: {name} must be an integer, got {value!r}.")
        for name in ("target_layer_ids", "causal_layers"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (list, tuple)) and all(is_int(i) for i in value)):
                raise ValueError(f"XPressDrafterConfig: {name} must be a list of integers, got {value!r}.")
        if not isinstance(self.rms_norm_eps, (int, float)) or isinstance(self.rms_norm_eps, bool) or not (
            self.rms_norm_eps > 0
        ):
            raise ValueError(f"XPressDrafterConfig: rms_norm_eps must be a positive number, got {self.rms_norm_eps!r}.")
        for name, kinds in (("jacobi_passes", (int,)), ("jacobi_early_stop", (bool,)), ("refiner_shortlist", (int, None)),
                            ("num_assistant_tokens", (int, None)), ("assistant_confidence_threshold", (int, float)),
                            ("draft_vocab_size", (int, None)), ("tree_temperature", (int, float))):
            value = getattr(self, name)
            if not any(value is None if k is None else isinstance(value, k) and (k is bool) == isinstance(value, bool)
                       for k in kinds):
                expected = " or ".join("None" if k is None else k.__name__ for k in kinds)
                raise ValueError(f"XPressDrafterConfig: {name} must be {expected}, got {value!r}.")

    def validate_xpress(self) -> None:
        """Raise a `ValueError` naming the first inconsistent field: its type (`_check_types`), then its value."""
        self._check_types()
        self._check_values()

    def _check_values(self) -> None:
        """`validate_xpress` once the types are known to be right: the range checks would otherwise fail in Python."""
        small = [name for name in SIZE_FIELDS[:8] if getattr(self, name) < 1]  # the model's sizes (more below)
        if small:
            raise ValueError(f"XPressDrafterConfig: {small[0]} must be at least 1, got {getattr(self, small[0])}.")
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"XPressDrafterConfig: hidden_act {self.hidden_act!r} is not an activation transformers "
                             f"knows ({', '.join(sorted(ACT2FN))}).")
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"XPressDrafterConfig: rope_parameters' rope_type {rope_type!r} is not one of "
                             f"{['default', *ROPE_INIT_FUNCTIONS]}.")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(
                f"XPressDrafterConfig: hidden_size ({self.hidden_size}) must equal target_hidden_size "
                f"({self.target_hidden_size}): the drafter reads the target's embeddings and writes through its lm_head."
            )
        if self.refiner not in REFINERS:
            raise ValueError(f"XPressDrafterConfig: refiner must be one of {REFINERS}, got {self.refiner!r}.")
        if self.block_size < 2:
            raise ValueError(f"XPressDrafterConfig: block_size must be >= 2 (anchor + drafts), got {self.block_size}.")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"XPressDrafterConfig: mask_token_id {self.mask_token_id} is outside the vocabulary "
                f"(vocab_size {self.vocab_size})."
            )
        if not self.target_layer_ids:
            raise ValueError("XPressDrafterConfig: target_layer_ids must name at least one target layer.")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(
                f"XPressDrafterConfig: target_layer_ids {bad} are outside the target's {self.num_target_layers} "
                "layers (ids are 0-based)."
            )
        if self.jacobi_passes < 0:
            raise ValueError(f"XPressDrafterConfig: jacobi_passes must be >= 0, got {self.jacobi_passes}.")
        if self.refiner_shortlist is not None and not 1 <= self.refiner_shortlist <= self.vocab_size:
            raise ValueError(
                f"XPressDrafterConfig: refiner_shortlist must be None or in [1, vocab_size], got {self.refiner_shortlist}."
            )
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"XPressDrafterConfig: draft_vocab_size must be None or in [1, vocab_size = {self.vocab_size}], got "
                f"{self.draft_vocab_size}."
            )
        if self.num_assistant_tokens is not None and not 1 <= self.num_assistant_tokens < self.block_size:
            raise ValueError(
                f"XPressDrafterConfig: num_assistant_tokens must be None or in [1, block_size - 1 = {self.block_size - 1}]"
                f", got {self.num_assistant_tokens}."
            )
        if not 0.0 < self.tree_temperature < float("inf"):
            raise ValueError(f"XPressDrafterConfig: tree_temperature must be a positive number, got {self.tree_temperature}.")
        if self.num_assistant_tokens_schedule not in DRAFT_SCHEDULES:
            raise ValueError(
                f"XPressDrafterConfig: num_assistant_tokens_schedule must be one of {DRAFT_SCHEDULES}, got "
                f"{self.num_assistant_tokens_schedule!r}."
            )
        if not 0.0 <= self.assistant_confidence_threshold < 1.0:
            raise ValueError(
                "XPressDrafterConfig: assistant_confidence_threshold must be in [0, 1), got "
                f"{self.assistant_confidence_threshold}."
            )
        if self.refiner_rank < 1 or self.refiner_mlp_ratio < 1:
            raise ValueError("XPressDrafterConfig: refiner_rank and refiner_mlp_ratio must be positive.")
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(
                f"XPressDrafterConfig: layer_types must give one of {LAYER_TYPES} for each of the "
                f"{self.num_hidden_layers} layers, got {self.layer_types}."
            )
        if "sliding_attention" in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise ValueError(
                f"XPressDrafterConfig: layers {self.sliding_layers} use sliding_attention, so sliding_window must be a "
                f"positive number of tokens, got {self.sliding_window}."
            )
        bad = [i for i in self.causal_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(
                f"XPressDrafterConfig: causal_layers {bad} are outside the drafter's {self.num_hidden_layers} layers."
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"XPressDrafterConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})."
            )

    @property
    def sliding_layers(self) -> list[int]:
        """Indices of the drafter layers with sliding-window attention."""
        return [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]

    @property
    def num_drafts(self) -> int:
        """Draft tokens per round: the block minus its anchor."""
        return self.block_size - 1


__all__ = ["XPressDrafterConfig", "default_target_layer_ids"]
