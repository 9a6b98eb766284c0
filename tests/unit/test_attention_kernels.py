"""Fused attention runs at its kernel's measured rate (estimate/attention.py, catalog/attention.py: Dao 2023,
arXiv 2307.08691, Fig. 4 (c), (d), A100 80GB, causal, fwd + bwd TFLOP/s), and the published runs name their kernel."""
from __future__ import annotations

import pytest

from orchestrator.catalog.attention import KERNEL_RATES
from orchestrator.estimate.attention import ATTENTION_IMPLS, measured_attention_flops
from orchestrator.estimate.compute import FLASH_BWD_FACTOR, causal_fraction, estimate_layer_time
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.hardware import hardware_for
from orchestrator.estimate.params import ModelShape
from orchestrator.estimate.step import EstimateContext
from tests.published import (EXTRA_CASES, MPT_FSDP, MPT_SHAPES, TORCHTITAN_FSDP, case_attention,
                                    published_estimate)
from orchestrator.spec_loader import parse_spec
from tests.spec_variants import spec_with

A100 = "a100-80gb"


def _spec(gpu: str = A100):
    return parse_spec({"name": "a", "model": {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
                                              "vocab_size": 50368, "seq_length": 2048},
                       "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch_size": 8, "precision": "bf16"}})


def _shape(heads: int, attention: str, seq: int = 2048) -> ModelShape:
    return ModelShape(num_layers=4, hidden_size=2048, num_attention_heads=heads, num_query_groups=heads,
                      ffn_hidden_size=8192, vocab_size=50368, seq_length=seq, attention=attention)


def test_rates_are_the_figures_bars():
    assert measured_attention_flops("fa2", A100, 128, 2048) == 155e12
    assert measured_attention_flops("fa2", A100, 64, 2048) == 140e12
    assert measured_attention_flops("flash_attn_triton", A100, 128, 2048) == 69e12
    assert measured_attention_flops("flash_attn_triton", A100, 64, 16384) == 97e12


def test_every_listed_series_can_be_interpolated():
    """What measured_attention_flops assumes of the data: a known kernel, two head dimensions or more (it
    interpolates between the smallest and the largest) and sequence lengths in ascending order (bisect)."""
    for (impl, _gpu), series in KERNEL_RATES.items():
        assert impl in ATTENTION_IMPLS and impl != "catalog"
        assert len(series) >= 2
        for points in series.values():
            seqs = [s for s, _ in points]
            assert seqs == sorted(set(seqs)) and all(rate > 0 for _, rate in points)


def test_interpolation_in_log_seq_and_head_dim_and_held_outside():
    mid_seq = measured_attention_flops("fa2", A100, 128, 2896)          # ~sqrt(2048 * 4096)
    assert mid_seq == pytest.approx((155e12 + 173e12) / 2, rel=2e-3)
    assert measured_attention_flops("fa2", A100, 96, 2048) == pytest.approx((140e12 + 155e12) / 2)
    assert measured_attention_flops("fa2", A100, 128, 256) == 99e12      # below 512: the 512 bar
    assert measured_attention_flops("fa2", A100, 128, 131072) == 189e12  # above 16k: the 16k bar
    assert measured_attention_flops("fa2", A100, 256, 2048) == 155e12    # above 128: the 128 rate
    assert measured_attention_flops("fa2", A100, 32, 2048) == 140e12     # below 64: the 64 rate


def test_unmeasured_kernels_and_gpus_fall_back_to_the_catalog():
    assert measured_attention_flops("catalog", A100, 128, 2048) is None
    assert measured_attention_flops("fa2", "h200", 128, 2048) is None
    with pytest.raises(ValueError, match="flash_attn_triton"):
        measured_attention_flops("triton", A100, 128, 2048)


def test_triton_is_slower_than_fa2_at_equal_shape():
    hw = hardware_for(_spec(), CostModel())
    fa2 = estimate_layer_time(_shape(16, "fa2"), hw, 1, 8, False, "none")
    triton = estimate_layer_time(_shape(16, "flash_attn_triton"), hw, 1, 8, False, "none")
    assert triton.attention_forward_s / fa2.attention_forward_s == pytest.approx(155 / 69)
    # the measured path: half of 4 s^2 d per head (the benchmark's causal FLOPs) at the sustained clock
    flops = 2.0 * 8 * 16 * 2048**2 * 128
    assert fa2.attention_forward_s == pytest.approx(flops / (155e12 * hw.sustained_clock_fraction))
    assert triton.backward_s - fa2.backward_s == pytest.approx(
        FLASH_BWD_FACTOR * (triton.attention_forward_s - fa2.attention_forward_s))


def test_head_dim_moves_the_kernels_opposite_ways():
    """Same hidden size, 32 heads of 64 or 16 of 128 (equal FLOPs): FlashAttention-2 is faster at 128, flash-attn
    1.x slower (Fig. 4 (c) against (d))."""
    hw = hardware_for(_spec(), CostModel())

    def att(heads, impl):
        return estimate_layer_time(_shape(heads, impl), hw, 1, 8, False, "none").attention_forward_s

    assert att(16, "fa2") < att(32, "fa2")
    assert att(16, "flash_attn_triton") > att(32, "flash_attn_triton")


def test_catalog_kernel_keeps_the_catalog_figure():
    hw = hardware_for(_spec(), CostModel())
    layer = estimate_layer_time(_shape(16, "catalog"), hw, 1, 8, False, "none")
    flops = 4.0 * 8 * 16 * 2048**2 * 128 * causal_fraction(2048)
    assert layer.attention_forward_s == pytest.approx(flops / (hw.peak_flops * hw.attention_efficiency))
    # a kernel measured only on the A100 and H100 runs at the catalog figure elsewhere
    b200 = hardware_for(_spec("b200"), CostModel())
    assert (estimate_layer_time(_shape(16, "fa2"), b200, 1, 8, False, "none")
            == estimate_layer_time(_shape(16, "catalog"), b200, 1, 8, False, "none"))


def test_h100_fa2_rates_combine_the_fa3_papers_forward_and_backward_bars():
    """FlashAttention-3's paper prints FlashAttention-2's H100 forward (causal and not) and unmasked backward;
    the causal forward + backward adds the two passes as time, the backward masked as the forward is."""
    from orchestrator.catalog.attention import fwd_bwd_rates

    f, n, b = 319.0, 368.0, 310.0                      # head dim 128, 4k: forward causal, unmasked; backward
    expected = 3.5 / (1 / f + 2.5 / (b * f / n))
    assert fwd_bwd_rates((f,), (n,), (b,)) == (round(expected, 1),)
    assert measured_attention_flops("fa2", "h100-sxm", 128, 4096) == pytest.approx(expected * 1e12, rel=1e-3)
    # FlashAttention-2 is not written for Hopper: on the H100 it runs well below the catalog's fused kernel
    # (cuDNN / Transformer Engine; the paper's cuDNN bars are 1.6x its FlashAttention-2 bars at 4k)
    h100 = hardware_for(_spec("h100-sxm"), CostModel())
    fa2 = estimate_layer_time(_shape(16, "fa2", seq=4096), h100, 1, 8, False, "none").attention_forward_s
    catalog = estimate_layer_time(_shape(16, "catalog", seq=4096), h100, 1, 8, False, "none").attention_forward_s
    assert 1.3 < fa2 / catalog < 1.8
    # and above its A100 rate, below the H100's peak ratio to the A100 (3.2x)
    assert 1.3 < measured_attention_flops("fa2", "h100-sxm", 128, 4096) / measured_attention_flops(
        "fa2", A100, 128, 4096) < 2.0


def test_orch_runs_use_the_catalog_and_published_runs_their_kernel():
    assert EstimateContext.of(_spec()).shape.attention == "catalog"
    assert EstimateContext.of(spec_with(_spec(), **{"training.attention_impl": "flash_attn_2"})).shape.attention == "fa2"
    assert {case_attention(c) for c in MPT_FSDP} == {"flash_attn_triton"}
    assert {case_attention(c) for c in TORCHTITAN_FSDP} == {"fa2"}
    assert all(c["published"].get("attention_source") for c in (*MPT_FSDP, *TORCHTITAN_FSDP))
    others = [c for c in EXTRA_CASES if c not in MPT_FSDP and c not in TORCHTITAN_FSDP]
    assert {case_attention(c) for c in others} == {"catalog"}


def test_mpt_head_dims_are_64_for_the_two_smallest():
    assert {m: h // heads for m, (h, heads, _) in MPT_SHAPES.items()} == {
        "70b": 128, "30b": 128, "13b": 128, "7b": 128, "3b": 128, "1b": 128, "760m": 128, "350m": 64, "125m": 64}


def test_mpt_125m_runs_slower_on_its_triton_kernel():
    case = next(c for c in MPT_FSDP if c["id"] == "llmfoundry_mpt_125m_fsdp_64gpu")
    as_catalog = {**case, "published": {**case["published"], "attention": "catalog"}}
    assert published_estimate(case).step_time_s > 1.15 * published_estimate(as_catalog).step_time_s
