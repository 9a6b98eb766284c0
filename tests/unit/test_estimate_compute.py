"""Compute time: GEMM efficiency falls for small / ragged shapes, never exceeds the measured ceiling."""
from __future__ import annotations

import pytest

from orchestrator.estimate.compute import (causal_fraction, embedding_time_s, estimate_layer_time, matmul_efficiency,
                                           matmul_time_s, straggler_factor)
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.hardware import hardware_for
from orchestrator.estimate.params import estimate_params, model_shape
from orchestrator.spec_loader import parse_spec

CEIL = 0.8


def test_large_gemm_approaches_ceiling():
    assert matmul_efficiency(16384, 16384, 8192, 108, CEIL) == pytest.approx(CEIL, rel=0.02)
    assert matmul_efficiency(16384, 16384, 8192, 108, CEIL) <= CEIL


def test_small_hidden_over_tp_is_less_efficient():
    """h/tp shrinks the GEMMs: h=4096 at tp=8 gives K=512 (row-parallel) and N=1536 (column-parallel)."""
    tokens, h = 4096, 4096
    effs = [matmul_efficiency(tokens, h, h // tp, 108, CEIL) for tp in (1, 2, 4, 8, 16)]
    assert effs == sorted(effs, reverse=True)
    assert effs[-1] < 0.85 * effs[0]


def test_short_k_and_wave_quantisation_cost():
    assert matmul_efficiency(2048, 2048, 64, 108, CEIL) < 0.55 * CEIL          # head-dim K
    # one tile too many for a full wave: 109 tiles of 256x128 on 108 SMs -> nearly two waves
    ragged = matmul_efficiency(256 * 109, 128, 4096, 108, CEIL)
    full = matmul_efficiency(256 * 108, 128, 4096, 108, CEIL)
    assert ragged < full


def test_roofline_bounds_memory_bound_gemm():
    spec = parse_spec({"name": "c", "model": {"preset": "gpt3-1.7b"}, "cluster": {"gpu": "a100-80gb"},
                       "training": {"global_batch_size": 8}})
    hw = hardware_for(spec, CostModel())
    t = matmul_time_s(8192, 8192, 16, hw)      # K=16: pure traffic
    assert t >= 2 * (8192 * 16 * 2 + 8192 * 8192) / hw.hbm_Bps


def test_straggler_factor_grows_slowly_with_world_size():
    f = [straggler_factor(n, 0.02) for n in (1, 8, 64, 1024, 16384)]
    assert f[0] == 1.0
    assert f == sorted(f)
    assert f[-1] < 1.1


def test_causal_fraction_about_half():
    assert causal_fraction(8192) == pytest.approx(0.5, abs=0.01)


def _layer(preset, gpu, tp, mb, sp, recompute, flash=True):
    spec = parse_spec({"name": "c", "model": {"preset": preset, "flash_attention": flash},
                       "cluster": {"gpu": gpu}, "training": {"global_batch_size": 8}})
    return estimate_layer_time(model_shape(spec), hardware_for(spec, CostModel()), tp, mb, sp, recompute)


def test_layer_time_structure():
    none = _layer("gpt3-7.5b", "a100-80gb", 4, 1, True, "none", flash=False)
    sel = _layer("gpt3-7.5b", "a100-80gb", 4, 1, True, "selective", flash=False)
    full = _layer("gpt3-7.5b", "a100-80gb", 4, 1, True, "full", flash=False)
    assert none.recompute_s == 0
    assert sel.recompute_s == pytest.approx(sel.attention_forward_s)
    assert full.recompute_s == pytest.approx(full.forward_s)
    assert 1.8 < none.backward_s / none.forward_s < 2.6          # backward ~2x forward
    assert _layer("gpt3-7.5b", "a100-80gb", 4, 1, True, "none").attention_forward_s < none.attention_forward_s


def test_sequence_parallel_shrinks_replicated_elementwise_work():
    no_sp = _layer("gpt3-18b", "a100-80gb", 8, 1, False, "none")
    sp = _layer("gpt3-18b", "a100-80gb", 8, 1, True, "none")
    assert sp.memory_bound_forward_s < no_sp.memory_bound_forward_s
    assert sp.matmul_forward_s == no_sp.matmul_forward_s


def test_h100_faster_than_a100_for_the_same_layer():
    a = _layer("llama3-8b", "a100-80gb", 1, 1, False, "none").total_s
    h = _layer("llama3-8b", "h100-sxm", 1, 1, False, "none").total_s
    assert 2.0 < a / h < 3.5    # 3.2x peak, 1.6x HBM bandwidth


def test_embedding_backward_pays_its_dense_gradient_table():
    """PyTorch's embedding backward zero-fills a dense (vocab / tp) x h gradient each micro-batch and the engine
    accumulates it into the fp32 buffer: e + e + 8 bytes per element of the padded table (GPT-2's 50257 tokens
    padded to 50304, the rows the step passes), whatever the token count."""
    spec = parse_spec({"name": "x", "model": {"preset": "gpt3-1.7b", "seq_length": 2048, "vocab_size": 50257},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch_size": 8, "precision": "bf16"}})
    shape, hw = model_shape(spec), hardware_for(spec, CostModel())
    padded = estimate_params(shape, 1).padded_vocab_size
    assert padded > 50257
    lookup = 3 * 2 * 2048 * shape.hidden_size / hw.hbm_Bps
    table = padded * shape.hidden_size * (2 + 2 + 8) / hw.hbm_Bps
    assert embedding_time_s(shape, hw, 1, 1, padded) == pytest.approx(lookup + table + 6 * hw.kernel_gap_s)
    assert embedding_time_s(shape, hw, 2, 1, padded) - embedding_time_s(shape, hw, 1, 1, padded) == \
        pytest.approx(-table / 2)
