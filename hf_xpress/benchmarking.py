"""`hf-xpress bench`: acceptance length and speed of xPress against every baseline, on real prompts, with plots.

Two entry points:

* :func:`run_benchmark` (CLI: ``hf-xpress bench ...``): every method on the same prompts in one process. For each
  prompt the methods run one after the other, in an order rotated from prompt to prompt (so slow drift of the
  machine does not favour one method), after one warm-up run of each method. Methods: plain ``generate``
  (tau = 1), transformers' prompt-lookup decoding, transformers' assisted decoding with a classic assistant
  (``--assistant``), transformers' native ``speculation_type="dflash"`` path, and ours with every drafter given
  (dFlash-only, Markov head, xPress at each K with early stop on and off). Every greedy output is compared with
  plain ``generate``; mismatches are printed loudly with the first differing position and the target's top-2 logit
  gap there (a near-tie in low precision, or a bug if the gap is large). Writes ``results.json`` (every figure),
  ``report.md`` (tables) and PNG plots into ``--out``.
* :func:`block_latency` (CLI: ``hf-xpress bench --block-only``): per-block micro-benchmark at block size B: the
  drafter forward (+ base logits through the target's lm_head), refiner time for K = 0..8 (0: the seed; fixed passes,
  early stop off), the Markov head's sequential decode, the refiner's pieces (w2 read vs lm_head), and the target's verify
  forward over B tokens against one decode step. Median of repeats; device-generic (synchronises on CUDA), so the
  same function times Qwen3-8B sizes on a GPU.

How the figures are measured:

* ``tau`` = mean accepted drafts per drafting round + 1 (the bonus token); ``tokens_per_forward`` = new tokens /
  target forwards (prefill included), defined for every method. Rounds are recorded for every speculative method
  by wrapping the candidate generator that ``generate`` builds (``get_candidates`` / ``update_candidate_strategy``),
  so transformers' own methods get per-slot acceptance too.
* Target forwards are timed with forward hooks (prefill, decode steps, verify forwards).
* Our drafters' per-round split (draft / refine / verify) comes from ``drafter.stats``; "other" is the rest of the
  wall time (generate's loop, cache crops, stopping criteria) per round.
* Decomposition: ``predicted speed-up = tau x t_step / (t_draft + t_refine + t_verify)`` per round, with
  ``t_step`` = plain ``generate``'s wall time per token after the prefill, measured on the same prompts;
  ``break-even tau = (t_draft + t_refine + t_verify) / t_step``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import itertools
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .configuration_xpress import DRAFT_SCHEDULES, INFERENCE_SETTINGS

PLAIN = "plain"
DEFAULT_PASSES = (1, 2, 4, 6, 8)
# The command line's defaults for our methods' settings (`add_parser`); one set to anything else asks for a drafter
# that reads it (`_check_options_apply`).
METHOD_SETTING_DEFAULTS = {"passes": ",".join(map(str, DEFAULT_PASSES)), "early_stop": "on,off", "shortlist": "none",
                           "drafts": "none", "draft_vocab": "on", "schedule": "constant", "confidence": "0",
                           "tree": "none", "with_lookup": "off"}
DEFAULT_SETS = ("humaneval", "mtbench", "math500")
PROMPT_LOOKUP_TOKENS = 10
DEFAULT_OUT = "results/bench"
NEAR_TIE_ULPS = 4  # a first mismatch whose top-2 gap is within this many ulps (target dtype) counts as a near-tie


# --------------------------------------------------------------------------------------------------------------------
# Clocks
# --------------------------------------------------------------------------------------------------------------------


def _sync(device: torch.device | str | None) -> None:
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is not None and device.type == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)
    elif device is not None and device.type == "mps":
        torch.mps.synchronize()


def _now(device: torch.device | str | None = None) -> float:
    _sync(device)
    return time.perf_counter()


def _median_time(fn: Callable[[], Any], device, repeats: int, warmup: int) -> float:
    """Median wall time of `fn()` in seconds (synchronised before and after on accelerators)."""
    return _median_times_after({"": (lambda: None, fn)}, device, repeats, warmup)[""]


def _median_times_after(calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], device, repeats: int,
                        warmup: int) -> dict[str, float]:
    """Median wall time (seconds) of each call `fn` of `calls` (name -> (before, fn)), each timed right after its own
    untimed `before()` (synchronised before and after on accelerators), the calls in turn so that drift hits all
    alike; `warmup` untimed rounds first."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(warmup + repeats):
        for name, (before, fn) in calls.items():
            before()
            start = _now(device)
            fn()
            if i >= warmup:
                times[name].append(_now(device) - start)
    return {name: statistics.median(values) for name, values in times.items()}


# --------------------------------------------------------------------------------------------------------------------
# Methods
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Method:
    """One decoding method of the benchmark.

    kind: "plain", "pld" (prompt lookup), "assisted" (classic assistant), "native-dflash", "dflash" / "markov" /
    "xpress" (ours, by the drafter's refiner), or "custom" (``runner(target, input_ids, generate_kwargs)`` returns
    the output ids; used by tests and for experiments). Ours with `tree` set verify a draft tree of that width
    (`hf_xpress.tree_decoding`) instead of a chain; with `tree_budget` too, a dynamic tree of that many draft nodes.
    """

    name: str
    kind: str
    model: Any = None  # drafter or assistant
    label: str | None = None  # drafter/assistant label (folder name)
    passes: int | None = None  # xPress: K
    early_stop: bool | None = None  # xPress: lock converged prefix and stop early
    shortlist: int | None = None  # xPress / Markov: refiner_shortlist (None: full vocabulary)
    drafts: int | None = None  # ours: num_assistant_tokens, drafts per round (None: B-1)
    confidence: float = 0.0  # ours: assistant_confidence_threshold (0: off)
    schedule: str = "constant"  # ours, chains: num_assistant_tokens_schedule ("cost": drafts per round from measured costs)
    draft_vocab: bool = True  # ours: draft among the drafter's stored draft vocabulary, if it has one
    tree: int | None = None  # ours: tree verification with this many slot-1 branches (None: a chain)
    tree_budget: int | None = None  # ours, with `tree`: a dynamic tree of this many draft nodes (None: W branches)
    tree_temperature: float | None = None  # ours, dynamic trees: rank nodes at this temperature (None: the drafter's)
    generate_kwargs: dict = field(default_factory=dict)
    runner: Callable | None = None

    def describe(self) -> dict:
        out = {"name": self.name, "kind": self.kind, "label": self.label}
        if self.kind == "xpress":
            out.update(passes=self.passes, early_stop=self.early_stop)
        if self.ours:
            out.update(shortlist=self.shortlist, drafts=self.drafts, confidence=self.confidence, schedule=self.schedule,
                       draft_vocab=self.draft_vocab and getattr(self.model, "draft_vocab", None) is not None,
                       prompt_lookup=self.generate_kwargs.get("prompt_lookup_num_tokens"), tree=self.tree,
                       tree_budget=self.tree_budget, lookup_branch=bool(self.generate_kwargs.get("lookup_branch")))
            if self.tree_budget is not None:  # the temperature the dynamic tree ranked its nodes at
                out["tree_temperature"] = (self.tree_temperature if self.tree_temperature is not None
                                           else getattr(self.model.config, "tree_temperature", None))
        if self.model is not None and getattr(self.model, "config", None) is not None:
            cfg = self.model.config
            out["model"] = {
                "class": type(self.model).__name__,
                "layers": getattr(cfg, "num_hidden_layers", None),
                "block_size": getattr(cfg, "block_size", None),
                "refiner": getattr(cfg, "refiner", None),
                "parameters": sum(p.numel() for p in self.model.parameters()),
            }
        return out

    @property
    def ours(self) -> bool:
        return self.kind in ("dflash", "markov", "xpress")

    def settings_key(self) -> tuple:
        """What one of our methods submits per round, whichever the drafter: drafts, threshold, draft vocabulary, tree
        and prompt lookup, and a dynamic tree's temperature (not the refiner's own settings: passes, early stop,
        shortlist)."""
        lookup = self.generate_kwargs.get("prompt_lookup_num_tokens")
        return (self.drafts, self.confidence, self.draft_vocab, self.tree, self.tree_budget, lookup,
                bool(self.generate_kwargs.get("lookup_branch")), self.tree_temperature, self.schedule)


def _drafter_kind(drafter) -> str:
    refiner = getattr(drafter.config, "refiner", None)
    return {"xpress": "xpress", "markov": "markov"}.get(refiner, "dflash")


def build_methods(
    drafters: Sequence[tuple[str, Any]] = (),
    *,
    assistant: tuple[str, Any] | None = None,
    passes: Iterable[int] = DEFAULT_PASSES,
    early_stop: Iterable[bool] = (True, False),
    shortlists: Iterable[int | None] = (None,),
    drafts: Iterable[int | None] = (None,),
    confidences: Iterable[float] = (0.0,),
    schedules: Iterable[str] = ("constant",),
    draft_vocabs: Iterable[bool] = (True,),
    prompt_lookup: int | None = PROMPT_LOOKUP_TOKENS,
    lookup_alone: bool = True,
    native_dflash: bool = True,
    with_lookup: Iterable[bool | str] = (False,),
    trees: Iterable[int | None] = (None,),
    tree_budgets: Iterable[int | None] = (None,),
    tree_temperatures: Iterable[float | None] = (None,),
) -> list[Method]:
    """The method list: plain, prompt lookup (unless `lookup_alone` is False), assisted (if `assistant`), native
    DFlash, then ours per drafter.

    drafters: ``(label, XPressDrafterModel)`` pairs. The native DFlash path runs each refiner-less drafter (or, when
    there is none, the first drafter's base, labelled so). Names carry the label only when two drafters of the same
    kind are given. Each of our methods runs at every `drafts` (drafts per round; with a schedule other than
    "constant", its cap) x `confidences` (threshold) x `schedules` (`num_assistant_tokens_schedule`, chains only)
    setting, the Markov head and xPress also at every shortlist; names carry " sl<M>", " n<drafts>", " c<threshold>",
    " <schedule>" (not for "constant"). A drafter
    with a stored draft vocabulary also runs without it where `draft_vocabs` holds False (names carry " allV"). Where
    `with_lookup` holds True, each of ours also runs with prompt lookup first (`prompt_lookup_num_tokens` =
    `prompt_lookup`, or the default when it is None; names carry " +pld"); where it holds "branch",
    each of ours with a tree also runs with lookup's continuation joining the drafter's tree as a branch
    (`tree_decoding`'s `lookup_branch`; names carry " +pldb"). Each tree width in
    `trees` (None: the chain) runs each of ours with tree verification (names carry " tree<W>"), at every budget in
    `tree_budgets` (None: W fixed branches; N: a dynamic tree of N draft nodes as deep as the drafts per round, names
    carry " tree<W>b<N>"); a tree ignores the confidence threshold, so it runs once per drafts-per-round (and
    prompt-lookup) setting. Dynamic trees also run at each `tree_temperatures` value (None: the drafter's own
    `tree_temperature`; T: names carry " t<T>").
    """
    passes, early_stop, shortlists = list(passes), list(early_stop), list(shortlists)
    trees = [(w, b) for w in trees for b in ([None] if w is None else list(tree_budgets))]
    temperatures = list(tree_temperatures)

    def submission(name: str, **method) -> list[Method]:
        """`name` at every tree width (chain first) x drafts-per-round x confidence-threshold and draft-count schedule
        (chains only) x draft-vocabulary on/off x prompt-lookup setting."""
        has_vocab = getattr(method["model"], "draft_vocab", None) is not None
        return [
            Method(name + (f" n{n}" if n else "") + (f" c{c:g}" if c else "") + ("" if sc == "constant" else f" {sc}")
                   + ("" if dv else " allV")
                   + ("" if w is None else f" tree{w}") + ("" if b is None else f"b{b}")
                   + ("" if t is None else f" t{t:g}") + {False: "", True: " +pld", "branch": " +pldb"}[lookup],
                   drafts=n, confidence=c, schedule=sc, draft_vocab=dv, tree=w, tree_budget=b, tree_temperature=t,
                   generate_kwargs=({"prompt_lookup_num_tokens": prompt_lookup or PROMPT_LOOKUP_TOKENS} if lookup else {})
                   | ({"lookup_branch": True} if lookup == "branch" else {}),
                   **method)
            for w, b in trees for t in ([None] if b is None else temperatures) for n in drafts
            for c in (confidences if w is None else [0.0]) for sc in (schedules if w is None else ["constant"])
            for dv in (list(draft_vocabs) if has_vocab else [True]) for lookup in with_lookup
            if not (lookup == "branch" and w is None)  # a chain has no tree to join
        ]

    methods = [Method(PLAIN, "plain")]
    if prompt_lookup and lookup_alone:
        methods.append(Method("prompt-lookup", "pld", generate_kwargs={"prompt_lookup_num_tokens": prompt_lookup}))
    if assistant is not None:
        label, model = assistant
        methods.append(Method(f"assisted[{label}]", "assisted", model=model, label=label))
    kinds = [_drafter_kind(d) for _, d in drafters]

    def tag(kind: str, label: str) -> str:
        return f"[{label}]" if kinds.count(kind) > 1 else ""

    if native_dflash and drafters:
        plain_drafters = [(label, d) for (label, d), k in zip(drafters, kinds) if k == "dflash"]
        if plain_drafters:
            for label, d in plain_drafters:
                methods.append(Method(f"native-dflash{tag('dflash', label)}", "native-dflash", model=d, label=label))
        else:
            label, d = drafters[0]
            methods.append(Method(f"native-dflash[{label} base]", "native-dflash", model=d, label=label))
    for (label, d), kind in zip(drafters, kinds):
        if kind == "markov":  # the same shortlists as xPress, for a like-for-like comparison
            for sl in shortlists:
                name = f"markov{tag(kind, label)}" + (f" sl{sl}" if sl else "")
                methods += submission(name, kind=kind, model=d, label=label, shortlist=sl)
            continue
        if kind != "xpress":
            methods += submission(f"{kind}{tag(kind, label)}", kind=kind, model=d, label=label)
            continue
        for k in passes:
            for es in early_stop if k > 0 else [False]:
                for sl in shortlists if k > 0 else [None]:
                    name = f"xpress{tag(kind, label)} K={k}" + (" es" if es else "") + (f" sl{sl}" if sl else "")
                    methods += submission(
                        name, kind="xpress", model=d, label=label, passes=k, early_stop=es, shortlist=sl
                    )
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate method names: {twice} (the same drafter folder given twice, or two folders of "
                         "the same name)")
    return methods


# --------------------------------------------------------------------------------------------------------------------
# Instrumentation: target forward times, and per-round proposed / accepted counts of any candidate generator
# --------------------------------------------------------------------------------------------------------------------


class _Recorder:
    def __init__(self, device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.forward_times: list[float] = []
        self.proposed: list[int] = []
        self.accepted: list[int] = []
        self._pending = 0
        self._start = 0.0

    def pre_hook(self, module, args, kwargs=None):
        self._start = _now(self.device)

    def post_hook(self, module, args, *rest):
        self.forward_times.append(_now(self.device) - self._start)

    def wrap_generator(self, generator):
        recorder = self
        get_candidates = generator.get_candidates
        update = generator.update_candidate_strategy

        def wrapped_get_candidates(input_ids, *args, **kwargs):
            out = get_candidates(input_ids, *args, **kwargs)
            recorder._pending = out[0].shape[1] - input_ids.shape[1]
            return out

        def wrapped_update(input_ids, scores, num_matches, *args, **kwargs):
            if recorder._pending > 0:
                recorder.proposed.append(int(recorder._pending))
                recorder.accepted.append(int(num_matches))
            recorder._pending = 0
            return update(input_ids, scores, num_matches, *args, **kwargs)

        generator.get_candidates = wrapped_get_candidates
        generator.update_candidate_strategy = wrapped_update
        return generator


@contextlib.contextmanager
def _instrumented(target):
    """Forward hooks on `target` and a wrapper around `_get_candidate_generator`; both removed on exit."""
    from transformers import GenerationMixin

    recorder = _Recorder(target.device)
    handles = [
        target.register_forward_pre_hook(recorder.pre_hook),
        target.register_forward_hook(recorder.post_hook),
    ]
    original = GenerationMixin._get_candidate_generator

    @functools.wraps(original)  # keeps hf_xpress's `_hf_xpress` marker, so `install()` stays idempotent
    def _get_candidate_generator(self, *args, **kwargs):
        return recorder.wrap_generator(original(self, *args, **kwargs))

    GenerationMixin._get_candidate_generator = _get_candidate_generator
    try:
        yield recorder
    finally:
        GenerationMixin._get_candidate_generator = original
        for handle in handles:
            handle.remove()


# --------------------------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------------------------


def _generate_kwargs(target, input_ids: torch.LongTensor, max_new_tokens: int, temperature: float) -> dict:
    """`generate` arguments for one unpadded prompt `input_ids` `[1, n]`: its attention mask is all ones (without one,
    transformers masks every prompt token equal to the pad id, which is set below when the target has none)."""
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "attention_mask": torch.ones_like(input_ids)}
    gen_cfg = getattr(target, "generation_config", None)
    if getattr(gen_cfg, "pad_token_id", None) is None:
        eos = getattr(gen_cfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        kwargs["pad_token_id"] = eos if eos is not None else 0
    if temperature and temperature > 0:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0, min_p=None)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None)
    return kwargs


@contextlib.contextmanager
def _drafter_settings(method: Method):
    """Set K / early stop / shortlist / drafts per round / tree temperature on the drafter's config for one run
    (restored after)."""
    if not method.ours:
        yield
        return
    cfg = method.model.config
    saved = {name: getattr(cfg, name) for name in INFERENCE_SETTINGS}
    if method.kind == "xpress":
        cfg.jacobi_passes, cfg.jacobi_early_stop = method.passes, method.early_stop
    cfg.refiner_shortlist = method.shortlist
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = method.drafts, method.schedule
    cfg.assistant_confidence_threshold = method.confidence
    if method.tree_temperature is not None:
        cfg.tree_temperature = method.tree_temperature
    vocab = method.model.draft_vocab
    if not method.draft_vocab:
        method.model.draft_vocab = None  # the whole vocabulary for this run
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cfg, name, value)
        method.model.draft_vocab = vocab


def run_once(
    target,
    method: Method,
    input_ids: torch.LongTensor,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    recorder: _Recorder,
) -> dict:
    """Generate once with `method`; return new tokens, wall time, target forwards, rounds and drafter stats."""
    kwargs = _generate_kwargs(target, input_ids, max_new_tokens, temperature) | method.generate_kwargs
    if method.tree is not None:
        from .tree_decoding import tree_decoding

        kwargs.update(custom_generate=tree_decoding, drafter=method.model, tree_width=method.tree,
                      tree_budget=method.tree_budget)
    elif method.kind in ("assisted", "dflash", "markov", "xpress"):
        kwargs["assistant_model"] = method.model
    elif method.kind == "native-dflash":
        kwargs.update(assistant_model=method.model, speculation_type="dflash")
    if temperature and temperature > 0:
        torch.manual_seed(seed)
    recorder.reset()
    with _drafter_settings(method), torch.inference_mode():
        start = _now(target.device)
        if method.kind == "custom":
            out = method.runner(target, input_ids, kwargs)
        else:
            out = target.generate(input_ids, **kwargs)
        elapsed = _now(target.device) - start
    new = out[0, input_ids.shape[1] :].tolist()
    result = {
        "method": method.name,
        "new_tokens": len(new),
        "time_s": elapsed,
        "tokens": new,
        "forwards": len(recorder.forward_times),
        "prefill_s": recorder.forward_times[0] if recorder.forward_times else float("nan"),
        "forward_s": sum(recorder.forward_times),
        "proposed": list(recorder.proposed),
        "accepted": list(recorder.accepted),
    }
    if method.ours and getattr(method.model, "stats", None) is not None:
        stats = method.model.stats.as_dict()
        if method.tree is not None:  # no candidate generator round trips to record: the loop's own counts
            result["proposed"], result["accepted"] = stats["proposed"], stats["accepted"]
        result["stats"] = {k: stats[k] for k in ("rounds", "passes", "lookup", "draft_time", "refine_time", "verify_time",
                                                 "plain_steps", "plain_time")}
    return result


def first_mismatch(target, prompt_ids: torch.LongTensor, reference: list[int], candidate: list[int]) -> dict | None:
    """None if `candidate == reference`; else the first differing position (0-based, in new tokens) and the
    target's top-2 logit gap at that position (computed on the reference prefix, in the target's dtype). Where one
    output is a prefix of the other, one stopped where the other did not: `kind` "length", never a near-tie."""
    if candidate == reference:
        return None
    pos = next((i for i, (a, b) in enumerate(zip(reference, candidate)) if a != b), min(len(reference), len(candidate)))
    info: dict[str, Any] = {
        "position": pos,
        "reference_len": len(reference),
        "method_len": len(candidate),
        "reference_token": reference[pos] if pos < len(reference) else None,
        "method_token": candidate[pos] if pos < len(candidate) else None,
    }
    if pos == min(len(reference), len(candidate)):  # no differing token: a stop (EOS, length, stop string) differs
        return dict(info, kind="length", near_tie=False)
    info["kind"] = "token"
    prefix = torch.tensor([reference[:pos]], dtype=prompt_ids.dtype, device=prompt_ids.device)
    with torch.inference_mode():
        logits = target(torch.cat([prompt_ids, prefix], dim=1), logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2)
    top1 = float(top.values[0])
    # one unit in the last place of the target's dtype at the top logit's magnitude: the rounding step there
    finfo = torch.finfo(target.dtype)
    ulp = finfo.eps * 2.0 ** math.floor(math.log2(abs(top1))) if top1 else finfo.tiny
    gap = float(top.values[0] - top.values[1])
    info.update(
        top1_token=int(top.indices[0]),
        top2_token=int(top.indices[1]),
        top1_logit=top1,
        top2_logit_gap=gap,
        gap_in_ulps=gap / ulp,
        near_tie=gap <= NEAR_TIE_ULPS * ulp,
    )
    if info["method_token"] is not None:
        info["method_token_logit_gap"] = float(top.values[0] - logits[info["method_token"]])
    return info


# --------------------------------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------------------------------


def _encode_sets(tokenizer, prompt_sets: dict[str, list]) -> dict[str, list[tuple[str, list[int]]]]:
    from .assets import PromptRecord, apply_chat_template

    encoded = {}
    for name, records in prompt_sets.items():
        ids = [rec.id for rec in records if isinstance(rec, PromptRecord)]  # token-id lists are numbered: distinct
        repeated = sorted({ident for ident in ids if ids.count(ident) > 1})
        if repeated:  # runs are paired across methods by (set, prompt id)
            raise ValueError(f"set {name!r} has prompts with the same id ({', '.join(map(repr, repeated[:5]))}): give "
                             "each prompt its own id (a jsonl row's \"id\")")
        rows = []
        for i, rec in enumerate(records):
            if isinstance(rec, PromptRecord):
                rows.append((rec.id, apply_chat_template(tokenizer, rec)))
            elif isinstance(rec, (list, tuple)) and all(isinstance(t, int) for t in rec):
                rows.append((f"{name}/{i}", list(rec)))
            else:
                raise TypeError(f"prompt {i} of set {name!r}: expected a PromptRecord or a list of token ids")
        encoded[name] = rows
    return encoded


def _machine() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def run_benchmark(
    target,
    tokenizer,
    methods: Sequence[Method],
    prompt_sets: dict[str, list],
    *,
    max_new_tokens: int = 128,
    temperatures: Sequence[float] = (0.0,),
    seed: int = 0,
    warmup: bool = True,
    progress: bool = True,
    out_dir: str | os.PathLike | None = None,
    settings: dict | None = None,
    block: dict | None = None,
    target_name: str | None = None,
) -> dict:
    """Run every method on every prompt (interleaved, order rotated per prompt), check greedy exactness against
    plain ``generate``, aggregate, and (if `out_dir`) write ``results.json``, ``report.md`` and the plots.

    prompt_sets: set name -> list of `PromptRecord` (chat template applied with `tokenizer`) or of token-id lists.
    The first method must be plain ``generate`` (the reference for exactness and speed-up).
    Returns the results dict (the content of ``results.json``).
    """
    from tqdm.auto import tqdm

    methods = list(methods)
    if not methods or methods[0].kind != "plain":
        raise ValueError("the first method must be plain generate (kind 'plain'): it is the reference")
    encoded = _encode_sets(tokenizer, prompt_sets)
    device = target.device
    started = _dt.datetime.now(_dt.timezone.utc)
    load_start = _loadavg()
    runs: list[dict] = []
    mismatches: list[dict] = []
    total = sum(len(rows) for rows in encoded.values()) * len(methods) * len(temperatures)

    with _instrumented(target) as recorder:
        if warmup:
            first = next((ids for rows in encoded.values() for _, ids in rows), None)
            if first is not None:
                ids = torch.tensor([first], device=device)
                warm_tokens = min(max_new_tokens, 2 * _block_size(methods) + 2)
                for method in methods:
                    for temperature in temperatures:
                        run_once(target, method, ids, max_new_tokens=warm_tokens, temperature=temperature,
                                 seed=seed, recorder=recorder)
        bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True)
        index = 0
        for temperature in temperatures:
            for set_name, rows in encoded.items():
                for prompt_id, prompt in rows:
                    ids = torch.tensor([prompt], device=device)
                    order = [methods[(index + j) % len(methods)] for j in range(len(methods))]
                    index += 1
                    by_method = {}
                    for method in order:
                        bar.set_postfix_str(f"T={temperature:g} {set_name} {method.name}", refresh=False)
                        result = run_once(target, method, ids, max_new_tokens=max_new_tokens,
                                          temperature=temperature, seed=seed + index, recorder=recorder)
                        result.update(set=set_name, prompt_id=prompt_id, prompt_len=len(prompt),
                                      temperature=temperature)
                        by_method[method.name] = result
                        bar.update(1)
                    reference = by_method[PLAIN]["tokens"]
                    for method in methods:
                        result = by_method[method.name]
                        result["mismatch"] = None
                        if temperature == 0 and method.kind != "plain":
                            info = first_mismatch(target, ids, reference, result["tokens"])
                            if info is not None:
                                info.update(method=method.name, set=set_name, prompt_id=prompt_id,
                                            dtype=str(target.dtype).replace("torch.", ""))
                                result["mismatch"] = info
                                mismatches.append(info)
                                bar.write(_mismatch_line(info), file=sys.stderr)
                        runs.append(result)
        bar.close()

    results = {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": _machine(),
            "device": str(device),
            "dtype": str(target.dtype).replace("torch.", ""),
            "target": target_name or getattr(target.config, "_name_or_path", None) or type(target).__name__,
            "max_new_tokens": max_new_tokens,
            "temperatures": list(temperatures),
            "sets": {name: len(rows) for name, rows in encoded.items()},
            "seed": seed,
            "load_average_start": load_start,
            "load_average_end": _loadavg(),
            "settings": settings or {},
        },
        "methods": [m.describe() for m in methods],
        "summary": summarize(runs, methods, temperatures, list(encoded)),
        "mismatches": mismatches,
        "runs": runs,
    }
    if block is not None:
        results["block_latency"] = block
    results["headline"] = headline(results)
    if mismatches:
        print(_mismatch_banner(mismatches, results["meta"]["dtype"]), file=sys.stderr)
    if out_dir is not None:
        write_outputs(results, out_dir)
    return results


def headline(results: dict) -> str:
    """One sentence for a README: the fastest xPress setting at the first temperature, against the baselines."""
    meta = results["meta"]
    tkey = next(iter(results["summary"]), None)
    table = results["summary"].get(tkey, {}).get("all", {}) if tkey else {}
    kinds = {m["name"]: m["kind"] for m in results["methods"]}
    xp = [n for n in table if kinds.get(n) == "xpress"]
    if not xp:
        return ""
    best = max(xp, key=lambda n: table[n].get("speedup", 0.0))
    machine = meta["machine"]
    others = []
    for name, f in table.items():
        if kinds.get(name) in ("pld", "assisted", "native-dflash", "dflash", "markov"):
            others.append(f"{name} tau {f['tau']:.2f}, {f.get('speedup', float('nan')):.2f}x")
    load = meta.get("load_average_start") or [0.0]
    busy = bool(machine.get("cpu_count")) and load[0] > 0.5 * machine["cpu_count"]
    greedy = 0.0 in meta.get("temperatures", [0.0])
    exactness = f"greedy mismatches vs plain: {len(results['mismatches'])}" if greedy else "no greedy runs"
    return (
        f"{meta['target']} ({meta['dtype']}, {tkey}, {sum(meta['sets'].values())} prompts from "
        f"{', '.join(meta['sets'])}, {meta['max_new_tokens']} new tokens) on "
        f"{machine.get('cuda_device') or machine.get('cpu_model') or machine.get('processor')} "
        f"({machine.get('torch_threads')} threads): {best} tau {table[best]['tau']:.2f}, "
        f"{table[best]['tokens_per_s']:.1f} tok/s, {table[best].get('speedup', float('nan')):.2f}x over plain generate "
        f"({table.get(PLAIN, {}).get('tokens_per_s', float('nan')):.1f} tok/s); " + "".join(f"{o}; " for o in others)
        + exactness + (" [TIMINGS TAKEN UNDER LOAD]" if busy else "") + "."
    )


def _block_size(methods: Sequence[Method]) -> int:
    configs = [getattr(m.model, "config", None) for m in methods if m.model is not None]
    sizes = [c.block_size for c in configs if hasattr(c, "block_size")]
    return max(sizes, default=16)


def _mismatch_line(info: dict) -> str:
    if info.get("kind") == "length":  # the same tokens, but one output stopped earlier: no logit gap to report
        return (f"!!! MISMATCH vs plain generate: {info['method']} on {info['prompt_id']}: the same tokens, but "
                f"{info['method_len']} new tokens against plain generate's {info['reference_len']} (a stop differs)")
    gap = info.get("top2_logit_gap")
    return (
        f"!!! MISMATCH vs plain generate: {info['method']} on {info['prompt_id']} at new token {info['position']} "
        f"(plain {info['reference_token']}, method {info['method_token']}; target top-2 logit gap "
        f"{gap:.4g} = {info.get('gap_in_ulps', float('nan')):.1f} ulp in {info['dtype']}"
        + (", a near-tie)" if info.get("near_tie") else ", NOT a near-tie)")
    )


def _mismatch_banner(mismatches: list[dict], dtype: str) -> str:
    by_method: dict[str, int] = {}
    for m in mismatches:
        by_method[m["method"]] = by_method.get(m["method"], 0) + 1
    gaps = [m["top2_logit_gap"] for m in mismatches if m.get("top2_logit_gap") is not None]
    ties = sum(bool(m.get("near_tie")) for m in mismatches)
    lines = [
        "=" * 100,
        f"!!! MISMATCH: {len(mismatches)} GREEDY OUTPUT(S) DIFFER FROM PLAIN generate ({dtype}): "
        + ", ".join(f"{k}: {v}" for k, v in by_method.items()),
        f"!!! target top-2 logit gap at the first differing position: max {max(gaps, default=float('nan')):.4g}, "
        f"median {statistics.median(gaps) if gaps else float('nan'):.4g}; {ties} of {len(mismatches)} are near-ties "
        f"(within {NEAR_TIE_ULPS} ulp)",
    ]
    if dtype == "float32":
        lines.append("!!! In float32 greedy speculative decoding must be token-identical: this is a bug.")
    else:
        lines.append("!!! In low precision a block verify can round near-ties differently; small gaps = near-ties.")
    lines.append("=" * 100)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------------------------


def _slot_acceptance(accepted: list[int], proposed: list[int]) -> list[float]:
    if not accepted:
        return []
    width = max(proposed)
    return [sum(a >= k for a in accepted) / len(accepted) for k in range(1, width + 1)]


def _aggregate(rows: list[dict]) -> dict:
    new = sum(r["new_tokens"] for r in rows)
    elapsed = sum(r["time_s"] for r in rows)
    forwards = sum(r["forwards"] for r in rows)
    accepted = [a for r in rows for a in r["accepted"]]
    proposed = [p for r in rows for p in r["proposed"]]
    out: dict[str, Any] = {
        "prompts": len(rows),
        "new_tokens": new,
        "time_s": elapsed,
        "tokens_per_s": new / elapsed if elapsed > 0 else float("nan"),
        "forwards": forwards,
        "tokens_per_forward": new / forwards if forwards else float("nan"),
        "rounds": len(accepted),
        "tau": (sum(accepted) / len(accepted) + 1.0) if accepted else 1.0,
        "acceptance_rate": sum(accepted) / sum(proposed) if proposed else float("nan"),
        "slot_acceptance": _slot_acceptance(accepted, proposed),
        "prefill_s": sum(r["prefill_s"] for r in rows),
        "mismatches": sum(r.get("mismatch") is not None for r in rows),
    }
    stats = [r["stats"] for r in rows if r.get("stats")]
    if stats:
        rounds = sum(s["rounds"] for s in stats)
        passes = [p for s in stats for p in s["passes"]]
        if rounds:
            draft = sum(s["draft_time"] for s in stats) / rounds
            refine = sum(s["refine_time"] for s in stats) / rounds
            verify = sum(s["verify_time"] for s in stats) / rounds
            plain = sum(s.get("plain_time", 0.0) for s in stats)  # the "cost" schedule's plain steps: not rounds
            other = (elapsed - out["prefill_s"] - plain) / rounds - draft - refine - verify
            out["per_round_ms"] = {"draft": draft * 1e3, "refine": refine * 1e3, "verify": verify * 1e3,
                                   "other": other * 1e3}
        plain_steps = sum(s.get("plain_steps", 0) for s in stats)
        if plain_steps:
            out["plain_steps"] = plain_steps
        out["mean_passes"] = sum(passes) / len(passes) if passes else 0.0
        # with prompt lookup first: which rounds lookup drafted, and what each kind of round accepted
        kinds = [(looked, a) for r in rows if r.get("stats") for looked, a in zip(r["stats"].get("lookup", []), r["accepted"])]
        if any(looked for looked, _ in kinds):
            by_lookup = [a for looked, a in kinds if looked]
            by_drafter = [a for looked, a in kinds if not looked]
            out["lookup"] = {
                "share": len(by_lookup) / len(kinds),
                "tau_lookup_rounds": sum(by_lookup) / len(by_lookup) + 1.0,
                "tau_drafter_rounds": sum(by_drafter) / len(by_drafter) + 1.0 if by_drafter else float("nan"),
            }
    return out


def ratio_interval(rows: list[dict], method: str, other: str = PLAIN, resamples: int = 2000,
                   seed: int = 0) -> list[float] | None:
    """95% bootstrap interval of `method`'s speed over `other`'s (total tokens / total time, each), resampling the
    prompts both ran (paired: a resampled prompt brings both its runs); None with fewer than 3 such prompts.

    Stratified by set: each resample draws as many prompts from each set as the run had (the run drew a fixed number
    per set, so differences between sets are not sampling noise). It shows how far the figure depends on which prompts
    were drawn, not the timing noise within one run."""
    def key(r: dict) -> tuple:
        return r["set"], r.get("prompt_id")

    theirs = {key(r): r for r in rows if r["method"] == other}
    by_set: dict[str, list[tuple]] = {}
    for r in rows:
        if r["method"] == method and key(r) in theirs:
            mine = theirs[key(r)]
            by_set.setdefault(r["set"], []).append((r["new_tokens"], r["time_s"], mine["new_tokens"], mine["time_s"]))
    if sum(len(pairs) for pairs in by_set.values()) < 3:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        draw = [pairs[rng.randrange(len(pairs))] for pairs in by_set.values() for _ in pairs]
        tokens, elapsed, other_tokens, other_elapsed = (sum(p[i] for p in draw) for i in range(4))
        ratios.append((tokens / elapsed) / (other_tokens / other_elapsed))
    ratios.sort()
    return [ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]]


def summarize(runs: list[dict], methods: Sequence[Method], temperatures: Sequence[float], sets: list[str]) -> dict:
    """`{"T=<t>": {set or "all": {method: figures}}}` with speed-ups over plain and the decomposition."""
    summary: dict[str, dict] = {}
    for temperature in temperatures:
        key = f"T={temperature:g}"
        summary[key] = {}
        for set_name in [*sets, "all"]:
            rows = [r for r in runs if r["temperature"] == temperature and (set_name == "all" or r["set"] == set_name)]
            if not rows:
                continue
            table = {}
            for method in methods:
                mine = [r for r in rows if r["method"] == method.name]
                if mine:
                    table[method.name] = _aggregate(mine)
            plain = table.get(PLAIN)
            if plain:
                plain_rows = [r for r in rows if r["method"] == PLAIN]
                decode_tokens = sum(max(r["new_tokens"] - 1, 0) for r in plain_rows)
                decode_time = sum(r["time_s"] - r["prefill_s"] for r in plain_rows)
                t_step = decode_time / decode_tokens if decode_tokens else float("nan")
                plain["t_step_ms"] = t_step * 1e3
                for name, figures in table.items():
                    figures["speedup"] = figures["tokens_per_s"] / plain["tokens_per_s"]
                    if name != PLAIN:
                        figures["speedup_ci95"] = ratio_interval(rows, name)  # over plain
                    split = figures.get("per_round_ms")
                    if split and t_step == t_step and t_step > 0:
                        round_ms = split["draft"] + split["refine"] + split["verify"]
                        figures["decomposition"] = {
                            "tau": figures["tau"],
                            "t_step_ms": t_step * 1e3,
                            "t_round_ms": round_ms,
                            "predicted_speedup": figures["tau"] * t_step * 1e3 / round_ms,
                            "break_even_tau": round_ms / (t_step * 1e3),
                        }
            if set_name == "all" and plain:  # the fastest method, and the fastest xPress setting, against the rest
                others = [name for name in table if name != PLAIN]
                xpress = [m.name for m in methods if m.kind == "xpress" and m.name in table]
                for group in (others, xpress):
                    if len(others) < 2 or not group:
                        continue
                    fastest = max(group, key=lambda name: table[name]["tokens_per_s"])
                    table[fastest]["over_others"] = {
                        name: {"ratio": table[fastest]["tokens_per_s"] / table[name]["tokens_per_s"],
                               "ci95": ratio_interval(rows, fastest, name)}
                        for name in others if name != fastest
                    }
                # each xPress method against the other drafters run with the same submission settings
                by_settings: dict[tuple, list[Method]] = {}
                for m in methods:
                    if m.ours and m.name in table:
                        by_settings.setdefault(m.settings_key(), []).append(m)
                for group in by_settings.values():
                    for xp in (m for m in group if m.kind == "xpress"):
                        rivals = [m.name for m in group if m.kind != "xpress"]
                        if rivals:
                            table[xp.name]["vs_same_settings"] = {
                                name: {"ratio": table[xp.name]["tokens_per_s"] / table[name]["tokens_per_s"],
                                       "tau_ratio": table[xp.name]["tau"] / table[name]["tau"],
                                       "ci95": ratio_interval(rows, xp.name, name)}
                                for name in rivals
                            }
            summary[key][set_name] = table
    return summary


# --------------------------------------------------------------------------------------------------------------------
# Outputs: JSON, markdown, plots
# --------------------------------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}f}"
    return str(x)


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# What a run writes into its folder (`write_outputs`, and `--block-only`'s block_latency.*): a later run into the same
# folder replaces all of them, so no plot or table of an earlier run stays beside its figures. Other files stay.
OUTPUT_PATTERNS = ("results.json", "report.md", "tau_*.png", "slot_acceptance_*.png", "speedup_*.png",
                   "latency_split_*.png", "refine_vs_k_*.png", "block_latency.png", "block_latency.json",
                   "block_latency.md")


def _remove_earlier_outputs(out: Path) -> None:
    """Delete an earlier run's files in `out` (`OUTPUT_PATTERNS`), which would read as this run's."""
    for old in {path for pattern in OUTPUT_PATTERNS for path in out.glob(pattern)}:
        old.unlink()


def write_outputs(results: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``results.json``, the PNG plots and ``report.md`` into `out_dir`; return their paths.

    Everything is built in a temporary folder inside `out_dir` first, so results the report or a plot cannot be
    made from leave `out_dir` as it was; then an earlier run's files there (`OUTPUT_PATTERNS`) are removed and the new
    ones moved in."""
    import tempfile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".bench-") as tmp:
        staged = Path(tmp)
        (staged / "results.json").write_text(json.dumps(_json_safe(results), indent=1) + "\n", encoding="utf-8")
        plots = make_plots(results, staged)
        (staged / "report.md").write_text(render_report(results, {k: v.name for k, v in plots.items()}),
                                          encoding="utf-8")
        _remove_earlier_outputs(out)
        for path in staged.iterdir():
            os.replace(path, out / path.name)
    return {"json": out / "results.json", **{k: out / v.name for k, v in plots.items()}, "report": out / "report.md"}


def render_report(results: dict, plots: dict[str, str] | None = None) -> str:
    meta, summary = results["meta"], results["summary"]
    plots = plots or {}
    machine = meta["machine"]
    lines = [
        "# hf-xpress benchmark",
        "",
        f"- target: `{meta['target']}` ({meta['dtype']}, {meta['device']}); max_new_tokens {meta['max_new_tokens']}; "
        f"temperatures {', '.join(f'{t:g}' for t in meta['temperatures'])}; seed {meta['seed']}",
        f"- prompts: " + ", ".join(f"{k} ({v})" for k, v in meta["sets"].items()),
        f"- machine: {machine.get('cpu_model') or machine.get('processor')}, {machine.get('cpu_count')} CPUs, "
        f"{machine.get('torch_threads')} torch threads"
        + (f", {machine['cuda_device']}" if machine.get("cuda_device") else "")
        + f"; torch {machine.get('torch')}, transformers {machine.get('transformers')}",
        f"- run {meta['started']} -> {meta['finished']}; load average at start {meta['load_average_start']}, "
        f"at end {meta['load_average_end']}",
    ]
    load = meta.get("load_average_start") or [0.0]
    if load and machine.get("cpu_count") and load[0] > 0.5 * machine["cpu_count"]:
        lines.append(f"- **warning: the machine was busy (1-min load {load[0]} on {machine['cpu_count']} CPUs); "
                     f"timings are distorted, acceptance figures are not.**")
    if results.get("headline"):
        lines += ["", "**Headline:** " + results["headline"]]
    lines.append("")
    methods = [m["name"] for m in results["methods"]]
    lines += ["## Exactness (greedy outputs vs plain `generate`)", ""]
    if 0.0 not in meta.get("temperatures", [0.0]):
        lines.append("No greedy runs: exactness is checked token for token on greedy outputs only.")
    elif not results["mismatches"]:
        lines.append("All greedy outputs are token-identical to plain `generate`.")
    else:
        lines.append(f"**{len(results['mismatches'])} greedy output(s) differ from plain `generate`.** "
                     "First differing position and the target's top-2 logit gap there:")
        ties = sum(bool(m.get("near_tie")) for m in results["mismatches"])
        lines.append(f"{ties} of them are near-ties (top-2 gap within {NEAR_TIE_ULPS} ulp of the target's dtype at "
                     "the top logit's magnitude).")
        lines += ["", "| method | prompt | position | plain token | method token | top-2 gap | gap (ulp) | near-tie |"
                  " method-token gap |", "|---|---|---|---|---|---|---|---|---|"]
        for m in results["mismatches"]:
            lines.append(f"| {m['method']} | {m['prompt_id']} | {m['position']} | {m['reference_token']} | "
                         f"{m['method_token']} | {_fmt(m.get('top2_logit_gap'), 4)} | "
                         f"{_fmt(m.get('gap_in_ulps'), 1)} | "
                         f"{'yes' if m.get('near_tie') else '**no**'} | {_fmt(m.get('method_token_logit_gap'), 4)} |")
    lines.append("")
    for tkey, per_set in summary.items():
        sets = [s for s in per_set if s != "all"]
        cols = sets + (["all"] if "all" in per_set else [])
        lines += [f"## {tkey}", "", "### Acceptance length tau (tokens per drafting round; plain = 1)", "",
                  "| method | " + " | ".join(cols) + " | tokens/forward (all) |",
                  "|---|" + "---|" * (len(cols) + 1)]
        for name in methods:
            if name not in per_set.get("all", {}):
                continue
            cells = [_fmt(per_set[s].get(name, {}).get("tau")) for s in cols]
            per_forward = _fmt(per_set["all"][name]["tokens_per_forward"])
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {per_forward} |")
        lines += ["", "### Speed (all sets; interleaved, same prompts)", "",
                  "| method | tokens/s | speed-up over plain | 95% interval (prompts resampled) | mismatches | "
                  "mean passes |", "|---|---|---|---|---|---|"]
        for name in methods:
            f = per_set.get("all", {}).get(name)
            if f:
                ci = f.get("speedup_ci95")
                interval = f"{ci[0]:.2f}-{ci[1]:.2f}x" if ci else "-"
                lines.append(f"| {name} | {_fmt(f['tokens_per_s'])} | {_fmt(f.get('speedup'))}x | {interval} | "
                             f"{f['mismatches']} | {_fmt(f.get('mean_passes'))} |")
        leaders = [name for name in methods if "over_others" in per_set.get("all", {}).get(name, {})]
        # the faster of the (at most two) leaders is the fastest method overall, the other the fastest xPress setting
        for rank, fastest in enumerate(sorted(leaders, key=lambda name: -per_set["all"][name]["tokens_per_s"])):
            what = "method" if rank == 0 else "xPress setting"
            lines += ["", f"The fastest {what}, **{fastest}**, against each other method (its speed over theirs, "
                      "and the 95% interval with the prompts resampled in pairs; an interval that holds 1.00 is no "
                      "lead):", "", "| other method | this / other | 95% interval |", "|---|---|---|"]
            for name, f in per_set["all"][fastest]["over_others"].items():
                ci = f["ci95"]
                lines.append(f"| {name} | {f['ratio']:.3f}x | " + (f"{ci[0]:.3f}-{ci[1]:.3f}x" if ci else "-") + " |")
        paired = [name for name in methods if "vs_same_settings" in per_set.get("all", {}).get(name, {})]
        if paired:
            lines += ["", "xPress against the other drafters at the same settings (drafts per round, threshold, tree, "
                      "prompt lookup): its speed and tau over theirs, and the speed ratio's 95% interval with the "
                      "prompts resampled in pairs:", "", "| xPress method | other method | speed ratio | 95% interval "
                      "| tau ratio |", "|---|---|---|---|---|"]
            for name in paired:
                for other, f in per_set["all"][name]["vs_same_settings"].items():
                    ci = f["ci95"]
                    lines.append(f"| {name} | {other} | {f['ratio']:.3f}x | "
                                 + (f"{ci[0]:.3f}-{ci[1]:.3f}x" if ci else "-") + f" | {f['tau_ratio']:.3f}x |")
        looked = {name: per_set["all"][name]["lookup"] for name in methods if "lookup" in per_set.get("all", {}).get(name, {})}
        if looked:
            lines += ["", "With prompt lookup: share of rounds where lookup found a continuation (' +pld': verified "
                      "alone; ' +pldb': joined the drafter's tree), and tau of each kind of round:", "",
                      "| method | lookup rounds | tau, lookup rounds | tau, other rounds |", "|---|---|---|---|"]
            lines += [f"| {name} | {f['share']:.0%} | {_fmt(f['tau_lookup_rounds'])} | {_fmt(f['tau_drafter_rounds'])} |"
                      for name, f in looked.items()]
        lines += ["", "Speed-up per set:", "", "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for name in methods:
            if name in per_set.get("all", {}):
                cells = [_fmt(per_set[s].get(name, {}).get("speedup")) for s in cols]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", "### Latency split per drafting round (ms, all sets) and the speed-up decomposition", "",
                  "`predicted = tau x t_step / (t_draft + t_refine + t_verify)`; t_step = plain generate's time per "
                  "token after prefill; break-even tau = round time / t_step.", "",
                  "| method | draft | refine | verify | other | t_step | tau | predicted | measured | break-even tau |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name in methods:
            f = per_set.get("all", {}).get(name)
            if f and f.get("per_round_ms") and f.get("decomposition"):
                s, d = f["per_round_ms"], f["decomposition"]
                lines.append(f"| {name} | {_fmt(s['draft'])} | {_fmt(s['refine'])} | {_fmt(s['verify'])} | "
                             f"{_fmt(s['other'])} | {_fmt(d['t_step_ms'])} | {_fmt(d['tau'])} | "
                             f"{_fmt(d['predicted_speedup'])}x | {_fmt(f.get('speedup'))}x | "
                             f"{_fmt(d['break_even_tau'])} |")
        width = max((len(f["slot_acceptance"]) for f in per_set.get("all", {}).values()), default=0)
        if width:
            shown = list(range(1, width + 1))
            lines += ["", "### Per-slot acceptance (all sets): fraction of drafting rounds that accept slot k", "",
                      "| method | " + " | ".join(str(k) for k in shown) + " |", "|---|" + "---|" * len(shown)]
            for name in methods:
                f = per_set.get("all", {}).get(name)
                if f and f["slot_acceptance"]:
                    sa = f["slot_acceptance"]
                    cells = [_fmt(sa[k - 1]) if k <= len(sa) else "" for k in shown]
                    lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        for kind in ("tau", "slot_acceptance", "speedup", "latency_split", "refine_vs_k"):
            key = f"{kind}_{tkey}"
            if key in plots:
                lines += [f"![{kind} {tkey}]({plots[key]})", ""]
    if "block_latency" in results:
        lines += ["## Per-block latency", "", format_block_table(results["block_latency"]), ""]
        if "block_latency" in plots:
            lines += [f"![block latency]({plots['block_latency']})", ""]
    return "\n".join(lines)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe_key(tkey: str) -> str:
    return tkey.replace("=", "").replace(".", "p")


def make_plots(results: dict, out: Path) -> dict[str, Path]:
    """PNG plots: tau per set/method, per-slot acceptance, speed-up, latency split, refiner time vs K."""
    plt = _plt()
    methods = [m for m in results["methods"]]
    paths: dict[str, Path] = {}
    for tkey, per_set in results["summary"].items():
        suffix = _safe_key(tkey)
        sets = [s for s in per_set if s != "all"] + (["all"] if "all" in per_set else [])
        names = [m["name"] for m in methods if m["kind"] != "plain" and m["name"] in per_set.get("all", {})]
        if not names:
            continue
        # tau per set and method
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(sets) * max(1, len(names)) / 3), 4.5))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [j + i * width for j in range(len(sets))]
            ax.bar(xs, [per_set[s].get(name, {}).get("tau", 0) for s in sets], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("tau (tokens per drafting round)")
        ax.set_title(f"Acceptance length, {tkey}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths[f"tau_{tkey}"] = out / f"tau_{suffix}.png"
        fig.savefig(paths[f"tau_{tkey}"], dpi=110)
        plt.close(fig)

        # per-slot acceptance
        fig, axes = plt.subplots(1, len(sets), figsize=(4 * len(sets), 3.6), squeeze=False, sharey=True)
        for ax, s in zip(axes[0], sets):
            for name in names:
                sa = per_set[s].get(name, {}).get("slot_acceptance") or []
                if sa:
                    ax.plot(range(1, len(sa) + 1), sa, marker=".", label=name)
            ax.set_title(s)
            ax.set_xlabel("draft slot k")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("P(slot k accepted)")
        axes[0][-1].legend(fontsize=6)
        fig.suptitle(f"Per-slot acceptance, {tkey}")
        fig.tight_layout()
        paths[f"slot_acceptance_{tkey}"] = out / f"slot_acceptance_{suffix}.png"
        fig.savefig(paths[f"slot_acceptance_{tkey}"], dpi=110)
        plt.close(fig)

        # speed-up over plain (all sets)
        all_ = per_set["all"]
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names) + 2), 4))
        ax.bar(range(len(names)), [all_[n].get("speedup", 0) for n in names], color="tab:blue")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("speed-up over plain generate")
        ax.set_title(f"End-to-end speed-up (all sets), {tkey}")
        fig.tight_layout()
        paths[f"speedup_{tkey}"] = out / f"speedup_{suffix}.png"
        fig.savefig(paths[f"speedup_{tkey}"], dpi=110)
        plt.close(fig)

        # latency split per round
        ours = [n for n in names if all_[n].get("per_round_ms")]
        if ours:
            fig, ax = plt.subplots(figsize=(7, 0.4 * len(ours) + 1.8))
            left = [0.0] * len(ours)
            for part, color in (("draft", "tab:blue"), ("refine", "tab:orange"), ("verify", "tab:green"),
                                ("other", "tab:grey")):
                vals = [max(all_[n]["per_round_ms"][part], 0.0) for n in ours]
                ax.barh(range(len(ours)), vals, left=left, color=color, label=part)
                left = [a + b for a, b in zip(left, vals)]
            t_step = all_.get(PLAIN, {}).get("t_step_ms")
            if t_step:
                ax.axvline(t_step, color="black", ls="--", lw=1, label=f"plain decode step {t_step:.1f} ms")
            ax.set_yticks(range(len(ours)), ours, fontsize=7)
            ax.set_xlabel("ms per drafting round")
            ax.set_title(f"Latency split per round (all sets), {tkey}")
            ax.legend(fontsize=7)
            fig.tight_layout()
            paths[f"latency_split_{tkey}"] = out / f"latency_split_{suffix}.png"
            fig.savefig(paths[f"latency_split_{tkey}"], dpi=110)
            plt.close(fig)

        # refiner time per block vs K (end to end, from drafter.stats)
        xp = [m for m in methods if m["kind"] == "xpress" and m["name"] in all_ and all_[m["name"]].get("per_round_ms")]
        if xp:
            fig, ax = plt.subplots(figsize=(6, 4))
            # one line per setting other than K (drafter, early stop, shortlist, drafts, tree, lookup, ...), named as
            # its methods with "K=*": methods of other settings on one line zigzagged between them
            groups: dict[tuple, list] = {}
            for m in xp:
                setting = tuple(sorted((k, repr(v)) for k, v in m.items() if k not in ("name", "passes", "model")))
                name = re.sub(r"K=\d+", "K=*", m["name"])
                groups.setdefault(setting, [name, []])[1].append((m["passes"], all_[m["name"]]["per_round_ms"]["refine"]))
            for name, pts in groups.values():
                pts.sort()
                ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=name)
            markov = [m for m in methods
                      if m["kind"] == "markov" and m["name"] in all_ and all_[m["name"]].get("per_round_ms")]
            for m, style in zip(markov, itertools.cycle(["--", ":", "-.", (0, (5, 1))])):  # each its own line style
                ax.axhline(all_[m["name"]]["per_round_ms"]["refine"], color="tab:red", ls=style, label=m["name"])
            ax.set_xlabel("K (Jacobi passes)")
            ax.set_ylabel("refine ms per block (in generate)")
            ax.set_title(f"Refiner time per block vs K, {tkey}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            paths[f"refine_vs_k_{tkey}"] = out / f"refine_vs_k_{suffix}.png"
            fig.savefig(paths[f"refine_vs_k_{tkey}"], dpi=110)
            plt.close(fig)
    if "block_latency" in results:
        paths["block_latency"] = plot_block_latency(results["block_latency"], out / "block_latency.png")
    return paths


# --------------------------------------------------------------------------------------------------------------------
# Per-block micro-benchmark
# --------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def block_latency(
    target,
    drafter=None,
    *,
    passes: Iterable[int] = range(1, 9),
    context_length: int = 256,
    new_context: int = 4,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    verbose: bool = True,
    compiled: bool = False,
    profile: bool = False,
    **drafter_overrides,
) -> dict:
    """Median per-block latencies (ms) of one drafting round at the drafter's block size B.

    - ``drafter_forward``: the drafter over ``new_context`` new context rows + the block ``[anchor, mask x B-1]``
      with a KV cache of ``context_length`` context rows (block K/V cropped after, as in generation);
      ``lm_head``: the target's lm_head over the B-1 draft slots (base logits); ``draft`` = both.
    - ``refine[K]``: ``drafter.propose`` with K fixed Jacobi passes (early stop off), seed argmax included;
      ``refine[0]`` is the seed alone. ``per_pass``: least-squares slope of refine over K.
    - ``markov``: the Markov head's sequential decode of the B-1 slots (same propose call).
    - ``goals``: K = 4 against the Markov head timed again, interleaved call by call (``k4_interleaved_ms``,
      ``markov_interleaved_ms``): the comparison the goal reads, which drift between the separate loops cannot tilt.
    - ``in_round``: the draft, K = 4 and the Markov head again, in turn, each timed right after an untimed verify
      (the refiners also after an untimed draft): the caches as a round leaves them (the loops above repeat one call,
      which keeps all it reads in cache).
    - ``compiled=True``: also ``refine_compiled[K]``, the same calls through ``enable_fast_refine()`` (the fixed-K
      loop compiled by ``torch.compile``; a CUDA graph on a GPU, C++ kernels on a CPU), compiled before timing,
      with its slope ``per_pass_compiled``, and ``markov_compiled``, the Markov head's propose compiled the same way.
    - ``profile=True``: also ``ops``, where the time of xPress K = 4 and of the Markov head goes: per refiner, the
      operators (``torch.profiler``, CPU self time) with their calls and microseconds per block, largest first, and
      the profiled total per block (the profiler's own overhead inflates every figure; the shares are what it shows).
    - pieces of one pass: ``w2_read`` (r -> V over B-1 slots), ``refiner_hidden_part`` (once per block).
    - ``verify``: the target over B tokens (logits for all, the drafter's hidden-state layers kept) after a
      ``context_length`` cache; ``decode_step``: the target over 1 token. Both cropped back after each repeat.

    Weights do not matter for timing, so a drafter whose refiner is not xPress (or Markov) gets a random one of the
    drafter's config size for that measurement. `drafter=None` builds a random xPress drafter with
    ``XPressDrafterModel.from_target(target, **drafter_overrides)`` (e.g. ``num_hidden_layers=3,
    refiner_rank=128``). Device-generic: runs where the target is, synchronising on CUDA.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DFlashCache

    from .modeling_xpress import XPressDrafterModel, XPressMarkovHead, XPressRefiner

    device, dtype = target.device, target.dtype
    torch.manual_seed(seed)
    if drafter is None:
        last = target.config.get_text_config().vocab_size - 1  # timing only: which mask id does not matter
        drafter = XPressDrafterModel.from_target(target, **{"refiner": "xpress", "mask_token_id": last,
                                                            **drafter_overrides})
    drafter = drafter.to(device=device, dtype=dtype).eval()
    cfg = drafter.config
    B = cfg.block_size
    vocab = cfg.vocab_size
    passes = list(passes)
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    layer_ids = list(cfg.target_layer_ids)

    ids = torch.randint(0, min(vocab, cfg.mask_token_id), (1, context_length + B), device=device)
    # target: prefill the context, keep the drafter's layers
    cache = DynamicCache(config=target.config)
    out = target(ids[:, :context_length], cache=cache, use_cache=True,
                 output_hidden_states=[i + 1 for i in layer_ids], logits_to_keep=1)
    features = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)

    def verify():
        target(ids[:, context_length : context_length + B], cache=cache, use_cache=True,
               output_hidden_states=[i + 1 for i in layer_ids], logits_to_keep=B)
        cache.crop(-B)  # a negative value removes that many positions (transformers 5.24)

    def decode_step():
        target(ids[:, context_length : context_length + 1], cache=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-1)

    # drafter: context cache of context_length - new_context rows, then the timed call adds new_context + block
    dcache = DFlashCache(config=cfg)
    if hasattr(dcache, "activate_past_recording"):
        dcache.activate_past_recording()
    base_len = context_length - new_context
    mask_ids = torch.full((1, B - 1), cfg.mask_token_id, device=device)
    block_embeds = embed(torch.cat([ids[:, context_length - 1 : context_length], mask_ids], dim=1))
    drafter(noise_embeds=block_embeds, context_hidden_states=features[:, :base_len],
            position_ids=torch.arange(0, base_len + B, device=device)[None], cache=dcache)
    dcache.crop(-B)
    positions = torch.arange(base_len, context_length + B, device=device)[None]
    holder: dict[str, torch.Tensor] = {}

    def draft_forward():
        o = drafter(noise_embeds=block_embeds, context_hidden_states=features[:, base_len:context_length],
                    position_ids=positions, cache=dcache)
        dcache.crop(-(new_context + B))
        holder["hidden"] = o.last_hidden_state
        return o

    def head():  # as generation without logits processors: the draft vocabulary's columns only
        holder["logits"], holder["vocab_ids"] = drafter.draft_scores(holder["hidden"][:, 1:], lm_head)

    t_forward = _median_time(draft_forward, device, repeats, warmup)
    t_head = _median_time(head, device, repeats, warmup)
    hidden, base_logits, vocab_ids = holder["hidden"], holder["logits"], holder["vocab_ids"]
    draft_vocab = base_logits.shape[-1]
    lead = ids[:, context_length - 2 : context_length]

    original = drafter.refiner
    xpress = original if isinstance(original, XPressRefiner) else XPressRefiner(cfg).to(device=device, dtype=dtype)
    if isinstance(original, XPressMarkovHead):
        markov = original
    else:
        markov = XPressMarkovHead(cfg).to(device=device, dtype=dtype)
    refine: dict[int, float] = {}
    try:
        drafter.refiner = xpress
        for k in sorted(set([0, *passes])):
            refine[k] = _median_time(
                lambda k=k: drafter.propose(hidden, base_logits, lead, passes=k, early_stop=False, vocab_ids=vocab_ids),
                device, repeats, warmup,
            )
        hp = xpress.hidden_part(hidden)
        x = torch.randn(1, B - 1, xpress.rank, device=device, dtype=dtype)
        # the read-out rows a whole-vocabulary pass (no shortlist) reads: the draft vocabulary's
        read = xpress.w2.weight if vocab_ids is None else xpress.w2.weight[vocab_ids]
        markov_read = markov.w2.weight if vocab_ids is None else markov.w2.weight[vocab_ids]
        tables = xpress.tables()  # as propose: the inference tables, float32
        t_hidden_part = _median_time(lambda: xpress.hidden_part(hidden, tables, B), device, repeats, warmup)
        t_w2 = _median_time(lambda: F.linear(x, read), device, repeats, warmup)
        prev = torch.cat([lead, ids[:, context_length : context_length + B - 2]], dim=1)
        t_delta = _median_time(lambda: xpress.delta(hp, prev, read=read), device, repeats, warmup)
        t_argmax = _median_time(lambda: (base_logits + 0.0).argmax(dim=-1), device, repeats, warmup)
        t_markov_step = _median_time(lambda: markov(lead[:, 1:], markov_read), device, repeats, warmup)
        refine_compiled: dict[int, float] = {}
        mode = "reduce-overhead" if device.type == "cuda" else None
        if compiled:
            previous = drafter._fast_refine  # a caller's own compiled path is put back afterwards
            drafter.enable_fast_refine(mode=mode)
            try:
                for k in sorted(set(passes) - {0}):
                    call = lambda k=k: drafter.propose(  # noqa: E731
                        hidden, base_logits, lead, passes=k, early_stop=False, vocab_ids=vocab_ids
                    )
                    call()  # compiles for this K
                    refine_compiled[k] = _median_time(call, device, repeats, warmup)
            finally:
                drafter._fast_refine = previous
        drafter.refiner = markov
        t_markov = _median_time(lambda: drafter.propose(hidden, base_logits, lead, vocab_ids=vocab_ids), device, repeats,
                                warmup)

        def propose_with(refiner, **options):  # on the block `draft_forward` / `head` made last (`holder`)
            def call():
                drafter.refiner = refiner
                drafter.propose(holder["hidden"], holder["logits"], lead, vocab_ids=holder["vocab_ids"], **options)
            return call

        # The goal's comparison: K = 4 and the Markov head interleaved call by call, so that drift (another process, the
        # clock) hits both alike; the loops above time them minutes apart.
        paired = _median_times_after({"xpress_k4": (lambda: None, propose_with(xpress, passes=4, early_stop=False)),
                                      "markov": (lambda: None, propose_with(markov))}, device, repeats, warmup)

        # The draft and the refiners as a round runs them: right after the target's verify forward (and, for the
        # refiners, the draft), untimed, so every weight table is as cold as in generation and the inputs as fresh;
        # the loops above repeat one call, which keeps all it reads in cache.
        def forward_and_head():
            draft_forward()
            head()

        def verify_and_draft():
            verify()
            forward_and_head()

        in_round_times = _median_times_after(
            {"draft": (verify, forward_and_head),
             "xpress_k4": (verify_and_draft, propose_with(xpress, passes=4, early_stop=False)),
             "markov": (verify_and_draft, propose_with(markov))},
            device, max(1, repeats // 2), min(warmup, 2),
        )
        t_markov_compiled = None
        if compiled:  # the fair comparison: the Markov head's propose compiled the same way
            def markov_block(h, b, lead_tokens):
                proposal = drafter.propose(h, b, lead_tokens, vocab_ids=vocab_ids)
                return proposal.tokens, proposal.scores

            markov_compiled = torch.compile(markov_block, fullgraph=True, mode=mode)
            markov_compiled(hidden, base_logits, lead)
            t_markov_compiled = _median_time(lambda: markov_compiled(hidden, base_logits, lead), device, repeats, warmup)
        ops = None
        if profile:  # one block's call repeated, as in the loop timings
            ops = {"xpress_k4": _profile_ops(propose_with(xpress, passes=4, early_stop=False), repeats),
                   "markov": _profile_ops(propose_with(markov), repeats)}
    finally:
        drafter.refiner = original
    t_verify = _median_time(verify, device, repeats, warmup)
    t_step = _median_time(decode_step, device, repeats, warmup)

    ks = [k for k in refine if k > 0]
    slope = _slope(ks, [refine[k] for k in ks]) if len(ks) > 1 else float("nan")
    ms = 1e3
    draft = t_forward + t_head
    result = {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "block_size": B,
        "refiner_shortlist": cfg.refiner_shortlist,  # applies to both refiners' timings
        "context_length": context_length,
        "new_context": new_context,
        "repeats": repeats,
        "load_average": _loadavg(),
        "sizes": {
            "target_hidden": cfg.target_hidden_size,
            "drafter_hidden": cfg.hidden_size,
            "drafter_layers": cfg.num_hidden_layers,
            "vocab": vocab,
            "draft_vocab": draft_vocab,  # V': the columns drafted on (the draft vocabulary; V without one)
            "refiner_rank": cfg.refiner_rank,
        },
        "drafter_forward_ms": t_forward * ms,
        "lm_head_ms": t_head * ms,
        "draft_ms": draft * ms,
        "refine_ms": {int(k): v * ms for k, v in refine.items()},
        "per_pass_ms": slope * ms,
        **({"refine_compiled_ms": {int(k): v * ms for k, v in refine_compiled.items()},
            "per_pass_compiled_ms": _slope(list(refine_compiled), list(refine_compiled.values())) * ms}
           if refine_compiled else {}),
        **({"markov_compiled_ms": t_markov_compiled * ms} if t_markov_compiled is not None else {}),
        "markov_ms": t_markov * ms,
        **({"ops": ops} if ops is not None else {}),
        "in_round_ms": {name: t * ms for name, t in in_round_times.items()},
        "refiner_hidden_part_ms": t_hidden_part * ms,
        "refiner_delta_ms": t_delta * ms,
        "w2_read_ms": t_w2 * ms,
        "add_argmax_ms": t_argmax * ms,
        "markov_step_ms": t_markov_step * ms,
        # weights each step has to read (parameters): what bounds these times when memory-bound
        "weights": {
            "drafter_layers": sum(p.numel() for n, p in drafter.named_parameters() if not n.startswith("refiner.")),
            "lm_head": draft_vocab * lm_head.weight.shape[1],  # the rows the draft reads
            "w2_per_pass": read.numel(),
            "markov_w2_per_step": markov_read.numel(),
        },
        "verify_ms": t_verify * ms,
        "decode_step_ms": t_step * ms,
        "verify_over_step": t_verify / t_step,
    }
    if 4 in refine:
        result["goals"] = {
            "k4_refine_ms": refine[4] * ms,
            "k4_interleaved_ms": paired["xpress_k4"] * ms,
            "markov_interleaved_ms": paired["markov"] * ms,
            "k4_over_markov": paired["xpress_k4"] / paired["markov"],
            "k4_over_draft": refine[4] / draft,
            "k4_below_markov": paired["xpress_k4"] < paired["markov"],
            "k4_under_25pct_of_draft": refine[4] < 0.25 * draft,
            "k4_in_round_over_markov": in_round_times["xpress_k4"] / in_round_times["markov"],
            "k4_in_round_over_draft": in_round_times["xpress_k4"] / in_round_times["draft"],
        }
    result["dominant"] = _dominant(result)
    if verbose:
        print(format_block_table(result))
    return result


def _profile_ops(fn: Callable[[], Any], repeats: int, top: int = 12) -> dict:
    """Where `fn`'s time goes: `torch.profiler` over `repeats` calls (after 3 untimed), CPU self time per operator.
    Returns {"total_us": per call, "ops": [[name, calls per call, us per call], ...] (the `top` largest)}."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        fn()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) / repeats
    return {"total_us": total,
            "ops": [[e.key, e.count / repeats, e.self_cpu_time_total / repeats] for e in rows[:top]]}


def format_ops_table(ops: dict) -> str:
    """`block_latency(..., profile=True)["ops"]` as a markdown table: operators of xPress K=4 and the Markov head."""
    names = {"xpress_k4": "xPress K=4", "markov": "Markov head"}
    lines = ["| refiner | operator | calls per block | us per block | share |", "|---|---|---|---|---|"]
    for key, r in ops.items():
        for name, calls, us in r["ops"]:
            lines.append(f"| {names.get(key, key)} | {name} | {calls:g} | {us:.1f} | {us / r['total_us']:.0%} |")
        lines.append(f"| {names.get(key, key)} | **all operators (profiled)** | | **{r['total_us']:.1f}** | |")
    return "\n".join(lines)


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def _dominant(r: dict) -> str:
    """What one refinement pass costs and why, against the lm_head and the drafter forward."""
    per_pass, w2, head = r["per_pass_ms"], r["w2_read_ms"], r["lm_head_ms"]
    if not (per_pass == per_pass):
        return ""
    share = w2 / per_pass if per_pass > 0 else float("nan")
    vocab = r["sizes"].get("draft_vocab", r["sizes"]["vocab"])  # results written before draft vocabularies: V
    w = r["weights"]
    draft_weights = w["drafter_layers"] + w["lm_head"]
    read = (f"the w2 read (r={r['sizes']['refiner_rank']} x V'={vocab} over {r['block_size'] - 1} slots) is {w2:.3f} ms "
            f"({share:.0%})")
    if r.get("refiner_shortlist"):  # a shortlisted pass reads M rows per slot, not the w2 read timed here
        read = (f"it reads {r['refiner_shortlist']} w2 rows per slot; without the shortlist the w2 read alone (r="
                f"{r['sizes']['refiner_rank']} x V'={vocab} over {r['block_size'] - 1} slots) would be {w2:.3f} ms")
    return (
        f"One Jacobi pass costs {per_pass:.3f} ms: {read}, "
        f"the add + argmax over {r['block_size'] - 1} x V' logits {r['add_argmax_ms']:.3f} ms. For comparison the target lm_head over "
        f"the same slots (H={r['sizes']['target_hidden']} x V') costs {head:.3f} ms and the drafter layers "
        f"{r['drafter_forward_ms']:.3f} ms; one Markov step (w2 on one row) {r['markov_step_ms']:.3f} ms. "
        f"Weight reads{' of passes without the shortlist' if r.get('refiner_shortlist') else ''}: K=4 passes read "
        f"{4 * w['w2_per_pass'] / 1e6:.1f}M parameters, the draft {draft_weights / 1e6:.1f}M "
        f"({w['drafter_layers'] / 1e6:.1f}M drafter layers + {w['lm_head'] / 1e6:.1f}M lm_head), i.e. "
        f"{4 * w['w2_per_pass'] / draft_weights:.0%}; the Markov head reads {(r['block_size'] - 1) * w['markov_w2_per_step'] / 1e6:.1f}M."
    )


def format_block_table(r: dict) -> str:
    shortlist = f", shortlist {r['refiner_shortlist']}" if r.get("refiner_shortlist") else ""
    vocab = r["sizes"].get("draft_vocab", r["sizes"]["vocab"])
    columns = f"V'={vocab}" if vocab != r["sizes"]["vocab"] else f"V={vocab}"
    lines = [
        f"per-block latency, B={r['block_size']}, {r['dtype']} on {r['device']} ({r['threads']} threads), context "
        f"{r['context_length']} (+{r['new_context']} new rows), median of {r['repeats']}, load {r.get('load_average')}",
        "",
        "| part | ms |",
        "|---|---|",
        f"| drafter forward ({r['sizes']['drafter_layers']} layers) | {r['drafter_forward_ms']:.3f} |",
        f"| base logits (target lm_head, {r['block_size'] - 1} slots x {columns}) | {r['lm_head_ms']:.3f} |",
        f"| **draft = forward + lm_head** | **{r['draft_ms']:.3f}** |",
    ]
    for k, v in sorted(r["refine_ms"].items()):
        extra = f" ({v / r['draft_ms']:.0%} of draft)" if k else " (seed argmax only)"
        lines.append(f"| xPress refine K={k}{shortlist if k else ''}{extra} | {v:.3f} |")
    for k, v in sorted(r.get("refine_compiled_ms", {}).items()):
        lines.append(f"| xPress refine K={k}{shortlist}, compiled ({v / r['draft_ms']:.0%} of draft) | {v:.3f} |")
    lines += [
        f"| per extra pass (slope) | {r['per_pass_ms']:.3f} |",
        f"| Markov head, {r['block_size'] - 1} sequential steps{shortlist} | {r['markov_ms']:.3f} |",
        *([f"| Markov head, {r['block_size'] - 1} sequential steps{shortlist}, compiled | {r['markov_compiled_ms']:.3f} |"]
          if "markov_compiled_ms" in r else []),
        *([f"| in a round (each after an untimed verify, the refiners also after the draft): draft | "
           f"{r['in_round_ms']['draft']:.3f} |",
           f"| xPress refine K=4{shortlist}, in a round | {r['in_round_ms']['xpress_k4']:.3f} |",
           f"| Markov head{shortlist}, in a round | {r['in_round_ms']['markov']:.3f} |"] if "in_round_ms" in r else []),
        f"| refiner hidden part (once per block) | {r['refiner_hidden_part_ms']:.3f} |",
        f"| refiner delta (one pass, no argmax) | {r['refiner_delta_ms']:.3f} |",
        f"| w2 read r x {columns} ({r['block_size'] - 1} slots) | {r['w2_read_ms']:.3f} |",
        f"| add + argmax over {r['block_size'] - 1} x {columns} logits | {r['add_argmax_ms']:.3f} |",
        f"| one Markov step (w2(w1[x]), one slot) | {r['markov_step_ms']:.3f} |",
        f"| target verify forward ({r['block_size']} tokens) | {r['verify_ms']:.3f} |",
        f"| target decode step (1 token) | {r['decode_step_ms']:.3f} |",
        f"| verify / decode step | {r['verify_over_step']:.2f}x |",
    ]
    goals = r.get("goals")
    if goals:
        lines += [
            "",
            f"Goal K=4 < Markov{' (the two interleaved call by call)' if 'k4_interleaved_ms' in goals else ''}: "
            f"{'met' if goals['k4_below_markov'] else 'NOT met'} ({goals.get('k4_interleaved_ms', goals['k4_refine_ms']):.3f}"
            f" vs {goals.get('markov_interleaved_ms', r['markov_ms']):.3f} ms, {goals['k4_over_markov']:.2f}x). "
            f"Goal K=4 < 25% of draft: {'met' if goals['k4_under_25pct_of_draft'] else 'NOT met'} "
            f"({goals['k4_over_draft']:.0%}).",
        ]
        if "k4_in_round_over_markov" in goals:
            in_round = r["in_round_ms"]
            lines.append(f"In a round (caches as in generation): K=4 {in_round['xpress_k4']:.3f} ms vs the Markov head "
                         f"{in_round['markov']:.3f} ms ({goals['k4_in_round_over_markov']:.2f}x), "
                         f"{goals['k4_in_round_over_draft']:.0%} of the draft in a round "
                         f"({in_round['draft']:.3f} ms).")
        compiled_k4, compiled_markov = r.get("refine_compiled_ms", {}).get(4), r.get("markov_compiled_ms")
        if compiled_k4 is not None and compiled_markov is not None:
            lines.append(f"Both compiled (torch.compile): K=4 {compiled_k4:.3f} ms vs the Markov head "
                         f"{compiled_markov:.3f} ms ({compiled_k4 / compiled_markov:.2f}x; "
                         f"{'met' if compiled_k4 < compiled_markov else 'NOT met'}), {compiled_k4 / r['draft_ms']:.0%} of draft.")
    if r.get("dominant"):
        lines += ["", r["dominant"]]
    if r.get("ops"):
        lines += ["", "Where the time goes (torch.profiler, CPU self time per block, one block's call repeated as in "
                      "the loop timings; the profiler's overhead inflates the figures):", "",
                  format_ops_table(r["ops"])]
    return "\n".join(lines)


def plot_block_latency(r: dict, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = sorted(r["refine_ms"])
    ax.plot(ks, [r["refine_ms"][k] for k in ks], marker="o", label="xPress refine (fixed K)")
    compiled = r.get("refine_compiled_ms") or {}
    if compiled:
        kc = sorted(compiled)
        ax.plot(kc, [compiled[k] for k in kc], marker="s", label="xPress refine, compiled (enable_fast_refine)")
    ax.axhline(r["markov_ms"], color="tab:red", ls="--", label="Markov head (sequential)")
    if "markov_compiled_ms" in r:
        ax.axhline(r["markov_compiled_ms"], color="tab:purple", ls="--", label="Markov head, compiled")
    ax.axhline(0.25 * r["draft_ms"], color="tab:green", ls=":", label="25% of draft (forward + lm_head)")
    ax.axhline(r["draft_ms"], color="tab:blue", ls="-.", label="draft (forward + lm_head)")
    ax.set_xlabel("K (Jacobi passes)")
    ax.set_ylabel("ms per block")
    ax.set_title(f"Per-block latency, B={r['block_size']}, {r['dtype']} {r['device']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def _distinct(values: list, flag: str, text: str) -> list:
    """`values` parsed from a comma list, refused when empty (no method would run with that setting) or when a value
    is given twice (two methods of one name)."""
    if not values:
        raise ValueError(f"{flag} needs at least one value, got {text!r}")
    twice = sorted({repr(v) for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"{flag} gives {', '.join(twice)} more than once ({text!r})")
    return values


def _int_list(text: str, flag: str = "--passes") -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"{flag} takes integers >= 0, got {text!r}")
    return _distinct(values, flag, text)


def select_methods(methods: list[Method], spec: str) -> list[Method]:
    """`--methods`: plain, and the methods named in the comma list `spec`; a word that is no method's name selects
    every method of that kind ("dflash" is both: the method only, not "dflash allV")."""
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    names = {m.name for m in methods}
    unknown = [w for w in wanted if w not in names and w not in {m.kind for m in methods}]
    if unknown:
        raise ValueError(f"--methods: no method or kind named {unknown}; methods here: {sorted(names)}")
    return [m for m in methods if m.kind == "plain" or any(w == m.name or (w not in names and w == m.kind) for w in wanted)]


def _on_off_list(text: str, flag: str = "--early-stop") -> list[bool]:
    table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    try:
        values = [table[x.strip().lower()] for x in text.split(",") if x.strip()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{flag} takes on,off (got {text!r})") from None
    return _distinct(values, flag, text)


def _schedule_list(text: str) -> list[str]:
    """"constant,cost" -> ["constant", "cost"] (--schedule: `num_assistant_tokens_schedule` values)."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in DRAFT_SCHEDULES]
    if bad or not values:
        raise ValueError(f"--schedule takes comma-separated values of {', '.join(DRAFT_SCHEDULES)}, got {text!r}")
    return _distinct(values, "--schedule", text)


def _lookup_list(text: str) -> list[bool | str]:
    """--with-lookup: off / on (lookup first) / branch (lookup's continuation joins a tree), comma-separated."""
    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    try:
        values = ["branch" if x == "branch" else _on_off_list(x, "--with-lookup")[0] for x in items]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--with-lookup takes off, on and branch (got {text!r})") from None
    return _distinct(values, "--with-lookup", text)


def load_drafter(path: str, dtype: torch.dtype, device):
    """A `--drafter` (folder or Hub id) for `bench` and `demo`: an `XPressDrafterModel` in eval mode on `device`, or a
    one-line `ValueError` for a missing folder or a model that is not a drafter."""
    from transformers import AutoModel

    import hf_xpress  # noqa: F401  (Auto registration and the generate() hook)

    from .modeling_xpress import XPressDrafterModel

    try:
        model = AutoModel.from_pretrained(path, dtype=dtype)
    except OSError as err:  # a missing folder reads as a malformed Hub id
        raise ValueError(f"--drafter {path}: not a drafter folder or Hub id ({err})") from err
    if not isinstance(model, XPressDrafterModel):
        raise ValueError(f"--drafter {path} holds a {type(model).__name__}, not an xPress / dFlash drafter "
                         "(`hf-xpress convert` imports other drafter formats; a classic assistant goes to --assistant)")
    return model.to(device).eval()


def _label(path: str) -> str:
    return Path(str(path).rstrip("/")).name or str(path)


def set_keys(names: Sequence[str]) -> dict[str, str]:
    """`--sets` names -> the names the results report them under (a .jsonl file: its stem), refusing an unknown set,
    a missing .jsonl file and two sets reported under one name. Model-free, so it runs before any model loads."""
    from .assets import EVAL_SETS, TRAIN_SETS

    keys: dict[str, str] = {}
    for name in names:
        key = Path(name).stem if name.endswith(".jsonl") else name
        if name in keys:
            raise ValueError(f"--sets: {name} is given twice")
        if key != name and not Path(name).is_file():
            raise ValueError(f"--sets: {name} is not a file")
        if key == name and name not in EVAL_SETS + TRAIN_SETS:
            raise ValueError(f"--sets: unknown prompt set {name!r}; valid names: {', '.join(EVAL_SETS + TRAIN_SETS)}, "
                             "or a path ending in .jsonl")
        if key in keys.values() or (key != name and key in EVAL_SETS):
            raise ValueError(f"--sets: {name} would be reported as {key!r}, the name of {'another set given' if key in keys.values() else 'a built-in set'}; "
                             "rename the .jsonl file (a set is named by its file name without .jsonl)")
        keys[name] = key
    return keys


def _load_sets(keys: dict[str, str], limit: int | None, target, tokenizer, max_new_tokens: int) -> dict[str, list]:
    """The prompts of each set of `keys` (`set_keys`), under the name it is reported by."""
    from .assets import apply_chat_template, load_prompts

    def first_answer(messages):
        ids = torch.tensor([apply_chat_template(tokenizer, messages)], device=target.device)
        out = target.generate(ids, **_generate_kwargs(target, ids, max_new_tokens, 0.0))
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    sets = {key: load_prompts(name, limit, first_answer=first_answer if name == "mtbench2" else None)
            for name, key in keys.items()}
    if not any(sets.values()):
        raise ValueError(f"--sets {','.join(keys) or '(none)'}: no prompts to run")
    return sets


def _optional_ints(text: str, kind: type = int, flag: str = "--shortlist") -> list[int | float | None]:
    """"64,none" -> [64, None] (--shortlist, --drafts, --tree, --tree-budget: positive values of `kind`)."""
    try:
        values = [None if v.strip().lower() == "none" else kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated {kind.__name__}s or none, got {text!r}") from None
    if kind is int and any(v is not None and v < 1 for v in values):
        raise ValueError(f"{flag} takes positive integers or none, got {text!r}")
    return _distinct(values, flag, text)


def _optional_floats(text: str) -> list[float | None]:
    """"none,1.5" -> [None, 1.5] (--tree-temperature: positive values)."""
    values = _optional_ints(text, float, "--tree-temperature")
    bad = [v for v in values if v is not None and not 0.0 < v < float("inf")]
    if bad:
        raise ValueError(f"--tree-temperature takes positive numbers or none, got {bad}")
    return values


def _method_from(described: dict) -> Method:
    """A `Method` rebuilt from its `describe()` (model-free: enough to summarize a saved run)."""
    method = Method(described["name"], described["kind"])
    if method.ours:
        method.drafts, method.confidence = described.get("drafts"), described.get("confidence", 0.0)
        method.schedule = described.get("schedule", "constant")
        method.draft_vocab = " allV" not in described["name"]  # requested (describe() says whether one was used)
        method.tree = described.get("tree")
        method.tree_budget = described.get("tree_budget")
        if re.search(r" t\d", described["name"]):  # asked for (" t<T>"), else the drafter's own
            method.tree_temperature = described.get("tree_temperature")
        if described.get("prompt_lookup"):
            method.generate_kwargs["prompt_lookup_num_tokens"] = described["prompt_lookup"]
        if described.get("lookup_branch") or described["name"].endswith(" +pldb"):  # runs saved before the field
            method.generate_kwargs["lookup_branch"] = True
    return method


def resummarize(results: dict) -> dict:
    """A saved run (`results.json`) with its summary and headline recomputed from its runs by this version's
    `summarize`, e.g. for figures added since it ran; the runs, timings and mismatches are kept as measured."""
    methods = [_method_from(m) for m in results["methods"]]
    sets = list(results["meta"]["sets"])
    for run in results["runs"]:  # JSON has no NaN: a run without a target forward saved its prefill time as null
        if run.get("prefill_s") is None:
            run["prefill_s"] = float("nan")
    results = dict(results, summary=summarize(results["runs"], methods, results["meta"]["temperatures"], sets))
    block = results.get("block_latency")
    if block:  # JSON made the passes keys (K) strings
        results["block_latency"] = block | {
            key: {int(k): v for k, v in block[key].items()} for key in ("refine_ms", "refine_compiled_ms") if key in block
        }
    results["headline"] = headline(results)
    return results


def main(args: argparse.Namespace) -> int:
    import hf_xpress  # noqa: F401

    from .assets import load_target

    if args.from_results:
        source = Path(args.from_results)
        try:
            saved = json.loads(source.read_text(encoding="utf-8"))
            results = resummarize(saved)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"--from-results {source}: not a results.json written by `hf-xpress bench` ({error!r})")
        out_dir = Path(args.out) if args.out != DEFAULT_OUT else source.parent
        _check_out_dir(out_dir)
        if not results.get("runs"):
            raise ValueError(f"--from-results {source}: the file holds no runs to summarise")
        try:
            paths = write_outputs(results, out_dir)  # built aside first: a failure leaves out_dir as it was
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"--from-results {source}: a field the report reads is missing or malformed ({error!r}); "
                             "not a results.json written by this version of `hf-xpress bench`") from error
        print(results["headline"])
        print(f"wrote {paths['json']}, {paths['report']} and plots (re-summarized from {source})")
        return 1 if (args.fail_on_mismatch and results["mismatches"]) else 0  # as the run itself would have

    # Every setting is checked before any model loads, so a typo fails at once, and before anything runs, so a run
    # is never lost at the end.
    try:
        confidences = [float(c) for c in args.confidence.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--confidence takes comma-separated numbers, got {args.confidence!r}") from None
    if any(not 0.0 <= c < 1.0 for c in confidences):  # a draft probability threshold, as the drafter's config takes
        raise ValueError(f"--confidence takes thresholds in [0, 1), got {args.confidence!r}")
    _distinct(confidences, "--confidence", args.confidence)
    options = dict(
        passes=_int_list(args.passes),
        early_stop=_on_off_list(args.early_stop),
        shortlists=_optional_ints(args.shortlist),
        drafts=_optional_ints(args.drafts, flag="--drafts"),
        confidences=confidences,
        schedules=_schedule_list(args.schedule),
        draft_vocabs=_on_off_list(args.draft_vocab, "--draft-vocab"),
        prompt_lookup=args.prompt_lookup_tokens,
        lookup_alone=not args.no_prompt_lookup,
        native_dflash=not args.no_native_dflash,
        with_lookup=_lookup_list(args.with_lookup),
        trees=_optional_ints(args.tree, flag="--tree"),
        tree_budgets=_optional_ints(args.tree_budget, flag="--tree-budget"),
        tree_temperatures=_optional_floats(args.tree_temperature),
    )
    # ran, silently, without what they ask for (demo and tau refuse the same)
    if any(b is not None for b in options["tree_budgets"]) and not any(w is not None for w in options["trees"]):
        raise ValueError("--tree-budget needs --tree W (the dynamic tree's expansion width)")
    if any(t is not None for t in options["tree_temperatures"]) and \
            not any(b is not None for b in options["tree_budgets"]):
        raise ValueError("--tree-temperature ranks a dynamic tree's nodes: it needs --tree-budget N (and --tree W)")
    _check_run_numbers(args)
    set_names = set_keys([s.strip() for s in args.sets.split(",") if s.strip()])  # checked before any model loads
    out_dir = Path(args.out)
    _check_out_dir(out_dir)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(args.target, dtype=dtype, device=args.device)
    drafters = [(_label(p), load_drafter(p, dtype, target.device)) for p in args.drafter or []]
    for label, drafter in drafters:
        most = drafter.config.block_size - 1
        if any(n is not None and n > most for n in options["drafts"]):
            raise ValueError(f"--drafts {args.drafts}: {label} drafts at most {most} tokens per round (block size "
                             f"{most + 1})")
    if not args.block_only:
        _check_options_apply(args, {_drafter_kind(d) for _, d in drafters})
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}

    block = None
    if args.block_only or args.block_latency:
        xp = next((d for _, d in drafters if d.config.refiner == "xpress"), drafters[0][1] if drafters else None)
        overrides = {} if xp is not None else {"num_hidden_layers": args.block_layers, "refiner_rank": args.block_rank}
        block_shortlist = _optional_ints(args.shortlist)[-1]  # the last --shortlist value (none: full vocabulary)
        if xp is not None:
            xp.config.refiner_shortlist = block_shortlist
        else:
            overrides["refiner_shortlist"] = block_shortlist
        block = block_latency(target, xp, passes=range(1, 9), context_length=args.block_context,
                              repeats=args.block_repeats, compiled=args.block_compiled, profile=args.block_profile,
                              **overrides)
        if args.block_only:
            out_dir.mkdir(parents=True, exist_ok=True)
            _remove_earlier_outputs(out_dir)
            payload = _json_safe({"settings": settings, **block})
            (out_dir / "block_latency.json").write_text(json.dumps(payload, indent=1) + "\n")
            (out_dir / "block_latency.md").write_text(format_block_table(block) + "\n")
            plot_block_latency(block, out_dir / "block_latency.png")
            print(f"wrote {out_dir}/block_latency.{{json,md,png}}")
            return 0

    assistant = None
    if args.assistant:
        from transformers import AutoModelForCausalLM

        from .assets import resolve_target

        try:
            model = AutoModelForCausalLM.from_pretrained(resolve_target(args.assistant), dtype=dtype)
        except OSError as err:
            raise ValueError(f"--assistant {args.assistant}: not a model folder or Hub id ({err})") from err
        assistant = (_label(args.assistant), model.to(target.device).eval())
    methods = build_methods(drafters, assistant=assistant, **options)
    if drafters and not any(m.ours for m in methods):
        raise ValueError("these settings leave no method of ours to run for the drafters given (--with-lookup branch "
                         "joins a tree: it needs --tree W, or add off / on to it)")
    if args.methods:
        methods = select_methods(methods, args.methods)
    sets = _load_sets(set_names, args.limit, target, tokenizer, args.max_new_tokens)
    print(f"{len(methods)} methods x {sum(len(v) for v in sets.values())} prompts x {len(args.temperature)} "
          "temperature(s): " + ", ".join(m.name for m in methods), file=sys.stderr)
    results = run_benchmark(
        target, tokenizer, methods, sets,
        max_new_tokens=args.max_new_tokens,
        temperatures=args.temperature,
        seed=args.seed,
        progress=not args.no_progress,
        out_dir=out_dir,
        settings=settings,
        block=block,
        target_name=args.target,
    )
    print(render_summary(results))
    print(f"wrote {out_dir}/results.json, {out_dir}/report.md and plots")
    return 1 if (args.fail_on_mismatch and results["mismatches"]) else 0


def _check_run_numbers(args: argparse.Namespace) -> None:
    """Refuse numbers that would crash deep inside a run, or run something other than asked, with the flag's name."""
    keys: dict[str, float] = {}  # how the tables and files name each temperature: "T=0.7"
    for t in args.temperature or [0.0]:  # none given: greedy
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"--temperature takes 0 (greedy) or a positive number (sampling), got {t}")
        t = abs(t)  # -0.0: greedy, reported as T=0
        key = f"T={t:g}"
        if keys.get(key, t) != t:
            raise ValueError(f"--temperature {keys[key]!r} and {t!r} are both reported as {key}: give temperatures that "
                             "differ in their first 6 significant digits")
        keys[key] = t  # a temperature given twice runs once
    args.temperature = list(keys.values())
    for flag, value, least in (("--limit", args.limit, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                               ("--threads", args.threads, 0), ("--block-repeats", args.block_repeats, 1),
                               ("--block-context", args.block_context, 8), ("--prompt-lookup-tokens",
                                                                            args.prompt_lookup_tokens, 1)):
        if value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    for flag, value in (("--block-compiled", args.block_compiled), ("--block-profile", args.block_profile)):
        if value and not (args.block_only or args.block_latency):  # else silently nothing
            raise ValueError(f"{flag} applies to the per-block benchmark: add --block-only or --block-latency")
    from .assets import check_device

    check_device(args.device)


def _check_options_apply(args: argparse.Namespace, kinds: set[str]) -> None:
    """Refuse settings that no method of this run reads (the run went on without them): our drafters' settings
    without a --drafter, xPress's without an xPress drafter, the shortlist without a Markov or xPress one."""
    needs = {"passes": {"xpress"}, "early_stop": {"xpress"}, "shortlist": {"xpress", "markov"}}  # others: any of ours
    for dest, default in METHOD_SETTING_DEFAULTS.items():
        given = getattr(args, dest) != default and not (dest == "shortlist" and args.block_latency)  # it times that
        wanted, flag = needs.get(dest), "--" + dest.replace("_", "-")
        if given and not (kinds & wanted if wanted else kinds):
            what = "our drafters" if wanted is None else " or ".join(sorted(wanted)) + " drafters"
            raise ValueError(f"{flag} applies to {what}' methods, and no --drafter here is one: give one, or leave "
                             f"{flag} out (it would change nothing)")


def _check_out_dir(out_dir: Path) -> None:
    """Create `out_dir` now, so that a path that cannot be written fails before the run, not after it."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out_dir}: cannot create the output folder ({err})") from None
    if not os.access(out_dir, os.W_OK):
        raise ValueError(f"--out {out_dir}: the output folder is not writable")


def render_summary(results: dict) -> str:
    """A compact console table: tau per set, tokens/s, speed-up, mismatches."""
    lines = []
    width = max([28, *(len(m["name"]) + 1 for m in results["methods"])])  # names in full: some differ at the end
    for tkey, per_set in results["summary"].items():
        sets = [s for s in per_set if s != "all"]
        greedy = tkey == "T=0"
        head = f"{'method':<{width}}" + "".join(f"{s[:10]:>11}" for s in sets) + f"{'tok/s':>9}{'speedup':>9}{'mism':>6}"
        lines += [f"\n{tkey}: tau per set, speed over all sets", head, "-" * len(head)]
        for m in results["methods"]:
            f = per_set.get("all", {}).get(m["name"])
            if not f:
                continue
            taus = "".join(f"{_fmt(per_set[s].get(m['name'], {}).get('tau')):>11}" for s in sets)
            mism = f["mismatches"] if greedy else "-"  # sampled runs are not compared with plain generate
            lines.append(f"{m['name']:<{width}}" + taus + f"{_fmt(f['tokens_per_s'], 1):>9}{_fmt(f.get('speedup')):>8}x{mism:>6}")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark acceptance length and speed against every baseline (JSON, markdown report, plots)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default="smollm2-135m-instruct", help="target alias, folder or Hub id")
    p.add_argument("--drafter", action="append", help="drafter folder or Hub id (repeatable)")
    p.add_argument("--assistant", help="a classic autoregressive assistant (same tokenizer) for transformers' "
                   "assisted decoding baseline")
    p.add_argument("--sets", default=",".join(DEFAULT_SETS),
                   help="comma list of humaneval, mtbench, mtbench2, math500, aime2024, aime2025 or .jsonl paths")
    p.add_argument("--limit", type=int, default=10, help="prompts per set")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, action="append",
                   help="0 (greedy, checked against plain generate) and/or 1 (sampling); repeatable; default 0")
    d = METHOD_SETTING_DEFAULTS
    p.add_argument("--passes", default=d["passes"], help="xPress K values, e.g. 1,2,4,6,8")
    p.add_argument("--early-stop", default=d["early_stop"], help="xPress early stop settings to run: on,off | on | off")
    p.add_argument("--shortlist", default=d["shortlist"],
                   help="xPress refiner_shortlist values to run, e.g. none,64 (none: the full vocabulary); "
                   "--block-only uses the last one")
    p.add_argument("--drafts", default=d["drafts"],
                   help="drafts per round (num_assistant_tokens) for our methods, e.g. none,2,4 (none: B-1)")
    p.add_argument("--draft-vocab", default=d["draft_vocab"],
                   help="for drafters that store a draft vocabulary: on (use it), off (whole vocabulary) or on,off")
    p.add_argument("--schedule", default=d["schedule"],
                   help="num_assistant_tokens_schedule values for our chain methods, e.g. constant,cost ('cost': each "
                   "round's drafts, up to --drafts, from the acceptance and round times measured so far)")
    p.add_argument("--confidence", default=d["confidence"],
                   help="assistant_confidence_threshold values for our methods, e.g. 0,0.3 (0: off)")
    p.add_argument("--methods", help="only these methods (names or kinds: pld, assisted, native-dflash, dflash, "
                   "markov, xpress, 'xpress K=4 es'; a method's exact name wins over a kind); plain always runs")
    p.add_argument("--tree", default=d["tree"],
                   help="our methods with tree verification of this many slot-1 branches (hf_xpress.tree_decoding; "
                   "names end in ' tree<W>'), e.g. none,2,3 (none: chain verification)")
    p.add_argument("--tree-budget", default="none",
                   help="with --tree: dynamic trees of this many draft nodes, the drafter's most probable, as deep as "
                   "--drafts (names end in ' tree<W>b<N>'), e.g. none,8 (none: W fixed branches)")
    p.add_argument("--tree-temperature", default="none",
                   help="with --tree-budget: dynamic trees ranking their nodes at these temperatures (tree_temperature; "
                   "names carry ' t<T>'), e.g. none,1.5 (none: each drafter's own)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=PROMPT_LOOKUP_TOKENS)
    p.add_argument("--with-lookup", default=d["with_lookup"],
                   help="our methods with prompt lookup first (drafter rounds only where lookup finds nothing; "
                   "names end in ' +pld'), and with 'branch' our tree methods with lookup's continuation joining "
                   "the drafter's tree (names end in ' +pldb'): e.g. off, on, off,on,branch")
    p.add_argument("--no-prompt-lookup", action="store_true")
    p.add_argument("--no-native-dflash", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder")
    p.add_argument("--from-results", metavar="RESULTS_JSON",
                   help="load nothing and run nothing: recompute a saved run's summary, report and plots with this "
                   "version (written next to it unless --out is given)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--fail-on-mismatch", action="store_true", help="exit 1 if a greedy output differs from plain")
    p.add_argument("--block-only", action="store_true", help="only the per-block latency micro-benchmark")
    p.add_argument("--block-latency", action="store_true", help="also run the per-block micro-benchmark")
    p.add_argument("--block-context", type=int, default=256, help="context length for the per-block benchmark")
    p.add_argument("--block-repeats", type=int, default=20)
    p.add_argument("--block-compiled", action="store_true",
                   help="per-block benchmark: also time xPress refinement compiled (enable_fast_refine; torch.compile)")
    p.add_argument("--block-profile", action="store_true",
                   help="per-block benchmark: also show where xPress K=4's and the Markov head's time goes, operator by "
                        "operator (torch.profiler)")
    p.add_argument("--block-layers", type=int, default=3,
                   help="layers of the random drafter when no --drafter is given")
    p.add_argument("--block-rank", type=int, default=256, help="refiner rank of the random drafter (no --drafter)")

    p.set_defaults(func=main)


__all__ = [
    "Method",
    "block_latency",
    "build_methods",
    "first_mismatch",
    "format_block_table",
    "make_plots",
    "render_report",
    "run_benchmark",
    "run_once",
    "summarize",
    "write_outputs",
]
