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

import datasets
import evaluate

_DESCRIPTION = """Acceptance length (tau = mean accepted drafts per round + 1 bonus token) and per-slot acceptance
(how often draft slot k of a block is accepted) for block speculative decoding such as dFlash / xPress."""

_KWARGS_DESCRIPTION = """
Args:
    accepted (`list[int]`): accepted draft tokens per verification round, each in 0 .. block_size - 1.
    block_size (`int`, default 16): the drafter's block size B (anchor + B - 1 drafts).
    proposed (`list[int]`, optional): drafts proposed per round (B - 1 except near max_length). When given,
        `acceptance_rate` = sum(accepted) / sum(proposed) is also returned.
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
            features=datasets.Features({"accepted": datasets.Value("int64")}),
            reference_urls=["https://arxiv.org/abs/2608.02438"],
        )

    def _compute(self, accepted, block_size: int = 16, proposed=None):
        block_size = int(block_size)
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {block_size}")
        accepted = [int(a) for a in accepted]
        bad = [a for a in accepted if a < 0 or a > block_size - 1]
        if bad:
            raise ValueError(
                f"accepted counts must lie in 0..{block_size - 1} for block_size {block_size}; got {bad[:5]}"
            )
        rounds = len(accepted)
        if rounds == 0:
            nan = float("nan")
            out = {"tau": nan, "mean_accepted": nan, "rounds": 0, "slot_acceptance": [nan] * (block_size - 1)}
        else:
            mean = sum(accepted) / rounds
            out = {
                "tau": mean + 1.0,
                "mean_accepted": mean,
                "rounds": rounds,
                "slot_acceptance": [sum(a >= k for a in accepted) / rounds for k in range(1, block_size)],
            }
        if proposed is not None:
            proposed = [int(p) for p in proposed]
            if len(proposed) != rounds:
                raise ValueError(f"proposed has {len(proposed)} rounds, accepted has {rounds}")
            if any(a > p for a, p in zip(accepted, proposed)):
                raise ValueError("a round accepted more drafts than it proposed")
            total = sum(proposed)
            out["acceptance_rate"] = sum(accepted) / total if total else float("nan")
        return out
