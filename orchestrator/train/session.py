"""Glue between a run dir and the telemetry package: timers, run constants and sinks for one job."""
from __future__ import annotations

from pathlib import Path

from ..telemetry.comm import OPS, CommTimer
from ..telemetry.metrics import RunConstants
from ..telemetry.sinks import METRICS_FILE, ConsoleSink, JsonlSink
from ..telemetry.step import StepTelemetry
from ..telemetry.timing import BusyTimer

LAYOUT_KEYS = ("tp", "pp", "vpp", "dp", "zero_stage", "micro_batch_size", "sequence_parallel", "recompute",
               "offload", "first_stage_layers", "last_stage_layers", "cp", "ep", "etp")


def resolved_layout(run_dir):
    """The run's Layout: plan.json's chosen record, completed from the spec's fixed fields."""
    from ..layout import Layout, layout_from_spec  # noqa: PLC0415

    chosen, fixed = run_dir.plan.get("chosen") or {}, layout_from_spec(run_dir.spec)
    return Layout(**{k: chosen.get(k, getattr(fixed, k)) for k in LAYOUT_KEYS})


def run_constants(run_dir, world_size: int) -> RunConstants:
    """FLOPs from the cost model's one formula (estimate/flops.py), peak from the GPU catalog."""
    from ..catalog.gpus import GPUS  # noqa: PLC0415
    from ..estimate.flops import estimate_flops  # noqa: PLC0415
    from ..estimate.params import model_shape  # noqa: PLC0415

    spec, layout = run_dir.spec, resolved_layout(run_dir)
    batch = spec.training.global_batch_size
    flops = estimate_flops(model_shape(spec), batch, layout.recompute or "none")
    return RunConstants(global_batch_size=batch, seq_length=spec.model.seq_length, world_size=world_size,
                        pp=layout.pp or 1, model_flops_per_step=flops.model_flops,
                        hardware_flops_per_step=flops.hardware_flops,
                        peak_flops=GPUS[spec.cluster.gpu].peak_for(spec.training.precision))


class TelemetrySession:
    """Owns the CommTimer and BusyTimer of one process and opens its StepTelemetry."""

    def __init__(self, run_dir, *, engine_name: str, rank: int, enabled: bool = True, synchronize=None):
        self.engine_name, self.rank, self.enabled = engine_name, rank, enabled
        self.comm = CommTimer()
        self.busy = BusyTimer(self.comm, synchronize=synchronize)
        self.layout_tag = resolved_layout(run_dir).tag()
        self.wandb_dir: str | None = None
        self._wandb = None            # WandbSink, False when disabled, None before start_wandb

    def install_comm(self, namespace, names=OPS) -> None:
        if self.enabled:
            self.comm.install(namespace, names)

    def start_wandb(self, run_dir) -> None:
        """Open the W&B run early (rank 0), so that its service starts while the engine initialises."""
        if self.rank != 0 or not self.enabled or self._wandb is not None:
            return
        from ..spec import spec_to_data  # noqa: PLC0415
        from ..telemetry.wandb_sink import open_wandb_sink  # noqa: PLC0415

        self._wandb = open_wandb_sink(run_dir=run_dir.path, spec=run_dir.spec, spec_data=spec_to_data(run_dir.spec),
                                      chosen=run_dir.plan.get("chosen") or {}, layout_tag=self.layout_tag,
                                      engine=self.engine_name) or False
        if self._wandb:
            self.wandb_dir = self._wandb.directory

    def open(self, run_dir, engine, *, total_steps: int, start_step: int, device="cpu",
             console: bool = True) -> StepTelemetry:
        """The step telemetry; call after the resume point is known (metrics.jsonl is truncated by then)."""
        import torch.distributed as dist  # noqa: PLC0415

        from ..node import host_name  # noqa: PLC0415
        from ..telemetry.straggler import StragglerWatch  # noqa: PLC0415

        world = dist.get_world_size()
        hosts: list = [None] * world
        dist.all_gather_object(hosts, host_name())
        sinks: list = []
        if self.rank == 0 and self.enabled:
            self.start_wandb(run_dir)
            sinks.append(JsonlSink(Path(run_dir.path) / METRICS_FILE))
            if console:
                sinks.append(ConsoleSink(total_steps))
            if self._wandb:
                sinks.append(self._wandb)
        return StepTelemetry(run_constants(run_dir, world), rank=self.rank, world_size=world, sinks=sinks,
                             comm=self.comm, busy=self.busy, device=device, enabled=self.enabled,
                             moe=getattr(engine, "moe_shape", None), hosts=hosts,
                             stragglers=StragglerWatch(run_dir.path) if self.rank == 0 and self.enabled else None)
