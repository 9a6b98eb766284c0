"""What every estimate needs from the spec, resolved once: :class:`EstimateContext` (the planner shares it)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import engine_of
from ..spec import Spec, default_host_memory_GiB
from .cost import CostModel
from .hardware import Hardware, hardware_for
from .params import ModelShape, model_shape
from .precision import FP8_RECIPE


@dataclass(frozen=True)
class EstimateContext:
    """Everything an estimate needs from the spec, resolved once (the planner shares it)."""

    shape: ModelShape
    hw: Hardware
    cost: CostModel
    global_batch: int
    precision: str
    engine: str                   # training.engine: megatron | deepspeed
    host_capacity_bytes: float    # host memory one process may fill with offloaded states
    gpu: str = "h100-sxm"         # catalog key (FP8 GEMM rates)
    engine_version: str | None = None   # DeepSpeed release the run uses; None: the one orch writes for
                                        # (estimate/engines.py DEEPSPEED_VERSION; only published runs set it)
    ep_a2a_overlap: bool = True   # False: a published run that ran without --overlap-moe-expert-parallel-comm
                                  # (orch emits it wherever Megatron allows it; only published runs set it)
    fp8_recipe: str = FP8_RECIPE  # the FP8 scaling recipe orch writes; a published run may have used another
                                  # ("tensorwise": current scaling; only published runs set it)
    distribute_saved_activations: bool = False   # full recompute keeps each layer's input split over the tp
                                  # ranks (distributed_saved_input; only published runs set it: orch does not emit it)
    p2p_overlap: bool = True      # Megatron's interleaved schedule overlaps its p2p exchanges (step.uses_p2p_overlap):
                                  # the release orch writes for does; a published run on Megatron-LM before
                                  # 2023-05-31 did not (only published runs set it)

    @classmethod
    def of(cls, spec: Spec, cost: CostModel | None = None, engine_version: str | None = None,
           ep_a2a_overlap: bool = True, fp8_recipe: str = FP8_RECIPE,
           distribute_saved_activations: bool = False, dropout: float = 0.0,
           loss: str | None = None, shape_fields: dict | None = None, p2p_overlap: bool = True) -> "EstimateContext":
        """``dropout``: the hidden/attention dropout probability the run trains with (ModelShape.dropout); orch
        trains without (0), a published run states its own (tests/published.py case_dropout). ``loss``: the cross
        entropy implementation (ModelShape.loss); None: what orch's engine trains with (:func:`default_loss`).
        ``shape_fields``: ModelShape fields a published run states that a spec cannot (attention, fused_rope,
        glu_clamp, recompute_modules, router_force_balance, layer_impl, eager_norm; orch's runs state none; tests/published_layouts.py layout_case_shape_fields, tests/published.py
        case_shape_fields)."""
        cost = cost or CostModel()
        c = spec.cluster
        host_GiB = c.host_memory_GiB or default_host_memory_GiB(c.gpu, c.gpus_per_node)
        shape = model_shape(spec)
        if dropout:
            shape = dataclasses.replace(shape, dropout=dropout)
        shape = dataclasses.replace(shape, loss=loss or default_loss(engine_of(spec)),
                                    **(shape_fields or {}))
        return cls(shape=shape, hw=hardware_for(spec, cost), cost=cost,
                   global_batch=spec.training.global_batch_size, precision=spec.training.precision,
                   engine=engine_of(spec),
                   host_capacity_bytes=host_GiB * 2**30 / c.gpus_per_node, gpu=c.gpu,
                   engine_version=engine_version, ep_a2a_overlap=ep_a2a_overlap, fp8_recipe=fp8_recipe,
                   distribute_saved_activations=distribute_saved_activations, p2p_overlap=p2p_overlap)


def default_loss(engine: str) -> str:
    """The cross entropy orch's runs train with: Megatron-Core's vocab-parallel cross entropy (render/megatron.py
    writes no --cross-entropy-loss-fusion; the native fusion keeps the same buffers), the reference trainer's
    torch cross entropy on DeepSpeed (train/model.py lm_loss). estimate/activations.py LOSS_IMPLS."""
    return "torch" if engine == "deepspeed" else "vocab_parallel"
