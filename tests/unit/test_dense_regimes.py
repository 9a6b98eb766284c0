"""The dense-regime terms of the step model: Megatron's overlapped pipeline exchanges (interleaved schedule)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate import estimate_layout
from orchestrator.estimate.estimate_context import EstimateContext
from orchestrator.estimate.step import estimate, overlapped_p2p_exposed_s, uses_p2p_overlap
from orchestrator.layout import Layout
from orchestrator.spec_loader import parse_spec
from tests.spec_variants import spec_with

def pp_spec(engine: str = "megatron"):
    return parse_spec({"name": "pp", "model": {"preset": "llama2-13b"},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": 2, "gpus_per_node": 8},
                       "training": {"global_batch_size": 128, "precision": "bf16", "engine": engine}})


H100_PP = pp_spec()
NO_OVERLAP = spec_with(H100_PP, **{"parallelism.overlap_p2p_comm": False})   # --no-overlap-p2p-communication
INTERLEAVED = Layout(tp=1, pp=4, vpp=10, dp=4, zero_stage=1, micro_batch_size=1, sequence_parallel=False,
                     recompute="none", offload="none")


def test_overlapped_exchange_hides_behind_the_chunk_windows():
    assert overlapped_p2p_exposed_s(1e-3, 4, 2e-3, 4e-3) == 0.0           # both windows longer than a transfer
    # shorter windows leave the rest of each transfer exposed, v chunks a micro-batch
    assert overlapped_p2p_exposed_s(1e-3, 4, 0.5e-3, 4e-3) == pytest.approx(4 * 0.5e-3)
    assert overlapped_p2p_exposed_s(1e-3, 2, 0.0, 0.0) == pytest.approx(2 * 2 * 1e-3)   # no window: all of it


def test_interleaved_megatron_pipeline_exposes_less_p2p_with_overlap():
    on = estimate(EstimateContext.of(H100_PP), INTERLEAVED)
    off = estimate(EstimateContext.of(NO_OVERLAP), INTERLEAVED)
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
        estimate(EstimateContext.of(NO_OVERLAP), plain).comm.pp_exposed_s)


# --- what hidden NCCL collectives cost the compute (estimate/overlap.py) ---------------------------------

from orchestrator.estimate.comm import DataParallelWork, data_parallel_comm, group_placement  # noqa: E402
from orchestrator.estimate.overlap import contention_s, gemm_slowdown  # noqa: E402


def fsdp_spec(gpu: str, nodes: int = 16):
    return parse_spec({"name": "fsdp", "model": {"preset": "llama2-7b"},
                       "cluster": {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": 8},
                       "training": {"global_batch_size": 2 * 8 * nodes, "precision": "bf16", "engine": "megatron"}})


FSDP = Layout(tp=1, pp=1, vpp=1, dp=128, zero_stage=3, micro_batch_size=1, sequence_parallel=False,
              recompute="none", offload="none")


def test_persistent_gemm_runs_a_second_round_behind_a_nccl_kernel():
    # 8192 x 4096 output in 128 x 256 tiles: 1024 tiles, a grid of 132 persistent CTAs
    assert gemm_slowdown(8192, 4096, 132, 16, persistent=True) == 2.0
    assert gemm_slowdown(8192, 4096, 132, 0, persistent=True) == 1.0
    assert gemm_slowdown(256, 256, 132, 16, persistent=True) == 1.0      # 2 tiles: room left on free SMs
    conventional = gemm_slowdown(8192, 4096, 132, 16, persistent=False)   # waves: about the SM share
    assert 1.0 < conventional < 1.25
    assert contention_s(1.0, 2.0) == pytest.approx(0.5) and contention_s(1.0, 132 / 116) == pytest.approx(16 / 132)


def test_fsdp_overlap_costs_hopper_more_than_ampere():
    h100 = estimate_layout(fsdp_spec("h100-sxm"), FSDP)
    a100 = estimate_layout(fsdp_spec("a100-80gb"), FSDP)

    def lost_share(est):
        hidden = est.comm.dp_s - est.comm.dp_exposed_s
        return est.breakdown.contention_s / hidden

    assert lost_share(a100) == pytest.approx(16 / 108, rel=0.1)         # the SMs NCCL holds
    assert lost_share(h100) > 0.35                                       # the persistent GEMMs' second round
    assert h100.breakdown.contention_s > 0.15 * h100.breakdown.compute_s


def test_fsdp_cost_grows_as_compute_per_layer_shrinks():
    spec = fsdp_spec("h100-sxm")
    big = estimate_layout(parse_spec({**_spec_dict(spec), "training": {**_spec_dict(spec)["training"],
                                                                       "global_batch_size": 4 * 128}}),
                          dataclasses.replace(FSDP, micro_batch_size=4))
    small = estimate_layout(spec, FSDP)
    share = [(e.step_time_s - e.breakdown.compute_s) / e.step_time_s for e in (big, small)]
    assert share[1] > share[0]      # the same gathers per layer, a quarter of the compute to hide them


def _spec_dict(spec):
    return {"name": spec.name, "model": {"preset": "llama2-7b"},
            "cluster": {"gpu": spec.cluster.gpu, "num_nodes": spec.cluster.num_nodes, "gpus_per_node": 8},
            "training": {"global_batch_size": spec.training.global_batch_size, "precision": "bf16",
                         "engine": "megatron"}}


def test_zero3_exposed_gathers_grow_when_the_compute_window_shrinks():
    ctx = EstimateContext.of(fsdp_spec("h100-sxm"))
    pl = group_placement(128, 1, 8)
    work = DataParallelWork(engine="megatron", zero_stage=3, param_elements=6.7e9, param_bytes=2, grad_bytes=4,
                            layers=32, num_microbatches=1, full_recompute=False, forward_window_s=0.2,
                            backward_window_s=0.4)
    wide = data_parallel_comm(work, pl, 0.7, ctx.hw)
    narrow = data_parallel_comm(dataclasses.replace(work, forward_window_s=0.02, backward_window_s=0.04), pl, 0.7,
                                ctx.hw)
    assert narrow.time_s == pytest.approx(wide.time_s)
    assert narrow.exposed_s > 5 * wide.exposed_s


def test_overlap_p2p_comm_false_reaches_the_megatron_arguments():
    """The spec field the estimate reads is what orch writes: --no-overlap-p2p-communication only when false."""
    from orchestrator.plan import build_plan
    from orchestrator.render.megatron import render_megatron_args

    fixed = {"parallelism.tensor": 1, "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 10,
             "parallelism.micro_batch_size": 1}
    on = render_megatron_args(build_plan(spec_with(H100_PP, **fixed), top_k=1))
    off = render_megatron_args(build_plan(spec_with(NO_OVERLAP, **fixed), top_k=1))
    assert "--num-virtual-stages-per-pipeline-rank" in on and "--no-overlap-p2p-communication" not in on
    assert "--no-overlap-p2p-communication" in off
