"""xPress inside `target.generate(..., assistant_model=drafter)`.

`XPressCandidateGenerator` builds on transformers' `DFlashTokenCandidateGenerator` (its `DFlashCache`, its
`model_kwargs_overrides` that make the target keep only the needed hidden states, its mask-token embeddings): per
round it ingests the newly verified tokens' target features, runs one drafter forward over
`[anchor, mask x (B-1)]`, then refines the block (`XPressDrafterModel.propose`). Verification, acceptance and the
bonus token stay transformers' own `_assisted_decoding`, so greedy output is the target's and sampling keeps the
target's distribution (draft tokens are exact samples of the returned logits).

With `prompt_lookup_num_tokens` also given to `generate`, a round first tries transformers' own prompt lookup
(`PromptLookupCandidateGenerator`: the continuation of the last n-gram's earlier occurrence in the sequence) and runs
the drafter only when nothing is found. Lookup rounds return no logits, so transformers verifies them by matching
(greedy) or by sampling the target and matching (`do_sample`): exact either way. The drafter's cache catches up on
the tokens those rounds verified at its next forward.

transformers checks stopping criteria only at the end of a round (max length and EOS also inside it), so a stop
string or a user's `StoppingCriteria` that an accepted draft satisfies before the round's last token would not stop
generation where plain `generate` stops. Drafts therefore end before the first token at which any such criterion
fires (criteria are checked on each draft's sequence, without scores, as plain `generate` checks them by default;
a user's own criteria on shallow copies, so that drafts the target rejects do not advance the state they keep).

transformers has no public hook for a third-party candidate generator: `_get_candidate_generator` is a fixed
if/elif chain, and it is not handed the stopping criteria. `install()` wraps it, and only for xPress drafters (every
other assistant goes to the original method untouched), and wraps `_assisted_decoding` only to make its
`stopping_criteria` visible to that choice; `_extract_generation_mode_kwargs` is wrapped for `custom_generate` (see
`install`). Other private names read, each where the public API has no equivalent: `generation_config.
_eos_token_tensor` (the EOS ids `generate` prepared, as transformers' own candidate generators read them),
`config._attn_implementation`, the parent generator's `_get_noise_embeds` / `noise_ids_mask`, and the cache layers'
`keys` / `values` (`tree_decoding.keep_cache_rows`, to keep an accepted branch's rows). The Hub recipe
(`custom_generate.py`), which runs without this package and so without `install()`, overrides
`_get_candidate_generator` on the one target instance while its calls run; the benchmark wraps it while it runs, to
time transformers' own generators.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessorList,
    StoppingCriteriaList,
    StopStringCriteria,
    SynthIDTextWatermarkingConfig,
)
from transformers.cache_utils import DFlashCache
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator, PromptLookupCandidateGenerator
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)
from transformers.generation.stopping_criteria import (
    ConfidenceCriteria,
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
)
from transformers.utils import logging

from .configuration_xpress import XPressDrafterConfig
from .modeling_xpress import check_compatible, check_supported_target

logger = logging.get_logger(__name__)


# Processors that look only at the scores, not at the tokens before them: applied to all slots in one call.
PREFIX_FREE_PROCESSORS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


@dataclass
class XPressStats:
    """Acceptance and timing of one `generate` call (`drafter.stats`). Times are seconds, summed over rounds."""

    block_size: int
    accepted: list[int] = field(default_factory=list)  # accepted drafts per verification round
    proposed: list[int] = field(default_factory=list)  # drafts proposed per round (B-1 except near max_length)
    passes: list[int] = field(default_factory=list)  # refinement passes run per round
    drafts: list[list[int]] = field(default_factory=list)  # the draft tokens proposed in each round
    lookup: list[bool] = field(default_factory=list)  # per round: drafted by prompt lookup (no drafter forward)
    draft_time: float = 0.0  # drafter forward + base logits (+ prompt lookup)
    refine_time: float = 0.0  # seed + Jacobi passes / Markov steps
    verify_time: float = 0.0  # target forward over the candidates + acceptance
    plain_steps: int = 0  # target steps without drafts that the "cost" schedule chose (not rounds: no tau)
    plain_time: float = 0.0  # those steps, each from its start to the next round's (the call's last one not included)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Tokens committed per target verification forward: accepted drafts + 1 bonus token, averaged."""
        return (sum(self.accepted) / self.rounds + 1.0) if self.rounds else float("nan")

    def slot_acceptance(self) -> list[float]:
        """Fraction of rounds in which draft slot k (1-based, list index k-1) was accepted."""
        if not self.rounds:
            return []
        return [sum(a >= k for a in self.accepted) / self.rounds for k in range(1, self.block_size)]

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "tau": self.tau,
            "accepted": list(self.accepted),
            "proposed": list(self.proposed),
            "passes": list(self.passes),
            "drafts": [list(d) for d in self.drafts],
            "lookup": list(self.lookup),
            "slot_acceptance": self.slot_acceptance(),
            "draft_time": self.draft_time,
            "refine_time": self.refine_time,
            "verify_time": self.verify_time,
            "plain_steps": self.plain_steps,
            "plain_time": self.plain_time,
        }


class DraftCountPlanner:
    """The `"cost"` draft-count schedule: each round submits the number of drafts n (0..`most`) that maximises the
    expected tokens per second, E(n) / T(n), from what this call has measured so far (n = 0: a plain target step).

    E(n) = 1 + sum_{j<=n} prod_{k<=j} p_k, with p_k the acceptance rate of slot k among rounds that reached it
    (accepted every slot before it), counts decayed by `decay` per drafter round so the rates follow the text, and
    shrunk towards the pooled rate (which also stands in for slots no round has reached). T(n) for n >= 1 is a
    least-squares line a + b n through the mean round time (draft, refine, verify and transformers' bookkeeping, from
    one round's start to the next's) at each n tried; T(0) is the plain step's own mean. The first rounds try `most`,
    1, 0 and `most` (the first one's time is dropped: warm-up). Plain steps are taken only where they beat the best
    count by `PLAIN_MARGIN` (they teach nothing about acceptance, and the rates are noisy), and while they do, a round
    after `probe` plain steps in a row still drafts (the best n >= 1), so the figures keep up with the text. Nothing
    here looks at the drafts themselves, so sampling stays exact: how many drafts a round submits depends on earlier
    rounds only.

    Where verifying more tokens costs little (a GPU), it settles on `most`; where every verified token costs (a CPU),
    on the few slots accepted often enough to pay for themselves, and where drafting does not pay at all (a drafter
    too weak for the host), on plain steps."""

    EXPLORE = (None, 1, 0, None)  # the first rounds' counts (None: `most`), before the first choice
    PRIOR = 2.0  # pseudo-rounds of the pooled rate in each slot's estimate
    PLAIN_MARGIN = 1.1  # plain steps must beat drafting by this factor: they teach nothing about acceptance

    def __init__(self, most: int, decay: float = 0.95, probe: int = 8):
        self.most, self.decay, self.probe = most, decay, probe
        self.reached = [0.0] * (most + 1)  # index k = 1..most: decayed rounds that submitted slot k after k-1 accepts
        self.accepted = [0.0] * (most + 1)  # ... and accepted it
        self.times: dict[int, list[float]] = {}  # n -> [decayed sum of round seconds, decayed count]
        self.planned = 0  # rounds reported by `submitted` so far
        self.plain_in_a_row = 0
        self._open: tuple[int, float] | None = None  # the running round's drafts and start, if timed

    def next_count(self) -> int:
        """Drafts for the next round, in 0..most (`submitted` reports what the round did with it)."""
        if self.planned < len(self.EXPLORE):
            n = self.EXPLORE[self.planned]
            return self.most if n is None else n
        best, rate = self.best_drafting()
        plain = self.times.get(0)
        if (plain is not None and plain[1] > 0 and plain[1] / plain[0] > self.PLAIN_MARGIN * rate
                and self.plain_in_a_row < self.probe):
            return 0
        return best

    def best_drafting(self) -> tuple[int, float]:
        """The best n >= 1 and its expected tokens per second (0 before any timing: then `most`)."""
        line = self.time_line()
        if line is None:
            return self.most, 0.0
        a, b = line
        best, best_rate, expected, reach = self.most, 0.0, 1.0, 1.0
        for n, p in enumerate(self.slot_rates(), start=1):
            reach *= p
            expected += reach
            seconds = a + b * n
            if seconds > 0 and expected / seconds > best_rate:
                best, best_rate = n, expected / seconds
        return best, best_rate

    def slot_rates(self) -> list[float]:
        """The estimated acceptance rate p_k of slots 1..most."""
        pooled = (sum(self.accepted) + 1.0) / (sum(self.reached) + 2.0)
        return [(self.accepted[k] + self.PRIOR * pooled) / (self.reached[k] + self.PRIOR) for k in range(1, self.most + 1)]

    def time_line(self) -> tuple[float, float] | None:
        """(a, b) of T(n) = a + b n, a least-squares line through the mean drafter round time at each n >= 1 tried,
        weighted by its decayed round count (b = 0 with one n, never below 0); None before any."""
        points = [(n, total / count, count) for n, (total, count) in self.times.items() if n > 0 and count > 0]
        if not points:
            return None
        if len(points) == 1:
            return points[0][1], 0.0
        weight = sum(w for _, _, w in points)  # each count's mean weighs as much as the (decayed) rounds behind it
        mean_n = sum(w * n for n, _, w in points) / weight
        mean_t = sum(w * t for _, t, w in points) / weight
        b = sum(w * (n - mean_n) * (t - mean_t) for n, t, w in points) / sum(w * (n - mean_n) ** 2 for n, _, w in points)
        b = max(b, 0.0)
        return mean_t - b * mean_n, b

    def round_started(self, now: float) -> tuple[int, float] | None:
        """A round starts at `now` (seconds, `time.perf_counter`): the previous one ends, and its time is recorded if
        it was timed (see `submitted`). Returns that round's (drafts, seconds), or None."""
        closed, self._open = self._open, None
        if closed is None:
            return None
        n, seconds = closed[0], now - closed[1]
        total, count = self.times.get(n, (0.0, 0.0))
        self.times[n] = [total * self.decay + seconds, count * self.decay + 1.0]
        return n, seconds

    def submitted(self, drafts: int, began: float) -> None:
        """The round that started at `began` submits `drafts` drafter drafts (0: a plain step). Prompt lookup rounds
        are not reported (they run no drafter forward, and leave the plan where it was); the first round is not timed
        (warm-up)."""
        self._open = (drafts, began) if self.planned > 0 else None
        self.planned += 1
        self.plain_in_a_row = self.plain_in_a_row + 1 if drafts == 0 else 0

    def record_acceptance(self, drafts: int, accepted: int) -> None:
        """A drafter round submitted `drafts` and the target accepted the first `accepted`."""
        for k in range(1, self.most + 1):
            self.reached[k] *= self.decay
            self.accepted[k] *= self.decay
        for k in range(1, min(accepted + 1, drafts) + 1):  # slots 1..accepted, and the first rejected one
            self.reached[k] += 1.0
            self.accepted[k] += float(k <= accepted)


def position_dependent_rope(config) -> tuple[str, int] | None:
    """(rope type, threshold) for a target whose RoPE frequencies depend on the largest position in the forward
    ("dynamic" past `max_position_embeddings`, "longrope" past `original_max_position_embeddings`); None otherwise."""
    text = config.get_text_config()
    rope = getattr(text, "rope_parameters", None) or {}
    entries = list(rope.values()) if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]
    for entry in entries:  # one dict, or one per layer type
        kind = entry.get("rope_type")
        if kind == "dynamic":
            return kind, int(text.max_position_embeddings)
        if kind == "longrope":
            return kind, int(entry.get("original_max_position_embeddings") or text.max_position_embeddings)
    return None


# Draft-count settings that transformers reads from a classic assistant's generation_config (their GenerationConfig
# defaults), and an xPress drafter from its own config: given to generate(), they change nothing (a warning says so).
DRAFTER_SETTINGS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                    "assistant_confidence_threshold": 0.4}


def check_generation_options(target, generation_config: GenerationConfig) -> None:
    """Refuse generate() options that speculative decoding with an xPress drafter would silently get wrong."""
    if generation_config.guidance_scale is not None and generation_config.guidance_scale != 1:
        raise ValueError(
            f"guidance_scale={generation_config.guidance_scale} (classifier-free guidance) is not supported with an "
            "xPress drafter: its logits processor runs the model on the unconditional prompt and keeps state from "
            "call to call, which scoring drafts would advance, so the output would differ from plain generate."
        )
    if isinstance(getattr(generation_config, "watermarking_config", None), SynthIDTextWatermarkingConfig):
        raise ValueError(
            "SynthID watermarking is not supported with an xPress drafter: its logits processor keeps the contexts it "
            "has seen from call to call, which scoring drafts would advance, so the output would differ from plain "
            "generate."
        )
    rope = position_dependent_rope(target.config)
    if rope is not None and generation_config.max_length is not None and generation_config.max_length > rope[1]:
        raise ValueError(
            f"The target's {rope[0]!r} RoPE changes its frequencies with the largest position a forward sees, so "
            f"verifying several tokens at once past position {rope[1]} would rotate them differently from plain "
            f"generate's one-token steps. With an xPress drafter keep max_length <= {rope[1]} (it is "
            f"{generation_config.max_length})."
        )
    ignored = [f"{name}={getattr(generation_config, name)!r}" for name, default in DRAFTER_SETTINGS.items()
               if getattr(generation_config, name, None) not in (None, default)]  # None: not set (transformers 5)
    if ignored:  # transformers reads these from a classic assistant's own generation_config, never from generate()
        logger.warning_once(
            f"generate()'s arguments or the target's generation_config set {', '.join(ignored)}, which an xPress "
            "drafter does not read: its drafts per round "
            "come from its own config. Set them there instead, e.g. drafter.config.num_assistant_tokens = 4 (also "
            "num_assistant_tokens_schedule, assistant_confidence_threshold)."
        )
    attention = getattr(target.config, "_attn_implementation", None)
    if generation_config.output_attentions and generation_config.return_dict_in_generate and attention != "eager":
        raise ValueError(
            f"output_attentions=True with an xPress drafter needs the target's attn_implementation='eager' (it is "
            f"{attention!r}, which returns no attention weights; transformers' assisted decoding fails on them too): "
            "load the target with attn_implementation='eager'."
        )


class XPressCandidateGenerator(DFlashTokenCandidateGenerator):
    """Candidates from an `XPressDrafterModel`: one dFlash forward, then the refiner (see module docstring)."""

    def __init__(
        self,
        target: GenerationMixin,
        assistant_model,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
        tokenizer=None,
        jacobi_passes: int | None = None,
        stopping_criteria: StoppingCriteriaList | None = None,
    ):
        """`jacobi_passes`: xPress passes per block for this generator only (None: the drafter config's).
        `stopping_criteria`: those `generate` checks; drafts end before any token at which one fires (see
        `draft_stopping_criteria`)."""
        check_drafter_settings(assistant_model)
        check_compatible(target.config, assistant_model.config)
        check_supported_target(target)
        check_generation_options(target, generation_config)
        if jacobi_passes is not None and (isinstance(jacobi_passes, bool) or not isinstance(jacobi_passes, int)
                                          or jacobi_passes < 0):
            raise ValueError(f"jacobi_passes must be an integer >= 0, got {jacobi_passes!r}.")
        self.jacobi_passes = jacobi_passes
        super().__init__(
            assistant_model=assistant_model,
            main_model_input_embeddings=target.get_input_embeddings(),
            main_model_output_embeddings=target.get_output_embeddings(),
            generation_config=generation_config,
            logits_processor=logits_processor,
        )
        if generation_config.output_hidden_states:
            # The user asked for every hidden state: keep them all (a layer subset would break `_split_model_outputs`).
            self.model_kwargs_overrides = {"output_hidden_states": True}
        self.config: XPressDrafterConfig = assistant_model.config
        # where the target embeds token ids (prompt ids may sit elsewhere, on the CPU)
        self.embed_device = self.main_model_input_embeddings.weight.device
        if self.device != self.embed_device:
            logger.warning_once(
                f"The drafter is on {self.device} and the target's embeddings on {self.embed_device}: drafting runs on "
                f"{self.device}, with the target's features copied there every round. For speed, move it: "
                f"drafter.to({str(self.embed_device)!r}) (or load it with device_map={str(self.embed_device)!r})."
            )
        # The parent sizes the cache from the config: sliding-window layers would keep only the last keys. Ours keeps
        # the whole context in every layer (a few drafter layers: small), and the drafter's masks apply the window.
        self.cache = DFlashCache()
        self.context_length = 0  # target tokens whose features are in the drafter's cache
        self.pending: list[torch.Tensor] = []  # features `[1, n, L*H]` of verified tokens not in the cache yet
        self.mask_embeds: torch.Tensor | None = None
        self.stats = XPressStats(block_size=self.block_size)
        assistant_model.stats = self.stats
        self._proposed_this_round = 0
        self._verify_start = 0.0
        # Drafts per round and where they end: the drafter's settings, as transformers reads a classic assistant's
        # from `assistant_model.generation_config` (generate() fills the target's with defaults, so a value there
        # cannot tell a user's choice from the default).
        self.schedule = self.config.num_assistant_tokens_schedule
        self.confidence_threshold = float(self.config.assistant_confidence_threshold)
        cap = self.config.num_assistant_tokens
        self.num_assistant_tokens = self.block_size - 1 if cap is None else max(1, min(int(cap), self.block_size - 1))
        self.planner = DraftCountPlanner(self.num_assistant_tokens) if self.schedule == "cost" else None
        # transformers checks stopping criteria only at the end of a round: drafts end before a token at which one fires.
        self.stop = draft_stopping_criteria(stopping_criteria, generation_config, tokenizer)
        # Sampling verifies drafts against their logits (rejection sampling) only while which drafts are submitted does
        # not depend on their own values. Cutting drafts before a stop does (a draft is dropped because of what it is),
        # which would skew the output; with such criteria transformers instead samples the target and keeps the drafts
        # that match: exact however drafts are cut. Greedy verification compares tokens only.
        ensemble = getattr(generation_config, "assistant_ensemble_weight", None) is not None
        if ensemble and self.do_sample and self.stop is not None:
            raise ValueError("assistant_ensemble_weight with do_sample=True cannot be combined with stop strings or "
                             "stopping_criteria: its verification needs every draft sampled from the drafter's logits, "
                             "and drafts that would stop generation are dropped.")
        self.needs_logits = (self.do_sample and self.stop is None) or ensemble
        self.lookup = None
        if generation_config.prompt_lookup_num_tokens:
            if generation_config.assistant_ensemble_weight is not None:
                raise ValueError("assistant_ensemble_weight needs the drafter's logits; it cannot be combined with "
                                 "prompt_lookup_num_tokens (lookup drafts have none).")
            self.lookup = PromptLookupCandidateGenerator(
                eos_token_id=generation_config._eos_token_tensor,
                num_output_tokens=generation_config.prompt_lookup_num_tokens,
                max_matching_ngram_size=generation_config.max_matching_ngram_size or 2,
                max_length=self.main_model_max_length,
                logits_processor=logits_processor,
                vocab_size=target.config.get_text_config().vocab_size,
            )

    @property
    def num_drafting_tokens(self) -> int:
        """The most drafts a round submits (a hybrid target's cache keeps that many recurrent states to roll back):
        a drafter block's, or prompt lookup's continuation where that is longer."""
        lookup = getattr(self, "lookup", None)  # read by the parent's __init__ before `lookup` is set
        return max(self.block_size, lookup.num_output_tokens if lookup is not None else 0)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_kwargs: dict | None = None,
        model_outputs=None,
        is_first_iteration: bool = False,
        n_last_matches: int = 0,
        **kwargs,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """input_ids: `[1, n]` (prompt + committed tokens; the last one is the anchor) -> `[1, n + d]`, logits `[1, d, V]`."""
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"xPress drafting supports batch size 1 (like transformers' assisted generation); got batch size "
                f"{input_ids.shape[0]}. Call generate once per prompt."
            )
        self._proposed_this_round = 0
        if is_first_iteration:  # the target prefills first; its features arrive with the next call
            check_prompt_inputs(input_ids, model_kwargs or {})
            mask = (model_kwargs or {}).get("attention_mask")
            if mask is not None and not bool(mask.all()):
                logger.warning_once(
                    "xPress drafting: the prompt is padded (its attention_mask has zeros). The drafter places and "
                    "attends to every position, padding included, so it drafts worse (the output is still the "
                    "target's, exactly); pass the prompt without padding."
                )
            return input_ids, None
        if model_outputs is None or getattr(model_outputs, "hidden_states", None) is None:
            raise ValueError("xPress drafting needs the target's hidden states from the previous forward.")
        start = self._clock()
        self._keep_features(input_ids, model_outputs)
        if self.planner is not None:
            closed = self.planner.round_started(start)
            if closed is not None and closed[0] == 0:
                self.stats.plain_time += closed[1]
        planned = self.num_assistant_tokens if self.planner is None else self.planner.next_count()
        room = self.main_model_max_length - input_ids.shape[1] - 1
        if room <= 0:  # at most one token left: a plain target step
            return input_ids, None
        found = self.lookup_continuation(input_ids)
        if found:
            return self._lookup_round(torch.cat([input_ids, input_ids.new_tensor([found])], dim=1), len(found), start)
        num_drafts = min(planned, room)
        if num_drafts == 0:  # the "cost" schedule's choice: a plain target step, timed
            self.planner.submitted(0, start)
            self.stats.plain_steps += 1
            return input_ids, None
        hidden = self._draft_forward(input_ids)
        # Only the slots we submit; without logits processors only the draft vocabulary's columns (the processors need
        # the whole vocabulary).
        base_logits, vocab_ids = self.head_scores(hidden[:, 1 : 1 + num_drafts], bool(self.logits_processor))
        drafted = self._clock()

        noise = None
        if self.do_sample:  # one Gumbel draw per block, shared by the seed and every pass
            uniform = torch.rand_like(base_logits).clamp_(min=torch.finfo(torch.float32).tiny)
            noise = -torch.log(-torch.log(uniform))
        proposal = self.assistant_model.propose(
            hidden,
            base_logits,
            # a fresh [1, 2] tensor: the view's row stride (the sequence's length) changes every round, and a compiled
            # refiner (enable_fast_refine) takes each stride for a new input (`.to` and `.contiguous` keep it)
            lead_tokens=input_ids[:, -2:].to(self.device).clone(memory_format=torch.contiguous_format),
            passes=self.jacobi_passes,
            noise=noise,
            logits_hook=self._logits_hook(input_ids) if self.logits_processor else None,
            vocab_ids=vocab_ids,
        )
        if self.needs_logits:  # a slot whose processed logits allow no token has no q to sample: drafts end before it
            allowed = torch.isfinite(proposal.logits[0, :num_drafts]).any(dim=-1)
            num_drafts = int(allowed.long().cumprod(0).sum())
        if self.confidence_threshold > 0:
            num_drafts = min(num_drafts, self._confident_prefix(proposal.token_log_probs()))
        if self.stop is not None:
            num_drafts = self._before_stop(input_ids, proposal.tokens[0, :num_drafts].tolist())
        end = self._clock()
        if num_drafts == 0:  # nothing to submit (a stop, or no samplable slot): a plain target step
            if self.planner is not None:  # for the planner: a drafter round, its first slot not accepted
                self.planner.submitted(min(planned, room), start)
                self.planner.record_acceptance(1, 0)
            return input_ids, None

        self.stats.draft_time += drafted - start
        self.stats.refine_time += end - drafted
        self._record_round(proposal.tokens[0, :num_drafts].tolist(), proposal.passes, lookup=False, end=end)
        if self.planner is not None:
            self.planner.submitted(num_drafts, start)
        candidate_ids = torch.cat([input_ids, proposal.tokens[:, :num_drafts].to(input_ids.device)], dim=1)
        # Greedy verification compares tokens only; the logits (q) are for speculative sampling and ensembling.
        return candidate_ids, proposal.logits[:, :num_drafts].to(input_ids.device) if self.needs_logits else None

    def head_scores(self, hidden: torch.Tensor, whole_vocabulary: bool = False
                    ) -> tuple[torch.Tensor, torch.LongTensor | None]:
        """The drafter's base scores of the slots `hidden` `[1, S, H]` through the target's lm_head (in the head's
        dtype: a bf16 drafter may serve an fp32 target), float32, and the token ids of their columns (None: the whole
        vocabulary, also with `whole_vocabulary`), both on the drafter's device, where the refiner runs: the head may
        sit on another device (a target split over GPUs: its last)."""
        lm_head = self.main_model_output_embeddings
        if whole_vocabulary:
            scores, ids = self.assistant_model.draft_logits(hidden, lm_head), None
        else:
            scores, ids = self.assistant_model.draft_scores(hidden, lm_head)
        return scores.to(self.device), None if ids is None else ids.to(self.device)

    def _confident_prefix(self, log_probs: torch.Tensor) -> int:
        """Drafts up to and including the first whose log-probability (`[1, S]`) is below the threshold's (all S if
        none is)."""
        low = (log_probs[0] < math.log(self.confidence_threshold)).nonzero()
        return int(low[0]) + 1 if low.numel() else log_probs.shape[1]

    def _before_stop(self, input_ids: torch.LongTensor, drafts: list[int]) -> int:
        """How many of `drafts` to submit: all those before the first one whose acceptance would complete a stop
        string (transformers checks stopping criteria on a round's last token only). All without stop strings."""
        stop = None if self.stop is None else first_stop(draft_copies(self.stop), input_ids, drafts)
        return len(drafts) if stop is None else stop

    def lookup_continuation(self, input_ids: torch.LongTensor) -> list[int]:
        """With prompt lookup: its continuation of `input_ids` (`[1, n]`), at most the room left before max_length
        (as for the drafter's drafts) and ending before a stop string; empty without lookup or when nothing recurs."""
        if self.lookup is None:
            return []
        found, _ = self.lookup.get_candidates(input_ids)
        room = self.main_model_max_length - input_ids.shape[1] - 1
        drafts = found[0, input_ids.shape[1] :].tolist()[: max(room, 0)]
        return drafts[: self._before_stop(input_ids, drafts)]

    def _lookup_round(self, candidate_ids: torch.LongTensor, num_drafts: int, start: float):
        """A round drafted by prompt lookup: no drafter forward, no logits (verified by matching)."""
        end = self._clock()
        self.stats.draft_time += end - start
        self._record_round(candidate_ids[0, -num_drafts:].tolist(), passes=0, lookup=True, end=end)
        return candidate_ids, None

    def _record_round(self, drafts: list[int], passes: int, lookup: bool, end: float, proposed: int | None = None) -> None:
        """Record a round's drafts in `stats`; its verification starts at `end`. `proposed`: the slots the round
        drafts (default: all of `drafts`, a chain; a tree's `drafts` hold every branch)."""
        proposed = len(drafts) if proposed is None else proposed
        self.stats.passes.append(passes)
        self.stats.proposed.append(proposed)
        self.stats.drafts.append(drafts)
        self.stats.lookup.append(lookup)
        self._proposed_this_round = proposed
        self._verify_start = end

    def _keep_features(self, input_ids: torch.LongTensor, model_outputs) -> None:
        """Keep the target features of the verified tokens (all but the anchor) that the drafter has not seen: the
        last target forward's first rows (prompt lookup rounds run no drafter forward, so these can pile up)."""
        num_new = input_ids.shape[1] - 1 - self.context_length - sum(f.shape[1] for f in self.pending)
        self.pending.append(torch.cat(
            [model_outputs.hidden_states[i + 1][:, :num_new] for i in self.config.target_layer_ids], dim=-1
        ).to(self.device))

    def _draft_forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Add the kept target features to the drafter's cache and run the block. Returns hidden `[1, B, H]`."""
        features = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending, dim=1)
        num_new = features.shape[1]  # verified tokens before the anchor, not yet cached
        self.pending = []
        if self.mask_embeds is None:
            self.mask_embeds = self._get_noise_embeds(self.noise_ids_mask.to(self.embed_device)).to(self.device)
        anchor = self._get_noise_embeds(input_ids[:, -1:].to(self.embed_device)).to(self.device)
        positions = torch.arange(
            self.context_length, self.context_length + num_new + self.block_size, device=self.device
        ).unsqueeze(0)
        out = self.assistant_model(
            noise_embeds=torch.cat([anchor, self.mask_embeds], dim=1),
            context_hidden_states=features,
            position_ids=positions,
            cache=self.cache,
        )
        self.cache.crop(-self.block_size)  # block keys/values are discarded; the context stays
        self.context_length += num_new
        return out.last_hidden_state

    def _logits_hook(self, input_ids: torch.LongTensor):
        """Apply the generation's logits processors to draft scores, with each slot's own prefix where needed."""
        processors = self.logits_processor
        prefix_free = all(type(p) in PREFIX_FREE_PROCESSORS for p in processors)

        def hook(scores: torch.Tensor, start: int, cond: torch.LongTensor | None) -> torch.Tensor:
            # A copy (a processor may work in place; `scores` can be the drafter's base logits), on the prefix's
            # device: with a target split over devices the lm_head's (the last) is not the inputs' (the first), and
            # processors such as the repetition penalty index the scores with the prefix, as in transformers' own
            # assisted decoding. The result goes back to the scores' device.
            rows = scores[0].to(input_ids.device, copy=True)
            if prefix_free:
                return processors(input_ids.expand(rows.shape[0], -1), rows).unsqueeze(0).to(scores.device)
            out = torch.empty_like(rows)
            for i in range(rows.shape[0]):
                prefix = input_ids if cond is None else torch.cat([input_ids, cond[:, : start + i].to(input_ids.device)], 1)
                out[i] = processors(prefix, rows[i : i + 1])[0]
            return out.unsqueeze(0).to(scores.device)

        return hook

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Called by transformers after each verification: record the round."""
        if self._proposed_this_round:
            self.stats.verify_time += self._clock() - self._verify_start
            self.stats.accepted.append(int(num_matches))
            lookup = self.stats.lookup[-1]  # this round's, recorded by get_candidates
            if self.schedule in ("heuristic", "heuristic_transient") and not lookup:  # transformers' rule
                grow = int(num_matches) == self._proposed_this_round
                cap = self.num_assistant_tokens + 2 if grow else self.num_assistant_tokens - 1
                self.num_assistant_tokens = max(1, min(cap, self.block_size - 1))
                if self.schedule == "heuristic":  # kept for the next generate call, like transformers does
                    self.config.num_assistant_tokens = self.num_assistant_tokens
            if self.planner is not None and not lookup:
                self.planner.record_acceptance(self._proposed_this_round, int(num_matches))
            self._proposed_this_round = 0


def check_prompt_inputs(input_ids: torch.LongTensor, model_kwargs: dict) -> None:
    """Refuse prompts the drafter cannot follow: the target's features of every prompt token are its context."""
    embeds = model_kwargs.get("inputs_embeds")
    if embeds is not None and input_ids.shape[1] < embeds.shape[1]:
        raise ValueError(
            "xPress drafting needs the prompt's token ids: generate(inputs_embeds=...) was given without input_ids, "
            "so the drafter would never see the prompt. Pass input_ids too."
        )
    cache = model_kwargs.get("cache")
    cached = cache.get_seq_length() if cache is not None else 0
    if cached:
        raise ValueError(
            f"generate(cache=...) was given a cache that already holds {cached} tokens (a cached prefix or an earlier "
            "turn): the target skips their forward, so the drafter never gets their hidden states. Pass an empty "
            "cache, or none, with an xPress drafter."
        )


PER_CALL_SETTINGS = ("tree_width", "tree_budget", "lookup_branch")  # `tree_decoding`'s arguments, never a config's


def check_drafter_settings(drafter) -> None:
    """Raise a `ValueError` naming an inference setting that a loaded drafter's config holds (settings change there
    after loading) but that validation refuses, a shape field changed since the drafter was built
    (`XPressDrafterModel.check_built_shape`), or a tree setting put in the config, where nothing reads it."""
    config = drafter.config
    for check in (getattr(config, "validate_xpress", None), getattr(drafter, "check_built_shape", None)):
        if check is not None:  # a remote-code copy from before it existed has none
            check()
    misplaced = [name for name in PER_CALL_SETTINGS if hasattr(config, name)]
    if misplaced:
        raise ValueError(
            f"The drafter's config sets {', '.join(misplaced)}, which no drafter reads from its config: a tree is asked "
            "for per call, generate(ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter, tree_width=3, ...) "
            "(see the README). Remove it from the config."
        )


def first_stop(criteria, input_ids: torch.LongTensor, tokens: list[int]) -> int | None:
    """The index of the first of `tokens` at which stopping `criteria` fire, appending them to `input_ids` (`[1, n]`)
    one at a time (plain `generate` checks after every token, handing its criteria no scores without output_scores);
    None if none does."""
    for j in range(len(tokens)):
        sequence = torch.cat([input_ids, input_ids.new_tensor([tokens[: j + 1]])], dim=1)
        fired = False
        for criterion in criteria:  # every one, as `StoppingCriteriaList` calls them (some keep state)
            try:
                result = criterion(sequence, None)
            except Exception as err:  # a user's criterion that needs the target's scores, which drafts do not have yet
                raise ValueError(
                    f"{type(criterion).__name__} failed on a draft token ({type(err).__name__}: {err}). With an xPress "
                    "drafter, drafts end before a token at which a stopping criterion fires, so every criterion is "
                    "called on draft tokens before the target scores them, with scores=None: it must depend on the "
                    "tokens only."
                ) from err
            fired = bool(torch.as_tensor(result).any()) or fired  # a tensor per row, or a plain bool
        if fired:
            return j
    return None


def draft_copies(criteria) -> list:
    """`criteria` to check drafts with: transformers' own as they are (they keep no state), every other one as a
    copy (`_draft_copy`), so that drafts the target then rejects do not advance a count or a flag it keeps. The
    originals see committed tokens only: transformers calls them at the end of each round."""
    return [c if type(c).__module__.startswith("transformers.") else _draft_copy(c) for c in criteria]


DRAFT_COPY_TENSOR_LIMIT = 4096  # a criterion's tensors of up to this many elements are copied (state), larger shared


def _draft_copy(criterion):
    """A shallow copy of a user's criterion whose attributes that are lists, dicts, sets or small tensors (where a
    criterion keeps its state: a shallow copy alone shares them) are copied too, one level deep; everything else it
    holds (tokenizers, models, tables, the contents of those containers) is shared, so a copy stays cheap every
    round (a deep copy also copied any tokenizer or weight it held). An object that refuses copying is checked as it
    is (documented: no state, then)."""
    try:
        clone = copy.copy(criterion)
    except Exception:
        return criterion
    state = getattr(clone, "__dict__", None)
    for name, value in list((state or {}).items()):
        if isinstance(value, (list, dict, set)):
            state[name] = copy.copy(value)
        elif isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                and value.numel() <= DRAFT_COPY_TENSOR_LIMIT:
            state[name] = value.clone()
    return clone


def enforced_in_round(criterion, generation_config: GenerationConfig) -> bool:
    """Whether `criterion` needs no cut drafts: `_assisted_decoding` itself ends a round at `generation_config`'s
    max length and EOS ids (a user's `MaxLengthCriteria` / `EosTokenCriteria` may ask for less), max time does not
    depend on the tokens, and confidence is a classic assistant's own criterion (on its scores)."""
    if isinstance(criterion, (MaxTimeCriteria, ConfidenceCriteria)):
        return True
    if isinstance(criterion, MaxLengthCriteria):
        if generation_config.max_length is not None and criterion.max_length > generation_config.max_length:
            raise ValueError(
                f"stopping_criteria holds MaxLengthCriteria(max_length={criterion.max_length}), beyond generate's "
                f"max_length ({generation_config.max_length}), which assisted decoding cannot pass: give generate "
                f"max_length={criterion.max_length} (or max_new_tokens) instead."
            )
        return criterion.max_length == generation_config.max_length
    if isinstance(criterion, EosTokenCriteria):
        eos = generation_config._eos_token_tensor
        return eos is not None and set(criterion.eos_token_id.tolist()) <= set(eos.flatten().tolist())
    return False


def draft_stopping_criteria(stopping_criteria: StoppingCriteriaList | None, generation_config: GenerationConfig,
                            tokenizer=None) -> StoppingCriteriaList | None:
    """The criteria drafts must end before: those of `stopping_criteria` (what `generate` checks) that transformers
    does not enforce inside a round (`enforced_in_round`), plus one for `generation_config.stop_strings` when none is
    among them; None when that leaves nothing."""
    criteria = [c for c in stopping_criteria or () if not enforced_in_round(c, generation_config)]
    if generation_config.stop_strings and not any(isinstance(c, StopStringCriteria) for c in criteria):
        criteria.append(stop_string_criteria(tokenizer, generation_config.stop_strings))
    return StoppingCriteriaList(criteria) if criteria else None


def stop_string_criteria(tokenizer, stop_strings) -> StopStringCriteria:
    """transformers' criterion for `stop_strings`, with a clear error when the tokenizer it needs is missing."""
    if tokenizer is None:
        raise ValueError("stop_strings need the target's tokenizer: pass tokenizer= to generate.")
    return StopStringCriteria(tokenizer, stop_strings)


def is_xpress_drafter(model) -> bool:
    """True for our drafter class, also when loaded as Hub remote code (matched by config `model_type`)."""
    return getattr(getattr(model, "config", None), "model_type", None) == XPressDrafterConfig.model_type


# The stopping criteria of the `_assisted_decoding` call in progress (set by `install`'s wrapper), for the generator.
_ASSISTED_STOPPING_CRITERIA: ContextVar[StoppingCriteriaList | None] = ContextVar(
    "hf_xpress_assisted_stopping_criteria", default=None
)
WRAPPED_METHODS = ("_get_candidate_generator", "_assisted_decoding", "_extract_generation_mode_kwargs")


def install() -> None:
    """Route `generate(assistant_model=<xPress drafter>)` to `XPressCandidateGenerator`. Idempotent.

    `speculation_type="dflash"` keeps transformers' native DFlash generator (drafter alone, no refiner).

    Three private `GenerationMixin` methods are wrapped, here only (`uninstall` restores them):
    - `_get_candidate_generator`: the one place transformers picks an assisted-decoding candidate generator.
    - `_assisted_decoding`: unchanged, but its `stopping_criteria` (generate's merged list: the user's criteria, stop
      strings, max length, EOS) are visible to the generator while it runs, so drafts end where plain generate stops.
    - `_extract_generation_mode_kwargs`: for a `custom_generate` callable it keeps only the arguments `_sample` lacks,
      so the `streamer` that `generate` has already fed the prompt to, and the `tokenizer` its stop strings need,
      never reach the callable. For callables marked `takes_generate_streamer` (`tree_decoding`) they are passed on.
      It is also the first step of `generate` that sees the assistant: an xPress drafter for another target is
      refused there, by name (transformers' own check, next, would blame the tokenizers), and the drafter's `stats`
      are cleared, so a call that does not draft (refused, or beam search) never shows the previous call's.
    """
    original = GenerationMixin._get_candidate_generator
    if getattr(original, "_hf_xpress", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _get_candidate_generator(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        assistant = bound.arguments.get("assistant_model")
        config = bound.arguments["generation_config"]
        if is_xpress_drafter(assistant) and config.speculation_type != "dflash":
            return XPressCandidateGenerator(
                target=self,
                assistant_model=assistant,
                generation_config=config,
                logits_processor=bound.arguments.get("logits_processor"),
                tokenizer=bound.arguments.get("target_tokenizer"),
                stopping_criteria=_ASSISTED_STOPPING_CRITERIA.get(),
            )
        if is_xpress_drafter(assistant):  # transformers' native DFlash path records none: not the previous call's
            assistant.stats = None
        return original(self, *args, **kwargs)

    original_assisted = GenerationMixin._assisted_decoding
    assisted_signature = inspect.signature(original_assisted)

    @functools.wraps(original_assisted)
    def _assisted_decoding(self, *args, **kwargs):
        criteria = assisted_signature.bind(self, *args, **kwargs).arguments.get("stopping_criteria")
        token = _ASSISTED_STOPPING_CRITERIA.set(criteria)
        try:
            return original_assisted(self, *args, **kwargs)
        finally:
            _ASSISTED_STOPPING_CRITERIA.reset(token)

    original_extract = GenerationMixin._extract_generation_mode_kwargs
    extract_signature = inspect.signature(original_extract)

    @functools.wraps(original_extract)
    def _extract_generation_mode_kwargs(self, *args, **kwargs):
        bound = extract_signature.bind(self, *args, **kwargs)
        assistant = bound.arguments.get("assistant_model")
        if is_xpress_drafter(assistant):
            # A call that ends up not drafting (refused, or beam search, which transformers runs without the
            # assistant) must not leave the previous call's figures; the generator sets this call's.
            assistant.stats = None
            check_compatible(self.config, assistant.config)  # before transformers' checks, which blame tokenizers
        tokenizer = (bound.arguments.get("kwargs") or {}).get("tokenizer")  # the original pops it
        out = original_extract(self, *args, **kwargs)
        if getattr(bound.arguments.get("custom_generate"), "takes_generate_streamer", False):
            extra = {"streamer": bound.arguments.get("streamer"), "tokenizer": tokenizer}
            out.update({k: v for k, v in extra.items() if v is not None})
        return out

    for wrapper, wrapped in ((_get_candidate_generator, original), (_assisted_decoding, original_assisted),
                             (_extract_generation_mode_kwargs, original_extract)):
        wrapper._hf_xpress = True
        wrapper._hf_xpress_original = wrapped
        setattr(GenerationMixin, wrapped.__name__, wrapper)


def uninstall() -> None:
    """Restore transformers' own `WRAPPED_METHODS`."""
    for name in WRAPPED_METHODS:
        current = getattr(GenerationMixin, name)
        if getattr(current, "_hf_xpress", False):
            setattr(GenerationMixin, name, current._hf_xpress_original)


__all__ = [
    "XPressCandidateGenerator",
    "XPressStats",
    "draft_stopping_criteria",
    "first_stop",
    "install",
    "is_xpress_drafter",
    "uninstall",
]
