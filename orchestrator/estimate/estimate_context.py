"""What every estimate needs from the spec, resolved once: :class:`EstimateContext` (the planner shares it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..layout import engine_of
from ..spec import Spec, default_host_memory_GiB
from .cost import CostModel
from .engines import grad_reduce_bytes
from .hardware import Hardware, hardware_for
from .params import ModelShape, model_shape
from .precision import FP8_RECIPE


@dataclass(frozen=True)
class EstimateContext:
    """Everything an estimate needs from the spec, resolved once (the planner shares it). Every field follows
    from a spec field or its default (the software orch writes for): nothing a spec cannot state."""

    shape: ModelShape
    hw: Hardware
    cost: CostModel
    global_batch: int
    precision: str
    engine: str                   # training.engine: megatron | deepspeed
    host_capacity_bytes: float    # host memory one process may fill with offloaded states
    gpu: str = "h100-sxm"         # catalog key (FP8 GEMM rates)
    engine_version: str | None = None   # training.engine_version; None: the DeepSpeed orch writes for
                                        # (estimate/engines.py DEEPSPEED_VERSION)
    ep_a2a_overlap: bool = True   # parallelism.overlap_moe_expert_parallel_comm (False: never)
    fp8_recipe: str = FP8_RECIPE  # training.fp8_recipe (default: the delayed scaling orch writes)
    distribute_saved_activations: bool = False   # parallelism.distribute_saved_activations: full recompute keeps
                                  # each layer's input split over the tp ranks
    p2p_overlap: bool = True      # parallelism.overlap_p2p_comm: Megatron's interleaved schedule overlaps its p2p
                                  # exchanges (step.uses_p2p_overlap; False: a Megatron-LM before 2023-05-31)
    grad_reduce_dtype: str | None = None   # training.grad_reduce_dtype; None: the engine's default
                                           # (engines.default_grad_reduce_dtype)

    @classmethod
    def of(cls, spec: Spec, cost: CostModel | None = None) -> "EstimateContext":
        cost = cost or CostModel()
        c, t, p = spec.cluster, spec.training, spec.parallelism
        host_GiB = c.host_memory_GiB or default_host_memory_GiB(c.gpu, c.gpus_per_node)
        return cls(shape=model_shape(spec), hw=hardware_for(spec, cost), cost=cost,
                   global_batch=t.global_batch_size, precision=t.precision, engine=engine_of(spec),
                   host_capacity_bytes=host_GiB * 2**30 / c.gpus_per_node, gpu=c.gpu,
                   engine_version=t.engine_version, ep_a2a_overlap=p.overlap_moe_expert_parallel_comm is not False,
                   fp8_recipe=t.fp8_recipe or FP8_RECIPE,
                   distribute_saved_activations=bool(p.distribute_saved_activations),
                   p2p_overlap=p.overlap_p2p_comm is not False, grad_reduce_dtype=t.grad_reduce_dtype)

    def grad_reduce_bytes(self, cp: int) -> int:
        """Bytes per gradient element the data-parallel reduction moves, and Megatron's gradient buffer holds,
        for a layout of context degree ``cp`` (engines.grad_reduce_bytes)."""
        return grad_reduce_bytes(self.engine, self.precision, self.grad_reduce_dtype, cp,
                                 self.engine_version)
