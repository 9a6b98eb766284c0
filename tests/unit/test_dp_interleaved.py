"""Megatron-Core's chunk-by-chunk DP sync under the interleaved 1F1B (comm.interleaved_reduce_exposed_s,
comm.interleaved_gather_exposed_s; core_v0.16.1 pipeline_parallel/schedules.py)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate import estimate_layout
from orchestrator.estimate.comm import DataParallelWork, interleaved_gather_exposed_s, interleaved_reduce_exposed_s
from orchestrator.estimate.estimate_context import EstimateContext
from orchestrator.estimate.step import _interleaved_fields, uses_interleaved_dp_sync
from orchestrator.layout import Layout
from orchestrator.spec_loader import parse_spec
from tests.spec_variants import spec_with


def chunked(v: int, pp: int, rank: int = 0, backward_s: float = 0.0, forward_s: float = 0.0) -> DataParallelWork:
    return DataParallelWork(engine="megatron", zero_stage=1, param_elements=1e9, param_bytes=2, grad_bytes=4,
                            layers=8, num_microbatches=16, full_recompute=False, forward_window_s=forward_s,
                            backward_window_s=backward_s, chunk_shares=(1 / v,) * v, pp_size=pp, stage_rank=rank)


def test_each_chunk_hides_behind_the_backwards_left_and_the_last_one_stays_exposed():
    # v = 4 chunks of 2 s of reduction; a chunk's backward 1 s; chunk c launched with 4c chunk backwards left
    w = chunked(v=4, pp=4, backward_s=4.0)
    assert interleaved_reduce_exposed_s(w, 8.0, 1.0) == pytest.approx(2.0)   # chunk 0's, whole
    # the one-window model hid 4 s of 8 behind one micro-batch's backward of the stage
    assert interleaved_reduce_exposed_s(w, 8.0, 1.0) < 8.0 - 4.0
    # chunks too big for their gaps queue on the one communicator: 40 s less the 6 chunk backwards before
    assert interleaved_reduce_exposed_s(chunked(v=4, pp=2, backward_s=4.0), 40.0, 1.0) == pytest.approx(34.0)
    # no overlap: nothing hides
    assert interleaved_reduce_exposed_s(w, 8.0, 0.0) == pytest.approx(8.0)


def test_a_later_stage_ends_its_cooldown_early_and_hides_its_last_chunk():
    # stage 3 of 4 launches chunk 0 after its own last backward, 3 chunk backwards before stage 0 ends
    assert interleaved_reduce_exposed_s(chunked(v=4, pp=4, rank=3, backward_s=4.0), 8.0, 1.0) == 0.0
    assert interleaved_reduce_exposed_s(chunked(v=4, pp=4, rank=1, backward_s=4.0), 8.0, 1.0) == pytest.approx(1.0)


def test_the_first_forward_waits_for_chunk_zero_and_later_chunks_gather_ahead():
    w = chunked(v=4, pp=4, forward_s=4.0)       # a chunk's forward 1 s, p = 4 of them before the next chunk
    assert interleaved_gather_exposed_s(w, 8.0, 1.0) == pytest.approx(2.0)
    # 5 s a chunk: chunk 0 waits 5; chunk 1 (launched with it) is done at 10, wanted at 9; chunk 2, launched
    # when chunk 1 starts (10), is done at 15, wanted at 14; chunk 3 the same: 5 + 1 + 1 + 1
    assert interleaved_gather_exposed_s(w, 20.0, 1.0) == pytest.approx(5.0 + 1.0 + 1.0 + 1.0)


SPEC = parse_spec({"name": "il", "model": {"preset": "llama2-70b"},
                   "cluster": {"gpu": "h100-sxm", "num_nodes": 16, "gpus_per_node": 8},
                   "training": {"global_batch_size": 256, "precision": "bf16", "engine": "megatron"}})
BASE = Layout(tp=8, pp=4, vpp=1, dp=4, zero_stage=1, micro_batch_size=1, sequence_parallel=True,
              recompute="none", offload="none")


def test_exposed_dp_falls_with_vpp_but_keeps_stage_zeros_last_chunk():
    est = {v: estimate_layout(SPEC, dataclasses.replace(BASE, vpp=v)) for v in (1, 2, 4, 10)}
    exposed = {v: e.comm.dp_exposed_s for v, e in est.items()}
    assert exposed[2] > exposed[4] > exposed[10]
    assert exposed[1] > exposed[2]
    for v in (2, 4, 10):
        assert est[v].comm.dp_s == pytest.approx(est[1].comm.dp_s)      # the same traffic, chunked
        # at least stage 0's last chunk (its 1/v of the layers and the embedding) of the reduce-scatter waits
        assert exposed[v] > est[v].comm.dp_reduce_s / v


def test_non_interleaved_deepspeed_and_fsdp_keep_the_one_window_model():
    ctx = EstimateContext.of(SPEC)
    assert uses_interleaved_dp_sync(ctx, dataclasses.replace(BASE, vpp=2))
    # 1F1B: stage 0 enables grad sync before its last backward, its buckets hide behind it (schedules.py
    # forward_backward_pipelining_without_interleaving); DeepSpeed and Megatron FSDP sync otherwise
    assert not uses_interleaved_dp_sync(ctx, BASE)
    assert not uses_interleaved_dp_sync(ctx, dataclasses.replace(BASE, vpp=2, zero_stage=3))
    assert not uses_interleaved_dp_sync(EstimateContext.of(spec_with(SPEC, **{"training.engine": "deepspeed"})),
                                        dataclasses.replace(BASE, vpp=2))
    # only there does the step give the DP work its chunks (comm.py follows what it is given)
    from orchestrator.estimate.step import params_of, step_timing
    ds = EstimateContext.of(spec_with(SPEC, **{"training.engine": "deepspeed"}))
    lay = dataclasses.replace(BASE, vpp=2)
    assert _interleaved_fields(ds, lay, params_of(ds, lay), 0, 8, 10**9) == {}
    assert _interleaved_fields(ctx, lay, params_of(ctx, lay), 0, 8, 10**9)["chunk_shares"]
    assert step_timing(ctx, lay).comm.dp_exposed_s < step_timing(ctx, BASE).comm.dp_exposed_s
