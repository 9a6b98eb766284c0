"""The dense-regime terms of the step model: Megatron's overlapped pipeline exchanges (interleaved schedule)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate import estimate_layout
from orchestrator.estimate.estimate_context import EstimateContext
from orchestrator.estimate.step import estimate, overlapped_p2p_exposed_s, uses_p2p_overlap
from orchestrator.layout import Layout
from orchestrator.spec_loader import parse_spec

def pp_spec(engine: str = "megatron"):
    return parse_spec({"name": "pp", "model": {"preset": "llama2-13b"},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": 2, "gpus_per_node": 8},
                       "training": {"global_batch_size": 128, "precision": "bf16", "engine": engine}})


H100_PP = pp_spec()
INTERLEAVED = Layout(tp=1, pp=4, vpp=10, dp=4, zero_stage=1, micro_batch_size=1, sequence_parallel=False,
                     recompute="none", offload="none")


def test_overlapped_exchange_hides_behind_the_chunk_windows():
    assert overlapped_p2p_exposed_s(1e-3, 4, 2e-3, 4e-3) == 0.0           # both windows longer than a transfer
    # shorter windows leave the rest of each transfer exposed, v chunks a micro-batch
    assert overlapped_p2p_exposed_s(1e-3, 4, 0.5e-3, 4e-3) == pytest.approx(4 * 0.5e-3)
    assert overlapped_p2p_exposed_s(1e-3, 2, 0.0, 0.0) == pytest.approx(2 * 2 * 1e-3)   # no window: all of it


def test_interleaved_megatron_pipeline_exposes_less_p2p_with_overlap():
    on = estimate(EstimateContext.of(H100_PP), INTERLEAVED)
    off = estimate(EstimateContext.of(H100_PP, p2p_overlap=False), INTERLEAVED)
    assert on.comm.pp_s == pytest.approx(off.comm.pp_s)                 # the same traffic ...
    assert on.comm.pp_exposed_s < 0.25 * off.comm.pp_exposed_s          # ... most of it hidden
    assert on.step_time_s < off.step_time_s
    # the warmup and flush still wait for their exchanges: more than the steady state leaves exposed
    assert on.comm.pp_exposed_s > 0
    b = on.breakdown
    assert sum(vars(b).values()) == pytest.approx(on.step_time_s, rel=1e-6)


def test_p2p_overlap_needs_interleaving_and_megatron():
    ctx = EstimateContext.of(H100_PP)
    assert uses_p2p_overlap(ctx, INTERLEAVED)
    assert not uses_p2p_overlap(ctx, dataclasses.replace(INTERLEAVED, vpp=1))   # 1F1B: batched, waited
    assert not uses_p2p_overlap(EstimateContext.of(pp_spec("deepspeed")), INTERLEAVED)
    plain = dataclasses.replace(INTERLEAVED, vpp=1)
    assert estimate_layout(H100_PP, plain).comm.pp_exposed_s == pytest.approx(
        estimate(EstimateContext.of(H100_PP, p2p_overlap=False), plain).comm.pp_exposed_s)
