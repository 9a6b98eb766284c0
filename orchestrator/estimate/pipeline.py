"""Pipeline schedule: the bubble of 1F1B and of the interleaved schedule, and the step's pipeline time.

Narayanan et al. 2021 (arXiv 2104.04473), section 2.2: with p stages and m micro-batches a 1F1B step
spends (p - 1) micro-batch times filling and draining the pipeline. As an idle fraction of the step that is
    (p - 1) / (m + p - 1)
(the paper quotes the ratio to the ideal time, (p - 1)/m). The interleaved schedule gives each device v
chunks of L/(p*v) layers, shrinking the fill/drain by v:
    (p - 1) / (v*m + p - 1)       (ratio to ideal: (p - 1)/(v*m)),
at the price of v times more point-to-point transfers.

Stages need not be equal: the first holds the embedding, the last the output layer and the loss. The
steady state runs at the pace of the slowest stage; the fill and drain pass through every stage once:
    T = m * (t_slowest + x) + (p - 1)/v * (t_mean + x)
where t is a stage's compute per micro-batch and x its exposed p2p time per micro-batch.
"""
from __future__ import annotations


def bubble_fraction(pp: int, num_microbatches: int, vpp: int = 1) -> float:
    """Idle fraction of a (possibly interleaved) 1F1B step."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (vpp * num_microbatches + pp - 1)


def bubble_ratio(pp: int, num_microbatches: int, vpp: int = 1) -> float:
    """Bubble time over ideal time, as Narayanan et al. state it: (p - 1)/(v*m)."""
    return (pp - 1) / (vpp * num_microbatches)


def pipeline_time_s(*, num_microbatches: int, pp: int, vpp: int, slowest_stage_s: float, mean_stage_s: float,
                    p2p_s: float = 0.0, fill_p2p_s: float | None = None) -> float:
    """Wall time of the forward/backward part of a step (see module doc); ``fill_p2p_s``: the exposed p2p per
    micro-batch in the fill and drain where it differs from the steady state's (Megatron's overlapped
    exchanges wait at once there, estimate/step.py overlapped_p2p_exposed_s)."""
    fill_p2p = p2p_s if fill_p2p_s is None else fill_p2p_s
    fill = (pp - 1) / vpp * (mean_stage_s + fill_p2p) if pp > 1 else 0.0
    return num_microbatches * (slowest_stage_s + p2p_s) + fill
