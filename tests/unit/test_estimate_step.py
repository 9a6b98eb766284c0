"""estimate_layout: SPEC.md's LAYOUT record, metric definitions, the CostModel seam."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.errors import SpecError
from orchestrator.estimate import CostModel, estimate_layout
from orchestrator.layout import Layout
from orchestrator.spec_loader import parse_spec
from tests.spec_variants import spec_with

SPEC = parse_spec({"name": "s", "model": {"preset": "gpt3-7.5b"},
                   "cluster": {"gpu": "a100-80gb", "num_nodes": 8, "gpus_per_node": 8},
                   "training": {"global_batch_size": 512, "precision": "bf16"}})
LAYOUT = Layout(tp=4, pp=4, vpp=3, dp=4, zero_stage=1, micro_batch_size=2, sequence_parallel=True,
                recompute="selective", offload="none")
LAYOUT_KEYS = {"tp", "pp", "vpp", "dp", "zero_stage", "micro_batch_size", "grad_accum_steps", "num_microbatches",
               "sequence_parallel", "recompute", "offload", "memory", "flops_per_step", "step_time_s", "tokens_per_s",
               "tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "comm", "engine", "uncertainty"}
MEMORY_KEYS = {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes", "total_bytes",
               "hbm_bytes", "fits"}
COMM_KEYS = {"dp_bytes", "tp_bytes", "pp_bytes", "dp_s", "tp_s", "pp_s", "exposed_s"}


def test_to_dict_has_the_spec_md_shape():
    d = estimate_layout(SPEC, LAYOUT).to_dict()
    assert LAYOUT_KEYS <= set(d)
    assert MEMORY_KEYS <= set(d["memory"])
    assert COMM_KEYS <= set(d["comm"])
    assert d["grad_accum_steps"] == d["num_microbatches"] == 512 // (2 * 4)
    assert isinstance(d["memory"]["fits"], bool) and isinstance(d["memory"]["total_bytes"], int)


def test_metric_definitions():
    est = estimate_layout(SPEC, LAYOUT)
    world, peak = 64, 312e12
    assert est.tokens_per_s == pytest.approx(512 * 2048 / est.step_time_s)
    assert est.tflops_per_gpu == pytest.approx(est.flops.model_flops / (est.step_time_s * world) / 1e12)
    assert est.mfu == pytest.approx(est.tflops_per_gpu * 1e12 / peak)
    assert est.hfu == pytest.approx(est.flops.hardware_flops / (est.step_time_s * world) / peak)
    assert est.bubble_fraction == pytest.approx(3 / (3 * 64 + 3))
    assert est.comm.exposed_s == pytest.approx(est.comm.dp_exposed_s + est.comm.tp_exposed_s + est.comm.pp_exposed_s)


def test_step_time_breakdown_adds_up():
    est = estimate_layout(SPEC, LAYOUT)
    b = est.breakdown
    assert sum(vars(b).values()) == pytest.approx(est.step_time_s, rel=1e-6)   # every part, once


def test_open_field_or_broken_rule_is_a_spec_error():
    with pytest.raises(SpecError, match="parallelism.micro_batch_size"):
        estimate_layout(SPEC, dataclasses.replace(LAYOUT, micro_batch_size=None))
    with pytest.raises(SpecError, match="global_batch_size"):
        estimate_layout(SPEC, dataclasses.replace(LAYOUT, micro_batch_size=3))


def test_cost_model_is_the_calibration_seam():
    base = estimate_layout(SPEC, LAYOUT)
    slower = estimate_layout(SPEC, LAYOUT, CostModel(matmul_efficiency=0.4))
    assert slower.step_time_s > 1.5 * base.step_time_s
    assert CostModel.from_dict(CostModel().to_dict()) == CostModel()
    with pytest.raises(SpecError, match="did you mean 'dp_overlap'"):
        CostModel.from_dict({"dp_overlapp": 0.5})
    with pytest.raises(SpecError, match="calibration.hbm_efficiency"):
        CostModel.from_dict({"hbm_efficiency": 1.5})
    assert CostModel.from_dict({"dp_overlap": 0.0, "matmul_efficiency": 0.5}).dp_overlap == 0.0


def test_offload_reports_host_bytes_and_costs_time():
    spec = parse_spec({"name": "o", "model": {"preset": "gpt3-1.7b"}, "cluster": {"gpu": "a100-80gb"},
                       "training": {"global_batch_size": 64}})
    lay = Layout(tp=1, pp=1, vpp=1, dp=8, zero_stage=3, micro_batch_size=1, sequence_parallel=False,
                 recompute="full", offload="none")
    on, off = estimate_layout(spec, lay), estimate_layout(spec, dataclasses.replace(lay, offload="optimizer+params"))
    assert on.memory.host_bytes == 0 and off.memory.host_bytes > 0
    assert off.memory.total_bytes < on.memory.total_bytes
    assert off.step_time_s > on.step_time_s
    assert off.to_dict()["memory"]["host_bytes"] > 0


def test_stage_times_closed_form():
    """Per micro-batch: first c_0*u + embedding, middle c*u, last c_{p-1}*u + head; the slowest paces the
    steady state, the mean (num_layers/p * u + (embedding + head)/p) the fill and drain."""
    from orchestrator.estimate.step import stage_times
    from orchestrator.stages import stage_split

    u, head, emb = 1.0, 1.5, 0.1
    even = stage_times(stage_split(128, 16), u, head, emb)
    assert even.slowest_s == 8 * u + head and even.slowest_layers == 8
    assert even.mean_s == pytest.approx(8 * u + (head + emb) / 16)
    uneven = stage_times(stage_split(126, 16, 7, 7), u, head, emb)          # 7 + 14x8 + 7
    assert uneven.slowest_s == max(7 * u + emb, 7 * u + head, 8 * u) == 8.5
    assert uneven.mean_s == pytest.approx(126 / 16 * u + (head + emb) / 16)
    light = stage_times(stage_split(126, 16, 7, 7), u, 0.5, emb)             # head lighter than a layer
    assert light.slowest_s == 8 * u and light.slowest_layers == 8
    one = stage_times(stage_split(4, 1), u, head, emb)
    assert one.slowest_s == one.mean_s == 4 * u + head + emb


def test_uneven_split_step_time_follows_the_slowest_stage():
    """BLOOM-176B's 5 + 10x6 + 5 on pp = 12: the pipeline term is m*(t_slowest + x) + (p-1)*(t_mean + x)."""
    from tests.published import BLOOM_176B, throughput_spec

    spec = throughput_spec(BLOOM_176B)
    lay = Layout(tp=4, pp=12, vpp=1, dp=8, zero_stage=1, micro_batch_size=2, sequence_parallel=False,
                 recompute="full", offload="none", first_stage_layers=5, last_stage_layers=5)
    est = estimate_layout(spec, lay)
    b = est.breakdown
    assert est.step_time_s == pytest.approx(sum(vars(b).values()))
    assert est.to_dict()["first_stage_layers"] == 5 and est.to_dict()["last_stage_layers"] == 5
    assert "first_stage_layers" not in estimate_layout(SPEC, LAYOUT).to_dict()   # even: the record is unchanged
    assert est.bubble_fraction == pytest.approx(11 / (128 + 11))
    # With full recompute the output layer + loss cost about one layer (6V / (96h + 16s) = 1.07 here), so
    # the balanced 5 + 10x6 + 5 beats a heavier first or last stage, whose extra layers pace every micro-batch.
    for first, last in ((4, 6), (7, 3)):
        other = estimate_layout(spec, dataclasses.replace(lay, first_stage_layers=first, last_stage_layers=last))
        assert other.step_time_s > est.step_time_s * 1.1


def _tp_exposed_fraction(gpu: str, sp: bool) -> float:
    spec = parse_spec({"name": "s", "model": {"preset": "gpt3-7.5b"},
                       "cluster": {"gpu": gpu, "num_nodes": 8, "gpus_per_node": 8},
                       "training": {"global_batch_size": 512, "precision": "bf16"}})
    comm = estimate_layout(spec, dataclasses.replace(LAYOUT, sequence_parallel=sp)).comm
    return comm.tp_exposed_s / comm.tp_s


def test_tp_comm_overlap_with_sequence_parallelism_on_nvlink_gpus_only():
    # --tp-comm-overlap: TE's userbuffers leave the pipelined reduce-scatters' last chunks exposed (1/4 of two
    # of the eight counted collectives when every transfer is shorter than its GEMM: estimate/tp_overlap.py)
    assert 0 < _tp_exposed_fraction("h100-sxm", sp=True) < 1 - CostModel().tp_comm_overlap
    assert _tp_exposed_fraction("h100-sxm", sp=False) == pytest.approx(1.0)          # plain all-reduces
    # A100: no userbuffers overlap (CUDA multicast is compute capability 9.0+; the published A100 runs ran
    # their TP collectives in series), with or without sequence parallelism
    assert _tp_exposed_fraction("a100-80gb", sp=True) == pytest.approx(1.0)
    assert _tp_exposed_fraction("l40s", sp=True) == pytest.approx(1.0)               # PCIe: no userbuffers


def test_megatron_args_carry_tp_comm_overlap_exactly_when_the_model_assumed_it():
    from orchestrator.plan import Plan
    from orchestrator.render.megatron import render_megatron_args

    for gpu, sp, expected in (("h100-sxm", True, True), ("h100-sxm", False, False), ("l40s", True, False),
                              ("a100-80gb", True, False)):
        spec = parse_spec({"name": "s", "model": {"preset": "gpt3-7.5b"},
                           "cluster": {"gpu": gpu, "num_nodes": 8, "gpus_per_node": 8},
                           "training": {"global_batch_size": 512, "precision": "bf16"}})
        plan = Plan(spec=spec, layout=dataclasses.replace(LAYOUT, sequence_parallel=sp), chosen={})
        assert ("--tp-comm-overlap" in render_megatron_args(plan)) is expected


def test_distributed_saved_input_keeps_one_tp_slice_and_pays_one_all_gather_per_layer():
    """Megatron's --distribute-saved-activations / metaseq's --distribute-checkpointed-activations (OPT-175B):
    full recompute stores 1/tp of each layer's input and gathers it back before the recompute."""
    from orchestrator.estimate.step import EstimateContext, estimate
    from orchestrator.estimate.comm import all_gather_s, group_placement

    full = dataclasses.replace(LAYOUT, sequence_parallel=False, recompute="full", pp=1, vpp=1, dp=16)
    plain, split = (estimate(EstimateContext.of(spec_with(SPEC, **{'parallelism.distribute_saved_activations': d})), full)
                   for d in (False, True))
    per_layer = plain.memory.activations_bytes - split.memory.activations_bytes
    stored = 2048 * 2 * SPEC.model.hidden_size * 2          # s * b * h, 16-bit, per layer in flight
    layers = SPEC.model.num_layers
    assert per_layer == pytest.approx(layers * stored * (1 - 1 / 4), rel=1e-3)
    ctx = EstimateContext.of(SPEC)
    gather = all_gather_s(stored, group_placement(4, 1, 8), ctx.hw)
    assert split.comm.tp_s - plain.comm.tp_s == pytest.approx(plain.num_microbatches * layers * gather, rel=1e-6)
    # with sequence parallelism the layer input is already split: the flag changes nothing (Megatron refuses both)
    sp = dataclasses.replace(full, sequence_parallel=True)
    assert (estimate(EstimateContext.of(spec_with(SPEC, **{'parallelism.distribute_saved_activations': True})), sp).step_time_s
            == estimate(EstimateContext.of(SPEC), sp).step_time_s)


def test_distributed_optimizer_zeroes_its_whole_gradient_buffer():
    """ZeRO-1 on Megatron (the distributed optimizer) steps 1/dp of the parameters, but zero_grad_buffer clears
    every local fp32 gradient (bf16 reduces in fp32): the optimizer time is the owned shard's Adam plus 4 bytes
    per non-owned local parameter; ZeRO-0 owns them all and DeepSpeed is not charged it."""
    from orchestrator.estimate.compute import optimizer_step_s
    from orchestrator.estimate.step import EstimateContext, _optimizer_s, params_of

    ctx = EstimateContext.of(SPEC)
    local = params_of(ctx, LAYOUT).per_gpu
    optimizer_s, _ = _optimizer_s(ctx, LAYOUT, local, 1, 8)
    owned = local / LAYOUT.dp
    assert optimizer_s == pytest.approx(optimizer_step_s(owned, ctx.hw) + 4 * (local - owned) / ctx.hw.hbm_Bps)
    zero0 = dataclasses.replace(LAYOUT, zero_stage=0)
    assert _optimizer_s(ctx, zero0, local, 1, 8)[0] == pytest.approx(optimizer_step_s(local, ctx.hw))
    ds = EstimateContext.of(spec_with(SPEC, **{"training.engine": "deepspeed"}))
    assert _optimizer_s(ds, LAYOUT, local, 1, 8)[0] == pytest.approx(optimizer_step_s(owned, ds.hw))
