"""Memory of the busiest GPU: model states (ZeRO 0-3, offload), activations and framework overheads.

Model states follow ZeRO (Rajbhandari et al. 2020, section 3.1 and Table 1), or DeepSpeed's own estimator with
``accounting="deepspeed"``. A layout fits when its floor (every term but the allocator's fragmentation, which
is our estimate, not a count) is within the capacity; past the capacity with fragmentation it is "tight".
The formulas, the overheads and what fits: docs/cost-model.md, "estimate/memory.py".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .cost import CostModel

PAPER = "zero-paper"
DEEPSPEED = "deepspeed"
ZERO3_LIVE_FACTOR = 4   # bytes per largest-layer parameter: 16-bit parameter + 16-bit gradient (DeepSpeed docs)


@dataclass(frozen=True)
class ModelStatesEstimate:
    """Parameters, gradients and optimizer states of one GPU, and what offload put on the host."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    host_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _paper_bytes_per_param(precision: str, fp32_master: bool = False) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per parameter; ``fp32_master``: an fp32 run whose optimizer
    still keeps its own fp32 master copy (DeepSpeed ZeRO-3: estimate/ds_memory.py)."""
    if precision == "fp32":
        return (4, 4, 12) if fp32_master else (4, 4, 8)
    return (2, 2, 12)


def estimate_model_states(num_params: float, dp: int, zero_stage: int, offload: str = "none",
                          precision: str = "bf16", accounting: str = PAPER,
                          fp32_master: bool = False, grad_bytes: int | None = None) -> ModelStatesEstimate:
    """Bytes of model states per GPU for ``num_params`` parameters held after TP/PP sharding; ``grad_bytes``:
    bytes per gradient element where the engine's gradient buffer is not in the training dtype (Megatron's
    main_grad buffer in its reduce dtype: training.grad_reduce_dtype)."""
    if accounting == DEEPSPEED:
        return _deepspeed_states(num_params, dp, zero_stage, offload)
    p, g, o = _paper_bytes_per_param(precision, fp32_master)
    g = grad_bytes or g
    psi, n = num_params, dp
    params = p * psi / n if zero_stage >= 3 else p * psi
    grads = g * psi / n if zero_stage >= 2 else g * psi
    optim = o * psi / n if zero_stage >= 1 else o * psi
    host = 0.0
    if offload in ("optimizer", "optimizer+params"):
        host += optim
        optim = 0.0
        if zero_stage >= 2:
            host += grads
            grads = 0.0
    if offload == "optimizer+params":
        host += params
        params = 0.0
    return ModelStatesEstimate(params, grads, optim, host)


def _deepspeed_states(psi: float, n: int, zero_stage: int, offload: str) -> ModelStatesEstimate:
    if zero_stage <= 2:
        if offload == "none":
            return ModelStatesEstimate(2 * psi, 2 * psi, 16 * psi / n)
        return ModelStatesEstimate(2 * psi, 0.0, 0.0, 16 * psi / n)
    if offload == "none":
        return ModelStatesEstimate(2 * psi / n, 0.0, 16 * psi / n)
    if offload == "optimizer":
        return ModelStatesEstimate(2 * psi / n, 0.0, 0.0, 16 * psi / n)
    return ModelStatesEstimate(0.0, 0.0, 0.0, 18 * psi / n)


@dataclass(frozen=True)
class OverheadEstimate:
    """Framework memory beyond model states and activations, each term separately."""

    cuda_context_bytes: float
    nccl_bytes: float
    dp_bucket_bytes: float
    zero3_live_bytes: float
    fragmentation_bytes: float

    @property
    def total_bytes(self) -> float:
        return (self.cuda_context_bytes + self.nccl_bytes + self.dp_bucket_bytes + self.zero3_live_bytes
                + self.fragmentation_bytes)

    @property
    def uncertain_bytes(self) -> float:
        """What no allocation counts (the fragmentation estimate): left out of the floor."""
        return self.fragmentation_bytes


@dataclass(frozen=True)
class EngineBuffers:
    """What the engine's own code says it holds, where :func:`estimate_overheads`'s generic rules would guess
    (built per engine by estimate/step.py ``engine_buffers``).

    ``bucket_views``: the gradient buckets are views into the contiguous gradient buffer the model states
    already count (Megatron-Core's DistributedDataParallel and distributed optimizer, param_and_grad_buffer.py),
    so they add nothing (Megatron FSDP's are transient buffers of their own: counted). ``bucket_bytes`` and
    ``zero3_live_bytes`` replace the generic bucket and ZeRO-3 live-parameter rules (DeepSpeed: the buckets of
    ZeRO-1/2 and ZeRO-3 and the gathered parameters at the peak, estimate/ds_memory.py); None: the rule."""

    bucket_views: bool = False
    bucket_bytes: float | None = None
    zero3_live_bytes: float | None = None


def estimate_overheads(cost: CostModel, *, num_groups: int, dp: int, zero_stage: int, local_grad_bytes: float,
                       largest_layer_params: int, activations_bytes: float, dtype_bytes: int = 2,
                       runtime_bytes: int | None = None, host_is_device: bool = False,
                       engine: EngineBuffers = EngineBuffers()) -> OverheadEstimate:
    """The explicit overhead terms for one GPU (see CostModel for each default's reason).

    ``runtime_bytes`` replaces the CUDA context where the accelerator has none (the catalog's cpu entry);
    ``host_is_device``: ranks are CPU processes (the catalog's cpu entry): they communicate through gloo, which
    keeps no NCCL buffers, and of the two buckets only the pages the gradient copies wrote are resident (the
    second is written only when the gradient outgrows the first). ``engine``: what the engine's code says it
    holds instead (:class:`EngineBuffers`).
    """
    buckets = 2 * min(local_grad_bytes, cost.dp_bucket_bytes) if dp > 1 and not engine.bucket_views else 0.0
    if host_is_device and buckets:
        buckets = min(local_grad_bytes, 2 * cost.dp_bucket_bytes)
    if engine.bucket_bytes is not None and dp > 1:
        buckets = engine.bucket_bytes
    live = ZERO3_LIVE_FACTOR * largest_layer_params * dtype_bytes / 2 if zero_stage == 3 else 0.0
    if engine.zero3_live_bytes is not None and zero_stage == 3:
        live = engine.zero3_live_bytes
    context = cost.cuda_context_bytes if runtime_bytes is None else runtime_bytes
    return OverheadEstimate(cuda_context_bytes=context,
                            nccl_bytes=0.0 if host_is_device else num_groups * cost.nccl_bytes_per_group,
                            dp_bucket_bytes=buckets,
                            zero3_live_bytes=live, fragmentation_bytes=cost.fragmentation * activations_bytes)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of the busiest pipeline stage (bytes), as in SPEC.md's LAYOUT.memory."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    hbm_bytes: int
    usable_bytes: float          # hbm_bytes less the planner's headroom (CostModel.hbm_headroom): the policy
    capacity_bytes: float        # hbm_bytes less what the driver keeps (catalog.gpus.DRIVER_RESERVED_FRACTION)
    host_bytes: float = 0.0
    host_capacity_bytes: float = float("inf")   # host memory this GPU's process may use for offload
    stage: str = "first"         # the busiest pipeline stage: "first", "last" or "middle" (stage 1, pp > 2)
    overheads: OverheadEstimate | None = field(default=None, compare=False)
    stage_totals: dict = field(default_factory=dict, compare=False)   # peak bytes per rank of every stage kind
    floor_peak_bytes: float | None = None   # the largest floor_bytes of every stage kind (None: this stage's)

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.other_bytes)

    @property
    def floor_bytes(self) -> float:
        """What the GPU certainly holds: every term but the fragmentation estimate (OverheadEstimate.uncertain_bytes)."""
        uncertain = self.overheads.uncertain_bytes if self.overheads is not None else 0.0
        return self.total_bytes - uncertain

    @property
    def fits(self) -> bool:
        """Physically: the floor of every pipeline stage within the device's capacity, the offloaded bytes within
        the host's. Where a term is uncertain the floor takes its lower bound, so a layout that ran is never
        refused; one that fits only so is ``tight`` (the planner warns)."""
        floor = self.floor_bytes if self.floor_peak_bytes is None else max(self.floor_bytes, self.floor_peak_bytes)
        return floor <= self.capacity_bytes and self.host_bytes <= self.host_capacity_bytes

    @property
    def tight(self) -> bool:
        """Fits on its floor, but not with the fragmentation estimate: expect allocator pressure."""
        return self.fits and self.total_bytes > self.capacity_bytes

    @property
    def within_headroom(self) -> bool:
        """Within the planner's safety policy: at most ``usable_bytes``, the margin for what the terms miss."""
        return self.total_bytes <= self.usable_bytes and self.host_bytes <= self.host_capacity_bytes

    def to_dict(self) -> dict:
        d = {k: int(round(getattr(self, k))) for k in (
            "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes",
            "total_bytes", "hbm_bytes", "usable_bytes", "capacity_bytes", "host_bytes")}
        d["host_capacity_bytes"] = int(min(self.host_capacity_bytes, 2**62))
        d.update(fits=self.fits, within_headroom=self.within_headroom, stage=self.stage)
        d.update(floor_bytes=int(round(self.floor_bytes)), tight=self.tight)
        if self.overheads is not None:
            d["other"] = {k: int(round(v)) for k, v in vars(self.overheads).items()}
        if self.stage_totals:
            d["stages"] = {k: int(round(v)) for k, v in self.stage_totals.items()}
        return d


def stage_memory(states: ModelStatesEstimate, activations: float, overheads: OverheadEstimate, *,
                 hbm_bytes: int, capacity_bytes: int, headroom: float, stage: str,
                 host_capacity_bytes: float = float("inf")) -> MemoryEstimate:
    """Assemble one stage's MemoryEstimate from its parts."""
    return MemoryEstimate(params_bytes=states.params_bytes, grads_bytes=states.grads_bytes,
                          optimizer_bytes=states.optimizer_bytes, activations_bytes=activations,
                          other_bytes=overheads.total_bytes, hbm_bytes=hbm_bytes,
                          usable_bytes=hbm_bytes * (1 - headroom), capacity_bytes=capacity_bytes,
                          host_bytes=states.host_bytes,
                          host_capacity_bytes=host_capacity_bytes, stage=stage, overheads=overheads)


def busiest_stage(first: MemoryEstimate, last: MemoryEstimate, middle: MemoryEstimate | None = None) -> MemoryEstimate:
    """The stage needing the most memory; ties go to the first, then the last stage."""
    busiest = first if first.total_bytes >= last.total_bytes else last
    if middle is not None and middle.total_bytes > busiest.total_bytes:
        return middle
    return busiest


def with_stage_totals(busiest: MemoryEstimate, stages: list[MemoryEstimate]) -> MemoryEstimate:
    """``busiest`` recording the peak per rank of every stage kind (the LAYOUT record's memory.stages)."""
    return dataclasses.replace(busiest, stage_totals={m.stage: m.total_bytes for m in stages})
