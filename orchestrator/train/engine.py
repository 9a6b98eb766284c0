"""The DeepSpeed engines: the run dir's ds_config.json, unchanged, drives ``deepspeed.initialize``.

:class:`ZeroEngine` (pp = 1: ZeRO 0-3, offload, MoE with expert parallelism, Ulysses context parallelism) and
:class:`PipeEngine` (pp > 1: DeepSpeed's PipelineModule, an uneven split placed exactly), both with the
trainer's small interface (``train_step``, ``save``, ``load``, ``info``, ``close``). Details:
docs/internals.md, "train/engine.py".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SpecError
from . import checkpoint
from .model import GPT, count_parameters, lm_loss, pipeline_specs, stage_bounds


@dataclass(frozen=True)
class StepResult:
    loss: float
    lr: float
    grad_norm: float | None
    moe_counts: list[float] | None = None     # this rank's routing vector (telemetry/moe.py), MoE only


def _finite_or_none(value) -> float | None:
    if value is None:
        return None
    value = float(value.item() if hasattr(value, "item") else value)
    return value if math.isfinite(value) and value >= 0 else None


class _DeepSpeedBase:
    """What both engines share: the DeepSpeed engine handle, checkpoints, teardown."""

    engine = None
    rank = 0
    pipelined = False      # a PipelineModule (its parameters named by layer index)

    def save(self, ckpt_dir: Path, step: int) -> None:
        checkpoint.save(self.engine, ckpt_dir, step, rank=self.rank)

    def load(self, ckpt_dir: Path, step: int) -> int:
        return checkpoint.load(self.engine, ckpt_dir, step)

    def load_source(self, source) -> int:
        """Load a resized run's converted checkpoint (convert.ResumeSource); returns its step."""
        from ..resize import UNIVERSAL_PARAMS  # noqa: PLC0415

        if source.method != UNIVERSAL_PARAMS:
            return self.load(source.ckpt_dir, source.step)
        from .universal import load  # noqa: PLC0415

        return load(self.engine, source.ckpt_dir, source.step, self.spec.model, source_pp=source.source_pp,
                    pipelined=self.pipelined)

    def follow_schedule(self) -> None:
        """After loading another run's checkpoint: the optimizer's learning rate as this run's schedule puts it
        at the loaded step (the checkpoint holds the source's: different with orch resize --scale-batch)."""
        scheduler = self.engine.lr_scheduler
        if scheduler is not None and hasattr(scheduler, "get_lr"):
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_lr()):
                group["lr"] = lr

    def current_lr(self) -> float:
        """The learning rate the next optimizer step will use (the optimizer's, not the scheduler's
        bookkeeping, which lags by one step before the first update)."""
        groups = getattr(self.engine.optimizer, "param_groups", None)
        if groups:
            return float(groups[0]["lr"])
        lrs = self.engine.get_lr()
        return float(lrs[0]) if lrs else 0.0

    def close(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        dist.barrier()
        self.engine.destroy()


class ZeroEngine(_DeepSpeedBase):
    """pp = 1: data parallel over every rank, ZeRO stage from ds_config; MoE with ep, Ulysses with cp."""

    def __init__(self, spec, ds_config: dict, dataset, busy, layout=None):
        import deepspeed  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        self.spec, self.dataset = spec, dataset
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        cp_size, ep_size = (layout.cp or 1, layout.ep or 1) if layout is not None else (1, 1)
        self.cp = context_group(cp_size, self.rank, self.world)
        torch.manual_seed(spec.training.seed)
        model = GPT(spec.model, recompute=_recompute(spec), cp=self.cp, ep_size=ep_size, seed=spec.training.seed)
        self.model, self.moe_shape = model, _moe_shape(model)
        # The whole model's count: this rank holds 1/ep of the routed experts (DeepSpeed's allreduce=False mark)
        local_experts = sum(p.numel() for p in model.parameters() if getattr(p, "allreduce", True) is False)
        self.param_count = count_parameters(model) + (ep_size - 1) * local_experts
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        self.dp_rank, self.dp_ranks, self.stage_id = self.rank // cp_size, list(range(self.world)), 0
        self.dp_size = self.world // cp_size
        self.device = self.engine.device
        self.micro_batch_size = ds_config["train_micro_batch_size_per_gpu"]
        self.grad_accum = ds_config["gradient_accumulation_steps"]
        self._forward = busy.wrap(self.engine)
        self._backward = busy.wrap(self.engine.backward)
        self._optimizer_step = busy.wrap(self.engine.step)

    def _micro_batch(self, step: int, j: int):
        """Micro-batch j of this rank's data-parallel group: its chunk of the positions with cp > 1."""
        from .ulysses import sequence_chunk  # noqa: PLC0415

        tokens, labels = self.dataset.micro_batch(step, self.dp_rank, j, self.micro_batch_size, dp_size=self.dp_size)
        return sequence_chunk(tokens, self.cp).to(self.device), sequence_chunk(labels, self.cp).to(self.device)

    def train_step(self, step: int) -> StepResult:
        lr = self.current_lr()
        stats = self.model.moe_stats
        losses = []
        for j in range(self.grad_accum):
            loss = self._forward(*self._micro_batch(step, j))
            if stats is not None:
                stats.recording = False       # a recomputed forward (recompute) is not a new routing
            self._backward(loss)
            if stats is not None:
                stats.recording = True
            self._optimizer_step()
            losses.append(self.model.last_lm_loss.detach().float())
        return StepResult(loss=float(torch.stack(losses).mean()), lr=lr,
                          grad_norm=_finite_or_none(self.engine.get_global_grad_norm()),
                          moe_counts=stats.take() if stats is not None else None)

    def info(self) -> dict:
        """Parameter counts of this rank: with ZeRO-3 the local shard (``ds_tensor``) of each parameter."""
        params = list(self.engine.module.parameters())
        if all(hasattr(p, "ds_tensor") for p in params):
            local = sum(p.ds_tensor.numel() for p in params)
            total = sum(p.ds_numel for p in params)
        else:
            local = total = sum(p.numel() for p in params)
        return {"stage_id": 0, "dp_rank": self.dp_rank, "param_count": self.param_count, "full_param_numel": total,
                "local_param_numel": local, "param_shard_fraction": local / total if total else 1.0,
                "layers": None}


class PipeEngine(_DeepSpeedBase):
    """pp > 1: DeepSpeed's PipelineModule + PipelineEngine.train_batch (1F1B)."""

    pipelined = True

    def __init__(self, spec, ds_config: dict, dataset, busy):
        import deepspeed  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415
        from deepspeed.pipe import PipelineModule  # noqa: PLC0415
        from deepspeed.runtime.pipe import schedule  # noqa: PLC0415

        self.spec, self.dataset = spec, dataset
        pipe = ds_config["pipeline"]
        torch.manual_seed(spec.training.seed)
        options = dict(layers=pipeline_specs(spec.model, _recompute(spec)), num_stages=pipe["stages"],
                       loss_fn=lm_loss, activation_checkpoint_interval=pipe["activation_checkpoint_interval"],
                       checkpointable_layers=["BlockPipe"])   # never the token embedding
        split = _stage_split(spec, pipe["stages"])
        if split.is_even:
            module = PipelineModule(partition_method=pipe["partition"], **options)
        else:
            module = exact_pipeline_module(stage_bounds(split.counts), **options)
        self.local_param_count = count_parameters(module)
        self.engine, *_ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()
                                                                               if p.requires_grad],
                                               config=ds_config)
        grid = self.engine.grid
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dp_rank, self.stage_id = grid.data_parallel_id, grid.get_stage_id()
        self.dp_ranks = dist.get_process_group_ranks(grid.get_data_parallel_group())
        self.dp_size = len(self.dp_ranks)
        self.device = self.engine.device
        self.micro_batch_size = ds_config["train_micro_batch_size_per_gpu"]
        self.grad_accum = ds_config["gradient_accumulation_steps"]
        self.parts = [int(p) for p in module.parts]
        # Time the stage's compute: DeepSpeed looks instructions up in _INSTRUCTION_MAP on the instance.
        table = dict(type(self.engine)._INSTRUCTION_MAP)
        for instruction in (schedule.ForwardPass, schedule.BackwardPass, schedule.OptimizerStep):
            table[instruction] = busy.wrap(table[instruction])
        self.engine._INSTRUCTION_MAP = table

    def _batches(self, step: int):
        for j in range(self.grad_accum):
            yield self.dataset.micro_batch(step, self.dp_rank, j, self.micro_batch_size, dp_size=self.dp_size)

    def train_step(self, step: int) -> StepResult:
        lr = self.current_lr()
        loss = self.engine.train_batch(data_iter=self._batches(step))
        return StepResult(loss=float(loss.float().mean()), lr=lr,
                          grad_norm=_finite_or_none(self.engine.get_global_grad_norm()))

    def info(self) -> dict:
        n = self.local_param_count
        return {"stage_id": self.stage_id, "dp_rank": self.dp_rank, "param_count": None, "full_param_numel": n,
                "local_param_numel": n, "param_shard_fraction": 1.0,
                "layers": [self.parts[self.stage_id], self.parts[self.stage_id + 1]]}


def _stage_split(spec, num_stages: int):
    from ..stages import stage_split  # noqa: PLC0415

    p = spec.parallelism
    return stage_split(spec.model.num_layers, num_stages, p.first_stage_layers, p.last_stage_layers)


def exact_pipeline_module(parts: list[int], **options):
    """A DeepSpeed PipelineModule whose stage r builds the layer specs ``parts[r]:parts[r + 1]``.

    It overrides ``PipelineModule._partition_layers`` (DeepSpeed 0.19.8), the one step of its constructor
    that chooses the bounds: it sets ``parts`` (what DeepSpeed's engine and checkpoints read) and this
    stage's ``_set_bounds``. Everything else (building, tied layers, the schedule) is DeepSpeed's own.
    """
    from deepspeed.pipe import PipelineModule  # noqa: PLC0415

    class ExactPartitionPipelineModule(PipelineModule):
        def _partition_layers(self, method: str = "uniform") -> None:
            if len(parts) != self.num_stages + 1 or parts[-1] != len(self._layer_specs):
                raise ValueError(f"stage bounds {parts} do not cover {len(self._layer_specs)} layer specs "
                                 f"on {self.num_stages} stages")
            self.parts = list(parts)
            self._set_bounds(start=self.parts[self.stage_id], stop=self.parts[self.stage_id + 1])

    return ExactPartitionPipelineModule(**options)


def _recompute(spec) -> str:
    return spec.parallelism.recompute or "none"


def context_group(cp_size: int, rank: int, world: int):
    """This rank's Ulysses group: ``cp_size`` consecutive ranks (None when cp = 1). Every rank creates
    every group (torch.distributed.new_group is collective)."""
    import torch.distributed as dist  # noqa: PLC0415

    from .ulysses import ContextGroup  # noqa: PLC0415

    if cp_size == 1:
        return None
    mine = None
    for first in range(0, world, cp_size):
        group = dist.new_group(list(range(first, first + cp_size)))
        if first <= rank < first + cp_size:
            mine = ContextGroup(group=group, size=cp_size, rank=rank - first)
    return mine


def _moe_shape(model):
    from ..telemetry.moe import MoEShape  # noqa: PLC0415

    stats = model.moe_stats
    return None if stats is None else MoEShape(num_layers=stats.num_layers, num_experts=stats.num_experts)


def build_engine(spec, ds_config: dict, dataset, busy, layout=None):
    """The DeepSpeed engine for the run dir's layout (pp from ds_config's pipeline section)."""
    if ds_config.get("pipeline", {}).get("stages", 1) > 1:
        if spec.model.moe is not None or (layout is not None and (layout.cp or 1) > 1):
            raise SpecError("the reference trainer runs MoE models and context parallelism with pipeline: 1",
                            path="parallelism.pipeline")
        return PipeEngine(spec, ds_config, dataset, busy)
    return ZeroEngine(spec, ds_config, dataset, busy, layout)
