"""Refiner bias at realistic scale (weights N(0, 0.05), L N(0, 0.05)): official XPressRefinerHead (unfolded and folded)
vs hf-xpress (training path and float32 inference tables), max abs diff over 20 random prev-token blocks."""
import argparse, os, sys, tempfile
from pathlib import Path
import torch
HERE = Path(__file__).parent
OFFICIAL = Path(os.environ.get("OFFICIAL", HERE / "official"))  # the official files: see README.md
sys.path.insert(0, str(HERE))
from compare_components import official_drafter, make_target, save_official, V, H  # noqa
from refiners.xpress_head import XPressRefinerHead  # noqa
from refiners.xpress import load_xpress_refiner  # noqa
from hf_xpress import conversion as cv  # noqa
torch.set_grad_enabled(False)
target = make_target()
for B in (8, 16):
    torch.manual_seed(1)
    head = XPressRefinerHead(V, H, B, markov_rank=32, mlp_ratio=2, initializer_range=0.05)
    head.mix.L.data.normal_(0, 0.05)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        off = official_drafter(2, B); save_official(off, tmp / "zlab")
        torch.save({"args": argparse.Namespace(markov_rank=32, mlp_ratio=2), "refiner_state_dict": head.state_dict()},
                   tmp / "x.pt")
        ours = cv.load_checkpoint(tmp / "x.pt", base=tmp / "zlab")
        hf = load_xpress_refiner(tmp / "x.pt", V, H, B, "cpu", dtype=torch.float32, fold_mixer=True)
    h = torch.randn(1, B, H)
    g = h.mean(1, keepdim=True).expand(-1, B, -1)
    du = df = dt = sc = 0.0
    for s in range(20):
        prev = torch.randint(0, V, (1, B))
        ref_u, ref_f = head.bias(h, g, prev)[:, 1:], hf.bias(h, g, prev)[:, 1:]
        x = ours.refiner; t = x.tables()
        a, b = x(h, prev), x.delta(x.hidden_part(h, t), prev, 1, None, t)
        du, df, dt = max(du, (ref_u - a).abs().max().item()), max(df, (ref_f - a).abs().max().item()), max(dt, (ref_f - b).abs().max().item())
        sc = max(sc, ref_u.abs().max().item())
    print(f"B{B}: max|bias|={sc:.3f}  ours-train vs official-unfolded {du:.2e}; vs official-folded {df:.2e}; "
          f"ours-inference-tables vs official-folded {dt:.2e}")
