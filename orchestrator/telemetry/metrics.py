"""From per-rank measurements to the step's MetricsRecord: pure arithmetic, one definition each.

Each rank contributes a :data:`ROW` of raw numbers; rank 0 turns the rows of all ranks into one record:

- ``step_time_s``: the slowest rank's step wall time (the step ends when the last rank is done);
- ``tokens_per_s`` = global_batch_size * seq_length / step_time_s;
- ``tflops_per_gpu`` = model FLOPs of the step / (step_time_s * world_size) / 1e12; ``mfu`` divides it by
  the catalog's dense peak for the run's precision, ``hfu`` does the same with hardware FLOPs;
- ``bubble_fraction``: per rank 1 - busy / step wall (busy = forward, backward and optimizer-step
  compute, see timing.py),
  the worst rank; ``bubble_fraction_mean`` the mean over ranks; both 0 when pp = 1;
- ``allreduce_time_s`` / ``comm_exposed_s``: the slowest rank's time in data-parallel gradient
  reductions / the part of it its training thread was blocked (comm.py); ``allreduce_overhead`` =
  allreduce_time_s / step_time_s;
- ``mem_peak_bytes``: max over ranks; ``loss``: mean over the ranks that report one (NaN: none) of each
  rank's mean micro-batch loss, None when no rank does;
- ``alltoall_time_s``: the slowest rank's time in all-to-all exchanges; with MoE, the routing metrics of
  moe.py from the counts summed over ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .record import MetricsRecord
from .straggler import rank_spread

ROW = ("step_time_s", "compute_time_s", "allreduce_s", "allreduce_blocked_s", "allgather_s", "other_s",
       "allreduce_bytes", "allreduce_bus_bytes", "mem_peak_bytes", "loss", "stop",
       "alltoall_s")   # MoE and context parallelism (issue 10)


@dataclass(frozen=True)
class RunConstants:
    """What the record needs besides measurements; fixed for the run."""

    global_batch_size: int
    seq_length: int
    world_size: int
    pp: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops: float                   # dense FLOP/s of one device at the run's precision


def tokens_per_s(c: RunConstants, step_time_s: float) -> float:
    return c.global_batch_size * c.seq_length / step_time_s if step_time_s > 0 else 0.0


def tflops_per_gpu(flops_per_step: float, step_time_s: float, world_size: int) -> float:
    return flops_per_step / (step_time_s * world_size) / 1e12 if step_time_s > 0 else 0.0


def utilisation(tflops: float, peak_flops: float) -> float:
    return tflops * 1e12 / peak_flops if peak_flops > 0 else 0.0


def bubble(compute_s: float, step_s: float) -> float:
    """1 - busy / wall, clipped to [0, 1]."""
    if step_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - compute_s / step_s))


def mean_loss(rows: list[dict]) -> float | None:
    """Mean of the ranks' finite losses; None when no rank reported one (a program that does not expose it)."""
    losses = [r["loss"] for r in rows if r["loss"] is not None and math.isfinite(r["loss"])]
    return sum(losses) / len(losses) if losses else None


def build_record(c: RunConstants, rows: list[dict], *, step: int, time_unix: float, lr: float | None,
                 grad_norm: float | None, moe: dict | None = None, hosts: list[str] | None = None) -> MetricsRecord:
    """The step's record from every rank's ROW (as dicts); ``moe``: the routing metrics (moe.py), if any;
    ``hosts[rank]`` names each rank's node."""
    spread, slowest = rank_spread([r["compute_time_s"] for r in rows], c.pp)
    step_time = max(r["step_time_s"] for r in rows)
    bubbles = [bubble(r["compute_time_s"], r["step_time_s"]) for r in rows] if c.pp > 1 else [0.0]
    allreduce = max(r["allreduce_s"] for r in rows)
    ar_time_sum = sum(r["allreduce_s"] for r in rows)
    tflops = tflops_per_gpu(c.model_flops_per_step, step_time, c.world_size)
    return MetricsRecord(
        step=step, time_unix=time_unix,
        loss=mean_loss(rows),
        step_time_s=step_time,
        tokens_per_s=tokens_per_s(c, step_time),
        tflops_per_gpu=tflops,
        mfu=utilisation(tflops, c.peak_flops),
        bubble_fraction=max(bubbles),
        allreduce_time_s=allreduce,
        allreduce_overhead=allreduce / step_time if step_time > 0 else 0.0,
        comm_exposed_s=max(r["allreduce_blocked_s"] for r in rows),
        mem_peak_bytes=int(max(r["mem_peak_bytes"] for r in rows)),
        lr=lr, grad_norm=grad_norm,
        bubble_fraction_mean=sum(bubbles) / len(bubbles),
        hfu=utilisation(tflops_per_gpu(c.hardware_flops_per_step, step_time, c.world_size), c.peak_flops),
        compute_time_s=max(r["compute_time_s"] for r in rows),
        allgather_time_s=max(r["allgather_s"] for r in rows),
        other_comm_time_s=max(r["other_s"] for r in rows),
        comm_bytes=int(max(r["allreduce_bytes"] for r in rows)),
        allreduce_busbw_GBps=(sum(r["allreduce_bus_bytes"] for r in rows) / ar_time_sum / 1e9
                              if ar_time_sum > 0 else 0.0),
        world_size=c.world_size,
        # MoE and context parallelism (issue 10)
        alltoall_time_s=max(r["alltoall_s"] for r in rows),
        **(moe or {}),
        # stragglers (issue 11)
        rank_step_time_spread=spread, slowest_rank=slowest,
        slowest_host=hosts[slowest] if hosts and slowest < len(hosts) else "",
    )
