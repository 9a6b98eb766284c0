"""StepTelemetry: time each optimizer step, gather every rank's numbers on rank 0, feed the sinks.

Per step every rank fills its row of a [world_size, len(ROW)] float64 tensor and ONE all_reduce (sum)
gives every rank all rows; rank 0 builds the record (metrics.py) and writes it to the sinks. With MoE the
same all_reduce also sums every rank's routing counts, appended after the rows (moe.py). The same
all_reduce carries each rank's "stop requested" flag (a signal arrived), so all ranks agree to stop
after the same step. With telemetry disabled only that flag is reduced.

Cost per step: a few ``perf_counter`` calls around collectives and forward/backward calls, one small
all_reduce, one JSON line and one W&B log call on rank 0 (measured by benchmarks/telemetry_overhead.py).
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from .comm import CommTimer
from .metrics import ROW, RunConstants, build_record
from .moe import MoEShape, moe_metrics
from .record import MetricsRecord
from .timing import BusyTimer, peak_memory_bytes


def _raw_all_reduce():
    import torch.distributed as dist  # noqa: PLC0415

    fn = dist.all_reduce
    return getattr(fn, "__wrapped__", fn)   # never timed by a CommTimer that wrapped torch.distributed


class StepTelemetry:
    def __init__(self, constants: RunConstants, *, rank: int, world_size: int, sinks: list,
                 comm: Optional[CommTimer], busy: BusyTimer, device: torch.device | str = "cpu",
                 enabled: bool = True, moe: MoEShape | None = None, hosts: list[str] | None = None,
                 stragglers=None):
        self.c = constants
        self.moe = moe
        self.rank, self.world_size = rank, world_size
        self.sinks = sinks if rank == 0 else []
        self.comm, self.busy = comm, busy
        self.device = device
        self.enabled = enabled
        self.last_record: MetricsRecord | None = None
        self.hosts = hosts                        # rank -> node name, for slowest_host
        self.stragglers = stragglers if rank == 0 else None   # a StragglerWatch (rank 0)
        self._t0 = 0.0
        self._all_reduce = _raw_all_reduce()
        self.set_enabled(enabled)

    def set_enabled(self, enabled: bool) -> None:
        """Switch measurement on or off (the stop flag is exchanged either way)."""
        self.enabled = enabled
        if self.comm is not None:
            self.comm.enabled = enabled
        self.busy.enabled = enabled

    def begin(self) -> None:
        """Call right before the step's first micro-batch."""
        if self.enabled:
            if self.comm is not None:
                self.comm.take()
            self.busy.take()
        self._t0 = time.perf_counter()

    def end(self, *, step: int, loss: float, lr: float, grad_norm: float | None,
            stop_requested: bool = False, moe_counts: list[float] | None = None) -> tuple[MetricsRecord | None, bool]:
        """Call right after the optimizer step. Returns (record on rank 0 else None, stop on all ranks).
        ``moe_counts``: this rank's routing vector (MoE models, laid out as ``self.moe``)."""
        if self.busy.synchronize:          # accelerator: the step is done when the device is
            self.busy.synchronize()
        step_time = time.perf_counter() - self._t0
        if not self.enabled:
            flag = torch.tensor([1.0 if stop_requested else 0.0], dtype=torch.float64, device=self.device)
            self._reduce(flag)
            return None, bool(flag.item() > 0)
        comm = self.comm.take() if self.comm is not None else None
        row = {"step_time_s": step_time, "compute_time_s": self.busy.take(),
               "allreduce_s": comm.allreduce_s if comm else 0.0,
               "allreduce_blocked_s": comm.allreduce_blocked_s if comm else 0.0,
               "allgather_s": comm.allgather_s if comm else 0.0, "other_s": comm.other_s if comm else 0.0,
               "allreduce_bytes": comm.allreduce_bytes if comm else 0,
               "allreduce_bus_bytes": comm.allreduce_bus_bytes if comm else 0.0,
               "mem_peak_bytes": peak_memory_bytes(), "loss": float(loss), "stop": 1.0 if stop_requested else 0.0,
               "alltoall_s": comm.alltoall_s if comm else 0.0}
        extra = self.moe.size if self.moe else 0
        table = torch.zeros(self.world_size * len(ROW) + extra, dtype=torch.float64, device=self.device)
        mine = self.rank * len(ROW)
        table[mine:mine + len(ROW)] = torch.tensor([float(row[k]) for k in ROW], dtype=torch.float64)
        if extra:
            table[-extra:] = torch.tensor(moe_counts or [0.0] * extra, dtype=torch.float64)
        self._reduce(table)
        values = table.cpu().tolist()
        rows = [dict(zip(ROW, values[r * len(ROW):(r + 1) * len(ROW)])) for r in range(self.world_size)]
        stop = any(r["stop"] > 0 for r in rows)
        if self.rank != 0:
            return None, stop
        moe = moe_metrics(self.moe, values[-extra:]) if extra else None
        record = build_record(self.c, rows, step=step, time_unix=time.time(), lr=lr, grad_norm=grad_norm, moe=moe,
                              hosts=self.hosts)
        self.last_record = record
        for sink in self.sinks:
            sink.write(record)
        if self.stragglers is not None:
            self.stragglers.observe(record, self.sinks)
        return record, stop

    def _reduce(self, tensor: torch.Tensor) -> None:
        if self.world_size > 1:
            self._all_reduce(tensor)

    def close(self, *, exit_code: int = 0) -> None:
        for sink in self.sinks:
            sink.close(exit_code=exit_code)
        self.sinks = []
