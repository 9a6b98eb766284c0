"""DeepSpeed's pipeline engine as the cost model counts it (estimate/engines.py, estimate/step.py)."""
from __future__ import annotations

import pytest

from orchestrator.estimate.engines import ds_bf16_optimizer, ds_pipeline_reduces_after_flush
from orchestrator.estimate.step import EstimateContext, estimate
from orchestrator.layout import Layout
from orchestrator.published import MT_NLG_530B, published_estimate
from orchestrator.spec import parse_spec


def _spec(engine: str):
    return parse_spec({"name": "s", "model": {"preset": "gpt3-7.5b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 4, "gpus_per_node": 8},
                       "training": {"global_batch_size": 256, "precision": "bf16", "engine": engine}})


LAYOUT = Layout(tp=2, pp=4, vpp=1, dp=4, zero_stage=1, micro_batch_size=1, sequence_parallel=False,
                recompute="full", offload="none")


def test_pipeline_engine_reduces_gradients_after_the_flush():
    ds = estimate(EstimateContext.of(_spec("deepspeed")), LAYOUT)
    assert ds.comm.dp_s > 0 and ds.comm.dp_exposed_s == pytest.approx(ds.comm.dp_s)
    meg = estimate(EstimateContext.of(_spec("megatron")), LAYOUT)
    assert meg.comm.dp_exposed_s < meg.comm.dp_s        # Megatron overlaps the reduction with the backward
    assert ds_pipeline_reduces_after_flush("deepspeed", 2) and not ds_pipeline_reduces_after_flush("deepspeed", 1)


def test_bf16_optimizer_releases():
    assert not ds_bf16_optimizer("0.5", "bf16", 1, 4) and not ds_bf16_optimizer("0.6.1", "bf16", 0, 4)
    assert ds_bf16_optimizer("0.6.2", "bf16", 1, 4) and ds_bf16_optimizer("0.9.0", "bf16", 1, 4)
    assert not ds_bf16_optimizer("0.9.5", "bf16", 1, 4) and not ds_bf16_optimizer(None, "bf16", 1, 4)
    assert ds_bf16_optimizer(None, "bf16", 0, 1) and not ds_bf16_optimizer("0.7", "fp16", 0, 4)


def test_bf16_optimizer_costs_its_fp32_gradient_copy():
    spec = _spec("deepspeed")
    old = estimate(EstimateContext.of(spec, engine_version="0.7"), LAYOUT)     # BF16_Optimizer
    new = estimate(EstimateContext.of(spec), LAYOUT)                            # ZeRO-1, bf16 gradients
    assert old.breakdown.compute_s > new.breakdown.compute_s
    # the tied embedding's fp32 gradient: twice the bf16 bytes between the first and last stage
    assert old.comm.pp_bytes > new.comm.pp_bytes


def test_per_gpu_throughput_falls_with_dp_at_fixed_batch():
    tflops = [published_estimate(c).tflops_per_gpu for c in MT_NLG_530B]
    assert tflops[0] > tflops[1] > tflops[2]


def test_a_case_states_its_network():
    from orchestrator.published import BLOOM_176B, throughput_spec

    spec = throughput_spec(BLOOM_176B)
    assert spec.cluster.inter_node_bandwidth_GBps == pytest.approx(400 / 8 / 8 * 0.9)   # 4x 100 Gb/s per node
    dgx = {**BLOOM_176B, "cluster": {k: v for k, v in BLOOM_176B["cluster"].items() if k != "nic_Gbps_per_node"}}
    assert published_estimate(BLOOM_176B).step_time_s > published_estimate(dgx).step_time_s
