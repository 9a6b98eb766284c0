"""torchtitan's eager Llama layer (estimate/eager_ops.py torchtitan_llama_work, eager_rmsnorm_work): its byte and
kernel counts against the fused Megatron-Core layer orch charges, and that only the torchtitan rows of
published.py state it (the 70B rows with the eager RMSNorm of their train configs' norm_type "rmsnorm")."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.compute import _memory_bound_bytes, estimate_layer_time
from orchestrator.estimate.eager_ops import eager_rmsnorm_work, torchtitan_llama_work
from orchestrator.estimate.step import EstimateContext
from tests.published import (EXTRA_CASES, MPT_FSDP, TORCHTITAN_FSDP, case_shape_fields, published_estimate,
                                    throughput_spec)

CASES = {c["id"]: c for c in TORCHTITAN_FSDP}
LLAMA3_70B, LLAMA2_13B = CASES["torchtitan_llama3_70b_fsdp_64gpu"], CASES["torchtitan_llama2_13b_fsdp_64gpu"]


def _shape_hw(case, **fields):
    """The case's shape on the fused layer, with ``fields`` (ModelShape's layer_impl, eager_norm) set."""
    fused = {**case, "published": {k: v for k, v in case["published"].items() if k not in ("layer_impl", "eager_norm")}}
    ctx = EstimateContext.of(throughput_spec(fused))
    return dataclasses.replace(ctx.shape, **fields), ctx.hw


def test_eager_rmsnorm_adds_its_fp32_passes_per_norm():
    """Forward 4 e + 7 FP32 in eight kernels, backward 8 e + 19 FP32 in sixteen, against a fused 2 e / 3 e: at bf16
    32 and 86 bytes more per element, for each of the layer's two norms."""
    shape, hw = _shape_hw(LLAMA3_70B)
    assert shape.rmsnorm and hw.dtype_bytes == 2
    tokens = shape.seq_length
    fused = estimate_layer_time(shape, hw, 1, 1, False, "none")
    eager = estimate_layer_time(dataclasses.replace(shape, eager_norm=True), hw, 1, 1, False, "none")
    elements = tokens * shape.hidden_size
    assert eager.forward_s - fused.forward_s == pytest.approx(2 * (32 * elements / hw.hbm_Bps + 7 * hw.kernel_gap_s))
    assert eager.backward_s - fused.backward_s == pytest.approx(2 * (86 * elements / hw.hbm_Bps
                                                                     + 15 * hw.kernel_gap_s))
    work = eager_rmsnorm_work(1, 2)
    assert (work.forward_bytes, work.backward_bytes) == (32, 86)


def test_torchtitan_layer_counts_for_mha_and_gqa():
    """Llama 2 13B (h = q = kv = 5120, f 13824): complex RoPE 16 bytes per Q/K element each way, SwiGLU 4 / 8 bytes
    per activation element, three 6-byte gradient sums per token x h backward, less the 4 (q + 2kv) + 4 q bytes of
    QKV and context copies each way. Llama 3 70B's GQA adds the repeat_kv copies, 4 (q + kv) bytes each way."""
    mha = torchtitan_llama_work(1, 5120, 5120, 5120, 13824, 2)
    assert (mha.forward_bytes, mha.backward_bytes) == (16 * 10240 + 4 * 13824 - 81920,
                                                       16 * 10240 + 8 * 13824 + 18 * 5120 - 81920)
    assert (mha.forward_kernels, mha.backward_kernels) == (4 + 1 - 2, 4 + 2 + 3 - 2)
    gqa = torchtitan_llama_work(1, 8192, 8192, 1024, 28672, 2)
    assert (gqa.forward_bytes, gqa.backward_bytes) == (16 * 9216 + 4 * 28672 - 4 * 10240 - 4 * 8192 + 4 * 9216,
                                                       16 * 9216 + 8 * 28672 + 18 * 8192 - 4 * 18432 + 4 * 9216)
    assert (gqa.forward_kernels, gqa.backward_kernels) == (mha.forward_kernels + 2, mha.backward_kernels + 2)


def test_layer_time_carries_the_work_and_full_recompute_repeats_it():
    shape, hw = _shape_hw(LLAMA3_70B)
    titan = dataclasses.replace(shape, layer_impl="torchtitan_llama")
    base = estimate_layer_time(shape, hw, 1, 1, False, "full")
    mine = estimate_layer_time(titan, hw, 1, 1, False, "full")
    work = torchtitan_llama_work(shape.seq_length, shape.hidden_size, shape.q_size, shape.kv_size,
                                 shape.ffn_hidden_size, hw.dtype_bytes)
    f, b = work.times_s(hw.hbm_Bps, hw.kernel_gap_s)
    assert (mine.forward_s - base.forward_s, mine.backward_s - base.backward_s) == pytest.approx((f, b))
    assert mine.recompute_s == mine.forward_s
    assert mine.matmul_forward_s == base.matmul_forward_s


def test_only_torchtitan_rows_state_eager_code_and_it_slows_them():
    def eager(case):
        return {k: v for k, v in case_shape_fields(case).items() if k in ("layer_impl", "eager_norm")}

    stated = {c["id"]: eager(c) for c in EXTRA_CASES if eager(c)}
    assert stated == {"torchtitan_llama3_70b_fsdp_64gpu": {"layer_impl": "torchtitan_llama", "eager_norm": True},
                      "torchtitan_llama2_70b_fsdp_64gpu": {"layer_impl": "torchtitan_llama", "eager_norm": True},
                      "torchtitan_llama2_13b_fsdp_64gpu": {"layer_impl": "torchtitan_llama", "eager_norm": False}}
    assert not any(eager(c) for c in MPT_FSDP)
    fused = {**LLAMA2_13B, "published": {k: v for k, v in LLAMA2_13B["published"].items()
                                         if k not in ("layer_impl", "eager_norm")}}
    assert published_estimate(LLAMA2_13B).step_time_s > published_estimate(fused).step_time_s


def test_orch_shapes_keep_the_fused_layer():
    """A spec's shape runs Megatron-Core's layer: its element-wise time is exactly the fused charges."""
    shape, hw = _shape_hw(LLAMA3_70B)
    assert (shape.layer_impl, shape.eager_norm) == ("megatron_core", False)
    fwd_bytes, _ = _memory_bound_bytes(shape, hw.dtype_bytes, 1, False, 1)
    assert estimate_layer_time(shape, hw, 1, 1, False, "none").memory_bound_forward_s == fwd_bytes / hw.hbm_Bps
