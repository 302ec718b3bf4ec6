"""xPress speculative decoding from the Hub, without the hf-xpress package (`custom_generate/generate.py`).

    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained("<target>")
    out = target.generate(**inputs, custom_generate="<drafter repo>", trust_remote_code=True, max_new_tokens=256)

`hf_xpress.hub.publish` copies this file, as `custom_generate/generate.py`, next to copies of `generation.py`,
`configuration_xpress.py` and `modeling_xpress.py`; it imports only those, torch and transformers. transformers
calls `generate(model=<target>, **every generate() argument)`; a folder/repo `custom_generate` keeps
`assistant_model`. The drafter is `assistant_model=` (an xPress drafter already loaded, e.g. with
`AutoModel.from_pretrained(<repo>, trust_remote_code=True)`), else `xpress_drafter=` (a folder or Hub id), else
the repository this file was published in. `jacobi_passes=` overrides K for the call. Decoding is transformers'
own assisted decoding with `XPressCandidateGenerator`, routed to on this one model while calls run on it; with
`tree_width=W`, tree verification of W slot-1 branches (`tree_decoding.py`, copied next to this file), and with
`tree_budget=N` too, of a dynamic tree of the drafter's N most probable draft nodes; `lookup_branch=True` (with
`prompt_lookup_num_tokens`) adds prompt lookup's continuation to the tree as a branch; a `streamer` and
`stop_strings` (with `tokenizer`) and `stopping_criteria` work on both paths, stopping where plain `generate` stops.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import types
from contextvars import ContextVar

from transformers import StoppingCriteriaList

from .generation import XPressCandidateGenerator, is_xpress_drafter, stop_string_criteria
from .modeling_xpress import XPressDrafterModel
from .tree_decoding import tree_decoding

DRAFTER = "__HF_XPRESS_DRAFTER__"  # replaced by hf_xpress.hub.publish with the repository it is published in
_LOADED: dict = {}


def _load_drafter(source: str, target) -> XPressDrafterModel:
    key = (str(source), str(target.device), target.dtype)
    if key not in _LOADED:
        drafter = XPressDrafterModel.from_pretrained(source)
        _LOADED[key] = drafter.to(device=target.device, dtype=target.dtype).eval()
    return _LOADED[key]


def generate(model, *args, assistant_model=None, xpress_drafter=None, jacobi_passes=None, tree_width=None,
             tree_budget=None, lookup_branch=False, **kwargs):
    """`model.generate(*args, **kwargs)` with xPress drafting (see the module docstring)."""
    if "drafter" in kwargs:  # tree_decoding's name for it, which this recipe passes on itself
        raise ValueError("This recipe takes the drafter as assistant_model= (a loaded drafter) or xpress_drafter= (a "
                         "folder or Hub id), not drafter=.")
    if isinstance(assistant_model, (str, os.PathLike)):
        raise ValueError("assistant_model= takes a loaded drafter; pass a folder or Hub id as xpress_drafter= instead.")
    if assistant_model is None and xpress_drafter is not None and not isinstance(xpress_drafter, (str, os.PathLike)):
        assistant_model = xpress_drafter  # already loaded
    if assistant_model is not None:
        drafter = assistant_model
    else:
        source = xpress_drafter or (None if DRAFTER.startswith("__HF_XPRESS") else DRAFTER)
        if source is None:
            raise ValueError("This custom_generate folder names no drafter: pass assistant_model= or xpress_drafter=.")
        drafter = _load_drafter(source, model)
    if not is_xpress_drafter(drafter):
        kind = getattr(getattr(drafter, "config", None), "model_type", type(drafter).__name__)
        raise ValueError(f"assistant_model must be an xPress drafter, got {kind!r}.")
    for key in ("custom_generate", "trust_remote_code"):
        kwargs.pop(key, None)
    if tree_budget is not None and tree_width is None:
        raise ValueError("tree_budget needs tree_width (the dynamic tree's children per node), e.g. tree_width=3.")
    if lookup_branch and tree_width is None:
        raise ValueError("lookup_branch adds prompt lookup's continuation to a draft tree: it needs tree_width.")
    if tree_width is not None:
        if jacobi_passes is not None:
            raise ValueError("jacobi_passes has no effect with tree_width: a tree reads the refiner once per slot.")
        # generate() hands a custom_generate callable neither `streamer` nor `tokenizer`: pass them on as
        # tree_decoding takes them (its streamer argument; stop strings as a stopping criterion).
        if kwargs.get("streamer") is not None:
            if kwargs.get("tree_streamer") is not None:
                raise ValueError("Pass either generate's streamer= or tree_decoding's tree_streamer=, not both.")
            kwargs["tree_streamer"] = kwargs.pop("streamer")
        config = kwargs.get("generation_config") or model.generation_config
        stop_strings = kwargs.pop("stop_strings", None) or getattr(config, "stop_strings", None)
        if stop_strings:  # given to generate, or set in a generation config
            stop = stop_string_criteria(kwargs.get("tokenizer"), stop_strings)
            kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stop])
            if getattr(config, "stop_strings", None):  # generate would build one too, and has no tokenizer here
                kwargs["generation_config"] = copy.deepcopy(config)
                kwargs["generation_config"].stop_strings = None
        kwargs.pop("tokenizer", None)
        return type(model).generate(model, *args, custom_generate=tree_decoding, drafter=drafter,
                                    tree_width=tree_width, tree_budget=tree_budget, lookup_branch=lookup_branch,
                                    **kwargs)
    # this call's passes and criteria go to its generator; the drafter (shared by every call) is left as it is
    token = _CALL.set((drafter, jacobi_passes, kwargs.get("stopping_criteria")))  # the user's criteria (stop strings:
    try:                                                                             # the generator adds them)
        with _routed(model):
            return type(model).generate(model, *args, assistant_model=drafter, **kwargs)
    finally:
        _CALL.reset(token)


# The recipe's call in progress in this thread / task: (drafter, jacobi_passes, the user's stopping criteria).
_CALL: ContextVar[tuple | None] = ContextVar("hf_xpress_custom_generate_call", default=None)
_ROUTED: dict[int, int] = {}  # id(target) -> recipe calls in progress on it
_LOCK = threading.Lock()


def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                             assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
    """The target's candidate generator while recipe calls run on it: ours for the calling context's drafter."""
    call = _CALL.get()
    if call is not None and assistant_model is call[0] and generation_config.speculation_type != "dflash":
        drafter, jacobi_passes, stopping_criteria = call
        return XPressCandidateGenerator(self, drafter, generation_config, logits_processor, target_tokenizer,
                                        jacobi_passes=jacobi_passes, stopping_criteria=stopping_criteria)
    return type(self)._get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor,
                                               model_kwargs, assistant_model, target_tokenizer, assistant_tokenizer)


@contextlib.contextmanager
def _routed(model):
    """Route `model`'s candidate generator through `_get_candidate_generator` while any recipe call runs on it.

    Without hf-xpress installed there is no `install()`: an instance attribute shadows the class method, set by the
    first call on this model and removed by the last to end, so concurrent calls (each with its own `_CALL`) never
    remove it from under one another, and nothing is left on the model afterwards."""
    with _LOCK:
        if _ROUTED.get(id(model), 0) == 0:
            model._get_candidate_generator = types.MethodType(_get_candidate_generator, model)
        _ROUTED[id(model)] = _ROUTED.get(id(model), 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            _ROUTED[id(model)] -= 1
            if _ROUTED[id(model)] == 0:
                del _ROUTED[id(model)]
                vars(model).pop("_get_candidate_generator", None)
