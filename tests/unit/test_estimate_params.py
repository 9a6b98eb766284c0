"""Parameter counts: closed forms for GPT (12h^2 per layer), GQA, gated MLP, tied/untied, padded vocab."""
from __future__ import annotations

import pytest

from orchestrator.estimate.params import ModelShape, estimate_params, layer_matrix_params, layer_params_per_rank
from orchestrator.layout import padded_vocab_size

GPT = ModelShape(num_layers=24, hidden_size=2304, num_attention_heads=24, num_query_groups=24,
                 ffn_hidden_size=4 * 2304, vocab_size=51200, seq_length=2048)
LLAMA = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                   vocab_size=128256, seq_length=8192, gated_mlp=True, tie_embeddings=False, rmsnorm=True,
                   learned_positions=False, bias=False)


def test_gpt_layer_is_12h2_plus_13h():
    h = GPT.hidden_size
    assert layer_matrix_params(GPT) == 12 * h * h
    # biases: QKV 3h, proj h, fc1 4h, fc2 h; two LayerNorms 2h each -> 13h
    assert layer_params_per_rank(GPT, 1) == 12 * h * h + 13 * h


def test_gpt_total_closed_form():
    h, L, v, s = GPT.hidden_size, GPT.num_layers, GPT.vocab_size, GPT.seq_length
    est = estimate_params(GPT)
    assert est.total == L * (12 * h * h + 13 * h) + v * h + s * h + 2 * h
    assert est.output_layer == 0                        # tied
    assert 1.6e9 < est.total < 1.8e9                    # "1.7B" (Narayanan Table 1)


def test_llama3_8b_is_8_billion():
    est = estimate_params(LLAMA)
    h, f, kv = 4096, 14336, 8 * 128
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h   # GQA, SwiGLU, two RMSNorms
    assert est.per_layer == per_layer
    v = padded_vocab_size(128256, 1)
    assert est.total == 32 * per_layer + 2 * v * h + h      # untied in/out embeddings, final norm
    assert 8.0e9 < est.total < 8.1e9


def test_gqa_and_gating_change_only_their_terms():
    mha = ModelShape(**{**LLAMA.__dict__, "num_query_groups": 32})
    h, kv = 4096, 8 * 128
    assert layer_matrix_params(mha) - layer_matrix_params(LLAMA) == 2 * h * (h - kv)
    ungated = ModelShape(**{**LLAMA.__dict__, "gated_mlp": False})
    assert layer_matrix_params(LLAMA) - layer_matrix_params(ungated) == h * 14336


def test_untied_output_layer_counted_once_more():
    untied = ModelShape(**{**GPT.__dict__, "tie_embeddings": False})
    v = padded_vocab_size(GPT.vocab_size, 1)
    assert estimate_params(untied).total - estimate_params(GPT).total == v * GPT.hidden_size


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_padded_vocab_used(tp):
    shape = ModelShape(**{**GPT.__dict__, "vocab_size": 50257})
    assert estimate_params(shape, tp).padded_vocab_size == padded_vocab_size(50257, tp)
    assert estimate_params(shape, tp).padded_vocab_size % (128 * tp) == 0


def test_sharding_splits_matrices_and_replicates_norms():
    h = GPT.hidden_size
    full, per8 = layer_params_per_rank(GPT, 1), layer_params_per_rank(GPT, 8)
    replicated = 2 * 2 * h + 2 * h                     # LayerNorms + row-parallel biases
    assert per8 == (full - replicated) // 8 + replicated


def test_pipeline_stages_hold_their_layers_and_embeddings():
    est = estimate_params(GPT, tp=2, pp=4)
    stage = GPT.num_layers // 4 * layer_params_per_rank(GPT, 2)
    vh = est.padded_vocab_size * GPT.hidden_size // 2
    assert est.first_stage_per_gpu == stage + vh + GPT.seq_length * GPT.hidden_size
    assert est.last_stage_per_gpu == stage + 2 * GPT.hidden_size + vh   # final norm + tied copy of the embedding
    assert est.per_gpu == max(est.first_stage_per_gpu, est.last_stage_per_gpu)


def test_uneven_split_stages_hold_their_own_layer_counts():
    """126 layers on pp=16 as 7 + 14x8 + 7: the middle stages hold the most layers and no embedding."""
    from orchestrator.stages import stage_split

    shape = ModelShape(num_layers=126, hidden_size=2304, num_attention_heads=24, num_query_groups=24,
                       ffn_hidden_size=4 * 2304, vocab_size=51200, seq_length=2048)
    est = estimate_params(shape, tp=2, pp=16, split=stage_split(126, 16, 7, 7))
    layer, vh = layer_params_per_rank(shape, 2), est.padded_vocab_size * shape.hidden_size // 2
    assert est.first_stage_per_gpu == 7 * layer + vh + shape.seq_length * shape.hidden_size
    assert est.last_stage_per_gpu == 7 * layer + 2 * shape.hidden_size + vh
    assert est.middle_stage_per_gpu == 8 * layer
    assert est.per_gpu == max(est.first_stage_per_gpu, est.last_stage_per_gpu, est.middle_stage_per_gpu)
    assert estimate_params(shape, tp=2, pp=16, split=stage_split(126, 16, 7, 7)).total == estimate_params(shape).total


def test_even_split_is_the_default():
    from orchestrator.stages import stage_split

    assert estimate_params(GPT, 2, 4) == estimate_params(GPT, 2, 4, stage_split(24, 4))
