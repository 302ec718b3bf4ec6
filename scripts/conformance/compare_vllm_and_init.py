"""(a) The official vLLM converter's folder (convert_xpress_to_vllm.py) read by hf-xpress == the .pt conversion and the
official head; (b) hf-xpress's fresh refiner init vs the official reset_parameters (N(0, 0.02), L = 0)."""
import argparse, os, subprocess, sys, tempfile
from pathlib import Path
import torch
HERE = Path(__file__).parent
OFFICIAL = Path(os.environ.get("OFFICIAL", HERE / "official"))  # the official files: see README.md
sys.path.insert(0, str(HERE))
from compare_components import official_drafter, make_target, save_official, rand_head, V, H  # noqa
from refiners.xpress import load_xpress_refiner  # noqa
from hf_xpress import conversion as cv, XPressDrafterModel  # noqa
torch.set_grad_enabled(False)
target = make_target()
B = 16
with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    off = official_drafter(2, B); save_official(off, tmp / "zlab")
    head = rand_head(B, 16, seed=4)
    cot = official_drafter(2, B, seed=66)
    torch.save({"args": argparse.Namespace(markov_rank=16, mlp_ratio=2), "refiner_state_dict": head.state_dict(),
                "draft_state_dict": cot.state_dict(), "step": 5}, tmp / "x.pt")
    subprocess.run([sys.executable, str(OFFICIAL / "xpress/vllm_xpress/convert_xpress_to_vllm.py"), "--ckpt",
                    str(tmp / "x.pt"), "--base-config", str(tmp / "zlab"), "--out", str(tmp / "vllm"),
                    "--num-passes", "4"], check=True)
    print("detect_format:", cv.detect_format(tmp / "vllm"))
    a = cv.load_checkpoint(tmp / "vllm", target=target.config)
    b = cv.load_checkpoint(tmp / "x.pt", base=tmp / "zlab", target=target.config, jacobi_passes=4)
    sa, sb = a.state_dict(), b.state_dict()
    print("same keys:", set(sa) == set(sb), "max|diff| over tensors:",
          max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa if k in sb))
    print("config refiner/passes/rank/block:", a.config.refiner, a.config.jacobi_passes, a.config.refiner_rank,
          a.config.block_size)
    hf = load_xpress_refiner(tmp / "x.pt", V, H, B, "cpu", dtype=torch.float32, fold_mixer=True)
    print("folded L vs ours(vllm) folded:", (hf.mix.L - a.refiner.mix.folded()).abs().max().item())
# (b) init
torch.manual_seed(0)
d = XPressDrafterModel.from_target(target, refiner="xpress", refiner_rank=32)
r = d.refiner
for n, p in r.named_parameters():
    print(f"init {n:24s} mean {p.mean().item():+.4f} std {p.std().item():.4f}")
