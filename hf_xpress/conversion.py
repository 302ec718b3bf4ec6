"""Import the published checkpoints into `XPressDrafterModel`, and export drafters for vLLM.

Formats (facts read in the public repositories, see `docs/interop.md`):

* **z-lab dFlash** (`z-lab/Qwen3-8B-DFlash-b16`): `config.json` with `architectures: ["DFlashDraftModel"]`,
  `model_type: "qwen3"`, `block_size` (top level, or inside `dflash_config` in newer releases),
  `dflash_config: {mask_token_id, target_layer_ids}`, `num_target_layers`; weights `fc`, `hidden_norm`, `layers.*`,
  `norm`: the same names as ours. -> `XPressDrafterModel` with `refiner=None`.
* **official xPress / Markov refiners** (`Supercomputing-System-AI-Lab/xPress`): a torch `.pt` holding `args` (an
  `argparse.Namespace`), `refiner_state_dict` (`w1.weight, w2.weight, down_h.weight, down_g.weight, in_proj.weight,
  mix.L, mix.tril, mlp.{gate,up,down}_proj.weight` for xPress; `w1.weight, w2.weight` for the Markov head) and, for
  the co-trained releases, `draft_state_dict` (the drafter trained together with the refiner, which the official
  harness loads over the z-lab drafter). Loaded with `torch.load(weights_only=True)` (only `argparse.Namespace` is
  allow-listed besides tensors and builtins); anything else is refused.
* **transformers' native DFlash drafter** (`MuseGlimmerAssistantModel`): `encoder.fc` / `encoder.output_norm_enc`
  instead of `fc` / `hidden_norm`, no `vocab_size` and no target depth in its config (taken from the target).
* **vLLM** (export, and import back): the z-lab layout for `method="dflash"`; the xPress fork's
  `Qwen3XPressModel` (head under `xpress_head.`, raw `mix.L`, `xpress_{rank,mlp_hidden,block_size,num_passes}`) for
  `method="xpress"`; `Qwen3DSparkModel` (`markov_head.markov_w{1,2}.weight`, `markov_rank`) for `method="dspark"`,
  both with `sample_from_anchor: false` (the dFlash fill-in block).

Entry points: `load_checkpoint` (any of the above), `load_dflash`, `load_muse_glimmer`, `load_refiner_checkpoint` +
`attach_refiner`, `convert` (to one of our folders), `export_vllm` / `load_vllm`, `vllm_serve_command`, and the
`hf-xpress convert` / `hf-xpress export` sub-commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .configuration_xpress import INFERENCE_SETTINGS, XPressDrafterConfig, default_target_layer_ids
from .modeling_xpress import XPressDrafterModel, check_compatible, check_plain_weights


logger = logging.getLogger(__name__)

DFLASH_ARCHITECTURE = "DFlashDraftModel"
MUSE_ARCHITECTURE = "MuseGlimmerAssistantModel"
MUSE_MODEL_TYPE = "muse_glimmer_assistant"
VLLM_XPRESS_ARCHITECTURE = "Qwen3XPressModel"
VLLM_DSPARK_ARCHITECTURE = "Qwen3DSparkModel"
VLLM_METHODS = {None: "dflash", "xpress": "xpress", "markov": "dspark"}
# Where the target's config goes, in each of the ways a checkpoint is read.
_TARGET_HINT = "target= in Python, --target to `hf-xpress convert` / `export`, --target-config to `hf-xpress push`"

# Official refiner state-dict names (refiners/xpress_head.py, refiners/markov.py). Ours are the same under `refiner.`.
XPRESS_KEYS = (
    "w1.weight",
    "w2.weight",
    "down_h.weight",
    "down_g.weight",
    "in_proj.weight",
    "mix.L",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
MARKOV_KEYS = ("w1.weight", "w2.weight")
# DeepSpec's VanillaMarkov names (refiners/deepspec/markov_head.py), accepted as an alias of the Markov keys.
DEEPSPEC_MARKOV_KEYS = {"markov_w1.weight": "w1.weight", "markov_w2.weight": "w2.weight"}
# The head variant of the released xPress checkpoints (refiners/xpress.py, `_head_kwargs_from_args`): any other
# value of these training flags is an ablation our refiner does not implement.
RELEASED_XPRESS_VARIANT = dict(
    markov_only=False,
    no_hidden=False,
    no_perpos=False,
    no_global=False,
    no_residual=True,
    no_mixer=False,
    no_mlp=False,
    input_mode="concat",
    no_sublayer_norm=True,
    no_mix_out=True,
    lowrank_lmhead_shared_rank=0,
    lowrank_base_rank=0,
    input_relu=False,
)
# Config keys of the dFlash layouts that change the computation in ways XPressDrafterModel does not implement.
UNSUPPORTED_DFLASH_FEATURES = ("attention_sink_bias", "use_swa", "conv_kernel_size", "selector_rank")
# Defaults of z-lab's logit / embedding scalings; any other value changes what the drafter computes.
DFLASH_SCALINGS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}


class ConversionError(ValueError):
    """A checkpoint that cannot be converted exactly; the message says why and what to do."""


# What reading a field or tensor of the wrong type or rank raises (a list where a dict belongs, a 1-D weight, a
# rank of 0, a transformers config class refusing a value): `load_checkpoint` reports these as a malformed checkpoint.
MALFORMED = (TypeError, AttributeError, IndexError, KeyError, ZeroDivisionError, StrictDataclassError)


# --------------------------------------------------------------------------------------------------------------------
# Reading folders
# --------------------------------------------------------------------------------------------------------------------


class _CheckpointConfig(dict):
    """A checkpoint's parsed config.json: reading a field it lacks is a `ConversionError` naming field and file."""

    def __init__(self, raw: dict, path: Path):
        super().__init__(raw)
        self.path = path

    def __missing__(self, key):
        raise ConversionError(f"{self.path} has no {key!r}, which this checkpoint format needs: the config is "
                              "incomplete, or the folder is not the format it was read as.")


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ConversionError(f"{folder} has no config.json: not a checkpoint folder.")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConversionError(f"{path} is not valid JSON ({err}); the checkpoint is corrupt.") from err
    if not isinstance(raw, dict):
        raise ConversionError(f"{path} does not hold a JSON object; the checkpoint is corrupt.")
    return _CheckpointConfig(raw, path)


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    """A `pytorch_model*.bin` state dict, tensors only (`torch.load(weights_only=True)`)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only=True refused a pickled object
        raise ConversionError(
            f"Refusing to load {path}: it pickles Python objects that torch.load(weights_only=True) does not allow "
            f"({err}); re-save it with save_pretrained (safetensors)."
        ) from err
    if not isinstance(state, dict):
        raise ConversionError(f"{path} does not hold a state dict.")
    return state


def read_state_dict(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: `model.safetensors` or `pytorch_model.bin`, each whole or sharded with
    its `.index.json`."""
    folder = Path(folder)
    try:
        for name, load in (("model.safetensors", load_file), ("pytorch_model.bin", _load_bin)):
            if (folder / name).is_file():
                return load(folder / name)
            index = folder / f"{name}.index.json"
            if index.is_file():
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
                state: dict[str, torch.Tensor] = {}
                for shard in shards:
                    state.update(load(folder / shard))
                return state
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError, RuntimeError) as err:
        raise ConversionError(
            f"Could not read the weights in {folder}: {err}. The checkpoint is corrupt or incomplete."
        ) from err
    raise ConversionError(f"{folder} holds no weights (model.safetensors or pytorch_model.bin, whole or sharded).")


def detect_format(source: str | os.PathLike) -> str:
    """One of `xpress_drafter`, `dflash`, `muse_glimmer`, `vllm_xpress`, `vllm_dspark`, `refiner_pt`."""
    path = Path(source)
    if path.is_file():
        if path.suffix in (".pt", ".pth", ".ckpt", ".bin"):
            return "refiner_pt"
        raise ConversionError(f"{path} is a file but not a torch checkpoint (.pt): cannot tell its format.")
    if not path.is_dir():
        raise ConversionError(f"{path} does not exist (give a local folder or .pt file; download Hub repos first).")
    raw = _read_config(path)
    architectures = raw.get("architectures") or []
    model_type = raw.get("model_type")
    if model_type == XPressDrafterConfig.model_type:
        return "xpress_drafter"
    if VLLM_XPRESS_ARCHITECTURE in architectures:
        return "vllm_xpress"
    if VLLM_DSPARK_ARCHITECTURE in architectures:
        return "vllm_dspark"
    if model_type == MUSE_MODEL_TYPE or MUSE_ARCHITECTURE in architectures:
        return "muse_glimmer"
    if DFLASH_ARCHITECTURE in architectures or "dflash_config" in raw:
        return "dflash"
    raise ConversionError(
        f"{path} is not a dFlash/xPress drafter: config model_type {model_type!r}, architectures {architectures}. "
        "Supported: z-lab DFlashDraftModel folders, MuseGlimmerAssistantModel folders, official xPress/Markov .pt "
        "refiners, the vLLM exports of hf-xpress, and hf-xpress folders."
    )


# --------------------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------------------


def _target_text_config(target) -> Any | None:
    """`target`: None, a PreTrainedConfig, a model, or a folder / Hub id of a config."""
    if target is None:
        return None
    if hasattr(target, "get_text_config"):
        return target.get_text_config()
    if hasattr(target, "config"):
        return target.config.get_text_config()
    from transformers import AutoConfig

    from .assets import looks_like_a_path

    if looks_like_a_path(str(target)) and not Path(target).expanduser().exists():  # else read as a Hub id
        raise ConversionError(f"The target {str(target)!r} does not exist (a local path).")
    try:
        return AutoConfig.from_pretrained(target).get_text_config()
    except OSError as err:  # a missing folder reads as a malformed Hub id
        raise ConversionError(f"Could not read the target's config from {target!r} (a folder or Hub id): {err}") from err


def _rope_parameters(raw: dict) -> dict:
    """`rope_parameters` from a config dict (transformers 5 key, or the 4.x `rope_theta` / `rope_scaling`)."""
    rope = raw.get("rope_parameters")
    if rope:
        return dict(rope)
    from transformers import Qwen3Config  # the dFlash drafter's own config class; it standardises the 4.x keys

    keys = {k: raw[k] for k in ("rope_theta", "rope_scaling") if k in raw}
    return dict(Qwen3Config(**keys).rope_parameters)


def zlab_attention_layout(raw: dict) -> dict:
    """`layer_types`, `sliding_window` and `causal_layers` of a z-lab dFlash config, as its model reads them.

    Layer types come from transformers' `Qwen3Config` (the drafter's config class: explicit `layer_types`, else
    `use_sliding_window` with `max_window_layers`); a layer is causal within the block if
    `dflash_config.causal` says so, else if the top-level `is_causal` says so, else if it is a sliding-window layer
    (z-lab's and vLLM's rule). A sliding layer without a window is a causal full-attention layer.
    """
    from transformers import Qwen3Config

    keys = ("num_hidden_layers", "layer_types", "use_sliding_window", "sliding_window", "max_window_layers")
    qwen = Qwen3Config(**{k: raw[k] for k in keys if raw.get(k) is not None})
    window = qwen.sliding_window
    dflash = raw.get("dflash_config") or {}
    forced = dflash.get("causal", raw.get("is_causal"))
    causal = [
        i for i, kind in enumerate(qwen.layer_types)
        if (bool(forced) if forced is not None else kind == "sliding_attention")
    ]
    types = [kind if window is not None else "full_attention" for kind in qwen.layer_types]
    return {"layer_types": types, "sliding_window": window if "sliding_attention" in types else None,
            "causal_layers": causal}


def _target_depth(raw_depth, ids: list[int], text_config, name: str) -> int:
    if text_config is not None:
        depth = int(text_config.num_hidden_layers)
        if raw_depth is not None and int(raw_depth) != depth:
            raise ConversionError(
                f"{name} was trained for a {raw_depth}-layer target, but the given target has {depth} layers."
            )
        return depth
    if raw_depth is not None:
        return int(raw_depth)
    guess = max(ids) + 3  # dFlash rule: the ids span layers 1 .. L-3
    logger.warning("%s does not record the target's depth; assuming %d (dFlash rule). Pass the target's config (%s) "
                   "to be sure.", name, guess, _TARGET_HINT)
    return guess


def dflash_config_to_xpress(
    raw: dict, *, target=None, name: str = "this dFlash checkpoint"
) -> XPressDrafterConfig:
    """A z-lab `DFlashDraftModel` config dict -> `XPressDrafterConfig` (refiner None)."""
    dflash = raw.get("dflash_config") or {}
    if any("DFlash2" in a for a in raw.get("architectures") or []):
        raise ConversionError(
            f"{name} is a {raw['architectures']} checkpoint (dynamic convolutions and a candidate selector in the "
            "drafter), which XPressDrafterModel does not implement."
        )
    for key in (*UNSUPPORTED_DFLASH_FEATURES, "pure_draft_prefix_len"):
        if dflash.get(key):
            raise ConversionError(f"{name} sets dflash_config.{key}, which XPressDrafterModel does not implement.")
    for key, default in DFLASH_SCALINGS.items():
        value = dflash.get(key, raw.get(key, default))
        if value != default and not (default is None and not value):
            raise ConversionError(
                f"{name} sets {key}={value!r} (default {default!r}), which XPressDrafterModel does not implement."
            )
    ours = raw.get("hf_xpress") or {}  # what `export_vllm` adds to the layout
    mask_token_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if mask_token_id is None:
        raise ConversionError(f"{name} has no dflash_config.mask_token_id.")
    block_size = raw.get("block_size", dflash.get("block_size"))
    if block_size is None:
        raise ConversionError(f"{name} records no block_size (top level or dflash_config).")
    def integer(value) -> bool:  # JSON's numbers: a bool is not one
        return isinstance(value, int) and not isinstance(value, bool)

    sizes = {key: raw[key] for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                       "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
             if raw.get(key) is not None}  # int() truncated a hand-edited 64.5
    for key, value in (("mask_token_id", mask_token_id), ("block_size", block_size), *sizes.items()):
        if not integer(value):
            raise ConversionError(f"{name}: {key} must be an integer, got {value!r}.")
    text = _target_text_config(target)
    num_layers = int(raw["num_hidden_layers"])
    hidden = int(raw["hidden_size"])
    ids = dflash.get("target_layer_ids")
    if ids is not None and (not isinstance(ids, list) or not all(integer(i) for i in ids)):
        raise ConversionError(f"{name}: dflash_config.target_layer_ids must be a list of integers, got {ids!r}.")
    raw_depth = raw.get("num_target_layers")
    if ids is None:
        depth = int(text.num_hidden_layers) if text is not None else raw_depth
        if depth is None:
            raise ConversionError(f"{name} has neither dflash_config.target_layer_ids nor num_target_layers.")
        ids = default_target_layer_ids(int(depth), num_layers)
    target_hidden = dflash.get("target_hidden_size", raw.get("target_hidden_size")) or hidden
    if int(target_hidden) != hidden:
        raise ConversionError(
            f"{name} reads a target of width {target_hidden} into a drafter of width {hidden}; XPressDrafterModel "
            "needs them equal (it uses the target's embeddings and lm_head)."
        )
    vocab = raw.get("vocab_size") or (text.vocab_size if text is not None else None)
    if vocab is None:
        raise ConversionError(f"{name} records no vocab_size; pass the target's config ({_TARGET_HINT}).")
    return XPressDrafterConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=num_layers,
        num_attention_heads=int(raw["num_attention_heads"]),
        num_key_value_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
        head_dim=int(raw.get("head_dim") or hidden // raw["num_attention_heads"]),
        hidden_act=raw.get("hidden_act", "silu"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 40960)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_parameters=_rope_parameters(raw),
        attention_bias=bool(raw.get("attention_bias", False)),
        attention_dropout=raw.get("attention_dropout", 0.0),
        num_target_layers=_target_depth(raw_depth, ids, text, name),
        target_layer_ids=[int(i) for i in ids],
        # our own export (`export_vllm`) records the target's type and the inference settings the layout lacks
        target_model_type=getattr(text, "model_type", None) or ours.get("target_model_type"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        block_size=int(block_size),
        mask_token_id=int(mask_token_id),
        refiner=None,
        **zlab_attention_layout(raw),
        **{k: v for k, v in ours.items() if k in INFERENCE_SETTINGS},
    )


def muse_config_to_xpress(
    raw: dict, *, target=None, vocab_size: int | None = None, num_target_layers: int | None = None,
    name: str = "this MuseGlimmerAssistant checkpoint",
) -> XPressDrafterConfig:
    """A transformers `MuseGlimmerAssistantConfig` dict -> `XPressDrafterConfig` (refiner None).

    Its config has no vocabulary size and no target depth: they come from `target` (or the explicit arguments).
    """
    from transformers import MuseGlimmerAssistantConfig

    config = MuseGlimmerAssistantConfig.from_dict({k: v for k, v in raw.items() if k != "auto_map"})
    text = _target_text_config(target)
    vocab = vocab_size or (text.vocab_size if text is not None else None)
    if vocab is None:
        raise ConversionError(f"{name}: its config has no vocab_size; pass the target's config ({_TARGET_HINT}) or "
                              "vocab_size=.")
    depth = num_target_layers or (text.num_hidden_layers if text is not None else None)
    ids = [int(i) for i in config.target_layer_ids]
    return XPressDrafterConfig(
        vocab_size=int(vocab),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=dict(config.rope_parameters),
        attention_bias=False,
        attention_dropout=config.attention_dropout,
        num_target_layers=_target_depth(depth, ids, None, name),
        target_layer_ids=ids,
        target_model_type=getattr(text, "model_type", None),
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        block_size=config.block_size,
        mask_token_id=config.mask_token_id,
        refiner=None,
        # Its sliding layers attend bidirectionally to keys with |q_pos - k_pos| <= window (transformers'
        # `sliding_window_bidirectional_overlay`), i.e. our `< window + 1`.
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window + 1 if "sliding_attention" in config.layer_types else None,
    )


# --------------------------------------------------------------------------------------------------------------------
# Building models
# --------------------------------------------------------------------------------------------------------------------


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def _dtype(value, fallback: torch.dtype) -> torch.dtype:
    """`value` (None / "auto": `fallback`, a torch dtype, or one of `DTYPES`' names) as a floating torch dtype."""
    if value is None or value == "auto":
        return fallback
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise ConversionError(f"dtype {value!r} is not one of {', '.join(DTYPES)} (or 'auto': as stored).")
    return DTYPES[name]


def _stored_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    floats = [t.dtype for t in state.values() if t.is_floating_point()]
    return max(set(floats), key=floats.count) if floats else torch.float32


def build_model(config: XPressDrafterConfig, state: dict[str, torch.Tensor], dtype=None, name: str = "checkpoint"):
    """`XPressDrafterModel(config)` with exactly the tensors of `state` (our names); refuses missing/extra/misshapen."""
    from transformers.initialization import no_init_weights

    # Built in its final dtype and filled tensor by tensor (load_state_dict casts each one as it copies): the memory
    # peak is the checkpoint plus one model, not a float32 model and a whole cast copy of the checkpoint besides.
    target_dtype = _dtype(dtype, _stored_dtype(state))
    with no_init_weights():  # every parameter is overwritten below: skip the random initialisation
        model = XPressDrafterModel._from_config(config, dtype=target_dtype)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    kinds = [f"{k}: {state[k].dtype}" for k, v in expected.items()  # copied as values: int8 100 would become 100.0
             if k in state and state[k].is_floating_point() != v.is_floating_point()]
    if kinds:
        raise ConversionError(
            f"The weights of {name} hold tensors of another kind than the layout's (integer for floating point or the "
            f"reverse: a quantised checkpoint?): {kinds[:8]}{'...' if len(kinds) > 8 else ''}. Convert a checkpoint "
            "with floating-point weights."
        )
    if missing or unexpected or shapes:
        raise ConversionError(
            f"The weights of {name} do not fit the layout: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}, wrong shapes {shapes[:8]}."
        )
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_dflash(
    folder: str | os.PathLike, *, target=None, dtype=None
) -> XPressDrafterModel:
    """A z-lab dFlash folder (`DFlashDraftModel`) -> `XPressDrafterModel` with `refiner=None`, same weights."""
    folder = Path(folder)
    raw = _read_config(folder)
    if (folder / "mask_embedding.pt").exists():
        raise ConversionError(
            f"{folder} ships a separate mask_embedding.pt; XPressDrafterModel embeds the mask token with the target's "
            "embedding table and cannot use it."
        )
    config = dflash_config_to_xpress(raw, target=target, name=str(folder))
    state = read_state_dict(folder)
    if any(k.startswith(("embed_tokens", "lm_head")) for k in state):
        raise ConversionError(f"{folder} carries its own embed_tokens/lm_head; XPressDrafterModel uses the target's.")
    return build_model(config, state, dtype, name=str(folder))


def load_muse_glimmer(
    folder: str | os.PathLike, *, target=None, vocab_size: int | None = None, num_target_layers: int | None = None,
    dtype=None,
) -> XPressDrafterModel:
    """A transformers `MuseGlimmerAssistantModel` folder -> `XPressDrafterModel` with `refiner=None`."""
    folder = Path(folder)
    raw = _read_config(folder)
    config = muse_config_to_xpress(
        raw, target=target, vocab_size=vocab_size, num_target_layers=num_target_layers,
        name=str(folder),
    )
    renames = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm."}
    state = {}
    for key, tensor in read_state_dict(folder).items():
        key = key.removeprefix("model.")
        for old, new in renames.items():
            if key.startswith(old):
                key = new + key[len(old):]
        state[key] = tensor
    return build_model(config, state, dtype, name=str(folder))


# --------------------------------------------------------------------------------------------------------------------
# Official refiner checkpoints (.pt)
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RefinerCheckpoint:
    """An official xPress / Markov refiner checkpoint, in our naming (without the `refiner.` prefix)."""

    kind: str  # "xpress" or "markov"
    state: dict[str, torch.Tensor]
    rank: int
    vocab_size: int
    mlp_ratio: int = 2
    block_size: int | None = None  # xPress: from mix.L
    hidden_size: int | None = None  # xPress: from down_h
    draft_state: dict[str, torch.Tensor] | None = None  # the co-trained drafter, if shipped
    args: dict = field(default_factory=dict)
    step: int | None = None
    path: str = ""


def _torch_load_safely(path: Path) -> Any:
    if not path.is_file():
        raise ConversionError(f"{path} does not exist.")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure becomes one clear refusal
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(err))))
        if found:
            raise ConversionError(
                f"Refusing to load {path}: it pickles Python objects ({', '.join(found)}) "
                "that torch.load(weights_only=True) does not allow, and loading it fully could run arbitrary code. "
                "If you trust the file, re-save its tensors and plain values only, e.g. after ck = torch.load(path, "
                "weights_only=False): torch.save({'args': {k: v if isinstance(v, (int, float, str, bool, type(None))) "
                "else str(v) for k, v in vars(ck['args']).items()}, 'refiner_state_dict': ck['refiner_state_dict'], "
                "'draft_state_dict': ck.get('draft_state_dict')}, 'clean.pt')."
            ) from err
        raise ConversionError(
            f"Could not read {path} as a torch checkpoint ({type(err).__name__}: {err}); is it corrupt?"
        ) from err


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the `module.` (DDP) and `_orig_mod.` (torch.compile) wrappers training code often leaves in names."""
    out = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def load_refiner_checkpoint(path: str | os.PathLike, *, strict: bool = True) -> RefinerCheckpoint:
    """Read an official xPress or Markov `.pt` with `weights_only=True`; check its variant, names and shapes."""
    path = Path(path)
    ckpt = _torch_load_safely(path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("refiner_state_dict"), dict):
        keys = sorted(ckpt)[:10] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConversionError(
            f"{path} is not an official xPress/Markov refiner checkpoint: expected a dict with 'refiner_state_dict' "
            f"(and 'args'), found {keys}."
        )
    args = ckpt.get("args")
    if not isinstance(args, (argparse.Namespace, dict, type(None))):
        raise ConversionError(f"{path}: 'args' is a {type(args).__name__}; an official refiner checkpoint stores its "
                              "training arguments as an argparse.Namespace or a dict.")
    args = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    state = _strip_prefixes(ckpt["refiner_state_dict"])
    both = [f"{k} / {ours}" for k, ours in DEEPSPEC_MARKOV_KEYS.items() if k in state and ours in state]
    if both:  # one would silently replace the other
        raise ConversionError(f"{path}: refiner_state_dict holds a tensor under both its names ({', '.join(both)}).")
    state = {DEEPSPEC_MARKOV_KEYS.get(k, k): v for k, v in state.items()}
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ConversionError(f"{path}: refiner_state_dict entries {bad[:5]} are not tensors.")
    is_xpress = any(k in state for k in ("in_proj.weight", "mix.L", "down_h.weight"))
    kind = "xpress" if is_xpress else "markov"
    expected = XPRESS_KEYS if is_xpress else MARKOV_KEYS
    missing = [k for k in expected if k not in state]
    if missing:
        raise ConversionError(f"{path}: the {kind} refiner state dict lacks {missing} (has {sorted(state)[:12]}).")
    tril = state.pop("mix.tril", None)
    extra = sorted(set(state) - set(expected))
    if extra:
        message = f"{path}: unknown {kind} refiner tensors {extra[:8]}: a head variant this release does not implement."
        if strict:
            raise ConversionError(message + " Pass strict=False (`--no-strict`) to ignore them.")
        logger.warning(message + " Ignored.")
        for key in extra:
            state.pop(key)

    if kind == "markov":
        head_type = str(args.get("markov_head_type", "vanilla")).lower()
        if head_type != "vanilla":
            raise ConversionError(f"{path}: Markov head type {head_type!r}; only DeepSpec's 'vanilla' head is supported.")
    else:
        variant = {k: args[k] for k in RELEASED_XPRESS_VARIANT if k in args and args[k] != RELEASED_XPRESS_VARIANT[k]}
        if variant:
            raise ConversionError(
                f"{path} was trained with an xPress head variant that is not the released one: {variant} "
                f"(released: {RELEASED_XPRESS_VARIANT})."
            )

    w1, w2 = state["w1.weight"], state["w2.weight"]
    if w1.dim() != 2 or w2.shape != w1.shape:
        raise ConversionError(f"{path}: w1 {tuple(w1.shape)} and w2 {tuple(w2.shape)} must both be [vocab, rank].")
    vocab, rank = w1.shape
    arg_rank = args.get("markov_rank")
    if arg_rank is not None and int(arg_rank) != rank:
        raise ConversionError(f"{path}: args.markov_rank = {arg_rank} but the tensors have rank {rank}.")
    out = RefinerCheckpoint(kind=kind, state=state, rank=int(rank), vocab_size=int(vocab), args=args, path=str(path))
    out.step = ckpt.get("global_step", ckpt.get("step"))
    if kind == "xpress":
        L = state["mix.L"]
        hidden = state["down_h.weight"].shape[1]
        mlp_hidden = state["mlp.gate_proj.weight"].shape[0]
        if L.dim() != 3 or L.shape[0] != rank or L.shape[1] != L.shape[2]:
            raise ConversionError(f"{path}: mix.L has shape {tuple(L.shape)}, expected [rank {rank}, B, B].")
        if mlp_hidden % rank:
            raise ConversionError(f"{path}: MLP width {mlp_hidden} is not a multiple of the rank {rank}.")
        shapes = {
            "down_h.weight": (rank, hidden),
            "down_g.weight": (rank, hidden),
            "in_proj.weight": (rank, 3 * rank),
            "mlp.gate_proj.weight": (mlp_hidden, rank),
            "mlp.up_proj.weight": (mlp_hidden, rank),
            "mlp.down_proj.weight": (rank, mlp_hidden),
        }
        wrong = [f"{k} {tuple(state[k].shape)} != {s}" for k, s in shapes.items() if tuple(state[k].shape) != s]
        if wrong:
            raise ConversionError(f"{path}: inconsistent xPress head shapes: {wrong}.")
        if tril is not None and not torch.equal(tril.float(), torch.tril(torch.ones_like(tril.float()))):
            raise ConversionError(f"{path}: mix.tril is not lower-triangular ones; the checkpoint is corrupt.")
        arg_ratio = args.get("mlp_ratio")
        if arg_ratio is not None and int(arg_ratio) * rank != mlp_hidden:
            raise ConversionError(f"{path}: args.mlp_ratio = {arg_ratio} but the MLP is {mlp_hidden} wide (rank {rank}).")
        out.mlp_ratio = mlp_hidden // rank
        out.block_size = int(L.shape[-1])
        out.hidden_size = int(hidden)
    draft = ckpt.get("draft_state_dict")
    if draft is not None:
        if not isinstance(draft, dict) or not all(isinstance(v, torch.Tensor) for v in draft.values()):
            raise ConversionError(f"{path}: draft_state_dict is not a dict of tensors.")
        out.draft_state = _strip_prefixes(draft)
    return out


def attach_refiner(
    drafter: XPressDrafterModel,
    refiner: RefinerCheckpoint | str | os.PathLike,
    *,
    use_cotrained_drafter: bool = True,
    jacobi_passes: int | None = None,
    strict: bool = True,
) -> XPressDrafterModel:
    """A new `XPressDrafterModel`: `drafter` (its config and weights) plus the official refiner.

    The co-trained releases also ship the drafter trained together with the refiner (`draft_state_dict`); as the
    official harness does, it replaces the base drafter's weights unless `use_cotrained_drafter=False`.
    """
    if not isinstance(refiner, RefinerCheckpoint):
        refiner = load_refiner_checkpoint(refiner, strict=strict)
    config = drafter.config
    where = refiner.path or "the refiner checkpoint"
    if refiner.vocab_size != config.vocab_size:
        raise ConversionError(f"{where} has vocabulary {refiner.vocab_size}; the drafter's is {config.vocab_size}.")
    if refiner.kind == "xpress":
        if refiner.hidden_size != config.hidden_size:
            raise ConversionError(f"{where} reads hidden size {refiner.hidden_size}; the drafter's is {config.hidden_size}.")
        if refiner.block_size != config.block_size:
            raise ConversionError(
                f"{where} was trained for block size {refiner.block_size} (mix.L); the drafter's is {config.block_size}."
            )
    fields = config.to_dict()
    for key in ("architectures", "auto_map", "transformers_version", "model_type", "dtype", "torch_dtype"):
        fields.pop(key, None)
    fields.update(refiner=refiner.kind, refiner_rank=refiner.rank, refiner_mlp_ratio=refiner.mlp_ratio)
    if jacobi_passes is not None:
        fields["jacobi_passes"] = int(jacobi_passes)
    new_config = XPressDrafterConfig(**fields)

    base = {k: v for k, v in drafter.state_dict().items() if not k.startswith("refiner.")}
    if refiner.draft_state is not None and use_cotrained_drafter:
        cotrained = refiner.draft_state
        unknown = sorted(set(cotrained) - set(base))
        if unknown:
            raise ConversionError(f"{where}: draft_state_dict has tensors the drafter does not: {unknown[:8]}.")
        wrong = [f"{k} {tuple(v.shape)} != {tuple(base[k].shape)}" for k, v in cotrained.items() if v.shape != base[k].shape]
        if wrong:
            raise ConversionError(f"{where}: draft_state_dict does not fit the drafter: {wrong[:8]}.")
        kept = sorted(set(base) - set(cotrained))
        if kept:
            logger.warning("%s: draft_state_dict lacks %s; those keep the base drafter's weights.", where, kept[:8])
        base.update(cotrained)
    state = {**base, **{f"refiner.{k}": v for k, v in refiner.state.items()}}
    dtype = next(drafter.parameters()).dtype
    return build_model(new_config, state, dtype, name=where).to(drafter.device)


# --------------------------------------------------------------------------------------------------------------------
# vLLM export / import
# --------------------------------------------------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _zlab_causal_field(config: XPressDrafterConfig) -> dict:
    """`dflash_config.causal` for `config.causal_layers` (readers default to: causal = the sliding layers)."""
    causal, every = config.causal_layers, list(range(config.num_hidden_layers))
    if causal == config.sliding_layers:
        return {}
    if causal in ([], every):
        return {"causal": causal == every}
    raise ConversionError(
        f"causal_layers {causal} can not be written in the dFlash layout: it has one `causal` switch for every layer, "
        f"or makes exactly the sliding-window layers ({config.sliding_layers}) causal."
    )


def dflash_config_dict(config: XPressDrafterConfig, dtype: torch.dtype) -> dict:
    """The z-lab `DFlashDraftModel` config.json for `config` (what vLLM's `method="dflash"` reads)."""
    rope = dict(config.rope_parameters or {"rope_type": "default", "rope_theta": XPressDrafterConfig.default_theta})
    rope_scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if rope_scaling.get("rope_type", "default") == "default":
        rope_scaling = None
    import transformers

    return {
        "architectures": [DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "attention_bias": bool(config.attention_bias),
        "attention_dropout": float(config.attention_dropout),
        "block_size": int(config.block_size),
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "dflash_config": {
            "mask_token_id": int(config.mask_token_id),
            "target_layer_ids": list(config.target_layer_ids),
            **_zlab_causal_field(config),
        },
        "dtype": _dtype_name(dtype),
        "head_dim": int(config.head_dim),
        "hidden_act": config.hidden_act,
        "hidden_size": int(config.hidden_size),
        "initializer_range": float(config.initializer_range),
        "intermediate_size": int(config.intermediate_size),
        "layer_types": list(config.layer_types),
        "max_position_embeddings": int(config.max_position_embeddings),
        "max_window_layers": int(config.num_hidden_layers),
        "num_attention_heads": int(config.num_attention_heads),
        "num_hidden_layers": int(config.num_hidden_layers),
        "num_key_value_heads": int(config.num_key_value_heads),
        "num_target_layers": int(config.num_target_layers),
        "rms_norm_eps": float(config.rms_norm_eps),
        "rope_parameters": rope,
        "rope_scaling": rope_scaling,
        "rope_theta": rope.get("rope_theta", XPressDrafterConfig.default_theta),
        "sliding_window": config.sliding_window if config.sliding_layers else None,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": bool(config.sliding_layers),
        "vocab_size": int(config.vocab_size),
        # Not read by vLLM; lets `load_vllm` restore the hf-xpress fields the dFlash layout has no place for.
        "hf_xpress": {"target_model_type": config.target_model_type,
                      **{name: getattr(config, name) for name in INFERENCE_SETTINGS}},
    }


@dataclass
class VLLMExport:
    """What `export_vllm` wrote."""

    path: Path
    method: str  # "dflash", "xpress" or "dspark"
    num_speculative_tokens: int
    architecture: str

    def serve_command(self, target: str = "<target model>", **kwargs) -> str:
        """`vllm_serve_command` for this export, its folder as an absolute path (vLLM reads a relative one that does
        not exist where it runs as a Hub id)."""
        return vllm_serve_command(
            target, self.path.resolve(), method=self.method, num_speculative_tokens=self.num_speculative_tokens, **kwargs
        )


def export_vllm(drafter: XPressDrafterModel, output: str | os.PathLike, *, dtype=None) -> VLLMExport:
    """Write `drafter` in the layout vLLM loads: `config.json` + `model.safetensors`.

    refiner None -> z-lab `DFlashDraftModel` (`method="dflash"`, upstream vLLM); xPress -> `Qwen3XPressModel`
    (`method="xpress"`, the vLLM fork in Supercomputing-System-AI-Lab/xPress `vllm_xpress/`); Markov ->
    `Qwen3DSparkModel` (`method="dspark"`). Refiner tensors keep the training names (raw `mix.L`: vLLM folds it).
    """
    check_plain_weights(drafter, "export_vllm")
    config = drafter.config
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    target_dtype = _dtype(dtype, next(drafter.parameters()).dtype)
    state = {k: v.detach().to("cpu", target_dtype).contiguous() for k, v in drafter.state_dict().items()
             if k != "draft_vocab"}
    if config.draft_vocab_size is not None:
        logger.warning("%s: vLLM's dFlash layout has no draft vocabulary; the exported drafter drafts over the whole "
                       "vocabulary (%d of its tokens were trained).", out, config.draft_vocab_size)
    tensors = {k: v for k, v in state.items() if not k.startswith("refiner.")}
    refiner = {k.removeprefix("refiner."): v for k, v in state.items() if k.startswith("refiner.")}
    cfg = dflash_config_dict(config, target_dtype)
    method = VLLM_METHODS[config.refiner]
    if config.refiner == "xpress":
        for key in XPRESS_KEYS:
            tensors[f"xpress_head.{key}"] = refiner[key]
        cfg.update(
            architectures=[VLLM_XPRESS_ARCHITECTURE],
            xpress_rank=int(config.refiner_rank),
            xpress_mlp_hidden=int(config.refiner_rank * config.refiner_mlp_ratio),
            xpress_block_size=int(config.block_size),
            xpress_num_passes=int(config.jacobi_passes),
            xpress_candidate_topc=0,  # full-vocabulary scoring: the exact semantics
            xpress_fused_kernel=False,
            sample_from_anchor=False,  # dFlash fill-in block: [anchor, mask x (B-1)]
        )
    elif config.refiner == "markov":
        tensors["markov_head.markov_w1.weight"] = refiner["w1.weight"]
        tensors["markov_head.markov_w2.weight"] = refiner["w2.weight"]
        cfg.update(architectures=[VLLM_DSPARK_ARCHITECTURE], markov_rank=int(config.refiner_rank), sample_from_anchor=False)
    shards = [p.name for p in out.glob("model-*-of-*.safetensors")]
    for stale in ("model.safetensors.index.json", "pytorch_model.bin", *shards):
        (out / stale).unlink(missing_ok=True)  # another checkpoint's weights would be loaded with these
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return VLLMExport(out, method, config.block_size - 1, cfg["architectures"][0])


def load_vllm(folder: str | os.PathLike, *, target=None, dtype=None) -> XPressDrafterModel:
    """Import a vLLM-layout folder (`DFlashDraftModel`, `Qwen3XPressModel` or `Qwen3DSparkModel`) back."""
    folder = Path(folder)
    raw = _read_config(folder)
    architectures = raw.get("architectures") or []
    config = dflash_config_to_xpress(raw, target=target, name=str(folder))
    fields = config.to_dict()
    for key in ("architectures", "auto_map", "transformers_version", "model_type", "dtype", "torch_dtype"):
        fields.pop(key, None)
    state = read_state_dict(folder)
    drafter_state = {k: v for k, v in state.items() if not k.startswith(("xpress_head.", "markov_head."))}
    if VLLM_XPRESS_ARCHITECTURE in architectures:
        rank, mlp_hidden = int(raw["xpress_rank"]), int(raw["xpress_mlp_hidden"])
        if mlp_hidden % rank:
            raise ConversionError(f"{folder}: xpress_mlp_hidden {mlp_hidden} is not a multiple of xpress_rank {rank}.")
        if int(raw.get("xpress_block_size", config.block_size)) != config.block_size:
            raise ConversionError(
                f"{folder}: xpress_block_size {raw['xpress_block_size']} != block_size {config.block_size}."
            )
        fields.update(refiner="xpress", refiner_rank=rank, refiner_mlp_ratio=mlp_hidden // rank)
        fields["jacobi_passes"] = int(raw.get("xpress_num_passes", fields.get("jacobi_passes", 6)))
        head = {k.removeprefix("xpress_head."): v for k, v in state.items() if k.startswith("xpress_head.")}
        head.pop("mix.tril", None)
    elif VLLM_DSPARK_ARCHITECTURE in architectures:
        fields.update(refiner="markov", refiner_rank=int(raw["markov_rank"]))
        head = {
            DEEPSPEC_MARKOV_KEYS.get(k.removeprefix("markov_head."), k): v
            for k, v in state.items()
            if k.startswith("markov_head.")
        }
    else:
        head = {}
    if raw.get("sample_from_anchor"):
        raise ConversionError(
            f"{folder} uses sample_from_anchor=true (anchor-as-first block); hf-xpress drafts the dFlash fill-in block."
        )
    state = {**drafter_state, **{f"refiner.{k}": v for k, v in head.items()}}
    return build_model(XPressDrafterConfig(**fields), state, dtype, name=str(folder))


def vllm_serve_command(
    target: str,
    drafter_path: str | os.PathLike,
    *,
    method: str = "dflash",
    num_speculative_tokens: int = 15,
    extra_args: str | None = None,
) -> str:
    """The `vllm serve` command line for an exported drafter. `extra_args` None: the flags z-lab documents for
    dFlash (`--attention-backend flash_attn --max-num-batched-tokens 32768`) for "dflash" and "xpress", none for
    "dspark" (docs/interop.md)."""
    if extra_args is None:
        extra_args = "" if method == "dspark" else "--attention-backend flash_attn --max-num-batched-tokens 32768"
    spec = json.dumps({"method": method, "model": str(drafter_path), "num_speculative_tokens": int(num_speculative_tokens)})
    command = f"vllm serve {target} \\\n  --speculative-config '{spec}'"
    return command + (f" \\\n  {extra_args}" if extra_args else "")


# --------------------------------------------------------------------------------------------------------------------
# One call for any format
# --------------------------------------------------------------------------------------------------------------------


def load_checkpoint(
    source: str | os.PathLike,
    *,
    refiner: str | os.PathLike | RefinerCheckpoint | None = None,
    base: str | os.PathLike | XPressDrafterModel | None = None,
    target=None,
    dtype=None,
    jacobi_passes: int | None = None,
    use_cotrained_drafter: bool = True,
    strict: bool = True,
) -> XPressDrafterModel:
    """Any supported checkpoint -> `XPressDrafterModel`.

    `source` is a drafter folder (any format of `detect_format`) or an official refiner `.pt`; for a `.pt`, `base`
    is the drafter it belongs to (e.g. a local copy of `z-lab/Qwen3-8B-DFlash-b16`). `refiner` attaches an official
    refiner `.pt` to the drafter read from `source`.
    """
    args = dict(refiner=refiner, base=base, target=target, dtype=dtype, jacobi_passes=jacobi_passes,
                use_cotrained_drafter=use_cotrained_drafter, strict=strict)
    try:
        return _load_checkpoint(source, **args)
    except (*MALFORMED, ValueError) as err:  # a field or tensor of another type or rank than its format's
        numeric = type(err) is ValueError and str(err).startswith(("invalid literal for", "could not convert"))
        if isinstance(err, ValueError) and not numeric:  # ours, which name the problem already
            raise
        raise ConversionError(
            f"{source}: a config field or tensor does not have the form its format needs ({type(err).__name__}: "
            f"{err}); the checkpoint is malformed."
        ) from err


def _load_checkpoint(source, *, refiner, base, target, dtype, jacobi_passes, use_cotrained_drafter,
                     strict) -> XPressDrafterModel:
    fmt = detect_format(source)
    if fmt != "refiner_pt":  # options that only a refiner .pt reads: refused rather than ignored
        unread = [name for name, given in (("base= (--base)", base is not None),
                                           ("use_cotrained_drafter=False (--base-drafter-weights)",
                                            not use_cotrained_drafter and refiner is None),
                                           ("strict=False (--no-strict)", not strict and refiner is None)) if given]
        if unread:
            raise ConversionError(
                f"{', '.join(unread)} only apply to an official refiner .pt, but {source} is a {fmt} checkpoint"
                f"{'' if refiner is None else ' (base= names the drafter of a .pt given as the source)'}: drop them, "
                "or attach a refiner .pt with refiner= (--refiner)."
            )
    if fmt == "refiner_pt":
        if refiner is not None:
            raise ConversionError("Give the refiner .pt either as source or as refiner=, not both.")
        if base is None:
            raise ConversionError(
                f"{source} is a refiner checkpoint: pass the drafter it refines as base= (`--base`), e.g. a local "
                "copy of z-lab/Qwen3-8B-DFlash-b16 (its config; the co-trained drafter weights come from the .pt)."
            )
        refiner, source = source, base
        if isinstance(source, XPressDrafterModel):
            drafter = source
        else:
            drafter = load_checkpoint(source, target=target, dtype=dtype)
    elif fmt == "dflash":
        drafter = load_dflash(source, target=target, dtype=dtype)
    elif fmt == "muse_glimmer":
        drafter = load_muse_glimmer(source, target=target, dtype=dtype)
    elif fmt in ("vllm_xpress", "vllm_dspark"):
        drafter = load_vllm(source, target=target, dtype=dtype)
    else:  # our own folders
        kwargs = {} if dtype in (None, "auto") else {"dtype": _dtype(dtype, torch.float32)}  # "auto": as stored
        drafter = XPressDrafterModel.from_pretrained(source, **kwargs).eval()
    if refiner is not None:
        if drafter.config.refiner is not None:
            logger.warning("%s already has a %s refiner; replacing it.", source, drafter.config.refiner)
        drafter = attach_refiner(
            drafter, refiner, use_cotrained_drafter=use_cotrained_drafter, jacobi_passes=jacobi_passes, strict=strict
        )
    elif jacobi_passes is not None:
        drafter.config.jacobi_passes = int(jacobi_passes)
        drafter.config.validate_xpress()
    if target is not None:  # the target given must be the one the checkpoint was trained for
        check_compatible(_target_text_config(target), drafter.config)
    return drafter


def convert(source: str | os.PathLike, output: str | os.PathLike, **kwargs) -> XPressDrafterModel:
    """`load_checkpoint(source, **kwargs)` saved to `output` as an hf-xpress folder (loads with `AutoModel`)."""
    drafter = load_checkpoint(source, **kwargs)
    drafter.save_pretrained(output)
    return drafter


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", help="drafter folder (z-lab dFlash, MuseGlimmerAssistant, vLLM export, hf-xpress) or refiner .pt"
    )
    parser.add_argument("--refiner", help="official xPress/Markov refiner .pt to attach to the drafter")
    parser.add_argument("--base", help="drafter folder the refiner .pt belongs to, when SOURCE is a .pt")
    parser.add_argument(
        "--target", help="target model config (folder or Hub id): vocabulary and depth when the checkpoint lacks them"
    )
    add_reading_options(parser)


def add_reading_options(parser: argparse.ArgumentParser) -> None:
    """`load_checkpoint`'s options for how a checkpoint is read (`convert`, `export`, `push`; `reading_options`)."""
    parser.add_argument("--passes", type=int, help="Jacobi passes K to record (default: keep, or 6)")
    parser.add_argument("--dtype", default=None, choices=[*DTYPES, "auto"], metavar="DTYPE",
                        help="float32, bfloat16 or float16 (default: as stored)")
    parser.add_argument(
        "--base-drafter-weights", action="store_true",
        help="keep the base drafter's weights even if the .pt ships a co-trained drafter",
    )
    parser.add_argument("--no-strict", action="store_true", help="ignore unknown refiner tensors instead of refusing")


def reading_options(args) -> dict:
    """`load_checkpoint` keyword arguments from `add_reading_options`' flags."""
    return dict(dtype=args.dtype, jacobi_passes=args.passes, use_cotrained_drafter=not args.base_drafter_weights,
                strict=not args.no_strict)


def _load_from_args(args) -> XPressDrafterModel:
    return load_checkpoint(args.source, refiner=args.refiner, base=args.base, target=args.target, **reading_options(args))


def _check_output_folder(path) -> None:
    if Path(path).exists() and not Path(path).is_dir():
        raise ConversionError(f"{path} exists and is not a folder: give a new or empty folder for the output.")
    if Path(path).is_dir() and any(not p.name.startswith(".") for p in Path(path).iterdir()):  # .git: a clone is fine
        raise ConversionError(f"{path} exists and is not empty: the output is a whole checkpoint folder, and files "
                              "already there (another checkpoint's shards, model card or code) would be mixed into it; "
                              "give a new or empty folder (hidden files such as a clone's .git are allowed).")


def _run_convert(args) -> int:
    _check_output_folder(args.output)
    drafter = _load_from_args(args)
    drafter.save_pretrained(args.output)
    c = drafter.config
    print(f"wrote {args.output}: {c.num_hidden_layers}-layer dFlash drafter, block {c.block_size}, refiner {c.refiner}")
    return 0


def _run_export(args) -> int:
    _check_output_folder(args.output)
    drafter = _load_from_args(args)
    result = export_vllm(drafter, args.output, dtype=args.dtype)
    print(f"wrote {result.path} ({result.architecture}, vLLM method {result.method!r}). Serve it with:\n")
    print(result.serve_command(args.serve_target or "<target model>"))
    if result.method != "dflash":
        print(f"\n(method {result.method!r} needs the vLLM build of Supercomputing-System-AI-Lab/xPress vllm_xpress/.)")
    return 0


def add_convert_parser(subparsers) -> None:
    parser = subparsers.add_parser("convert", help="import dFlash / xPress / Markov / MuseGlimmer checkpoints")
    _add_source_arguments(parser)
    parser.add_argument("output", help="folder to write (loads with AutoModel after `import hf_xpress`)")
    parser.set_defaults(func=_run_convert)


def add_export_parser(subparsers) -> None:
    parser = subparsers.add_parser("export", help="write a drafter in the layout vLLM serves")
    _add_source_arguments(parser)
    parser.add_argument("output", help="folder to write (config.json + model.safetensors)")
    parser.add_argument("--serve-target", help="target model name for the printed `vllm serve` command")
    parser.set_defaults(func=_run_export)


__all__ = [
    "ConversionError",
    "RefinerCheckpoint",
    "VLLMExport",
    "add_convert_parser",
    "add_export_parser",
    "attach_refiner",
    "build_model",
    "convert",
    "detect_format",
    "dflash_config_dict",
    "dflash_config_to_xpress",
    "export_vllm",
    "load_checkpoint",
    "load_dflash",
    "load_muse_glimmer",
    "load_refiner_checkpoint",
    "load_vllm",
    "muse_config_to_xpress",
    "read_state_dict",
    "vllm_serve_command",
]
