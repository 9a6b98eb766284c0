"""Activation memory vs Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 and the 1F1B in-flight counts."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.activations import estimate_activations, in_flight_chunks, layer_activation_bytes
from orchestrator.estimate.params import ModelShape
from tests.published import load_cases
from tests.conftest import ROOT

CASES = load_cases(ROOT / "tests" / "data" / "published-cases.json")

# MT-NLG 530B, the case of published-cases.json (korthikanti2022_actmem_530B_per_layer): s=2048, b=1,
# h=20480, a=128, t=8, no fused attention, dropout (the paper's setting; without dropout: tests/unit/test_dropout.py).
MTNLG = ModelShape(num_layers=105, hidden_size=20480, num_attention_heads=128, num_query_groups=128,
                   ffn_hidden_size=4 * 20480, vocab_size=51200, seq_length=2048, flash_attention=False, dropout=0.1)
S, B, H, A, T = 2048, 1, 20480, 128, 8


def test_formulas_as_printed():
    sbh = S * B * H
    assert layer_activation_bytes(MTNLG, 1, False, "none", B) == sbh * (34 + 5 * A * S / H)
    assert layer_activation_bytes(MTNLG, T, False, "none", B) == sbh * (10 + 24 / T + 5 * A * S / (H * T))
    assert layer_activation_bytes(MTNLG, T, True, "none", B) == sbh / T * (34 + 5 * A * S / H)
    assert layer_activation_bytes(MTNLG, T, False, "selective", B) == sbh * (10 + 24 / T)
    assert layer_activation_bytes(MTNLG, T, True, "selective", B) == 34 * sbh / T
    assert layer_activation_bytes(MTNLG, 1, False, "full", B) == 2 * sbh


def test_published_530b_case():
    case = next(c for c in CASES if c["id"] == "korthikanti2022_actmem_530B_per_layer")
    derived = case["published"]["derived_bytes_per_layer"]
    assert layer_activation_bytes(MTNLG, 1, False, "none", B) == derived["none"]
    assert layer_activation_bytes(MTNLG, T, False, "none", B) == derived["tp"]
    assert layer_activation_bytes(MTNLG, T, True, "none", B) == derived["tp_sp"]
    assert layer_activation_bytes(MTNLG, T, True, "selective", B) == derived["tp_sp_selective"]
    assert layer_activation_bytes(MTNLG, 1, False, "full", B) == derived["full_recompute"]
    # 1F1B: the first of 35 stages holds 35 micro-batches of 3 layers = all 105 layers' worth.
    est = estimate_activations(MTNLG, T, 35, 1, True, "selective", B, 64, 51200)
    assert est.first_stage_layers_in_flight == 105
    assert est.per_layer_bytes * est.first_stage_layers_in_flight == case["published"][
        "first_stage_total_tp_sp_selective_bytes"]


def test_interleaving_factor():
    """Korthikanti section 4.2.3: interleaving with v chunks multiplies the first stage by 1 + (p-1)/(p*v)."""
    p, v, m = 8, 4, 64
    shape = ModelShape(**{**MTNLG.__dict__, "num_layers": 96})
    plain = estimate_activations(shape, T, p, 1, True, "selective", 1, m, 51200)
    inter = estimate_activations(shape, T, p, v, True, "selective", 1, m, 51200)
    assert plain.first_stage_layers_in_flight == 96
    assert inter.first_stage_layers_in_flight == pytest.approx(96 * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("stage,expected", [(0, 4), (1, 3), (3, 1)])
def test_in_flight_1f1b(stage, expected):
    assert in_flight_chunks(stage, 4, 1, 16) == expected
    assert in_flight_chunks(stage, 4, 1, 2) == min(expected, 2)   # fewer micro-batches than stages


def test_flash_attention_stores_no_s2_terms():
    flash = ModelShape(**{**MTNLG.__dict__, "flash_attention": True})
    sbh = S * B * H
    lse = 4 * A * S * B // T
    assert layer_activation_bytes(flash, T, True, "none", B) == 34 * sbh // T + lse


def test_gqa_and_gated_mlp_generalisation():
    llama = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                       ffn_hidden_size=14336, vocab_size=128256, seq_length=8192, gated_mlp=True, flash_attention=False,
                       dropout=0.1)
    s, h, kv, f = 8192, 4096, 1024, 14336
    expected = 10 * s * h + 2 * s * (2 * h + 2 * kv + 3 * f) + 5 * 32 * s * s
    assert layer_activation_bytes(llama, 1, False, "none", 1) == expected


def test_last_stage_holds_logits_and_fewer_micro_batches():
    est = estimate_activations(MTNLG, T, 35, 1, True, "selective", 1, 64, 51200)
    assert est.last_stage_layers_in_flight == 3
    assert est.logits_bytes == 2048 * 51200 // 8 * (4 + 2)   # fp32 softmax + bf16 gradient (test_loss_memory.py)
    assert est.last_stage_bytes < est.first_stage_bytes


def test_uneven_split_in_flight_layers_per_stage():
    """Stage r holds in_flight(r) * c_r / v layers: 126 layers as 7 + 14x8 + 7 on p = 16 (Llama 3 405B's
    split) puts 16 x 7 = 112 layers' worth on stage 0 but 15 x 8 = 120 on stage 1, and 1 x 7 on the last."""
    from orchestrator.stages import stage_split

    shape = ModelShape(num_layers=126, hidden_size=4096, num_attention_heads=32, num_query_groups=32,
                       ffn_hidden_size=4 * 4096, vocab_size=51200, seq_length=2048)
    est = estimate_activations(shape, 8, 16, 1, True, "selective", 1, 64, 51200, 2, stage_split(126, 16, 7, 7))
    per = layer_activation_bytes(shape, 8, True, "selective", 1)
    assert (est.first_stage_layers_in_flight, est.middle_stage_layers_in_flight, est.last_stage_layers_in_flight) \
        == (112, 120, 7)
    assert est.middle_stage_bytes == 120 * per + est.working_bytes
    assert est.middle_stage_bytes > est.first_stage_bytes - est.working_bytes - 3 * S * H // 8   # embedding out
    # interleaved, v = 2 (6 + 14x8 + 8): stage r holds (p - r - 1)*2 + (v - 1)*p + 1 chunks of c_r / v layers
    est2 = estimate_activations(shape, 8, 16, 2, True, "selective", 1, 64, 51200, 2, stage_split(126, 16, 6, 8))
    assert est2.first_stage_layers_in_flight == in_flight_chunks(0, 16, 2, 64) * 3 == 47 * 3
    assert est2.middle_stage_layers_in_flight == in_flight_chunks(1, 16, 2, 64) * 4 == 45 * 4
    assert est2.last_stage_layers_in_flight == in_flight_chunks(15, 16, 2, 64) * 4 == 17 * 4


def test_even_split_has_no_larger_middle_stage():
    est = estimate_activations(MTNLG, T, 35, 1, True, "selective", 1, 64, 51200)
    assert 0 < est.middle_stage_bytes < est.first_stage_bytes
    two = dataclasses.replace(MTNLG, num_layers=104)
    assert estimate_activations(two, T, 2, 1, True, "selective", 1, 64, 51200).middle_stage_bytes == 0  # no middle


def test_logits_and_the_recompute_working_set_are_not_live_together():
    # The loss backward frees the logits, their fp32 softmax and gradient before the last layer is recomputed:
    # the last stage adds the larger of the two transients, not both.
    for mb, vocab in ((1, 51200), (4, 51200), (1, 1_024_000)):
        one = estimate_activations(MTNLG, 8, 35, 1, False, "full", mb, 35, vocab)
        stored = int(one.per_layer_bytes * one.last_stage_layers_in_flight)
        assert one.last_stage_bytes == stored + max(one.logits_bytes, one.working_bytes)
        single = estimate_activations(MTNLG, 8, 1, 1, False, "full", mb, 1, vocab)
        embedding_out = S * mb * H          # its 1-byte dropout mask (its output is the first layer's input)
        assert single.last_stage_bytes == (int(single.per_layer_bytes * single.last_stage_layers_in_flight)
                                           + embedding_out + max(single.logits_bytes, single.working_bytes))
