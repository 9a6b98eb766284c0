"""Dropout as a modelled property: masks and dropout traffic only with p > 0 (orch trains with p = 0)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.activations import attention_scores_bytes, estimate_activations, layer_activation_bytes
from orchestrator.estimate.compute import MASK, _attention_times_s, _memory_bound_bytes, estimate_layer_time
from orchestrator.estimate.params import ModelShape, model_shape
from orchestrator.estimate.step import EstimateContext
from orchestrator.plan import build_plan
from orchestrator.planner import search
from tests.published import BLOOM_176B, MPT_FSDP, NEOX_20B, TORCHTITAN_FSDP, case_dropout, load_cases
from tests.published_layouts import layout_case_dropout, load_layout_cases
from tests.spec_variants import spec_with
from orchestrator.render.megatron import render_megatron_args, render_megatron_config
from orchestrator.spec_loader import load_spec
from tests.conftest import ROOT

S, B, H, A, T = 2048, 1, 20480, 128, 8
NO_DROPOUT = ModelShape(num_layers=105, hidden_size=H, num_attention_heads=A, num_query_groups=A,
                        ffn_hidden_size=4 * H, vocab_size=51200, seq_length=S, flash_attention=False)
DROPOUT = dataclasses.replace(NO_DROPOUT, dropout=0.1)
SBH = S * B * H


def test_spec_shapes_train_without_dropout_as_orch_renders():
    """The estimate's dropout for a spec is what orch writes into the Megatron args and config."""
    spec = load_spec(ROOT / "examples" / "gpt3-1.7b-32xa100.yaml")
    plan = build_plan(spec)
    args = render_megatron_args(plan)
    config = render_megatron_config(plan)
    for flag, key in (("--hidden-dropout", "hidden_dropout"), ("--attention-dropout", "attention_dropout")):
        assert float(args[args.index(flag) + 1]) == config[key] == model_shape(spec).dropout == 0.0


def test_masks_only_with_dropout():
    """Korthikanti's 34 + 5as/h with dropout; 32 + 2as/h without (no two 1-byte masks, and the unfused
    attention keeps its softmax output only: no mask, no separate dropout output)."""
    assert layer_activation_bytes(DROPOUT, 1, False, "none", B) == SBH * (34 + 5 * A * S / H)
    assert layer_activation_bytes(NO_DROPOUT, 1, False, "none", B) == SBH * (32 + 2 * A * S / H)
    assert layer_activation_bytes(NO_DROPOUT, T, True, "selective", B) == 32 * SBH // T
    assert attention_scores_bytes(DROPOUT, T, B) == 5 * A * S * S // T
    assert attention_scores_bytes(NO_DROPOUT, T, B) == 2 * A * S * S // T
    flash = dataclasses.replace(NO_DROPOUT, flash_attention=True)
    assert (layer_activation_bytes(dataclasses.replace(flash, dropout=0.1), T, True, "none", B)
            - layer_activation_bytes(flash, T, True, "none", B)) == 2 * MASK * SBH // T
    # full recompute stores the layer input alone, dropout or not
    assert layer_activation_bytes(DROPOUT, T, True, "full", B) == layer_activation_bytes(NO_DROPOUT, T, True, "full", B)


def test_embedding_mask_only_with_dropout():
    with_p, without = (estimate_activations(s, T, 1, 1, True, "selective", B, 1, 51200) for s in (DROPOUT, NO_DROPOUT))
    per_layer = with_p.per_layer_bytes - without.per_layer_bytes
    transient = (max(with_p.logits_bytes, with_p.working_bytes) - max(without.logits_bytes, without.working_bytes))
    assert transient == (5 - 2) * A * S * S // T          # selective recompute's scores: no mask, no dropout out
    assert with_p.first_stage_bytes - without.first_stage_bytes == 105 * per_layer + MASK * SBH // T + transient
    assert with_p.logits_bytes == without.logits_bytes


def test_dropout_kernel_traffic():
    """Bias-dropout-add writes its mask forward and reads it backward; the unfused attention's dropout reads and
    writes the s^2 probabilities with their mask. None of it without dropout."""
    e, tp, mb = 2, T, 1
    f0, b0 = _memory_bound_bytes(NO_DROPOUT, e, tp, True, mb)
    f1, b1 = _memory_bound_bytes(DROPOUT, e, tp, True, mb)
    assert f1 - f0 == b1 - b0 == 2 * MASK * SBH / tp
    hw = EstimateContext.of(load_spec(ROOT / "examples" / "gpt3-1.7b-32xa100.yaml")).hw
    (af0, ab0, _), (af1, ab1, _) = (_attention_times_s(s, hw, tp, mb) for s in (NO_DROPOUT, DROPOUT))
    elems = mb * (A // tp) * S * S
    assert af1 - af0 == pytest.approx((2 * hw.dtype_bytes + MASK) * elems / hw.hbm_Bps)
    assert ab1 - ab0 == pytest.approx((2 * hw.dtype_bytes + MASK) * elems / hw.hbm_Bps)
    t0, t1 = (estimate_layer_time(s, hw, tp, mb, True, "none") for s in (NO_DROPOUT, DROPOUT))
    assert t0.forward_s < t1.forward_s and t0.backward_s < t1.backward_s


@pytest.mark.parametrize("example", ["gpt3-1.7b-32xa100.yaml", "llama3-8b-64xh100.yaml"])
def test_own_spec_plans_fit_more_without_dropout(example):
    """orch's own spec (no dropout): at least as many layouts fit, and none needs more memory or time, than if
    it trained with Megatron's default 0.1."""
    spec = load_spec(ROOT / "examples" / example)
    dropped = spec_with(spec, **{"model.hidden_dropout": 0.1, "model.attention_dropout": 0.1})
    without, with_p = search(spec, top_k=1), search(dropped, top_k=1)
    assert without.num_fitting >= with_p.num_fitting
    assert without.chosen.step_time_s <= with_p.chosen.step_time_s
    ctx0, ctx1 = EstimateContext.of(spec), EstimateContext.of(dropped)
    from orchestrator.estimate.step import estimate  # noqa: PLC0415
    lay = with_p.chosen.layout
    assert estimate(ctx0, lay).memory.total_bytes < estimate(ctx1, lay).memory.total_bytes


def test_published_dropout_per_family():
    """Runs state their dropout where their source does; otherwise Megatron-LM's default 0.1."""
    table1 = [c for c in load_cases(ROOT / "tests" / "data" / "published-cases.json", "throughput")]
    assert {case_dropout(c) for c in table1} == {0.1}
    assert case_dropout(BLOOM_176B) == 0.1 and case_dropout(NEOX_20B) == 0.0
    assert {case_dropout(c) for c in (*TORCHTITAN_FSDP, *MPT_FSDP)} == {0.0}
    layouts = {c["id"]: layout_case_dropout(c) for c in load_layout_cases(ROOT / "tests" / "data" /
                                                                           "published-moe-cp-fp8.json")}
    assert layouts["nemo2407_gpt3_175b_fp8"] == 0.1 and layouts["nemo2407_llama2_7b_fp8"] == 0.0
    assert all(p == 0.1 for k, p in layouts.items() if k.startswith("mlm0715_"))
