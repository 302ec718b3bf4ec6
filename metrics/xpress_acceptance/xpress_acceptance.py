"""xpress_acceptance: acceptance length (tau) and per-slot acceptance of speculative decoding.

An `evaluate` metric module. Load it from its folder (works offline, no Hub access):

    import evaluate
    metric = evaluate.load("metrics/xpress_acceptance")
    metric.compute(accepted=[3, 0, 15, 7], block_size=16)

Each input row is one verification round: the number of draft tokens the target accepted in that round
(0 .. block_size - 1). Every round also commits one bonus token from the target, so

    tau = mean(accepted) + 1          (tokens committed per target verification forward, 1 <= tau <= B)
    slot_acceptance[k - 1] = fraction of rounds with accepted >= k,  k = 1 .. B - 1

`XPressStats.accepted` (`drafter.stats.accepted` after `target.generate(..., assistant_model=drafter)`) is exactly
this input.
"""

from __future__ import annotations

import math
import numbers

import datasets
import evaluate

_DESCRIPTION = """Acceptance length (tau = mean accepted drafts per round + 1 bonus token) and per-slot acceptance
(how often draft slot k of a block is accepted) for block speculative decoding such as dFlash / xPress."""

_KWARGS_DESCRIPTION = """
Args:
    accepted (`list[int]`): accepted draft tokens per verification round, each in 0 .. block_size - 1.
    block_size (`int`, default 16): the drafter's block size B (anchor + B - 1 drafts).
    proposed (`list[int]`, optional): drafts proposed per round (B - 1 except near max_length; prompt lookup may
        propose more). When given, `acceptance_rate` = sum(accepted) / sum(proposed) is also returned; every round
        still counts in tau (tokens per target forward, as `drafter.stats.tau`).
Returns:
    tau (`float`): mean(accepted) + 1; NaN when there are no rounds.
    mean_accepted (`float`): mean(accepted).
    rounds (`int`): number of rounds.
    slot_acceptance (`list[float]`): B - 1 values; entry k - 1 is the fraction of rounds with accepted >= k.
    acceptance_rate (`float`, only with `proposed`): accepted drafts / proposed drafts.
Examples:
    >>> metric = evaluate.load("metrics/xpress_acceptance")
    >>> metric.compute(accepted=[3, 0, 15, 6], block_size=16)["tau"]
    7.0
"""

_CITATION = """@article{wang2026xpress,
  title={xPress: Parallel Refinement for Diffusion Drafters in Speculative Decoding},
  author={Wang and Wertheimer and Lim and Srivatsa and Ganti and Zhang and Wang},
  journal={arXiv preprint arXiv:2608.02438},
  year={2026}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class XpressAcceptance(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"accepted": datasets.Value("float64")}),  # checked whole in _compute (int64 would truncate 1.7 to 1)
            reference_urls=["https://arxiv.org/abs/2608.02438"],
        )

    def _compute(self, accepted, block_size: int = 16, proposed=None):
        block_size = _count(block_size, "block_size")
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {block_size}")
        accepted = [_count(a, "accepted") for a in accepted]
        width = block_size - 1  # draft slots per round
        if proposed is None:
            bad = [a for a in accepted if a > block_size - 1]
            if bad:
                raise ValueError(
                    f"accepted counts must lie in 0..{block_size - 1} for block_size {block_size}; got {bad[:5]} "
                    "(rounds that proposed more, e.g. prompt lookup's, need proposed=)"
                )
        else:
            proposed = [_count(p, "proposed") for p in proposed]
            if len(proposed) != len(accepted):
                raise ValueError(f"proposed has {len(proposed)} rounds, accepted has {len(accepted)}")
            if any(a > p for a, p in zip(accepted, proposed)):
                raise ValueError("a round accepted more drafts than it proposed")
            width = max([width, *proposed])  # prompt lookup may propose more than B - 1
        rounds = len(accepted)
        if rounds == 0:
            nan = float("nan")
            out = {"tau": nan, "mean_accepted": nan, "rounds": 0, "slot_acceptance": [nan] * width}
        else:
            mean = sum(accepted) / rounds
            out = {
                "tau": mean + 1.0,
                "mean_accepted": mean,
                "rounds": rounds,
                "slot_acceptance": [sum(a >= k for a in accepted) / rounds for k in range(1, width + 1)],
            }
        if proposed is not None:
            total = sum(proposed)
            out["acceptance_rate"] = sum(accepted) / total if total else float("nan")
        return out


def _count(value, name: str) -> int:
    """`value` as a non-negative int; anything else (a fraction, None, a string, a negative number) is refused."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value != int(value) or value < 0):
        raise ValueError(f"{name} takes non-negative whole numbers, got {value!r}")
    return int(value)
