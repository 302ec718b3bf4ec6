"""Peak memory of `hf-xpress convert` on a z-lab dFlash folder of Qwen3-8B-DFlash-b16's layout (random bf16 weights,
sizes chosen by flags; the default is about a quarter of the real drafter), against the checkpoint's size and a
child interpreter that only imports the package.

    python scripts/convert_memory.py [--hidden 2048 --layers 5 --intermediate 6144]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_zlab_folder(folder: Path, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int,
                      head_dim: int) -> int:
    """A z-lab `DFlashDraftModel` folder (config.json + model.safetensors, bf16); returns the weights' bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [1, 9, 17, 25, 33]
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "dtype": "bfloat16",
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": ids}, "num_target_layers": 36,
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": intermediate, "layer_types": ["full_attention"] * layers,
        "max_window_layers": layers, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": None, "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
        "bos_token_id": 151643, "eos_token_id": 151645,
    }
    (folder / "config.json").write_text(json.dumps(config))

    def rand(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.bfloat16).normal_(std=0.02)

    weights = {"fc.weight": rand(hidden, len(ids) * hidden), "hidden_norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
               "norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim, dtype=torch.bfloat16),
            p + "self_attn.k_norm.weight": torch.ones(head_dim, dtype=torch.bfloat16),
            p + "mlp.gate_proj.weight": rand(intermediate, hidden),
            p + "mlp.up_proj.weight": rand(intermediate, hidden),
            p + "mlp.down_proj.weight": rand(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        }
    save_file(weights, str(folder / "model.safetensors"))
    return sum(t.numel() * t.element_size() for t in weights.values())


def peak_rss_mb(command: list[str]) -> float:
    """Maximum resident set size (MB) of `command` run as a child process (Linux reports it in KB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        raise RuntimeError("this child's peak did not exceed an earlier child's: run each measurement in a fresh process")
    return after / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--intermediate", type=int, default=6144)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "zlab"
        size = write_zlab_folder(source, args.hidden, args.layers, args.intermediate, args.heads, args.kv_heads,
                                 args.head_dim) / 2**20
        # RUSAGE_CHILDREN keeps the largest child's peak: the smaller measurement (the bare import) goes first
        base = peak_rss_mb([sys.executable, "-c", "import hf_xpress.conversion"])
        peak = peak_rss_mb([sys.executable, "-m", "hf_xpress.cli", "convert", str(source), str(Path(tmp) / "out")])
    print(f"checkpoint {size:.0f} MB (bf16); importing the package {base:.0f} MB; `hf-xpress convert` peak {peak:.0f} MB, "
          f"{(peak - base) / size:.2f}x the checkpoint above the import")


if __name__ == "__main__":
    main()
