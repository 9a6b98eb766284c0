"""Host launch floor of dense layers: eager PyTorch launches every kernel of a layer from the host, so on a
GPU a layer takes at least its host time (estimate/moe.py dense_host_s); published layouts are far from it."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.compute import KERNELS_BWD, KERNELS_FWD, estimate_layer_time
from orchestrator.estimate.layer import LayerKey, rank_layer
from orchestrator.estimate.moe import HOST_OP_S, dense_host_s, moe_block_host_s, moe_host_s
from orchestrator.estimate.step import EstimateContext
from orchestrator.spec_loader import parse_spec

KEY = LayerKey(tp=1, cp=1, ep=1, etp=1, mb=1, sp=False, recompute="none")


def ctx_of(model: dict, gpu: str = "h100-sxm") -> EstimateContext:
    return EstimateContext.of(parse_spec({"name": "t", "model": model,
                                          "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
                                          "training": {"global_batch_size": 64}}))


TINY = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1024, "seq_length": 128}
# Megatron-LM README 2024-07 table, 1.7B GPT (tests/data/published-moe-cp-fp8.json mlm0715_gpt_1.7b_bf16)
MLM_1_7B = {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 131072,
            "seq_length": 4096, "tie_embeddings": False}


def test_dense_host_time_is_the_layer_kernels_at_the_per_op_host_time():
    assert dense_host_s() == pytest.approx((KERNELS_FWD * HOST_OP_S, KERNELS_BWD * HOST_OP_S))
    shape = ctx_of({"preset": "qwen3-30b-a3b"}).shape
    block, layer = moe_block_host_s(shape, 8, False), moe_host_s(shape, 8, False)
    assert (layer[0] - block[0], layer[1] - block[1]) == pytest.approx(dense_host_s())


def test_a_tiny_dense_layer_on_a_gpu_runs_at_its_host_launch_time():
    ctx = ctx_of(TINY)
    gpu_only = estimate_layer_time(ctx.shape, ctx.hw, 1, 1, False, "none")
    host_f, host_b = dense_host_s()
    assert gpu_only.forward_s < host_f / 2 and gpu_only.backward_s < host_b / 2      # tiny: under the host
    layer = rank_layer(ctx.shape, ctx.hw, "h100-sxm", "bf16", KEY).time
    assert layer.forward_s == pytest.approx(host_f) and layer.backward_s == pytest.approx(host_b)


def test_the_floor_scales_a_recomputed_forward_too():
    ctx = ctx_of(TINY)
    layer = rank_layer(ctx.shape, ctx.hw, "h100-sxm", "bf16", dataclasses.replace(KEY, recompute="full")).time
    assert layer.recompute_s == pytest.approx(layer.forward_s)


def test_the_cpu_target_has_no_floor_its_host_work_is_its_compute():
    ctx = ctx_of(TINY, gpu="cpu")
    layer = rank_layer(ctx.shape, ctx.hw, "cpu", "bf16", KEY).time
    assert layer == estimate_layer_time(ctx.shape, ctx.hw, 1, 1, False, "none")


def test_published_small_dense_layout_is_not_host_bound_even_at_micro_batch_1():
    """The 1.7B row of Megatron-LM's table (48 H100, tp 1, 4 sequences of 4096 per rank; micro-batch not
    published): even at micro-batch 1 its layer's GPU time is over 3x the host's, so the floor leaves it as it was."""
    ctx = ctx_of(MLM_1_7B)
    gpu_only = estimate_layer_time(ctx.shape, ctx.hw, 1, 1, False, "none")
    host_f, host_b = dense_host_s()
    assert gpu_only.forward_s > 3 * host_f and gpu_only.backward_s > 3 * host_b
    assert rank_layer(ctx.shape, ctx.hw, "h100-sxm", "bf16", KEY).time == gpu_only
