"""End to end, greedy: the official xPress spec_generate (model/dflash.py, eager paths: drafter-only, XPress K passes,
DeepSpec Markov) and z-lab's dflash_generate vs hf-xpress's target.generate(assistant_model=converted drafter).
Compares, round by round, the drafts submitted for verification and the acceptance lengths, and the outputs."""
import argparse, os, sys, tempfile
from pathlib import Path

import torch

HERE = Path(__file__).parent
OFFICIAL = Path(os.environ.get("OFFICIAL", HERE / "official"))  # the official files: see README.md
sys.path.insert(0, str(HERE))
from compare_components import (official_drafter, make_target, save_official, rand_head, V, H, MASK)  # noqa: E402
sys.path.insert(0, str(HERE))  # compat.py
from compat import CompatDynamicCache  # noqa: E402
import model.dflash as XD  # noqa: E402  (xPress spec_generate)
import zlab_model as Z  # noqa: E402
from refiners.xpress import load_xpress_refiner  # noqa: E402
from refiners.markov import load_markov_head  # noqa: E402

import hf_xpress  # noqa: E402,F401  (installs the candidate generator)
from hf_xpress import conversion as cv  # noqa: E402

XD.DynamicCache = CompatDynamicCache  # the 4.x crop(max_length) semantics (see official/compat.py)
Z.DynamicCache = CompatDynamicCache
import time  # noqa: E402
Z._cuda_time = time.perf_counter  # z-lab's timer calls torch.cuda.synchronize unconditionally (CPU run)
torch.set_grad_enabled(False)
import os  # noqa: E402
W1_SCALE = float(os.environ.get('W1_SCALE', '6'))


def shape_models(target, drafter_off):
    """Low-entropy logits so drafts are sometimes accepted: one dominant coordinate after both final norms."""
    for norm in (target.model.norm, drafter_off.norm):
        norm.weight.data.fill_(0.05)
        norm.weight.data[0] = 25.0
    g = torch.Generator().manual_seed(3)
    target.lm_head.weight.data[:, 0] = torch.randn(V, generator=g) * 2


class Recorder:
    """Wraps target.forward: records each verification's input ids (official: [anchor, drafts])."""
    def __init__(self, target):
        self.target, self.calls = target, []
        self.orig = target.forward

    def __enter__(self):
        def fwd(*a, **k):
            ids = k.get("input_ids", a[0] if a else None)
            self.calls.append(None if ids is None else ids.clone())
            return self.orig(*a, **k)
        self.target.forward = fwd
        return self

    def __exit__(self, *exc):
        self.target.forward = self.orig


def run(label, off_call, ours, target, prompt, n_new, bad):
    with Recorder(target) as rec:
        res = off_call()
    off_out = res.output_ids[:, : prompt.shape[1] + n_new] if hasattr(res, "output_ids") else res
    off_drafts = [c[0, 1:].tolist() for c in rec.calls[1:]]
    off_acc = list(getattr(res, "acceptance_lengths", []))
    out = target.generate(prompt, assistant_model=ours, max_new_tokens=n_new, do_sample=False)
    st = ours.stats
    plain = target.generate(prompt, max_new_tokens=n_new, do_sample=False)
    our_acc = [a + 1 for a in st.accepted]
    # rounds where ours drafted a full block compare whole; ours drafts fewer only in the last rounds (room before
    # max_length), where its drafts must be a prefix of the official block and acceptance the same up to that length
    n = len(our_acc)
    B1 = len(off_drafts[0])
    short = [i for i in range(n) if len(st.drafts[i]) < B1]
    tail_only = all(i >= n - B1 for i in short) and len(off_drafts) >= n
    same_drafts = tail_only and all(off_drafts[i][: len(st.drafts[i])] == st.drafts[i] for i in range(n))
    same_acc = tail_only and all(our_acc[i] == min(off_acc[i], len(st.drafts[i]) + 1) for i in range(n))
    eq_out = torch.equal(out, off_out[:, : out.shape[1]]) and torch.equal(out, plain)
    ok = same_drafts and same_acc and eq_out
    full = [i for i in range(n) if i not in short]
    run.drafts = off_drafts
    print(f"{'OK ' if ok else 'BAD'} {label}: rounds ours={n} official={len(off_acc)} compared={len(full)}; "
          f"drafts equal={same_drafts}; acceptance equal={same_acc}; outputs equal (ours/official/plain)={eq_out}")
    print(f"     tau ours={sum(our_acc) / max(n, 1):.2f} official(first {n})={sum(off_acc[:n]) / max(n, 1):.2f}; "
          f"acc ours {our_acc[:12]} official {off_acc[:12]}")
    if not ok:
        for i in full:
            if st.drafts[i] != off_drafts[i] or our_acc[i] != off_acc[i]:
                print("     first differing round", i, "ours", st.drafts[i], our_acc[i], "official", off_drafts[i],
                      off_acc[i])
                break
        bad.append(label)


def main():
    bad = []
    target = make_target()
    for block in (8, 16):
        off = official_drafter(2, block)
        shape_models(target, off)
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "zlab"
            save_official(off, base)
            g = torch.Generator().manual_seed(21)
            prompt = torch.randint(0, V - 1, (1, 13), generator=g)
            n_new = 60
            # 1. drafter alone: xPress spec_generate(drafter_only) and z-lab dflash_generate
            ours = cv.load_checkpoint(base, target=target.config)
            offx = XD.DFlashDraftModel(off.config).eval()
            offx.load_state_dict(off.state_dict())
            run(f"B{block} drafter-only (xPress spec_generate)", lambda: offx.spec_generate(
                prompt, target, max_new_tokens=n_new, return_dict=True, drafter_only=True), ours, target, prompt,
                n_new, bad)
            run(f"B{block} drafter-only (z-lab dflash_generate)", lambda: Z.dflash_generate(
                off, target, prompt, n_new, None, 0.0, return_stats=True), ours, target, prompt, n_new, bad)
            # 2. xPress refiner, K passes (co-trained drafter from the .pt, as the harness loads it)
            head = rand_head(block, 16, seed=5)
            for p in head.parameters():
                p.data.mul_(0.5)
            head.w1.weight.data.mul_(W1_SCALE)  # token dependence strong enough that K changes the drafts
            args = argparse.Namespace(markov_rank=16, mlp_ratio=2)
            cot = official_drafter(2, block, seed=55)
            shape_models(target, cot)
            pt = Path(tmp) / "x.pt"
            torch.save({"args": args, "refiner_state_dict": head.state_dict(), "draft_state_dict": cot.state_dict()},
                       pt)
            offx.load_state_dict(torch.load(pt, weights_only=False)["draft_state_dict"], strict=False)
            hf = load_xpress_refiner(pt, V, H, block, "cpu", dtype=torch.float32, fold_mixer=True)
            per_k = {}
            for K in (1, 3, 6):
                ours = cv.load_checkpoint(pt, base=base, target=target.config, jacobi_passes=K)
                run(f"B{block} xPress K={K}", lambda: offx.spec_generate(
                    prompt, target, max_new_tokens=n_new, return_dict=True, xpress_refiner=hf,
                    xpress_refine_passes=K), ours, target, prompt, n_new, bad)
                per_k[K] = run.drafts
            print(f"     (sensitivity) official xPress rounds whose drafts differ K=1 vs K=6: "
                  f"{sum(a != b for a, b in zip(per_k[1], per_k[6]))}; K=3 vs K=6: "
                  f"{sum(a != b for a, b in zip(per_k[3], per_k[6]))}")
            # 3. Markov head
            g2 = torch.Generator().manual_seed(8)
            sd = {"w1.weight": torch.randn(V, 16, generator=g2) * 0.6, "w2.weight": torch.randn(V, 16, generator=g2) * 0.6}
            cot2 = official_drafter(2, block, seed=56)
            shape_models(target, cot2)
            pt2 = Path(tmp) / "m.pt"
            torch.save({"args": argparse.Namespace(markov_rank=16), "refiner_state_dict": sd,
                        "draft_state_dict": cot2.state_dict()}, pt2)
            offx.load_state_dict(cot2.state_dict(), strict=False)
            mk = load_markov_head(pt2, V, "cpu", dtype=torch.float32)
            ours = cv.load_checkpoint(base, refiner=pt2, target=target.config)
            run(f"B{block} Markov", lambda: offx.spec_generate(
                prompt, target, max_new_tokens=n_new, return_dict=True, markov_refiner=mk), ours, target, prompt,
                n_new, bad)
    print("\nALL OK" if not bad else f"\nFAILED: {bad}")


if __name__ == "__main__":
    main()
