"""What each training engine does that the cost model counts: bucket sizes, gather units, gradient dtype, and
what each DeepSpeed release does differently (:class:`Zero3Runtime`). The DeepSpeed numbers are the ones orch
writes into ds_config.json (render/deepspeed.py imports them from here); the Megatron ones are Megatron-Core
0.16.1's defaults for the flags orch emits.

Each figure's source, release by release: docs/cost-model.md, "estimate/engines.py".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..releases import ds_version

DS_FLAT_GATHERS_SINCE = (0, 5, 5)          # _all_gather_base instead of a list of n views (#1188)
DS_ASYNC_COALESCED_FETCH_SINCE = (0, 6, 0)  # per-module coalesced gathers, no host synchronize (#1453)
DS_ZERO3_CONTIGUOUS_GRADIENTS_SINCE = (0, 4, 3)   # contiguous_gradients on by default for ZeRO-3 (#1199)
DS_LEGACY_PREFETCH_BUCKET_ELEMENTS = 50_000_000   # stage3_prefetch_bucket_size default, 0.3.12-0.5.x constants.py
# ZeRO-1/2 reduce their gradient buckets with all_reduce since DeepSpeed 0.12.4 (PR #4695, "Communication
# Optimization for Large-Scale Training": ``zero_optimization.use_multi_rank_bucket_allreduce``, default
# true, sends ``average_tensor`` through ``allreduce_and_scatter``; issue #7059 logs ``comm op: all_reduce``
# with ``reduce_scatter: true``). Before, one reduce per partition owner: a reduce-scatter's volume.
DS_BUCKET_ALL_REDUCE_SINCE = (0, 12, 4)
# ZeRO-1 all-reduces its gradients in every release since 0.4.4, and not only from 0.12.4: PR #1246 ("ignore
# overlap/contiguous_gradients if using zero 1", v0.4.4) makes engine.py _configure_zero_optimizer force
# ``contiguous_gradients = False`` for stage 1, so ``reduce_ipg_grads`` takes ``buffered_reduce_fallback(None,
# ...)`` -> ``allreduce_and_copy`` -> ``allreduce_bucket``: ``dist.all_reduce`` of each flattened bucket of up to
# reduce_bucket_size elements, every rank reducing the full gradient (runtime/zero/stage2.py v0.5.4,
# stage_1_and_2.py v0.5.10-v0.12.6). PR #4887 (v0.13.0) lifts the restriction; by then the contiguous path
# all-reduces too (DS_BUCKET_ALL_REDUCE_SINCE).
DS_ZERO1_FALLBACK_ALL_REDUCE_SINCE = (0, 4, 4)
# Where the host is the device (CPU target, DeepSpeed's synchronous CPU accelerator) the ZeRO-1/2 buffer
# copies sit on the critical path. Counted in DeepSpeed 0.19.8's ``runtime/zero/stage_1_and_2.py``, each a
# read and a write: per micro-batch over the full gradient, the hook's copy into the contiguous bucket, the
# ``div_`` by the DP size in ``average_tensor`` and the flatten in ``allreduce_and_copy_with_multiple_ranks``
# (3); per step over the rank's fp32 partition, the copy back of the reduced slice, the copy into the fp32
# gradient partition, the clip (``unscale_and_clip_grads``) and the copy of the updated fp32 partition into
# the parameters (4), plus one read for the gradient norm.
DS_FULL_GRAD_COPIES = 3
DS_PARTITION_COPIES = 4
DS_REDUCE_BUCKET_ELEMENTS = 500_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000   # stage3_max_reuse_distance (and max_live_parameters) orch writes
# stage3_max_live_parameters' default in every release with ZeRO-3 (constants.py, v0.3.12-v0.5.10: 1e9):
# the pre-0.6 prefetch is skipped while this many elements are gathered (ds_zero3_fetch_schedule) ...
DS_LEGACY_MAX_LIVE_PARAMETERS = 1_000_000_000
# ... as the coordinator counts them, and its count loses the resident parameters at every step (stage3.py
# v0.3.12-v0.5.10): backward() ends in _partition_all_parameters, whose release_and_reset_parameter
# decrements total_available_parameter_numel for every parameter still gathered, the resident ones (biases,
# norms: ds_persist) included, which no fetch ever counted in (fetch_sub_module counts only NOT_AVAILABLE
# parameters; _post_step gathers the resident ones back through param.all_gather, outside the coordinator).
# The gate compares a counter that falls by the resident elements every step: 13h per GPT layer, 2.8e7 for
# the 530B model, whose gated schedule is its ungated one from the 25th step (tests/unit/test_estimate_comm.py).
# A training run's step is the steady state: the gate never closes (ds_zero3_runtime: max_live_elements 0).
DS_GATHERS_PER_LAYER = 4
MEGATRON_FSDP_GATHERS_PER_LAYER = 1


def ds_prefetch_bucket_elements(hidden: int) -> int:
    return int(0.9 * hidden * hidden)


def ds_param_persistence_threshold(hidden: int) -> int:
    return 10 * hidden


def megatron_ddp_bucket_elements(dp: int) -> int:
    return max(40_000_000, 1_000_000 * dp)


def reduce_bucket_elements(engine: str, dp: int) -> int:
    """Gradient elements per reduction call."""
    return megatron_ddp_bucket_elements(dp) if engine == "megatron" else DS_REDUCE_BUCKET_ELEMENTS


def gathers_per_layer(engine: str) -> int:
    """ZeRO-3 parameter all-gathers per transformer layer and pass."""
    return MEGATRON_FSDP_GATHERS_PER_LAYER if engine == "megatron" else DS_GATHERS_PER_LAYER


def param_tensors_per_layer(bias: bool, rmsnorm: bool) -> int:
    """Parameter tensors of one transformer layer: 4 linear modules (QKV, attention output, MLP in, MLP out),
    weight and bias each, and 2 norms (weight and bias; RMSNorm only a weight). DeepSpeed's offload path
    walks them one by one in Python (CostModel.offload_tensor_host_s)."""
    return DS_GATHERS_PER_LAYER * (2 if bias else 1) + 2 * (1 if rmsnorm else 2)


@dataclass(frozen=True)
class TrainerModules:
    """What DeepSpeed ZeRO-3's module hooks meet in orch's reference trainer (orchestrator/train/model.py
    GPT, the DeepSpeed model code that runs on the CPU target): ZeRO-3 registers its forward and backward
    hooks on every submodule (runtime/zero/parameter_offload.py ``_register_deepspeed_module`` walks
    ``module.children()`` recursively), so each called module costs a hook pass, the containers too, and
    only those holding a tensor over ``stage3_param_persistence_threshold`` gather
    (:func:`reference_trainer_modules`)."""

    gathered_per_layer: int     # modules of a block whose weight is partitioned: q, kv, out, fc1, fc2
    hooked_per_layer: int       # called modules of a block that gather nothing: Block, norm1, attn, norm2, mlp
    gathered_outside: int       # the word embedding, the learned positions, the untied output layer
    hooked_outside: int         # the GPT root, FinalNorm and its norm (and a rope run's parameterless pos)
    resident_per_layer: int     # tensors of a block under the persistence threshold (biases, norms)
    resident_outside: int       # the final norm's
    tensors_per_layer: int      # parameter tensors of a block (what the offload path walks one by one)

    @property
    def tensors_outside(self) -> int:
        """Parameter tensors outside the blocks: the embeddings', the output layer's and the final norm's."""
        return self.gathered_outside + self.resident_outside


def reference_trainer_modules(h: int, bias_widths: tuple[int, ...], rmsnorm: bool, learned_positions: bool,
                              tie_embeddings: bool) -> TrainerModules:
    """The :class:`TrainerModules` of a dense reference-trainer GPT: each block is Block(norm1, Attention(q,
    kv, out), norm2, MLP(fc1, fc2)); ``bias_widths`` are the five Linear biases' widths (empty without
    biases), resident where under ZeRO-3's persistence threshold (ds_param_persistence_threshold, which
    render/deepspeed.py writes), like each norm tensor (weight, and bias unless RMSNorm)."""
    threshold = ds_param_persistence_threshold(h)
    norm_tensors = 1 if rmsnorm else 2
    return TrainerModules(
        gathered_per_layer=5, hooked_per_layer=5,
        gathered_outside=1 + (1 if learned_positions else 0) + (0 if tie_embeddings else 1),
        hooked_outside=3 + (0 if learned_positions else 1),
        resident_per_layer=sum(1 for w in bias_widths if w <= threshold) + 2 * norm_tensors,
        resident_outside=norm_tensors, tensors_per_layer=5 + len(bias_widths) + 2 * norm_tensors)


GRAD_REDUCE_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# DeepSpeed 0.19.8 reduces a Ulysses run's gradients in ``seq_parallel_communication_data_type`` (engine.py
# ``_configure_distributed_model``: with sequence_parallel_size > 1 it replaces communication_data_type), whose
# default is "fp32" (runtime/constants.py SEQ_PARALLEL_COMMUNICATION_DATA_TYPE_DEFAULT, set unconditionally
# after the NCCL-version branch). Releases before 0.19.8 are not read here: they keep the plain rule.
DS_SEQ_PARALLEL_FP32_SINCE = (0, 19, 8)


def default_grad_reduce_dtype(engine: str, precision: str, cp: int = 1, engine_version: str | None = None) -> str:
    """The dtype the engine reduces gradients in across data parallelism when training.grad_reduce_dtype is
    null, for the flags orch writes. Megatron-LM core_v0.16.1 (megatron/training/arguments.py): ``--bf16``
    (orch's bf16 and fp8 runs) turns ``accumulate_allreduce_grads_in_fp32`` on unless ``--grad-reduce-in-bf16``,
    and DistributedDataParallel keeps the gradient buffer in fp32 with it (``grad_reduce_in_fp32``,
    training.py); ``--fp16`` leaves it off (fp16 gradients) unless ``--accumulate-allreduce-grads-in-fp32``.
    Megatron FSDP takes the same ``grad_reduce_in_fp32``. DeepSpeed 0.19.8 (engine.py
    ``communication_data_type``): the config's ``communication_data_type``, else fp16 with fp16, bf16 with
    bf16, fp32 otherwise; a Ulysses run (cp > 1) fp32 (DS_SEQ_PARALLEL_FP32_SINCE)."""
    if precision == "fp32":
        return "fp32"
    if engine == "megatron":
        return "fp16" if precision == "fp16" else "fp32"
    if cp > 1 and ds_version(engine_version) >= DS_SEQ_PARALLEL_FP32_SINCE:
        return "fp32"
    return "fp16" if precision == "fp16" else "bf16"


def resolved_grad_reduce_dtype(engine: str, precision: str, asked: str | None, cp: int = 1,
                               engine_version: str | None = None) -> str:
    """training.grad_reduce_dtype, or the engine's default (:func:`default_grad_reduce_dtype`)."""
    return asked or default_grad_reduce_dtype(engine, precision, cp, engine_version)


def grad_reduce_bytes(engine: str, precision: str, asked: str | None = None, cp: int = 1,
                      engine_version: str | None = None) -> int:
    """Bytes per gradient element on the wire: the resolved training.grad_reduce_dtype's (Megatron reduces
    bf16 and fp8 runs' gradients in fp32 by default)."""
    return GRAD_REDUCE_DTYPE_BYTES[resolved_grad_reduce_dtype(engine, precision, asked, cp, engine_version)]


@dataclass(frozen=True)
class FetchEvent:
    """One module use of a DeepSpeed ZeRO-3 micro-batch (:func:`ds_zero3_fetch_schedule`)."""

    phase: str                  # "f" forward, "r" recomputed forward, "b" backward
    elements: int               # the module's parameters (its share of the pass's compute)
    waits: bool                 # its fetch waits for the gathers in flight (its own, or a synchronous one)
    gathered: int               # elements its fetch gathers synchronously (0: kept, or prefetched)
    prefetched: tuple[int, ...] = ()   # elements of each gather the prefetch after its fetch launches


@lru_cache(maxsize=1024)
def ds_zero3_fetch_schedule(module_elements: tuple[int, ...], layers: int, full_recompute: bool,
                            max_reuse: int = DS_MAX_REUSE_DISTANCE, max_live: int = 0,
                            prefetch_elements: int = 0) -> tuple[FetchEvent, ...]:
    """What DeepSpeed ZeRO-3's PartitionedParameterCoordinator does at every module use of one micro-batch.

    The trace: the layers' modules (``module_elements`` in forward order) forward; backward from the last
    layer, each layer recomputing its forward first when ``full_recompute``, then its modules in reverse.
    At each use the module's parameters are fetched (gathered synchronously unless kept or in flight; a
    fetch of parameters in flight waits for every gather in flight: ``_synchronize_communication``), then,
    with ``prefetch_elements``, the prefetch runs, only if no gather is in flight and (``max_live`` > 0) fewer
    than ``max_live`` elements are gathered (``prefetch_next_sub_modules``: ``not self.in_flight_handles and
    self.total_available_parameter_numel < self.max_available_parameters_in_numel``, v0.3.12-v0.5.x): it
    takes the next not-gathered modules of the trace until ``prefetch_elements``. After the use a module
    stays gathered when it is due again before ``max_reuse`` elements of other modules' parameters have run
    (``_keep_for_later``: the reuse distance walks the trace from the next step, counting parameters), else
    it is released. Every release since 0.3.12 keeps by that rule (stage3_max_reuse_distance, 1e9 by
    default); the live-parameter gate is the pre-0.6 prefetch's (the later coordinator caps a prefetch at
    the room left under max_live instead of skipping it)."""
    trace = _module_trace(len(module_elements), layers, full_recompute)
    elements = [module_elements[i] for _, i, _ in trace]
    prefix = [0]
    for e in elements:
        prefix.append(prefix[-1] + e)
    next_use = _next_uses(trace)
    status: dict[tuple[int, int], str] = {}          # absent: not gathered; "F" in flight; "A" gathered
    in_flight: list[tuple[int, int]] = []
    live, events = 0, []
    for t, (layer, i, phase) in enumerate(trace):
        unit, e = (layer, i), elements[t]
        state = status.get(unit)
        gathered = e if state is None else 0
        live += gathered
        waits = state != "A"
        if waits:
            for u in in_flight:
                status[u] = "A"
            in_flight = []
        status[unit] = "A"
        prefetched: list[int] = []
        if prefetch_elements and not in_flight and (max_live <= 0 or live < max_live):
            taken = 0
            for s in range(t + 1, len(trace)):
                u = trace[s][:2]
                if u not in status:
                    status[u] = "F"
                    in_flight.append(u)
                    prefetched.append(elements[s])
                    taken += elements[s]
                    if taken >= prefetch_elements:
                        break
            live += taken
        events.append(FetchEvent(phase, e, waits, gathered, tuple(prefetched)))
        nxt = next_use[t]
        if nxt is None or prefix[nxt] - prefix[t + 1] >= max_reuse:
            del status[unit]
            live -= e
    return tuple(events)


def _module_trace(k: int, layers: int, full_recompute: bool) -> list[tuple[int, int, str]]:
    """One micro-batch's module uses, (layer, module, phase) in order, for ``k`` modules a layer: every layer
    forward ("f"); then from the last layer, its recomputed forward ("r", with ``full_recompute``) and its
    modules in reverse ("b")."""
    trace = [(layer, i, "f") for layer in range(layers) for i in range(k)]
    for layer in reversed(range(layers)):
        if full_recompute:
            trace += [(layer, i, "r") for i in range(k)]
        trace += [(layer, i, "b") for i in reversed(range(k))]
    return trace


def _next_uses(trace: list[tuple[int, int, str]]) -> list[int | None]:
    """For each use of ``trace``, the position of the same module's next use (None: none follows)."""
    next_use: list[int | None] = [None] * len(trace)
    seen: dict[tuple[int, int], int] = {}
    for t in reversed(range(len(trace))):
        unit = trace[t][:2]
        next_use[t] = seen.get(unit)
        seen[unit] = t
    return next_use


@lru_cache(maxsize=1024)
def ds_backward_regather_share(module_elements: tuple[int, ...], layers: int, full_recompute: bool,
                               max_reuse: int = DS_MAX_REUSE_DISTANCE) -> float:
    """Backward all-gathers of DeepSpeed ZeRO-3 (every release: the reuse rule is the same since 0.3.12), in
    passes of the stage's parameters: the elements gathered by the backward's (and recompute's) uses of
    :func:`ds_zero3_fetch_schedule` over the stage's (1 without reuse and recompute, 2 with recompute and
    nothing kept)."""
    events = ds_zero3_fetch_schedule(module_elements, layers, full_recompute, max_reuse)
    return sum(ev.gathered for ev in events if ev.phase != "f") / (layers * sum(module_elements))


@dataclass(frozen=True)
class Zero3Runtime:
    """What a DeepSpeed release does per ZeRO-3 collective (docs/cost-model.md); all False: the current one."""

    synchronous_fetch: bool = False      # per-parameter gathers after torch.zeros + torch.cuda.synchronize()
    list_gathers: bool = False           # all-gather output as n views: per-rank host loop + n copies
    list_reduce_scatters: bool = False   # one reduce-scatter per parameter on n input views
    allreduce_gradients: bool = False    # bucketed all-reduce of full gradients (contiguous_gradients off)
    prefetch_elements: int = 0           # synchronous fetch: the release's default stage3_prefetch_bucket_size
    max_live_elements: int = 0           # synchronous fetch: the live-parameter gate (0: never closes)


@lru_cache(maxsize=64)
def ds_zero3_runtime(version: str | None) -> Zero3Runtime:
    """The ZeRO-3 behaviours of DeepSpeed ``version`` (None: DEEPSPEED_VERSION)."""
    v = ds_version(version)
    allreduce = v < DS_ZERO3_CONTIGUOUS_GRADIENTS_SINCE
    synchronous = v < DS_ASYNC_COALESCED_FETCH_SINCE
    return Zero3Runtime(synchronous_fetch=synchronous, list_gathers=v < DS_FLAT_GATHERS_SINCE,
                        list_reduce_scatters=not allreduce and synchronous, allreduce_gradients=allreduce,
                        prefetch_elements=DS_LEGACY_PREFETCH_BUCKET_ELEMENTS if synchronous else 0)


def ds_pipeline_reduces_after_flush(engine: str, pp: int) -> bool:
    """True where DeepSpeed's pipeline engine trains (deepspeed, pp > 1): its TrainSchedule appends
    ReduceTiedGrads, ReduceGrads and OptimizerStep to the commands of the schedule's last step, after the
    last BackwardPass (deepspeed/runtime/pipe/schedule.py TrainSchedule.steps, v0.3.x to v0.16.4 alike), and
    PipelineEngine turns the engine's backward-hook reduction off (pipe/engine.py __init__:
    ``enable_backward_allreduce = False``), and ZeRO's backward hooks stay off: the engine drops overlap_comm
    under pipeline parallelism ("Pipeline parallelism does not support overlapped communication, will be
    disabled", engine.py _configure_zero_optimizer, v0.16.4; before PR #4887 ZeRO-1 ignored overlap_comm
    altogether), so the overlap_comm orch writes for ZeRO-1 does not apply there. The data-parallel gradient
    reduction starts when the pipeline has drained and nothing overlaps it."""
    return engine == "deepspeed" and pp > 1


def ds_pipeline_host_exposed(engine: str, pp: int) -> bool:
    """Whether DeepSpeed's pipeline engine's per-micro-batch host work (CostModel.pipeline_microbatch_host_s)
    is on the critical path: always, on a GPU too. Every ForwardPass instruction starts with
    ``self.tput_timer.start()`` (pipe/engine.py _exec_forward_pass), and DeepSpeed's ThroughputTimer
    synchronizes the whole device there from the third step on (utils/timer.py ThroughputTimer.start:
    ``torch.cuda.synchronize()`` in v0.5.8; in v0.16.4 behind the timers config, ``enabled`` and
    ``synchronized`` both true by default, which orch does not change). So the host never runs a micro-batch
    ahead of the GPU. With tp > 1 the partitioned activations add more waits of the same kind: every
    forward and backward rebuilds them from a meta tensor with ``meta.tolist()`` (runtime/utils.py
    PartitionedTensor.from_meta)."""
    return engine == "deepspeed" and pp > 1


# DeepSpeed's pipeline engine with tensor parallelism hands activations over as ``PartitionedTensor``s
# (pipe/engine.py ``is_pipe_partitioned = is_model_parallel`` since v0.3; from v0.13 behind the
# ``pipeline.pipe_partitioned`` config key, true by default): the sender keeps its 1/tp slice (runtime/utils.py
# PartitionedTensor._partition_tensor) and sends two tensors, ``to_meta()`` (a LongTensor of 3 + ndim + tp + 1
# elements) and the slice; the receiver rebuilds the full tensor with ``full()``: a ``torch.zeros`` buffer and one
# all-gather over the tp group. Gradients are partitioned the same way from v0.5.4 (``is_grad_partitioned =
# is_model_parallel``, PR #1407 "Big science related changes", 2021-09-29; ``pipeline.grad_partitioned`` from
# v0.13); before, SendGrad sends the full gradient and RecvGrad receives it. Per micro-batch a middle stage runs
# (v0.5.3 and v0.5.4 _exec_forward_pass, _exec_backward_pass, _exec_send_*/_exec_recv_*), four blocking
# transfers in all (RecvActivation, SendActivation, RecvGrad, SendGrad):
# * v0.5.4 on: 4 slices, each after its meta tensor's own send/receive (latency-bound), and 3 tp all-gathers:
#   the received input (forward), and in the backward the stage's own output (its ``.data`` was freed after
#   partitioning and is re-gathered to restore the graph) and the received gradient; a send does not gather;
# * before: 2 slices with their metas (the activations), 2 full gradients, and 2 all-gathers (the received
#   input; the stage's own output, re-gathered at RecvGrad).
DS_PIPE_GRAD_PARTITIONED_SINCE = (0, 5, 4)
DS_PIPE_META_FIXED_ELEMENTS = 1 + 3 + 1 + 1   # ndim, the shape (3 dims), num_parts, rank; then tp + 1 bounds


@dataclass(frozen=True)
class PipeHandOvers:
    """What a middle stage of DeepSpeed's pipeline engine sends, receives and gathers per micro-batch (tp > 1)."""

    slices: int      # 1/tp slices sent or received, each with its meta tensor
    full: int        # full tensors sent or received (unpartitioned gradients)
    gathers: int     # tp all-gathers rebuilding a full tensor


def ds_pipe_partitioned(engine: str, tp: int) -> bool:
    """DeepSpeed's pipeline engine sends PartitionedTensors between stages (above): deepspeed with tp > 1."""
    return engine == "deepspeed" and tp > 1


def ds_pipe_hand_overs(version: str | None) -> PipeHandOvers:
    """The partitioned hand-overs of DeepSpeed ``version`` per micro-batch (above)."""
    if ds_version(version) >= DS_PIPE_GRAD_PARTITIONED_SINCE:
        return PipeHandOvers(slices=4, full=0, gathers=3)
    return PipeHandOvers(slices=2, full=2, gathers=2)


def ds_pipe_meta_bytes(tp: int) -> int:
    """Bytes of one PartitionedTensor.to_meta() int64 tensor: [ndim, *shape, num_parts, rank, *partition (tp + 1)]."""
    return 8 * (DS_PIPE_META_FIXED_ELEMENTS + tp + 1)


# DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, first in v0.6.2 with "bf16+pipeline
# parallelism", PR #1801): bf16 weights, fp32 master weights and optimizer states sharded over the DP ranks (its
# own ZeRO-1), and a full fp32 copy of every gradient. Which runs use it (:func:`ds_bf16_optimizer`):
# * bf16 without ZeRO in the config (stage 0): from v0.6.2 (engine.py _configure_optimizer; from v0.8,
#   get_data_types: bf16 without ZeRO accumulates gradients in fp32, _do_optimizer_sanity_check -> BFLOAT16).
#   BigScience's BLOOM-176B ran this way ("ZERO_STAGE=0 # important: bf16 must use z0! it implements its own
#   zero stage 1 equivalent", bigscience tr11-176B-ml.slurm).
# * bf16 with ZeRO-1 on the pipeline engine before v0.9.5: PipelineEngine._exec_reduce_grads raises
#   NotImplementedError for bf16 with ZeRO stage 1 (v0.6.2-v0.9.0: "only bf16 + z1 are supported"), so a
#   bf16 "ZeRO-1" pipeline run of those releases is a BF16_Optimizer run.
# What it adds to the pipeline engine's step, read in v0.6.5-v0.7.7 (and v0.16.4, unchanged):
# * every micro-batch, after the backward (pipe/engine.py _exec_backward_pass -> update_hp_grads): per
#   parameter ``hp_grad.add_(lp.grad.to(float32))``: the cast writes an fp32 temporary that the add reads back,
#   DS_BF16_HP_GRAD_EXTRA_BYTES per parameter beyond an fp32 accumulation (the bf16 gradient read, the fp32
#   accumulator read and written), which linear_times_s already counts for the linear layers' weights;
# * at ReduceGrads, ``_bf16_reduce_grads`` -> ``buffered_allreduce_fallback`` on the flat fp32 gradients: one
#   all-reduce (not a reduce-scatter), on the wire in bf16 (engine.py communication_data_type: bf16 without
#   ZeRO); after the step ``all_gather_dp_groups`` gathers the updated bf16 parameters;
# * the tied embedding's gradient is all-reduced between the first and last stage in fp32 (``weight._hp_grad``,
#   pipe/engine.py _exec_reduce_tied_grads).
DS_BF16_OPTIMIZER_SINCE = (0, 6, 2)
DS_BF16_ZERO1_PIPELINE_SINCE = (0, 9, 5)      # the pipeline engine reduces bf16 ZeRO-1 through ZeRO's optimizer
DS_BF16_HP_GRAD_EXTRA_BYTES = 8               # fp32 temporary of lp.grad.to(float32): written, read back


def ds_bf16_optimizer(version: str | None, precision: str, zero_stage: int, pp: int) -> bool:
    """True where DeepSpeed ``version`` trains a ``precision`` run with BF16_Optimizer (see above)."""
    v = ds_version(version)
    if precision != "bf16" or zero_stage > 1 or v < DS_BF16_OPTIMIZER_SINCE:
        return False
    return zero_stage == 0 or (pp > 1 and v < DS_BF16_ZERO1_PIPELINE_SINCE)


def ds_bucket_all_reduce(version: str | None, zero_stage: int = 2) -> bool:
    """True where DeepSpeed ``version`` all-reduces the gradient buckets of ZeRO ``zero_stage`` (1 or 2)
    instead of reducing each slice to its owner: ZeRO-1/2 from DS_BUCKET_ALL_REDUCE_SINCE, ZeRO-1 already from
    DS_ZERO1_FALLBACK_ALL_REDUCE_SINCE."""
    v = ds_version(version)
    return v >= DS_BUCKET_ALL_REDUCE_SINCE or (zero_stage == 1 and v >= DS_ZERO1_FALLBACK_ALL_REDUCE_SINCE)


def ds_zero12_copy_bytes(grad_elements: float, grad_bytes: int, dp: int, micro_batches: int, zero_stage: int) -> float:
    """Bytes DeepSpeed's ZeRO-1/2 moves through memory per step copying gradient buffers (DS_FULL_GRAD_COPIES,
    DS_PARTITION_COPIES); ZeRO-2 reduces, and copies, every micro-batch, ZeRO-1 once per step."""
    full = (micro_batches if zero_stage == 2 else 1) * DS_FULL_GRAD_COPIES * 2 * grad_elements * grad_bytes
    partition = (DS_PARTITION_COPIES * 2 + 1) * grad_elements / dp * 4        # the fp32 partition
    return full + partition

