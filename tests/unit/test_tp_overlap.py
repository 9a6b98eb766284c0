"""Transformer Engine's userbuffers TP overlap, GEMM by GEMM (orchestrator/estimate/tp_overlap.py)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.comm import group_placement, reduce_scatter_s
from orchestrator.estimate.hardware import hardware_for
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.params import model_shape
from orchestrator.estimate.tp_overlap import (bulk_exposed_s, pipeline_rs_exposed_s, ring_exchange_exposed_s,
                                              userbuffers_exposed_s)
from orchestrator.spec_loader import parse_spec


def test_ring_exchange_hides_the_shards_behind_all_but_the_first_chunk():
    assert ring_exchange_exposed_s(ag_s=3.0, gemm_s=8.0, tp=4) == 0.0        # 3 shards behind 3 of 4 chunks
    assert ring_exchange_exposed_s(ag_s=7.0, gemm_s=8.0, tp=4) == pytest.approx(1.0)


def test_pipelined_reduce_scatter_leaves_its_last_chunk_exposed():
    assert pipeline_rs_exposed_s(rs_s=4.0, gemm_s=100.0) == pytest.approx(1.0)   # 1 of 4 splits
    # a transfer longer than its GEMM: the excess of the first three chunks as well
    assert pipeline_rs_exposed_s(rs_s=4.0, gemm_s=2.0) == pytest.approx(1.0 + 1.5)
    assert bulk_exposed_s(2.0, 5.0) == 0.0 and bulk_exposed_s(5.0, 2.0) == 3.0


def _gpt3_175b(precision: str):
    spec = parse_spec({"name": "s", "model": {"preset": "gpt3-175b", "seq_length": 2048},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": 16, "gpus_per_node": 8},
                       "training": {"global_batch_size": 256, "precision": precision}})
    return model_shape(spec), hardware_for(spec, CostModel())


def test_large_dense_layer_exposes_only_the_last_reduce_scatter_chunks():
    shape, hw = _gpt3_175b("bf16")
    pl = group_placement(4, 1, hw.gpus_per_node)
    tokens = 2048
    rs = reduce_scatter_s(tokens * shape.hidden_size * hw.dtype_bytes, pl, hw)
    exposed = userbuffers_exposed_s(shape, 4, tokens, pl, hw, hw, fp8=False, recomputed_forward=False)
    # h = 12288 at tp 4: every GEMM outlasts its transfer, so two forward reduce-scatters leave a quarter each
    assert exposed == pytest.approx(2 * rs / 4)
    again = userbuffers_exposed_s(shape, 4, tokens, pl, hw, hw, fp8=False, recomputed_forward=True)
    assert again == pytest.approx(2 * exposed)                   # full recompute repeats the forward's
    assert userbuffers_exposed_s(shape, 1, tokens, pl, hw, hw, fp8=False, recomputed_forward=False) == 0.0


def test_fp8_all_gathers_move_one_byte_an_element():
    """A small layer whose GEMMs are shorter than its transfers: FP8 all-gather buffers (TE's fp8_buf) halve
    the gathers' excess."""
    shape, hw = _gpt3_175b("bf16")
    small = dataclasses.replace(shape, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8,
                                num_query_groups=8)
    pl = group_placement(8, 1, hw.gpus_per_node)
    bf16 = userbuffers_exposed_s(small, 8, 512, pl, hw, hw, fp8=False, recomputed_forward=False)
    fp8 = userbuffers_exposed_s(small, 8, 512, pl, hw, hw, fp8=True, recomputed_forward=False)
    assert 0 < fp8 < bf16
