"""Eager element-wise work of gpt-oss's features in Megatron-Core (estimate/eager_ops.py): unfused YaRN RoPE, the
clamped expert activation, the per-expert fc2 bias and the layernorm / moe_act recompute modules, counted byte
for byte, and threaded from the published gpt-oss-120b rows (tests/data/published-moe-cp-fp8.json)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.compute import estimate_layer_time
from orchestrator.estimate.eager_ops import expert_bias_work, glu_clamp_work
from orchestrator.estimate.moe import EXPERT_GRAD_HOOKS, HOST_OP_S, expert_work, moe_block_host_s, moe_mlp_times
from orchestrator.estimate.step import EstimateContext
from tests.published_layouts import (layout_case_shape_fields, layout_case_spec, load_layout_cases,
                                            predicted_layout)
from tests.conftest import ROOT

CASES = {c["id"]: c for c in load_layout_cases(ROOT / "tests" / "data" / "published-moe-cp-fp8.json")}
GPT_OSS = CASES["mbridge2602_gpt_oss_120b_bf16"]
EP, MB = 8, 1


PLAIN_GPT_OSS = {k: v for k, v in GPT_OSS.items() if k not in ("fused_rope", "glu_clamp", "recompute_modules")}


def _ctx(**fields):
    ctx = EstimateContext.of(layout_case_spec(PLAIN_GPT_OSS))
    return dataclasses.replace(ctx.shape, **fields), ctx.hw


def _plain():
    shape, hw = _ctx()
    return dataclasses.replace(shape, bias=False), hw


def test_unfused_rope_costs_its_counted_passes_over_q_and_k():
    """12 e forward / 10 e backward per element of Q and K instead of the fused 2 e / 2 e, and the extra kernels."""
    shape, hw = _plain()
    e, gap = hw.dtype_bytes, hw.kernel_gap_s
    fused = estimate_layer_time(shape, hw, 1, MB, False, "none")
    unfused = estimate_layer_time(dataclasses.replace(shape, fused_rope=False), hw, 1, MB, False, "none")
    elements = shape.seq_length * MB * (shape.q_size + shape.kv_size)
    assert unfused.forward_s - fused.forward_s == pytest.approx(10 * e * elements / hw.hbm_Bps + 22 * gap)
    assert unfused.backward_s - fused.backward_s == pytest.approx(8 * e * elements / hw.hbm_Bps + 8 * gap)
    assert unfused.memory_bound_forward_s > fused.memory_bound_forward_s
    learned = dataclasses.replace(shape, learned_positions=True)       # no RoPE at all: nothing to unfuse
    assert (estimate_layer_time(dataclasses.replace(learned, fused_rope=False), hw, 1, MB, False, "none")
            == estimate_layer_time(learned, hw, 1, MB, False, "none"))


def test_clamped_activation_adds_clamps_and_cat_over_the_fc1_output():
    shape, hw = _plain()
    clamped = dataclasses.replace(shape, glu_clamp=7.0)
    work = expert_work(shape, 1, 1, EP, 1, MB)
    fc1 = work.routed_rows * 2 * shape.moe.expert_ffn
    base, mine = moe_mlp_times(shape, hw, 1, 1, EP, 1, MB), moe_mlp_times(clamped, hw, 1, 1, EP, 1, MB)
    e = hw.dtype_bytes
    assert mine.forward_s - base.forward_s == pytest.approx(4 * e * fc1 / hw.hbm_Bps + 3 * hw.kernel_gap_s)
    assert mine.backward_s - base.backward_s == pytest.approx((5.5 * e + 4) * fc1 / hw.hbm_Bps + 9 * hw.kernel_gap_s)
    assert mine.matmul_forward_s == base.matmul_forward_s


def test_biased_experts_pay_the_per_expert_bias_loop_and_its_launches():
    """TEGroupedMLP._apply_bias: 6 e / 8 e per element of the fc2 output, 2 / 4 kernels and host ops per local
    expert (16 at ep 8 of 128 experts), and the biases' gradient hooks."""
    shape, hw = _plain()
    biased = dataclasses.replace(shape, bias=True)
    work = expert_work(shape, 1, 1, EP, 1, MB)
    assert work.local_experts == 16
    fc2 = work.routed_rows * shape.hidden_size
    base, mine = moe_mlp_times(shape, hw, 1, 1, EP, 1, MB), moe_mlp_times(biased, hw, 1, 1, EP, 1, MB)
    e, gap = hw.dtype_bytes, hw.kernel_gap_s
    assert mine.forward_s - base.forward_s == pytest.approx(6 * e * fc2 / hw.hbm_Bps + 33 * gap)
    assert mine.backward_s - base.backward_s == pytest.approx(8 * e * fc2 / hw.hbm_Bps + 65 * gap)
    (bf, bb), (f, b) = moe_block_host_s(shape, EP, False), moe_block_host_s(biased, EP, False)
    # and each expert's fc1 / fc2 bias has its DDP gradient hook, as its weights do (moe.py EXPERT_GRAD_HOOKS)
    assert (f - bf, b - bb) == pytest.approx((2 * 16 * HOST_OP_S, (4 + EXPERT_GRAD_HOOKS) * 16 * HOST_OP_S))
    assert expert_bias_work(fc2, 16, e).forward_kernels == 33


def test_recompute_modules_redo_the_expert_activation_and_the_pre_mlp_norm():
    shape, hw = _plain()
    clamped = dataclasses.replace(shape, glu_clamp=7.0)
    act = dataclasses.replace(clamped, recompute_modules=("moe_act",))
    norm = dataclasses.replace(shape, recompute_modules=("layernorm",))
    plain_mlp = moe_mlp_times(clamped, hw, 1, 1, EP, 1, MB)
    act_mlp = moe_mlp_times(act, hw, 1, 1, EP, 1, MB)
    work = expert_work(shape, 1, 1, EP, 1, MB)
    fc1 = work.routed_rows * 2 * shape.moe.expert_ffn
    clamp_f = glu_clamp_work(fc1, hw.dtype_bytes).times_s(hw.hbm_Bps, hw.kernel_gap_s)[0]
    # the activation's own forward (3 e per element of the f-wide output, gated) and its clamp, once more
    assert act_mlp.recompute_s == pytest.approx(3 * hw.dtype_bytes * fc1 / 2 / hw.hbm_Bps + clamp_f)
    assert plain_mlp.recompute_s == 0.0
    assert moe_mlp_times(norm, hw, 1, 1, EP, 1, MB).recompute_s == pytest.approx(
        2 * hw.dtype_bytes * shape.seq_length * MB * shape.hidden_size / hw.hbm_Bps + hw.kernel_gap_s)
    layer = estimate_layer_time(act, hw, 1, MB, False, "none", mlp=act_mlp)
    assert layer.recompute_s == act_mlp.recompute_s
    full = estimate_layer_time(act, hw, 1, MB, False, "full", mlp=act_mlp)
    assert full.recompute_s == full.forward_s            # full recompute already redoes the whole layer


def test_only_the_gpt_oss_rows_state_the_features_and_they_slow_the_prediction():
    eager_keys = ("fused_rope", "glu_clamp", "recompute_modules")
    stated = {cid: {k: v for k, v in layout_case_shape_fields(c).items() if k in eager_keys}
              for cid, c in CASES.items()}
    stated = {cid: fields for cid, fields in stated.items() if fields}
    assert sorted(stated) == ["mbridge2511_gpt_oss_120b_bf16", "mbridge2602_gpt_oss_120b_bf16",
                              "mbridge260401_gpt_oss_120b_bf16"]
    assert all(f == {"fused_rope": False, "glu_clamp": 7.0, "recompute_modules": ("layernorm", "moe_act")}
               for f in stated.values())
    without = {k: v for k, v in GPT_OSS.items() if k not in eager_keys}
    assert predicted_layout(GPT_OSS)["tokens_per_s"] < 0.9 * predicted_layout(without)["tokens_per_s"]
