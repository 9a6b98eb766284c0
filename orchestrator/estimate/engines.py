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
"""
from __future__ import annotations

DS_REDUCE_BUCKET_ELEMENTS = 500_000_000
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
