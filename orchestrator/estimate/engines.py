"""What each training engine does that the cost model counts: bucket sizes, gather units, gradient dtype.

The DeepSpeed numbers are the ones orch writes into ds_config.json (``render/deepspeed.py`` imports them
from here, so the planner counts the calls the run will make); the Megatron ones are Megatron-Core's own
defaults for the flags orch emits (core_v0.16.1).

* DeepSpeed ``reduce_bucket_size`` / ``allgather_bucket_size``: 5e8 elements (DeepSpeed's documented
  default). ZeRO-3 gathers parameters per module (each Linear is a module with its weight and bias);
  modules under ``stage3_param_persistence_threshold`` (10h elements: norms, biases) stay resident, and
  prefetching only coalesces modules smaller than ``stage3_prefetch_bucket_size`` (0.9h^2 elements), which
  every GEMM weight of a transformer layer exceeds: 4 all-gathers per layer and pass (QKV, attention
  output, MLP in, MLP out) plus the embedding.
* Megatron-Core DDP (``--overlap-grad-reduce``): gradient buckets of max(40M, 1M x dp) elements
  (``megatron/core/distributed/distributed_data_parallel.py``); with bf16 the gradients are accumulated
  and reduced in fp32 (``megatron/training/arguments.py``: accumulate_allreduce_grads_in_fp32). The
  distributed optimizer gathers the 16-bit parameters in the same buckets (``--overlap-param-gather``:
  behind the next forward). Megatron FSDP (ZeRO-2/3) shards per transformer layer: one all-gather per layer
  and pass, one reduce-scatter per layer in the backward.

DeepSpeed version. orch writes ds_config.json for DeepSpeed ``DEEPSPEED_VERSION`` (0.19.8, validate/_deepspeed_keys_data.py), and that is the
runtime the planner predicts by default: ZeRO-3 gathers each module's parameters with one coalesced
all-gather into a flat buffer (``allgather_coalesced`` / ``all_gather_into_tensor``) on its own stream,
prefetched behind compute (stage3_prefetch_bucket_size), and reduce-scatters gradients in buckets.
The ZeRO-3 of early 2021 (DeepSpeed 0.3.x-0.4.x; the runs of Narayanan et al. 2021, Table 2, were made with
it) worked differently, as its source shows (``runtime/zero/partition_parameters.py``:
``_allgather_param`` / ``_reduce_scatter_gradient``): one call per parameter, each all-gather preceded by a
``torch.cuda.synchronize()`` (so no gather overlaps the compute before it, whatever the prefetch setting),
and both collectives on lists of world-size tensors, which PyTorch's ProcessGroupNCCL flattens: one
device copy per rank per call (``all_gather`` copies each of the n outputs back, ``reduce_scatter`` each
of the n inputs in). The number of calls is the same as today's for a GPT layer (its biases and norms stay
resident below the persistence threshold, 1e5 elements then); what changes is that every call is exposed
and pays n copies. Gathers became coalesced into one flat buffer in 0.5 (our reading of DeepSpeed's
history: ``_allgather_params_coalesced`` and ``_all_gather_base`` replace the per-parameter list calls);
:func:`ds_list_collectives` says which behaviour a version has. A spec predicts DeepSpeed
``DEEPSPEED_VERSION``; only published runs say otherwise (``orchestrator/published.py``).
"""
from __future__ import annotations

from functools import lru_cache

from ..validate._deepspeed_keys_data import DEEPSPEED_VERSION  # the DeepSpeed orch writes ds_config for

DS_COALESCED_GATHERS_SINCE = (0, 5)
# ZeRO-1/2 reduce their gradient buckets with all_reduce since DeepSpeed 0.12.4 (PR #4695, "Communication
# Optimization for Large-Scale Training": ``zero_optimization.use_multi_rank_bucket_allreduce``, default
# true, sends ``average_tensor`` through ``allreduce_and_scatter``; issue #7059 logs ``comm op: all_reduce``
# with ``reduce_scatter: true``). Before, one reduce per partition owner: a reduce-scatter's volume.
DS_BUCKET_ALL_REDUCE_SINCE = (0, 12, 4)
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


def grad_reduce_bytes(engine: str, precision: str, dtype_bytes: int) -> int:
    """Bytes per gradient element on the wire: Megatron reduces bf16 gradients in fp32."""
    return 4 if engine == "megatron" and precision == "bf16" else dtype_bytes


@lru_cache(maxsize=1024)
def ds_backward_regather_share(module_elements: tuple[int, ...], layers: int, full_recompute: bool,
                               max_reuse: int = DS_MAX_REUSE_DISTANCE) -> float:
    """Backward all-gathers of DeepSpeed ZeRO-3 (0.5 on), in passes of the stage's parameters.

    After a module runs, DeepSpeed keeps its parameters gathered when the module is due again before
    ``max_reuse`` elements of other modules' parameters have run (PartitionedParameterCoordinator's
    __params_to_release walks the recorded module trace from the next step, counting parameters, and
    stops at stage3_max_reuse_distance). The trace of one micro-batch: the layers' modules
    (``module_elements`` in forward order) forward; backward from the last layer, each layer recomputing
    its forward first when ``full_recompute``, then its modules in reverse. Every forward use gathers;
    a backward use gathers again unless kept. Returns the gathered backward elements / the stage's
    (1 without reuse and recompute, 2 with recompute and nothing kept).
    """
    k, per_layer = len(module_elements), sum(module_elements)
    trace = [(layer, i) for layer in range(layers) for i in range(k)]
    forward_len = len(trace)
    for layer in reversed(range(layers)):
        if full_recompute:
            trace += [(layer, i) for i in range(k)]
        trace += [(layer, i) for i in reversed(range(k))]
    last_seen: dict[tuple[int, int], int] = {}
    prefix = [0]
    for unit in trace:
        prefix.append(prefix[-1] + module_elements[unit[1]])
    gathered = 0
    for t, unit in enumerate(trace):
        j = last_seen.get(unit)
        last_seen[unit] = t
        if t >= forward_len and (j is None or prefix[t] - prefix[j + 1] >= max_reuse):
            gathered += module_elements[unit[1]]
    return gathered / (layers * per_layer)


def _version(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in (version or DEEPSPEED_VERSION).split(".")[:3] if p.isdigit())


def ds_bucket_all_reduce(version: str | None) -> bool:
    """True for a DeepSpeed whose ZeRO-1/2 all-reduce gradient buckets (DS_BUCKET_ALL_REDUCE_SINCE)."""
    return _version(version) >= DS_BUCKET_ALL_REDUCE_SINCE


def ds_zero12_copy_bytes(grad_elements: float, grad_bytes: int, dp: int, micro_batches: int, zero_stage: int) -> float:
    """Bytes DeepSpeed's ZeRO-1/2 moves through memory per step copying gradient buffers (DS_FULL_GRAD_COPIES,
    DS_PARTITION_COPIES); ZeRO-2 reduces, and copies, every micro-batch, ZeRO-1 once per step."""
    full = (micro_batches if zero_stage == 2 else 1) * DS_FULL_GRAD_COPIES * 2 * grad_elements * grad_bytes
    partition = (DS_PARTITION_COPIES * 2 + 1) * grad_elements / dp * 4        # the fp32 partition
    return full + partition


def ds_list_collectives(version: str | None) -> bool:
    """True for a DeepSpeed whose ZeRO-3 runs host-synchronous per-parameter collectives on lists of
    world-size tensors (before DS_COALESCED_GATHERS_SINCE); None: the version orch writes configs for."""
    return _version(version)[:2] < DS_COALESCED_GATHERS_SINCE
