"""FLOPs: the general form reduces to Narayanan et al. 2021 eq. 3 (with and without recompute)."""
from __future__ import annotations

import pytest

from orchestrator.estimate.flops import estimate_flops, narayanan_flops
from orchestrator.estimate.params import ModelShape


def gpt(layers, hidden, heads, seq=2048, vocab=51200):
    return ModelShape(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=heads,
                      ffn_hidden_size=4 * hidden, vocab_size=vocab, seq_length=seq)


@pytest.mark.parametrize("layers,hidden,heads,batch", [(24, 2304, 24, 512), (96, 12288, 96, 1536),
                                                        (128, 25600, 160, 3072)])
def test_general_form_equals_eq3(layers, hidden, heads, batch):
    shape = gpt(layers, hidden, heads)
    full = estimate_flops(shape, batch, "full")
    none = estimate_flops(shape, batch, "none")
    assert full.hardware_flops == pytest.approx(narayanan_flops(batch, 2048, layers, hidden, 51200), rel=1e-12)
    assert none.model_flops == pytest.approx(narayanan_flops(batch, 2048, layers, hidden, 51200, False), rel=1e-12)
    assert full.model_flops == none.model_flops == none.hardware_flops   # MFU never counts recompute


def test_eq3_closed_form_value():
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    assert narayanan_flops(b, s, l, h, v) == pytest.approx(96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h)))
    # the no-recompute form has V/(12 l h), not V/(16 l h): logits are never recomputed
    assert narayanan_flops(b, s, l, h, v, False) == pytest.approx(72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h)))


def test_selective_recompute_adds_only_attention():
    shape = gpt(24, 2304, 24)
    none, sel = estimate_flops(shape, 8, "none"), estimate_flops(shape, 8, "selective")
    assert sel.hardware_flops - none.hardware_flops == pytest.approx(8 * 24 * 4 * 2048**2 * 2304)


def test_gqa_gated_counts_matrix_params():
    llama = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                       ffn_hidden_size=14336, vocab_size=128256, seq_length=8192, gated_mlp=True)
    h, kv, f, s = 4096, 1024, 14336, 8192
    matrix = h * (h + 2 * kv) + h * h + 3 * h * f
    per_seq = 32 * (2 * s * matrix + 4 * s * s * h) + 2 * s * h * 128256
    assert estimate_flops(llama, 1).model_flops == pytest.approx(3 * per_seq)
