"""hf-xpress: xPress refiners for dFlash block-diffusion drafters, inside Hugging Face `transformers.generate`.

Importing the package registers `XPressDrafterConfig` / `XPressDrafterModel` with the Auto classes (no
`trust_remote_code` needed) and routes `generate(..., assistant_model=<xPress drafter>)` to xPress drafting.
"""

from transformers import AutoConfig, AutoModel

from .configuration_xpress import XPressDrafterConfig, default_target_layer_ids
from .generation import XPressCandidateGenerator, XPressStats, install, uninstall
from .modeling_xpress import XPressDrafterModel, XPressMarkovHead, XPressRefiner, check_compatible
from .tree_decoding import tree_decoding

__version__ = "0.1.0"

AutoConfig.register(XPressDrafterConfig.model_type, XPressDrafterConfig, exist_ok=True)
AutoModel.register(XPressDrafterConfig, XPressDrafterModel, exist_ok=True)
XPressDrafterConfig.register_for_auto_class()
XPressDrafterModel.register_for_auto_class("AutoModel")
install()

__all__ = [
    "XPressCandidateGenerator",
    "XPressDrafterConfig",
    "XPressDrafterModel",
    "XPressMarkovHead",
    "XPressRefiner",
    "XPressStats",
    "check_compatible",
    "default_target_layer_ids",
    "install",
    "tree_decoding",
    "uninstall",
]
