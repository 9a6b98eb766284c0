"""One layout's full estimate: memory, FLOPs, step time and its breakdown, communication.

``estimate_layout(spec, layout, cost=None) -> LayoutEstimate`` for a complete layout;
``LayoutEstimate.to_dict()`` is SPEC.md's LAYOUT record.

Step time = pipeline time (micro-batches through the slowest stage, plus fill/drain; per-layer compute,
exposed TP collectives and exposed p2p inside it) + exposed DP communication + the optimizer step
(on the GPU, or CPU-Adam and PCIe traffic with offload) + the tied-embedding gradient sync.

Stages are costed from their own layer counts (:func:`orchestrator.layout.layout_split`): the first runs
c_0 layers + the embedding, each middle stage c layers, the last c_{p-1} layers + the output layer and
the loss. The slowest of them paces the steady state; the mean (num_layers / p layers + (embedding +
head) / p) the fill and drain. Memory is the busiest of the first, the first middle and the last stage.
An even split gives c_r = num_layers / p everywhere, as before.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from ..errors import Problem, SpecError
from ..layout import FIELD_PATHS, Layout, layout_split
from ..rules import check_layout
from ..spec import Spec
from ..stages import StageSplit
from .activations import ActivationsEstimate, estimate_activations
from .comm import (CommEstimate, DataParallelComm, DataParallelWork, Placement, all_gather_s, all_reduce_s,
                   data_parallel_comm, grad_sync_size, group_placement, hybrid_data_parallel_comm,
                   shard_group_size, shard_placements, pipeline_transfer, ring_bytes,
                   tensor_parallel_layer_comm)
from .compute import embedding_time_s, head_time_s, optimizer_step_s, straggler_factor
from .cost import CostModel
from .estimate_context import EstimateContext
from .engines import (ds_bucket_all_reduce, ds_pipe_hand_overs, ds_pipe_partitioned, ds_pipeline_host_exposed,
                      ds_pipeline_reduces_after_flush, ds_zero3_runtime)
from .flops import FlopsEstimate, estimate_flops
from .context import rank_shape
from .ds_memory import ds_zero3_bucket, ds_zero3_live_bytes, ds_zero12_bucket
from .ds_runtime import (ds_backward_gather_passes, ds_partitioned_transfers_s, hp_grad_copies_s, offload_host_s,
                         sharding_stage, uses_bf16_optimizer, zero3_fetch_host_s, zero3_persistent_regather_s,
                         zero12_copies_s)
from .hardware import Hardware
from .layer import LayerKey, RankLayer, moe_activation_scale, rank_layer
from .moe import expert_work, exposed_all_to_all_s, unpaired_share, uses_ep_a2a_overlap
from .overlap import contention_s, layer_gemms, nccl_overlap_slowdown
from .recompute import module_savings
from .memory import (EngineBuffers, MemoryEstimate, ModelStatesEstimate, busiest_stage, estimate_model_states, estimate_overheads,
                     stage_memory, with_stage_totals)
from .params import (ModelShape, ParamsEstimate, ds_layer_modules, estimate_params, expert_params_per_layer_per_rank,
                     largest_module_per_rank, layer_params_per_rank)
from .pipeline import bubble_fraction, pipeline_time_s
from .tp_overlap import userbuffers_exposed_s
from .precision import fp8_gemm_hardware, fp8_saved_activation_bytes, fp8_saved_moe_mlp_bytes, fp8_weight_bytes, weight_cast_s
from .uncertainty import layout_uncertainty, regime_of


@dataclass(frozen=True)
class StepBreakdown:
    """Where one step's wall time goes (seconds, on the busiest path)."""

    compute_s: float        # m micro-batches through the slowest stage, compute only
    bubble_s: float         # pipeline fill and drain
    tp_exposed_s: float
    pp_exposed_s: float
    dp_exposed_s: float
    optimizer_s: float      # GPU Adam, or CPU-Adam + PCIe with offload
    offload_s: float        # ZeRO-3 parameter fetches from host (optimizer+params)
    ep_exposed_s: float = 0.0   # expert all-to-all (dispatch and combine) on the slowest stage
    cp_exposed_s: float = 0.0   # context-parallel K/V exchange not hidden behind attention
    engine_s: float = 0.0   # the runtime's own host work on the critical path (DeepSpeed: ZeRO-3 fetch hooks,
                            # the pipeline engine's per-micro-batch instructions)
    contention_s: float = 0.0   # compute slowed by the SMs (CPU: the core) hidden collectives occupy


@dataclass(frozen=True)
class LayoutEstimate:
    """Predicted memory, time and communication of one complete layout."""

    layout: Layout
    engine: str
    num_microbatches: int
    memory: MemoryEstimate
    flops: FlopsEstimate
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    comm: CommEstimate
    breakdown: StepBreakdown
    uncertainty: dict          # expected relative error of tokens_per_s, its regime and basis (uncertainty.py)
    to_train: dict | None = None   # days and cost to train training.total_tokens (to_train.py), when the spec says
    host_wait_s: float = 0.0   # of breakdown.compute_s: the GPU waiting for eager launches (StepTiming.host_wait_s)

    @property
    def grad_accum_steps(self) -> int:
        return self.num_microbatches

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict:
        """SPEC.md's LAYOUT record (plus a few extra fields)."""
        lay = self.layout
        split = {k: getattr(lay, k) for k in ("first_stage_layers", "last_stage_layers") if getattr(lay, k) is not None}
        if lay.account_split:
            split["account_for_embedding_loss"] = True
        if lay.shard_degree:
            split["shard_degree"] = lay.shard_degree
        return split | {
            "engine": self.engine, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "dp": lay.dp, "cp": lay.cp,
            "ep": lay.ep, "etp": lay.etp, "zero_stage": lay.zero_stage,
            "micro_batch_size": lay.micro_batch_size, "grad_accum_steps": self.grad_accum_steps,
            "num_microbatches": self.num_microbatches, "sequence_parallel": lay.sequence_parallel,
            "recompute": lay.recompute, "offload": lay.offload, "tag": lay.tag(),
            **({"recompute_modules": list(lay.recompute_modules)} if lay.recompute_modules else {}),
            "memory": self.memory.to_dict(), "flops_per_step": float(self.flops.model_flops),
            "hardware_flops_per_step": float(self.flops.hardware_flops), "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "hfu": self.hfu, "bubble_fraction": self.bubble_fraction, "comm": self.comm.to_dict(),
            "breakdown": {k: float(v) for k, v in vars(self.breakdown).items()},
            "host_wait_s": float(self.host_wait_s), "uncertainty": dict(self.uncertainty),
        } | ({"to_train": dict(self.to_train)} if self.to_train is not None else {})


def estimate_layout(spec: Spec, layout: Layout, cost: CostModel | None = None) -> LayoutEstimate:
    """Estimate a complete layout of ``spec``; SpecError when a field is open or a rule fails."""
    if not layout.is_complete:
        raise SpecError([Problem(FIELD_PATHS[f], "open: estimate_layout needs a complete layout",
                                 "fix it in the spec or run the planner") for f in layout.open_fields()])
    problems = check_layout(spec, layout)
    if problems:
        raise SpecError(problems)
    return estimate(EstimateContext.of(spec, cost), layout)


def num_microbatches(ctx: EstimateContext, lay: Layout) -> int:
    return ctx.global_batch // (lay.micro_batch_size * lay.dp)


def split_of(ctx: EstimateContext, lay: Layout) -> StageSplit:
    return layout_split(ctx.shape.num_layers, lay)


def params_of(ctx: EstimateContext, lay: Layout) -> ParamsEstimate:
    return estimate_params(ctx.shape, lay.tp, lay.pp, split_of(ctx, lay), lay.ep, lay.etp)


def layer_key(lay: Layout) -> LayerKey:
    return LayerKey(tp=lay.tp, cp=lay.cp, ep=lay.ep, etp=lay.etp, mb=lay.micro_batch_size,
                    sp=bool(lay.sequence_parallel), recompute=lay.recompute)


def rank_layer_of(ctx: EstimateContext, lay: Layout) -> RankLayer:
    """The mean transformer layer of one rank (MoE, context parallelism and FP8 composed in); a full
    recompute by block recomputes only its share of the layers (:func:`full_recompute_share`)."""
    key = dataclasses.replace(layer_key(lay), combined_1f1b=True) if uses_ep_overlap(ctx, lay) else layer_key(lay)
    layer = rank_layer(ctx.shape, ctx.hw, ctx.gpu, ctx.precision, key, ctx.fp8_recipe)
    share = full_recompute_share(ctx.shape, lay)
    if share == 1.0:
        return layer
    return dataclasses.replace(layer, time=dataclasses.replace(layer.time, recompute_s=layer.time.recompute_s * share))


def uses_ep_overlap(ctx: EstimateContext, lay: Layout) -> bool:
    """The run overlaps its expert all-to-all (Megatron's combined 1F1B schedule): the spec allows it and
    Megatron-Core's conditions hold (estimate/moe.py uses_ep_a2a_overlap)."""
    moe = ctx.shape.moe
    return ctx.ep_a2a_overlap and uses_ep_a2a_overlap(moe is not None, ctx.engine, ctx.gpu, lay.ep, lay.pp, lay.vpp,
                                                      lay.recompute, moe.dispatcher if moe else None)


def full_recompute_share(shape: ModelShape, lay: Layout) -> float:
    """Share of a stage's layers a full recompute recomputes: all with method uniform, the first
    recompute_num_layers of each model chunk (of num_layers / (pp * vpp) layers) with block."""
    if lay.recompute != "full" or shape.recompute_method != "block":
        return 1.0
    chunk = max(1, round(shape.num_layers / (lay.pp * lay.vpp)))
    return min(shape.recompute_num_layers, chunk) / chunk


def _expert_elements(ctx: EstimateContext, lay: Layout, elements: float, layers: int) -> float:
    """Of a rank's ``elements`` parameters on ``layers`` layers, those of routed experts (0 when dense)."""
    if ctx.shape.moe is None:
        return 0.0
    return min(elements, layers * expert_params_per_layer_per_rank(ctx.shape, lay.ep, lay.etp))


def model_states(ctx: EstimateContext, lay: Layout, psi: float, layers: int) -> ModelStatesEstimate:
    """Model states of a stage's GPU: dense weights sharded over dp x cp, routed experts over edp."""
    expert = _expert_elements(ctx, lay, psi, layers)
    # Megatron-Core's DistributedDataParallel (and Megatron FSDP) keep the gradient buffer in the reduce dtype:
    # fp32 with grad_reduce_in_fp32 (distributed_data_parallel.py: ``torch.float if grad_reduce_in_fp32 else
    # param.dtype``), what --bf16 sets unless --grad-reduce-in-bf16 (engines.default_grad_reduce_dtype).
    grad_bytes = ctx.grad_reduce_bytes(lay.cp) if ctx.engine == "megatron" else None
    dense = estimate_model_states(psi - expert, shard_group_size(lay), sharding_stage(ctx, lay), lay.offload,
                                  ctx.precision, fp32_master=ctx.engine == "deepspeed" and lay.zero_stage == 3,
                                  grad_bytes=grad_bytes)
    if uses_bf16_optimizer(ctx, lay):          # a full fp32 copy of every gradient besides the bf16 one
        dense = dataclasses.replace(dense, grads_bytes=dense.grads_bytes + 4 * (psi - expert))
    if ctx.precision == "fp8":   # Transformer Engine's fp8 copies: the layers' GEMM weights, not the vocabulary's
        fp8_params = min(psi, layers * layer_params_per_rank(ctx.shape, lay.tp, lay.ep, lay.etp))
        dense = ModelStatesEstimate(dense.params_bytes + fp8_weight_bytes(fp8_params), dense.grads_bytes,
                                    dense.optimizer_bytes, dense.host_bytes)
    if not expert:
        return dense
    experts = estimate_model_states(expert, lay.edp // lay.replicas, lay.zero_stage, lay.offload, ctx.precision,
                                    grad_bytes=grad_bytes)
    return ModelStatesEstimate(*(getattr(dense, f) + getattr(experts, f) for f in
                                 ("params_bytes", "grads_bytes", "optimizer_bytes", "host_bytes")))


def engine_buffers(ctx: EstimateContext, lay: Layout, params: ParamsEstimate, psi: float) -> EngineBuffers:
    """What the engine's code says a stage holding ``psi`` parameters per GPU keeps besides its model states:
    Megatron's DDP / distributed optimizer buckets are views into its gradient buffer; DeepSpeed's own buckets
    and ZeRO-3's gathered parameters where its code says what it allocates (estimate/ds_memory.py)."""
    if ctx.engine == "megatron":
        return EngineBuffers(bucket_views=lay.zero_stage < 3)
    if ctx.engine != "deepspeed":
        return EngineBuffers()
    zero3 = ds_zero3_bucket(ctx, lay, psi)
    return EngineBuffers(bucket_bytes=zero3 if zero3 is not None else ds_zero12_bucket(ctx, lay),
                         zero3_live_bytes=ds_zero3_live_bytes(ctx, lay, params))


def estimate_memory(ctx: EstimateContext, lay: Layout, params: ParamsEstimate | None = None,
                    acts: ActivationsEstimate | None = None, stage_totals: bool = False) -> MemoryEstimate:
    """Memory of the busiest GPU (the first, the first middle or the last pipeline stage)."""
    shape, hw, cost = ctx.shape, ctx.hw, ctx.cost
    params = params or params_of(ctx, lay)
    acts = acts or _activations(ctx, lay, params)
    groups = sum(n > 1 for n in (lay.tp, lay.dp, lay.pp, lay.cp, lay.ep)) + (lay.pp > 1 and shape.tie_embeddings)
    split = split_of(ctx, lay)
    candidates = [("first", params.first_stage_per_gpu, acts.first_stage_bytes, split.first),
                  ("last", params.last_stage_per_gpu, acts.last_stage_bytes, split.last)]
    if lay.pp > 2:
        candidates.append(("middle", params.middle_stage_per_gpu, acts.middle_stage_bytes, split.middle))
    stages = []
    for name, psi, act, layers in candidates:
        states = model_states(ctx, lay, psi, layers)
        over = estimate_overheads(cost, num_groups=groups, dp=lay.dp, zero_stage=lay.zero_stage,
                                  local_grad_bytes=psi * hw.dtype_bytes,
                                  largest_layer_params=zero3_gather_unit(ctx, lay, params), activations_bytes=act,
                                  dtype_bytes=hw.dtype_bytes, runtime_bytes=hw.runtime_bytes,
                                  host_is_device=hw.host_is_device, engine=engine_buffers(ctx, lay, params, psi))
        stages.append(stage_memory(states, act, over, hbm_bytes=hw.hbm_bytes, capacity_bytes=hw.capacity_bytes,
                                   headroom=cost.hbm_headroom, stage=name, host_capacity_bytes=ctx.host_capacity_bytes))
    busiest = dataclasses.replace(busiest_stage(*stages), floor_peak_bytes=max(m.floor_bytes for m in stages))
    return with_stage_totals(busiest, stages) if stage_totals else busiest


def distributed_saved_input(ctx: EstimateContext, lay: Layout) -> bool:
    """Whether full recompute keeps each layer's input split over the tp ranks: Megatron's
    --distribute-saved-activations (core_v0.16.1 tensor_parallel/random.py CheckpointFunction: the forward keeps
    ``split_tensor_into_1d_equal_chunks`` of the input, the backward rebuilds it with ``gather_split_1d_tensor``,
    an all-gather over the tp group, before recomputing the layer), as metaseq's
    --distribute-checkpointed-activations does (modules/checkpoint_activation_wrapper/checkpoint_activations.py,
    OPT-175B) and DeepSpeed's activation checkpointing with partition_activations (runtime/
    activation_checkpointing/checkpointing.py: the inputs kept as 1/mp partitions, gathered back in the backward;
    GLM-130B). Megatron allows it with tp > 1 and full recompute, not with sequence parallelism."""
    return (ctx.distribute_saved_activations and lay.recompute == "full" and lay.tp > 1
            and not lay.sequence_parallel)


def zero3_gather_unit(ctx: EstimateContext, lay: Layout, params: ParamsEstimate) -> int:
    """Parameters of the largest unit a ZeRO-3 rank gathers (and holds gradients of) at once: DeepSpeed
    gathers module by module (estimate/engines.py), Megatron FSDP a transformer layer at a time."""
    if ctx.engine != "deepspeed":
        return params.largest_layer_per_gpu
    return largest_module_per_rank(ctx.shape, lay.tp, params.padded_vocab_size)


def _activations(ctx: EstimateContext, lay: Layout, params: ParamsEstimate) -> ActivationsEstimate:
    """Activations of one rank: s/cp tokens per sequence (context parallelism), MoE layers' routed rows."""
    acts = estimate_activations(rank_shape(ctx.shape, lay.cp), lay.tp, lay.pp, lay.vpp, lay.sequence_parallel,
                                lay.recompute, lay.micro_batch_size, num_microbatches(ctx, lay),
                                params.padded_vocab_size, ctx.hw.dtype_bytes, split_of(ctx, lay),
                                distributed_saved_input(ctx, lay))
    if ctx.shape.moe is None and ctx.precision != "fp8" and not ctx.shape.recompute_modules:
        return acts
    return _adjusted_activations(acts, ctx.shape, layer_key(lay), ctx.hw.dtype_bytes, ctx.precision,
                                 ctx.gpu != "cpu")


@lru_cache(maxsize=65536)
def _adjusted_activations(acts: ActivationsEstimate, shape: ModelShape, key: LayerKey, dtype_bytes: int,
                          precision: str, fused_norms: bool = True) -> ActivationsEstimate:
    """MoE layers' routed rows instead of a dense MLP's; FP8 GEMM inputs kept in fp8; what the recompute
    modules no longer store (estimate/recompute.py; ``fused_norms``: the Transformer Engine layer, GPUs)."""
    extra = (moe_activation_scale(shape, key, acts.per_layer_bytes, dtype_bytes) - 1) * acts.per_layer_bytes
    working = 0.0
    if shape.recompute_modules and key.recompute != "full":
        saved = module_savings(shape, key.tp, key.cp, key.ep, key.etp, key.mb, key.sp, dtype_bytes, fused_norms)
        extra -= saved.stored_bytes
        working = max(0.0, saved.working_bytes - acts.working_bytes)
    if precision == "fp8":
        rs = rank_shape(shape, key.cp)
        extra -= fp8_saved_activation_bytes(rs, key.tp, key.sp, key.mb, key.recompute, dtype_bytes)
        if shape.moe is not None and key.recompute != "full" and "moe" not in shape.recompute_modules:
            work = expert_work(shape, key.tp, key.cp, key.ep, key.etp, key.mb)
            extra -= shape.num_moe_layers / shape.num_layers * fp8_saved_moe_mlp_bytes(
                work.routed_rows, shape.hidden_size, shape.moe.expert_ffn / key.etp, rs.seq_length * key.mb,
                shape.ffn_hidden_size, key.tp, key.sp, dtype_bytes)
    if extra == 0 and working == 0:
        return acts
    middle = acts.middle_stage_bytes + extra * acts.middle_stage_layers_in_flight + working if acts.middle_stage_bytes else 0
    return dataclasses.replace(
        acts, first_stage_bytes=int(acts.first_stage_bytes + extra * acts.first_stage_layers_in_flight + working),
        last_stage_bytes=int(acts.last_stage_bytes + extra * acts.last_stage_layers_in_flight + working),
        middle_stage_bytes=int(middle), working_bytes=int(acts.working_bytes + working))


def for_layout(ctx: EstimateContext, lay: Layout) -> EstimateContext:
    """The context whose shape recomputes the layout's modules (Layout.recompute_modules; planner candidates
    may try other module sets than the spec's); ``ctx`` itself when the layout names none."""
    if lay.recompute_modules is None:
        return ctx
    fields = {"recompute_modules": tuple(m for m in lay.recompute_modules if m != "core_attn"),
              "recompute_core_attn": "core_attn" in lay.recompute_modules}
    if all(getattr(ctx.shape, k) == v for k, v in fields.items()):
        return ctx
    return _context_with(ctx, **fields)


@lru_cache(maxsize=256)
def _context_with(ctx: EstimateContext, **fields) -> EstimateContext:
    return dataclasses.replace(ctx, shape=dataclasses.replace(ctx.shape, **fields))


def estimate(ctx: EstimateContext, lay: Layout) -> LayoutEstimate:
    """The estimate of a complete, rule-abiding layout (no checks: the planner's entry)."""
    ctx = for_layout(ctx, lay)
    shape, hw, cost = ctx.shape, ctx.hw, ctx.cost
    m = num_microbatches(ctx, lay)
    params = params_of(ctx, lay)
    memory = estimate_memory(ctx, lay, params, stage_totals=True)
    timing = step_timing(ctx, lay, params)
    flops = estimate_flops(shape, ctx.global_batch, lay.recompute, full_recompute_share(shape, lay))
    step = timing.step_time_s
    world = hw.world_size
    tflops = flops.model_flops / (step * world) / 1e12
    return LayoutEstimate(
        layout=lay, engine=ctx.engine, num_microbatches=m, memory=memory, flops=flops, step_time_s=step,
        tokens_per_s=ctx.global_batch * shape.seq_length / step, tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / hw.peak_flops, hfu=flops.hardware_flops / (step * world) / hw.peak_flops,
        bubble_fraction=bubble_fraction(lay.pp, m, lay.vpp), comm=timing.comm, breakdown=timing.breakdown,
        host_wait_s=timing.host_wait_s,
        uncertainty=layout_uncertainty(regime_of(ctx.engine, hw.name, lay.pp, lay.zero_stage,
                                                 moe=shape.moe is not None, cp=lay.cp),
                                       calibrated=cost != CostModel()))


@dataclass(frozen=True)
class StepTiming:
    step_time_s: float
    comm: CommEstimate
    breakdown: StepBreakdown
    # Of breakdown.compute_s (not added to the step again): the time the slowest stage's GPU waits for the host
    # to launch its layers' kernels (layer.py RankLayer.host_wait_s: eager PyTorch, one launch per operator at
    # moe.HOST_OP_S; a MoE layer's per-expert launches and the dispatcher's sync), over its micro-batches.
    host_wait_s: float = 0.0


@dataclass(frozen=True)
class StageTimes:
    """Compute time per micro-batch of each kind of pipeline stage, and which one paces the pipeline."""

    slowest_s: float          # the slowest stage's time per micro-batch
    mean_s: float             # mean over all stages
    slowest_layers: int       # layers of the slowest stage


def stage_times(split: StageSplit, per_layer_s: float, head_s: float, embedding_s: float) -> StageTimes:
    """Per-micro-batch compute of the first (c_0 layers + embedding), middle (c layers) and last
    (c_{p-1} layers + output layer and loss) stage; pp = 1: everything on one stage."""
    pp = split.pp
    if pp == 1:
        total = split.first * per_layer_s + head_s + embedding_s
        return StageTimes(total, total, split.first)
    stages = [(split.first * per_layer_s + embedding_s, split.first), (split.last * per_layer_s + head_s, split.last)]
    if pp > 2:
        stages.append((split.middle * per_layer_s, split.middle))
    slowest, layers = max(stages, key=lambda t: t[0])
    mean = split.num_layers / pp * per_layer_s + (head_s + embedding_s) / pp
    return StageTimes(slowest, mean, layers)


def step_timing(ctx: EstimateContext, lay: Layout, params: ParamsEstimate | None = None) -> StepTiming:
    """Step time of a layout, with its communication and breakdown."""
    shape, hw, cost = ctx.shape, ctx.hw, ctx.cost
    params = params or params_of(ctx, lay)
    split = split_of(ctx, lay)
    tp, pp, vpp, mb = lay.tp, lay.pp, lay.vpp, lay.micro_batch_size
    m = num_microbatches(ctx, lay)
    rl = rank_layer_of(ctx, lay)
    layer = rl.time
    rshape = rank_shape(shape, lay.cp)
    tokens = rshape.seq_length * mb
    tp_pl = group_placement(tp, 1, hw.gpus_per_node)
    tp_bytes, tp_s = tensor_parallel_layer_comm(tokens=tokens, hidden=shape.hidden_size, pl=tp_pl,
                                                sp=bool(lay.sequence_parallel), full_recompute=lay.recompute == "full",
                                                hw=hw)
    if distributed_saved_input(ctx, lay):   # the backward's all-gather of the split input, before the recompute
        full_input = tokens * shape.hidden_size * hw.dtype_bytes
        tp_bytes, tp_s = tp_bytes + ring_bytes(full_input, tp, "all_gather"), tp_s + all_gather_s(full_input, tp_pl, hw)
    tp_exposed = tp_exposed_per_layer_s(ctx, lay, rshape, tokens, tp_pl, tp_s)
    slow = straggler_factor(hw.world_size, cost.gpu_speed_spread)
    head = slow * head_time_s(rshape, hw, tp, mb, params.padded_vocab_size)
    emb = slow * embedding_time_s(rshape, hw, tp, mb, params.padded_vocab_size)
    overlap = uses_ep_overlap(ctx, lay)
    # the other micro-batch's GPU work hides the overlapped all-to-all; the GPU's wait for a host-bound layer's
    # launches (moe.py host_idle_s) hides it too, counted once
    ep_unpaired, ep_window = unpaired_share(pp, vpp, m), slow * (layer.total_s - rl.host_idle_s)
    ep_behind_compute = exposed_all_to_all_s(rl.ep_s, ep_window, overlap, ep_unpaired)
    # less the GPU time the layer waits for its host launches (moe.py host_idle_s): after the dispatcher's sync
    # the host launches the dispatch all-to-all first and the experts after it, so the transfer runs in that wait
    ep_exposed = max(0.0, ep_behind_compute - rl.host_idle_s)
    bf16_opt = uses_bf16_optimizer(ctx, lay)
    hp_layer, hp_emb, hp_head = hp_grad_copies_s(ctx, lay, params) if bf16_opt else (0.0, 0.0, 0.0)
    times = stage_times(split, slow * layer.total_s + tp_exposed + ep_exposed + rl.cp_exposed_s + hp_layer,
                        head + hp_head, emb + hp_emb)
    slowest, mean, stage_layers = times.slowest_s, times.mean_s, times.slowest_layers
    chunk_layers = stage_layers / vpp
    pp_bytes, pp_s, x_exposed, emb_sync = _pipeline_comm(
        ctx, lay, params, tokens, tp_pl, m, bf16_opt,
        (chunk_layers * slow * layer.forward_s, chunk_layers * slow * (layer.backward_s + layer.recompute_s)),
        combined_1f1b=overlap)
    # the overlapped exchanges of the warmup and flush are waited at once (no overlap_p2p_comm_warmup_flush)
    x_fill = (pp_s - emb_sync) / m if uses_p2p_overlap(ctx, lay) else x_exposed
    host_mb = cost.pipeline_microbatch_host_s if ds_pipeline_host_exposed(ctx.engine, pp) else 0.0
    pipe = pipeline_time_s(num_microbatches=m, pp=pp, vpp=vpp, slowest_stage_s=slowest, mean_stage_s=mean,
                           p2p_s=x_exposed + host_mb, fill_p2p_s=x_fill + host_mb)
    pipe_host_s = (m + (pp - 1) / vpp) * host_mb if host_mb else 0.0   # part of the pipeline's time
    rank, reduce_layers = _stage_holding_most_params(split, params)
    # DeepSpeed's pipeline engine reduces after the pipeline has drained: nothing to hide behind
    backward_window = 0.0 if ds_pipeline_reduces_after_flush(ctx.engine, pp) else \
        reduce_layers * (layer.backward_s + layer.recompute_s)
    work = _dp_work(ctx, lay, reduce_layers, m, reduce_layers * layer.forward_s, backward_window, bf16_opt)
    work = dataclasses.replace(work, **_interleaved_fields(ctx, lay, params, rank, reduce_layers, params.per_gpu))
    dp_comm = _gradient_sync(ctx, lay, lambda elements: dataclasses.replace(work, param_elements=elements),
                             params.per_gpu, reduce_layers)
    if work.chunk_shares and rank != 0:
        # Interleaved: stage 0 ends the pipeline with its chunk 0 reduction exposed whole
        # (comm.interleaved_reduce_exposed_s); the step waits for the most exposed stage.
        first = dataclasses.replace(work, layers=split.first, forward_window_s=split.first * layer.forward_s,
                                    backward_window_s=split.first * (layer.backward_s + layer.recompute_s),
                                    **_interleaved_fields(ctx, lay, params, 0, split.first,
                                                          params.first_stage_per_gpu))
        first_comm = _gradient_sync(ctx, lay, lambda elements: dataclasses.replace(first, param_elements=elements),
                                    params.first_stage_per_gpu, split.first)
        dp_comm = dataclasses.replace(dp_comm, exposed_s=max(dp_comm.exposed_s, first_comm.exposed_s))
    optimizer_s, offload_s = _optimizer_s(ctx, lay, params.per_gpu, m, reduce_layers)
    step_host_s = cost.ds_step_host_s if ctx.engine == "deepspeed" and hw.host_is_device else 0.0
    offload_host = offload_host_s(ctx, lay, reduce_layers) + zero12_copies_s(ctx, lay, params.per_gpu, m)
    if ctx.precision == "fp8":
        optimizer_s += weight_cast_s(params.per_gpu, hw)
    fetch_host_s = zero3_fetch_host_s(ctx, lay, reduce_layers, m) + zero3_persistent_regather_s(ctx, lay, reduce_layers)
    engine_s = pipe_host_s + (offload_host + step_host_s) + fetch_host_s
    tp_total = m * stage_layers * tp_s
    # the expert all-to-all the EP overlap hides behind the other micro-batch's compute takes SMs as well
    ep_hidden = m * stage_layers * (rl.ep_s - ep_behind_compute)
    pp_fill_s = (pp - 1) / vpp * (x_fill - x_exposed) if pp > 1 else 0.0   # overlapped exchanges waited in fill/drain
    pp_hidden = max(0.0, pp_s - emb_sync - m * x_exposed - pp_fill_s)     # ... and those hidden (uses_p2p_overlap)
    # NCCL's hidden collectives slow the GEMMs they share the SMs with (estimate/overlap.py); TE's TP overlap
    # sizes its GEMMs for the SMs its userbuffers leave (math_sm_count), the expert exchange keeps the SM share
    nccl_hidden = (dp_comm.time_s - dp_comm.exposed_s) + pp_hidden
    sm_share = min(1.0, cost.comm_channels / hw.num_sms)
    tp_hidden_total = m * stage_layers * max(0.0, tp_s - tp_exposed)
    contention = sm_share * (tp_hidden_total + ep_hidden) + contention_s(
        nccl_hidden, nccl_overlap_slowdown(layer_gemms(rshape, tp, tokens), _gemm_share(layer), hw,
                                           cost.comm_channels))
    step = (pipe + dp_comm.exposed_s + optimizer_s + offload_s + emb_sync + fetch_host_s + contention
            + offload_host + step_host_s)
    comm = CommEstimate(dp_bytes=dp_comm.bytes, tp_bytes=m * stage_layers * tp_bytes, pp_bytes=pp_bytes,
                        dp_s=dp_comm.time_s, tp_s=tp_total, pp_s=pp_s, dp_exposed_s=dp_comm.exposed_s,
                        dp_reduce_s=dp_comm.reduce_s,
                        tp_exposed_s=tp_total - tp_hidden_total,
                        pp_exposed_s=m * x_exposed + emb_sync + pp_fill_s,
                        ep_bytes=m * stage_layers * rl.ep_bytes, ep_s=m * stage_layers * rl.ep_s,
                        ep_exposed_s=m * stage_layers * ep_exposed,
                        cp_bytes=m * stage_layers * rl.cp_bytes, cp_s=m * stage_layers * rl.cp_s,
                        cp_exposed_s=m * stage_layers * rl.cp_exposed_s)
    fill = pipe - m * (slowest + x_exposed) - pipe_host_s - pp_fill_s
    breakdown = StepBreakdown(compute_s=m * (slowest - stage_layers * (tp_exposed + ep_exposed + rl.cp_exposed_s)),
                              bubble_s=fill, ep_exposed_s=comm.ep_exposed_s, cp_exposed_s=comm.cp_exposed_s,
                              tp_exposed_s=comm.tp_exposed_s, pp_exposed_s=comm.pp_exposed_s,
                              dp_exposed_s=dp_comm.exposed_s, optimizer_s=optimizer_s, offload_s=offload_s,
                              engine_s=engine_s, contention_s=contention)
    host_wait = m * stage_layers * slow * rl.host_wait_s
    return StepTiming(step_time_s=step, comm=comm, breakdown=breakdown, host_wait_s=host_wait)


def _gemm_share(layer) -> float:
    """Share of a layer's compute its GEMMs take (its forward's: the backward's mix is alike)."""
    return min(1.0, layer.matmul_forward_s / layer.forward_s) if layer.forward_s > 0 else 0.0


def _pipeline_comm(ctx: EstimateContext, lay: Layout, params: ParamsEstimate, tokens: int, tp_pl: Placement,
                   m: int, bf16_opt: bool, chunk_windows_s: tuple[float, float] = (0.0, 0.0),
                   combined_1f1b: bool = False) -> tuple[float, float, float, float]:
    """(bytes, time, exposed time per micro-batch, tied-embedding sync time) of a step's pipeline traffic:
    the stage boundary transfers and, with tied embeddings, the embedding gradient's all-reduce between the
    first and last stage; all 0 without pipeline parallelism. ``chunk_windows_s``: (forward, backward) compute
    of one model chunk for one micro-batch, what Megatron's overlapped exchanges hide behind
    (:func:`overlapped_p2p_exposed_s`); ``combined_1f1b``: the EP overlap merges each forward chunk with a
    backward one, and every steady-state exchange is exposed (see below)."""
    shape, hw, tp = ctx.shape, ctx.hw, lay.tp
    if lay.pp <= 1:
        return 0.0, 0.0, 0.0, 0.0
    inter = tp * lay.cp * lay.dp * lay.pp > hw.gpus_per_node
    one_bytes, one_s = pipeline_transfer(tokens=tokens, hidden=shape.hidden_size, tp_pl=tp_pl,
                                         sp=bool(lay.sequence_parallel), inter_node=inter, hw=hw)
    x = p2p_transfers_per_microbatch(ctx.engine, lay.vpp) * one_s
    exposed = (1 - ctx.cost.pp_overlap) * x
    if uses_p2p_overlap(ctx, lay):
        # With the EP all-to-all overlap (combined_1f1b) every steady-state exchange is exposed: Megatron-Core
        # runs each step as one merged forward + backward chunk pass (core_v0.16.1 pipeline_parallel/
        # combined_1f1b.py, model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run) that sends the
        # forward's output and the backward's input gradient only after its last layer, and the next merged step
        # first waits for both receives, where overlap_p2p_comm's separate passes leave a chunk to travel in.
        exposed = x if combined_1f1b else overlapped_p2p_exposed_s(one_s, lay.vpp, *chunk_windows_s)
    if ds_pipe_partitioned(ctx.engine, tp) and not lay.sequence_parallel:
        x = ds_partitioned_transfers_s(ds_pipe_hand_overs(ctx.engine_version), one_bytes, tp_pl, inter, hw)
        exposed = (1 - ctx.cost.pp_overlap) * x
    pp_bytes, pp_s, emb_sync = 2 * lay.vpp * m * one_bytes, m * x, 0.0
    if shape.tie_embeddings:
        # BF16_Optimizer reduces the fp32 copy of the tied gradient (engines.py)
        emb_bytes = params.padded_vocab_size * shape.hidden_size // tp * (4 if bf16_opt else hw.dtype_bytes)
        emb_sync = all_reduce_s(emb_bytes, Placement(2, 1, 2) if inter else Placement(2, 2, 1), hw)
        pp_bytes += ring_bytes(emb_bytes, 2, "all_reduce")
        pp_s += emb_sync
    return pp_bytes, pp_s, exposed, emb_sync


def uses_p2p_overlap(ctx: EstimateContext, lay: Layout) -> bool:
    """Megatron's interleaved schedule overlaps its stage exchanges with compute (--overlap-p2p-communication):
    Megatron-LM's default since 4eeff55d1f (2023-10-12, "Make overlap_p2p_comm the default"; the option since
    f9283c5a8a, 2023-05-31), and NeMo's MegatronCommOverlapCallback sets overlap_p2p_comm where pp > 1 and
    vp > 1 (batch_p2p_comm otherwise). Without interleaving, Megatron batches the exchange and waits for it."""
    return ctx.engine == "megatron" and lay.pp > 1 and lay.vpp > 1 and ctx.p2p_overlap


def overlapped_p2p_exposed_s(one_s: float, vpp: int, chunk_forward_s: float, chunk_backward_s: float) -> float:
    """Exposed p2p time per micro-batch of Megatron-Core's interleaved 1F1B with overlap_p2p_comm
    (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving, steady state): after a
    chunk's forward, ``send_forward_recv_forward`` is posted asynchronously and waited in the next forward's
    ``pp_pre_forward``, so it runs behind one chunk's backward; the ``send_backward_recv_backward`` posted
    after the backward is waited before the next backward, behind one chunk's forward. Each of the v chunks of
    a micro-batch: what a transfer takes beyond its window."""
    return vpp * (max(0.0, one_s - chunk_backward_s) + max(0.0, one_s - chunk_forward_s))


def _dp_work(ctx: EstimateContext, lay: Layout, layers: int, m: int, forward_window_s: float,
             backward_window_s: float, bf16_opt: bool) -> DataParallelWork:
    """The DataParallelWork of a stage of ``layers`` layers (param_elements 0: _gradient_sync sets it)."""
    engine, dtype_bytes = ctx.engine, ctx.hw.dtype_bytes
    ds_zero3 = engine == "deepspeed" and lay.zero_stage == 3
    return DataParallelWork(
        engine=engine, zero_stage=sharding_stage(ctx, lay), param_elements=0.0, param_bytes=dtype_bytes,
        grad_bytes=ctx.grad_reduce_bytes(lay.cp), layers=layers,
        num_microbatches=m, full_recompute=lay.recompute == "full", forward_window_s=forward_window_s,
        backward_window_s=backward_window_s, backward_gather_passes=ds_backward_gather_passes(ctx, lay, layers),
        bucket_all_reduce=engine == "deepspeed" and (ds_bucket_all_reduce(ctx.engine_version, lay.zero_stage)
                                                     or bf16_opt),
        zero3=ds_zero3_runtime(ctx.engine_version) if ds_zero3 else None, rank_host_s=ctx.cost.ds_list_rank_host_s,
        modules=ds_layer_modules(ctx.shape, lay.tp) if ds_zero3 else ())


# Layouts that differ only in what the DP traffic does not see (splits, and interleaving outside
# uses_interleaved_dp_sync) share its cost.
_data_parallel_comm = lru_cache(maxsize=65536)(data_parallel_comm)
_hybrid_data_parallel_comm = lru_cache(maxsize=4096)(hybrid_data_parallel_comm)


def _gradient_sync(ctx: EstimateContext, lay: Layout, work, elements: float, layers: int) -> DataParallelComm:
    """Gradient reduction (and parameter gathers) of a step: dense weights over dp x cp, routed experts over
    the expert-data-parallel group (edp ranks, etp * ep apart: expert ranks are ordered etp -> ep -> edp).
    ``work(elements)`` builds the DataParallelWork of that many parameters."""
    gpn, cost, hw = ctx.hw.gpus_per_node, ctx.cost, ctx.hw
    expert = _expert_elements(ctx, lay, elements, layers)
    overlap = dp_overlap_fraction(cost, hw)
    if lay.replicas > 1:
        dense = _hybrid_data_parallel_comm(work(elements - expert), *shard_placements(lay, gpn), overlap, hw)
    else:
        dense = _data_parallel_comm(work(elements - expert), group_placement(grad_sync_size(lay), lay.tp, gpn),
                                    overlap, hw)
    if not expert:
        return dense
    if lay.replicas > 1:      # Megatron splits the expert-data-parallel group into as many instances
        shard = lay.edp // lay.replicas
        experts = _hybrid_data_parallel_comm(work(expert), group_placement(shard, lay.etp * lay.ep, gpn),
                                             group_placement(lay.replicas, lay.etp * lay.ep * shard, gpn), overlap, hw)
    else:
        experts = _data_parallel_comm(work(expert), group_placement(lay.edp, lay.etp * lay.ep, gpn), overlap, hw)
    return DataParallelComm(*(getattr(dense, f) + getattr(experts, f) for f in
                              ("bytes", "time_s", "exposed_s", "reduce_s", "calls")))


def dp_overlap_fraction(cost: CostModel, hw: Hardware) -> float:
    """Share of a compute window that DP collectives hide behind. None on CPU processes: DeepSpeed's CPU
    accelerator is a synchronized device (deepspeed/accelerator/cpu_accelerator.py is_synchronized_device()
    is True; its streams are no-ops), so overlap_comm's side stream runs each gloo collective inline on the
    rank's own thread, and every core already computes for a rank (OMP_NUM_THREADS=1 per rank, torchrun)."""
    return 0.0 if hw.host_is_device else cost.dp_overlap


def p2p_transfers_per_microbatch(engine: str, vpp: int) -> int:
    """Exposed pipeline transfers per micro-batch on a stage's critical path. Megatron's 1F1B sends the
    activation forward and receives the gradient in one batched exchange (p2p_communication.py:
    send_forward_recv_backward / send_backward_recv_forward), one each way per chunk: 2v. DeepSpeed's
    pipeline engine runs SendActivation, RecvActivation, SendGrad and RecvGrad as separate blocking
    instructions (deepspeed/runtime/pipe/schedule.py TrainSchedule, engine.py _exec_send_activations ...):
    4, none overlapped. tests/unit/test_ds_pipeline.py runs TrainSchedule's commands (v0.5.8 and v0.16.4
    orders) with blocking transfers: the same time within 3% (the fill and drain cross each boundary with
    fewer). The tensor meta exchange (_send_tensor_meta) runs on the first batch only (first_output_send);
    with tp > 1 each hand-over is a PartitionedTensor instead, its own meta tensor sent every micro-batch
    (ds_runtime.ds_partitioned_transfers_s)."""
    return 4 if engine == "deepspeed" else 2 * vpp


def uses_interleaved_dp_sync(ctx: EstimateContext, lay: Layout) -> bool:
    """Megatron-Core syncs gradients and parameters chunk by chunk: the interleaved schedule (pp > 1,
    vpp > 1) with DDP or the distributed optimizer (Megatron FSDP, zero_stage 2-3, has its own per-layer
    hooks: megatron_fsdp.py); see comm.interleaved_reduce_exposed_s."""
    return ctx.engine == "megatron" and lay.pp > 1 and lay.vpp > 1 and sharding_stage(ctx, lay) <= 1


def _interleaved_fields(ctx: EstimateContext, lay: Layout, params: ParamsEstimate, rank: int, layers: int,
                        elements: int) -> dict:
    """DataParallelWork's chunk_shares / pp_size / stage_rank of a stage of ``layers`` layers holding
    ``elements`` parameters per GPU: the layers split evenly over its vpp model chunks, what is not a layer
    (the embedding on stage 0, the final norm and output layer on the last) in the chunk that holds it:
    chunk 0 of stage 0 (the first virtual stage), chunk vpp-1 of the last stage (the last virtual stage).
    {} when the sync is not chunked (:func:`uses_interleaved_dp_sync`)."""
    if not uses_interleaved_dp_sync(ctx, lay) or elements <= 0:
        return {}
    v = lay.vpp
    layer_part = min(float(elements), layers * layer_params_per_rank(ctx.shape, lay.tp, lay.ep, lay.etp))
    rest = elements - layer_part
    shares = [layer_part / v / elements] * v
    if rank == 0:
        shares[0] += rest / elements
    elif rank == lay.pp - 1:
        shares[-1] += rest / elements
    else:                        # a middle stage holds layers only: spread what the count rounds away
        shares = [x + rest / elements / v for x in shares]
    return {"chunk_shares": tuple(shares), "pp_size": lay.pp, "stage_rank": rank}


def _stage_holding_most_params(split: StageSplit, params: ParamsEstimate) -> tuple[int, int]:
    """(pipeline rank, layers) of the stage whose gradients the DP reduction carries (params.per_gpu): its
    backward is the window the reduction overlaps with. First stage 0, last pp - 1, a middle stage 1 (the middle
    stage that ends its cooldown latest, for the interleaved sync: comm.interleaved_reduce_exposed_s)."""
    held = {params.first_stage_per_gpu: (0, split.first), params.last_stage_per_gpu: (split.pp - 1, split.last)}
    if split.pp > 2:
        held.setdefault(params.middle_stage_per_gpu, (1, split.middle))
    return held.get(params.per_gpu, (0, split.first))


def uses_tp_comm_overlap(hw: Hardware, lay: Layout) -> bool:
    """--tp-comm-overlap applies: sequence parallelism over tp > 1 on a GPU whose TE can overlap."""
    return bool(lay.sequence_parallel) and lay.tp > 1 and hw.tp_comm_overlap


def tp_overlap_fraction(cost: CostModel, hw: Hardware, lay: Layout) -> float:
    """Share of the tensor-parallel collectives hidden behind compute (without a per-GEMM model)."""
    return cost.tp_comm_overlap if uses_tp_comm_overlap(hw, lay) else cost.tp_overlap


def tp_exposed_per_layer_s(ctx: EstimateContext, lay: Layout, rshape: ModelShape, tokens: int, tp_pl: Placement,
                           tp_s: float) -> float:
    """Exposed TP communication of one layer for one micro-batch. Dense layers under --tp-comm-overlap: Transformer
    Engine's userbuffers, GEMM by GEMM (estimate/tp_overlap.py); MoE layers (their experts' collectives are not
    the fc1 / fc2 userbuffers) and no overlap: the share of CostModel (tp_comm_overlap, tp_overlap)."""
    cost, hw = ctx.cost, ctx.hw
    if not uses_tp_comm_overlap(hw, lay) or rshape.moe is not None:
        return (1 - tp_overlap_fraction(cost, hw, lay)) * tp_s
    fp8 = ctx.precision == "fp8"
    gemm_hw = fp8_gemm_hardware(hw, ctx.gpu) if fp8 else hw
    return min(tp_s, userbuffers_exposed_s(rshape, lay.tp, tokens, tp_pl, hw, gemm_hw, fp8,
                                           recomputed_forward=lay.recompute == "full"))


def _optimizer_s(ctx: EstimateContext, lay: Layout, stage_params: int, m: int, layers: int) -> tuple[float, float]:
    """(optimizer step, per-step parameter fetch) time; offload runs Adam on the CPU over PCIe. With ZeRO
    the dense states are sharded over dp x cp, the routed experts' over the expert-data-parallel group
    (as :func:`model_states` holds them)."""
    hw = ctx.hw
    expert = _expert_elements(ctx, lay, stage_params, layers)
    owned = ((stage_params - expert) / shard_group_size(lay) + expert / (lay.edp // lay.replicas)) \
        if sharding_stage(ctx, lay) >= 1 \
        else stage_params
    if lay.offload == "none":
        # On CPU orch writes torch_adam (render/deepspeed.py): PyTorch's unfused single-tensor Adam.
        return _adam_s(ctx, owned) + _grad_buffer_zero_s(ctx, lay, stage_params, owned), 0.0
    pcie = 2 * hw.dtype_bytes * owned / hw.host_Bps          # gradients down, parameters up
    adam = owned / ctx.cost.cpu_adam_params_per_s if ctx.gpu != "cpu" else _adam_s(ctx, owned)
    fetch = 0.0
    if lay.offload == "optimizer+params":                     # every forward and backward reads them back
        fetch = m * (3 if lay.recompute == "full" else 2) * hw.dtype_bytes * owned / hw.host_Bps
    return adam + pcie, fetch


def _adam_s(ctx: EstimateContext, owned: float) -> float:
    """The Adam step over ``owned`` parameters on the device: fused on a GPU; on CPU PyTorch's single-tensor
    Adam, at the rate `orch doctor` timed where --measured gives one (CostModel.optimizer_params_per_s)."""
    if ctx.gpu == "cpu" and ctx.cost.optimizer_params_per_s:
        return owned / ctx.cost.optimizer_params_per_s
    return optimizer_step_s(owned, ctx.hw, fused=ctx.gpu != "cpu")


def _grad_buffer_zero_s(ctx: EstimateContext, lay: Layout, stage_params: float, owned: float) -> float:
    """Megatron's distributed optimizer (ZeRO-1/2) zeroes the whole local gradient buffer every step, not only the
    owned shard optimizer_step_s counts (core distributed_data_parallel.py zero_grad_buffer: each bucket group's
    ``grad_data.zero_()``), in the gradient's reduce dtype (grad_reduce_bytes; docs/cost-model.md)."""
    if ctx.engine != "megatron" or sharding_stage(ctx, lay) not in (1, 2):
        return 0.0
    element = ctx.grad_reduce_bytes(lay.cp)
    return element * max(0.0, stage_params - owned) / ctx.hw.hbm_Bps
