"""DeepSpeed's runtime terms of a layout on its engine: what the engine's own code adds to a step beyond the
math and the collectives (ZeRO-3's hook-driven fetches and resident-parameter regather, the offload path's
per-tensor host work, ZeRO-1/2's buffer copies on the synchronous CPU target, BF16_Optimizer's sharding and
fp32 gradient copies, the pipeline engine's partitioned hand-overs), each read in DeepSpeed's source
(estimate/engines.py says which release does what).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .comm import Placement, all_gather_s, grad_sync_size, group_placement, p2p_s
from .engines import (DS_BF16_HP_GRAD_EXTRA_BYTES, PipeHandOvers, ds_backward_regather_share, ds_bf16_optimizer,
                      ds_pipe_meta_bytes, ds_zero12_copy_bytes, ds_zero3_runtime, gathers_per_layer,
                      param_tensors_per_layer, reference_trainer_modules, TrainerModules)
from .params import ds_layer_modules

if TYPE_CHECKING:
    from ..layout import Layout
    from .hardware import Hardware
    from .params import ParamsEstimate
    from .estimate_context import EstimateContext


def ds_backward_gather_passes(ctx: EstimateContext, lay: Layout, layers: int) -> float | None:
    """DeepSpeed ZeRO-3's backward all-gathers (in passes of the stage's parameters) under the
    stage3_max_reuse_distance orch writes, 1e9 elements, which is also the default of every release since
    ZeRO-3 shipped (0.3.12 constants.py; the same trace-based reuse rule, PartitionedParameterCoordinator
    _keep_for_later): engines.ds_backward_regather_share; None elsewhere."""
    if ctx.engine != "deepspeed" or lay.zero_stage != 3:
        return None
    return ds_backward_regather_share(ds_layer_modules(ctx.shape, lay.tp), layers, lay.recompute == "full")


def zero3_fetch_host_s(ctx: EstimateContext, lay: Layout, layers: int, m: int) -> float:
    """DeepSpeed ZeRO-3's host time per step: one hook-driven fetch per module (estimate/engines.py) in
    every forward, recomputed forward and backward of every micro-batch; where the host is the device (CPU),
    also the hooks of the modules that gather nothing (CostModel.zero3_resident_hook_host_s): there, every
    called module of orch's trainer (:func:`trainer_modules`)."""
    if ctx.engine != "deepspeed" or lay.zero_stage != 3 or lay.dp <= 1:
        return 0.0
    passes = 3 if lay.recompute == "full" else 2
    trainer = trainer_modules(ctx)
    if trainer is not None:       # every called module of orch's trainer, in series with the math
        gathered = layers * trainer.gathered_per_layer + trainer.gathered_outside
        hooked = layers * trainer.hooked_per_layer + trainer.hooked_outside
        return m * passes * (gathered * ctx.cost.zero3_fetch_host_s + hooked * ctx.cost.zero3_resident_hook_host_s)
    fetches = m * passes * (layers * gathers_per_layer("deepspeed") + 1) * ctx.cost.zero3_fetch_host_s
    if not ctx.hw.host_is_device:
        return fetches
    norms = 2 * layers + 1              # MoE on CPU (no trainer_modules): + the final norm; resident, hooks run
    return fetches + m * passes * norms * ctx.cost.zero3_resident_hook_host_s


def trainer_modules(ctx: EstimateContext) -> TrainerModules | None:
    """The module tree ZeRO-3's hooks walk where it is orch's reference trainer's: on the CPU target (the host
    is the device; Megatron-DeepSpeed needs CUDA, orch's trainer is the DeepSpeed code that runs there), a
    dense model. None elsewhere: GPU DeepSpeed runs are costed with Megatron-DeepSpeed's layer (fused QKV,
    engines.DS_GATHERS_PER_LAYER), whose resident hooks hide behind the kernel queue."""
    shape = ctx.shape
    if not ctx.hw.host_is_device or shape.moe is not None:
        return None
    biases = (shape.q_size, 2 * shape.kv_size, shape.hidden_size, shape.mlp_in_width, shape.hidden_size) \
        if shape.bias else ()
    return reference_trainer_modules(shape.hidden_size, biases, shape.rmsnorm, shape.learned_positions,
                                     shape.tie_embeddings)


def zero3_persistent_regather_s(ctx: EstimateContext, lay: Layout, layers: int) -> float:
    """DeepSpeed ZeRO-3, every release (0.19.8 still does it: stage3.py _post_step), once per step: every
    backward ends by partitioning all parameters, the resident ones too (stage3.py backward ->
    _partition_all_parameters), and the optimizer step ends by gathering the resident ones back
    synchronously (_post_step). Before 0.5.5
    (partition_parameters._allgather_params): one all-gather on a list of n views (the per-rank loop, n
    copies), then for each resident tensor a Python loop over the n ranks copying its slice out
    (CostModel.ds_persistent_copy_host_s, plus one copy kernel launch, kernel_gap_s, each). From 0.5.5
    (_allgather_params_coalesced): one all-gather per resident tensor, queued on one NCCL stream, latency-bound
    on the ring. The host waits for it; nothing else runs. Resident tensors: the biases and norms of each
    layer and the final norm (hidden-size vectors, the MLP-in bias 4h)."""
    if ctx.engine != "deepspeed" or lay.zero_stage != 3 or lay.dp <= 1:
        return 0.0
    rt = ds_zero3_runtime(ctx.engine_version)
    shape, cost, n = ctx.shape, ctx.cost, grad_sync_size(lay)
    trainer = trainer_modules(ctx)
    if trainer is not None:
        resident = layers * trainer.resident_per_layer + trainer.resident_outside
    else:
        resident = layers * (param_tensors_per_layer(shape.bias, shape.rmsnorm) - gathers_per_layer("deepspeed")) \
            + (1 if shape.rmsnorm else 2)
    if not rt.list_gathers:
        pl = group_placement(n, lay.tp, ctx.hw.gpus_per_node)
        return resident * all_gather_s(shape.hidden_size // lay.tp * ctx.hw.dtype_bytes, pl, ctx.hw)
    per_copy = cost.ds_persistent_copy_host_s + cost.kernel_gap_s
    return n * (cost.ds_list_rank_host_s + cost.kernel_gap_s) + resident * n * per_copy


def offload_host_s(ctx: EstimateContext, lay: Layout, layers: int) -> float:
    """DeepSpeed's optimizer-offload host time per step: one pass over the rank's parameter tensors (the
    stage's layers, plus the embeddings and the final norm; on CPU, orch's trainer's: :func:`trainer_modules`)."""
    if ctx.engine != "deepspeed" or lay.offload == "none":
        return 0.0
    shape, trainer = ctx.shape, trainer_modules(ctx)
    if trainer is not None:
        tensors = layers * trainer.tensors_per_layer + trainer.tensors_outside
    else:
        tensors = layers * param_tensors_per_layer(shape.bias, shape.rmsnorm) + 2 + (1 if shape.rmsnorm else 2)
    return tensors * ctx.cost.offload_tensor_host_s


def zero12_copies_s(ctx: EstimateContext, lay: Layout, stage_params: int, m: int) -> float:
    """DeepSpeed ZeRO-1/2's gradient-buffer copies (engines.ds_zero12_copy_bytes) where the host is the device:
    on the critical path of DeepSpeed's synchronous CPU accelerator. On a GPU they run on DeepSpeed's
    reduction stream (``overlap_comm``) behind the backward: not counted."""
    if ctx.engine != "deepspeed" or lay.zero_stage not in (1, 2) or not ctx.hw.host_is_device or lay.offload != "none":
        return 0.0
    dp = grad_sync_size(lay)
    nbytes = ds_zero12_copy_bytes(stage_params, ctx.grad_reduce_bytes(lay.cp),
                                  dp, m, lay.zero_stage)
    return nbytes / ctx.hw.hbm_Bps


def ds_partitioned_transfers_s(hand: PipeHandOvers, slice_bytes: float, tp_pl: Placement, inter_node: bool,
                               hw: Hardware) -> float:
    """Per micro-batch, a middle stage's pipeline transfers on DeepSpeed's pipeline engine with tp > 1
    (engines.ds_pipe_hand_overs): blocking sends/receives of 1/tp slices, each after its meta tensor's own, of
    full tensors (unpartitioned gradients, before 0.5.4), and all-gathers over the tp group ``tp_pl``
    rebuilding the full tensor."""
    tp = tp_pl.size
    slices = hand.slices * (p2p_s(slice_bytes, inter_node, hw) + p2p_s(ds_pipe_meta_bytes(tp), inter_node, hw))
    full = hand.full * p2p_s(slice_bytes * tp, inter_node, hw)
    return slices + full + hand.gathers * all_gather_s(slice_bytes * tp, tp_pl, hw)


def uses_bf16_optimizer(ctx: EstimateContext, lay: Layout) -> bool:
    """The run trains with DeepSpeed's BF16_Optimizer (engines.ds_bf16_optimizer)."""
    return ctx.engine == "deepspeed" and ds_bf16_optimizer(ctx.engine_version, ctx.precision, lay.zero_stage, lay.pp)


def sharding_stage(ctx: EstimateContext, lay: Layout) -> int:
    """The ZeRO stage the model states are sharded at: the layout's, or 1 where DeepSpeed's BF16_Optimizer
    runs a bf16 ZeRO-0 config as its own ZeRO-1 (fp32 master weights and optimizer states over the DP ranks,
    the updated bf16 parameters all-gathered after the step: engines.py)."""
    return max(lay.zero_stage, 1) if uses_bf16_optimizer(ctx, lay) else lay.zero_stage


def hp_grad_copies_s(ctx: EstimateContext, lay: Layout, params: ParamsEstimate) -> tuple[float, float, float]:
    """Per micro-batch, what DeepSpeed's BF16_Optimizer adds to accumulate the bf16 gradients into its fp32
    copy (engines.DS_BF16_HP_GRAD_EXTRA_BYTES per parameter, memory-bound): (per transformer layer, for the
    first stage's embedding, for the last stage's output layer: the tied copy of the embedding, or its own)."""
    per_param = DS_BF16_HP_GRAD_EXTRA_BYTES / ctx.hw.hbm_Bps
    emb = params.padded_vocab_size * ctx.shape.hidden_size / lay.tp
    head = params.output_layer / lay.tp
    if ctx.shape.tie_embeddings:
        head = emb if lay.pp > 1 else 0.0     # one stage holds the one tied weight
    return params.per_layer / lay.tp * per_param, emb * per_param, head * per_param
