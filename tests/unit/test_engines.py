"""What the cost model takes from each engine's own code: DeepSpeed's ZeRO-1/2 reduction and buffer copies."""
from __future__ import annotations

import dataclasses

from orchestrator.estimate import estimate_layout
from orchestrator.estimate.compute import optimizer_step_s
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.engines import ds_bucket_all_reduce, ds_zero12_copy_bytes
from orchestrator.estimate.hardware import hardware_for
from orchestrator.layout import require_complete
from orchestrator.spec_loader import parse_spec
from tests.conftest import spec_data


def test_zero12_all_reduces_gradient_buckets_from_deepspeed_0_12_4():
    assert not ds_bucket_all_reduce("0.4") and not ds_bucket_all_reduce("0.12.3")
    assert ds_bucket_all_reduce("0.12.4") and ds_bucket_all_reduce(None)      # None: the DeepSpeed orch writes for


def test_zero1_all_reduces_from_deepspeed_0_4_4():
    """ZeRO-1 with contiguous_gradients forced off (PR #1246, v0.4.4) takes buffered_reduce_fallback: an
    all-reduce of each bucket; ZeRO-2 still reduces each slice to its owner until 0.12.4."""
    assert not ds_bucket_all_reduce("0.4.3", zero_stage=1) and ds_bucket_all_reduce("0.4.4", zero_stage=1)
    assert ds_bucket_all_reduce("0.5", zero_stage=1) and ds_bucket_all_reduce("0.12.3", zero_stage=1)
    assert not ds_bucket_all_reduce("0.5", zero_stage=2)


def test_zero2_copies_every_micro_batch_zero1_once():
    one = ds_zero12_copy_bytes(1e6, 4, dp=2, micro_batches=1, zero_stage=2)
    assert ds_zero12_copy_bytes(1e6, 4, dp=2, micro_batches=4, zero_stage=2) > 2.5 * one
    assert ds_zero12_copy_bytes(1e6, 4, dp=2, micro_batches=4, zero_stage=1) == one
    assert ds_zero12_copy_bytes(1e6, 4, dp=4, micro_batches=1, zero_stage=2) < one    # smaller fp32 partition


def test_buffer_copies_count_on_cpu_only():
    """On the CPU target DeepSpeed's accelerator is synchronous: the copies are engine time; on a GPU they run
    on the reduction stream behind the backward."""
    cpu = parse_spec(spec_data(**{"parallelism.zero_stage": 2}))
    lay = require_complete(cpu)
    z0 = estimate_layout(cpu, dataclasses.replace(lay, zero_stage=0)).breakdown.engine_s
    assert estimate_layout(cpu, lay).breakdown.engine_s > z0
    gpu = parse_spec(spec_data(**{"parallelism.zero_stage": 2, "cluster.gpu": "h100-sxm", "training.precision": "bf16"}))
    glay = require_complete(gpu)
    assert estimate_layout(gpu, glay).breakdown.engine_s == estimate_layout(
        gpu, dataclasses.replace(glay, zero_stage=0)).breakdown.engine_s


def test_unfused_adam_moves_more_bytes():
    hw = hardware_for(parse_spec(spec_data()), CostModel())
    assert optimizer_step_s(1e6, hw, fused=False) > 2 * optimizer_step_s(1e6, hw)


def test_bf16_zero0_runs_as_bf16_optimizers_own_zero1():
    """DeepSpeed trains a bf16 ZeRO-0 config with BF16_Optimizer: fp32 master weights and Adam states sharded
    over the DP ranks, the updated bf16 parameters all-gathered after the step, as ZeRO-1 does."""
    spec = parse_spec(spec_data(**{"parallelism.zero_stage": 0, "cluster.gpu": "h100-sxm",
                                   "training.precision": "bf16", "training.engine": "deepspeed"}))
    z0 = require_complete(spec)
    z1 = dataclasses.replace(z0, zero_stage=1)
    a, b = estimate_layout(spec, z0), estimate_layout(spec, z1)
    assert a.memory.optimizer_bytes == b.memory.optimizer_bytes
    assert a.memory.grads_bytes > b.memory.grads_bytes          # its fp32 copy of every gradient
    assert a.comm.dp_bytes == b.comm.dp_bytes > 0                # all-reduce + all-gather, like ZeRO-1
    fp32 = parse_spec(spec_data(**{"parallelism.zero_stage": 0, "cluster.gpu": "h100-sxm",
                                   "training.precision": "fp32", "training.engine": "deepspeed"}))
    assert estimate_layout(fp32, require_complete(fp32)).memory.optimizer_bytes > a.memory.optimizer_bytes
