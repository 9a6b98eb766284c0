"""DeepSpeed's pipeline engine as the cost model counts it (estimate/engines.py, estimate/step.py)."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate import CostModel
from orchestrator.estimate.engines import ds_bf16_optimizer, ds_pipeline_reduces_after_flush
from orchestrator.estimate.step import EstimateContext, estimate
from orchestrator.layout import Layout
from tests.published import MT_NLG_530B, published_estimate
from tests.spec_variants import spec_with
from orchestrator.spec_loader import parse_spec


def _spec(engine: str):
    return parse_spec({"name": "s", "model": {"preset": "gpt3-7.5b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 4, "gpus_per_node": 8},
                       "training": {"global_batch_size": 256, "precision": "bf16", "engine": engine}})


LAYOUT = Layout(tp=2, pp=4, vpp=1, dp=4, zero_stage=1, micro_batch_size=1, sequence_parallel=False,
                recompute="full", offload="none")


def test_pipeline_engine_reduces_gradients_after_the_flush():
    ds = estimate(EstimateContext.of(_spec("deepspeed")), LAYOUT)
    assert ds.comm.dp_s > 0 and ds.comm.dp_exposed_s == pytest.approx(ds.comm.dp_s)
    meg = estimate(EstimateContext.of(_spec("megatron")), LAYOUT)
    assert meg.comm.dp_exposed_s < meg.comm.dp_s        # Megatron overlaps the reduction with the backward
    assert ds_pipeline_reduces_after_flush("deepspeed", 2) and not ds_pipeline_reduces_after_flush("deepspeed", 1)


def test_bf16_optimizer_releases():
    assert not ds_bf16_optimizer("0.5", "bf16", 1, 4) and not ds_bf16_optimizer("0.6.1", "bf16", 0, 4)
    assert ds_bf16_optimizer("0.6.2", "bf16", 1, 4) and ds_bf16_optimizer("0.9.0", "bf16", 1, 4)
    assert not ds_bf16_optimizer("0.9.5", "bf16", 1, 4) and not ds_bf16_optimizer(None, "bf16", 1, 4)
    assert ds_bf16_optimizer(None, "bf16", 0, 1) and not ds_bf16_optimizer("0.7", "fp16", 0, 4)


def test_bf16_optimizer_costs_its_fp32_gradient_copy():
    spec = _spec("deepspeed")
    old = estimate(EstimateContext.of(spec_with(spec, **{"training.engine_version": "0.7"})), LAYOUT)     # BF16_Optimizer
    new = estimate(EstimateContext.of(spec), LAYOUT)                            # ZeRO-1, bf16 gradients
    assert old.breakdown.compute_s > new.breakdown.compute_s
    # the tied embedding's fp32 gradient: twice the bf16 bytes between the first and last stage
    assert old.comm.pp_bytes > new.comm.pp_bytes
    # and holds it: 4 bytes per parameter beside the bf16 gradient
    assert old.memory.grads_bytes == pytest.approx(3 * new.memory.grads_bytes, rel=0.01)


def test_per_gpu_throughput_falls_with_dp_at_fixed_batch():
    tflops = [published_estimate(c).tflops_per_gpu for c in MT_NLG_530B]
    assert tflops[0] > tflops[1] > tflops[2]


def test_a_case_states_its_network():
    from tests.published import BLOOM_176B, throughput_spec

    spec = throughput_spec(BLOOM_176B)
    assert spec.cluster.inter_node_bandwidth_GBps == pytest.approx(400 / 8 / 8 * 0.9)   # 4x 100 Gb/s per node
    dgx = {**BLOOM_176B, "cluster": {k: v for k, v in BLOOM_176B["cluster"].items() if k != "nic_Gbps_per_node"}}
    assert published_estimate(BLOOM_176B).step_time_s > published_estimate(dgx).step_time_s


def _train_schedule(p: int, m: int, s: int, grads_first: bool) -> list[tuple]:
    """Stage ``s``'s commands in DeepSpeed's TrainSchedule (pipe/schedule.py): 2(m + p - 1) slots, even stages
    run forwards in even slots and backwards in odd ones (odd stages the other way round); a slot's send of the
    previous slot's output comes before (v0.5.8) or after (v0.16.4, ``grads_first``) its receive."""
    def slot(t):
        fwd = (t % 2) == (s % 2)
        if fwd:
            return (t - s % 2) // 2 - s // 2, True
        return (t - (s + 1) % 2) // 2 - p + (s + 1) // 2 + (0 if s % 2 else 1), False
    valid, cmds, prev = (lambda i: 0 <= i < m), [], -1
    for t in range(2 * (m + p - 1)):
        i, fwd = slot(t)
        if fwd and s > 0:
            pair = [("recv", s - 1, "act", i)] if valid(i) else []
            pair += [("send", s - 1, "grad", prev)] if valid(prev) else []
        elif not fwd and s < p - 1:
            pair = [("send", s + 1, "act", prev)] if valid(prev) else []
            pair += [("recv", s + 1, "grad", i)] if valid(i) else []
        else:
            pair = []
        cmds += pair[::-1] if grads_first else pair
        if valid(i):
            cmds.append(("F" if fwd else "B", i))
        prev = i
    return cmds


def _rendezvous_time(p: int, m: int, tf, tb, x: float, grads_first: bool) -> float:
    """Makespan when a send and its receive start together once both stages reach them and take ``x``;
    ``tf`` / ``tb``: one forward / backward time for every stage, or a list of them per stage."""
    tf = tf if isinstance(tf, list) else [tf] * p
    tb = tb if isinstance(tb, list) else [tb] * p
    cmds = [_train_schedule(p, m, s, grads_first) for s in range(p)]
    pos, clock, moved = [0] * p, [0.0] * p, True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(cmds[s]):
                c = cmds[s][pos[s]]
                if c[0] in ("F", "B"):
                    clock[s] += tf[s] if c[0] == "F" else tb[s]
                else:
                    peer = c[1]
                    mate = ("recv" if c[0] == "send" else "send", s, c[2], c[3])
                    if pos[peer] >= len(cmds[peer]) or cmds[peer][pos[peer]] != mate:
                        break
                    clock[s] = clock[peer] = max(clock[s], clock[peer]) + x
                    pos[peer] += 1
                pos[s] += 1
                moved = True
    assert pos == [len(c) for c in cmds], "the schedule deadlocked"
    return max(clock)


@pytest.mark.parametrize("grads_first", [False, True])
def test_train_schedule_is_1f1b_with_four_blocking_transfers(grads_first):
    """pipeline_time_s with p2p_transfers_per_microbatch("deepspeed") transfers per micro-batch is the
    makespan of DeepSpeed's schedule run with blocking sends and receives."""
    from orchestrator.estimate.pipeline import pipeline_time_s
    from orchestrator.estimate.step import p2p_transfers_per_microbatch

    p, m, tf, tb, x = 6, 24, 1.0, 3.0, 0.2          # full recompute: backward = recompute + 2 x forward
    assert _rendezvous_time(p, m, tf, tb, 0.0, grads_first) == pytest.approx((m + p - 1) * (tf + tb))
    def model(transfers):
        return pipeline_time_s(num_microbatches=m, pp=p, vpp=1, slowest_stage_s=tf + tb, mean_stage_s=tf + tb,
                               p2p_s=transfers * x)
    simulated = _rendezvous_time(p, m, tf, tb, x, grads_first)
    # the fill and drain cross each stage boundary with fewer transfers than the steady state: within 3%
    assert simulated == pytest.approx(model(p2p_transfers_per_microbatch("deepspeed", 1)), rel=0.03)
    assert simulated > 1.05 * model(2)               # not Megatron's batched exchange


@pytest.mark.parametrize("p, m", [(35, 160), (12, 128), (8, 176), (4, 32)])
def test_train_schedule_with_unequal_stages_is_paced_by_the_slowest(p, m):
    """With a heavier last stage (the output layer and the loss) and lighter end stages (an uneven split),
    DeepSpeed's TrainSchedule run with blocking transfers takes what pipeline_time_s gives for the slowest and
    the mean stage, within 3% and never more: the schedule's slot order (forwards in every other slot during
    the fill) adds no bubble of its own. The DeepSpeed pipeline runs' remaining gap (benchmarks/
    ds_pipeline_gap.py: 6-10 s per step) is not in the schedule (docs/cost-model.md, "DeepSpeed's pipeline
    engine: what was checked")."""
    from orchestrator.estimate.pipeline import pipeline_time_s

    x = 0.05
    for tf, tb in (([1.0] * (p - 1) + [1.2], [3.0] * (p - 1) + [3.6]),
                   ([0.9] + [1.0] * (p - 2) + [0.9], [2.7] + [3.0] * (p - 2) + [2.7])):
        stage = [f + b for f, b in zip(tf, tb)]
        model = pipeline_time_s(num_microbatches=m, pp=p, vpp=1, slowest_stage_s=max(stage),
                                mean_stage_s=sum(stage) / p, p2p_s=4 * x)
        simulated = _rendezvous_time(p, m, tf, tb, x, grads_first=False)
        assert simulated == pytest.approx(model, rel=0.03) and simulated <= model * 1.001
        assert _rendezvous_time(p, m, tf, tb, 0.0, grads_first=False) == pytest.approx(
            pipeline_time_s(num_microbatches=m, pp=p, vpp=1, slowest_stage_s=max(stage),
                            mean_stage_s=sum(stage) / p), rel=0.005)


def test_pipeline_host_work_is_exposed_on_a_gpu():
    """ThroughputTimer synchronizes the device at every ForwardPass: the host's instructions are not hidden,
    with or without tensor parallelism."""
    spec = _spec("deepspeed")
    tp1 = estimate(EstimateContext.of(spec), Layout(tp=1, pp=4, vpp=1, dp=8, zero_stage=1, micro_batch_size=1,
                                                    sequence_parallel=False, recompute="full", offload="none"))
    m = tp1.num_microbatches
    assert tp1.breakdown.engine_s == pytest.approx((m + 3) * CostModel().pipeline_microbatch_host_s)
    assert estimate(EstimateContext.of(_spec("megatron")), LAYOUT).breakdown.engine_s == 0.0


def test_zero1_pipeline_of_deepspeed_0_5_all_reduces_its_gradients():
    """The MT-NLG release (0.5.x): ZeRO-1 all-reduces every gradient bucket (engines.ds_bucket_all_reduce), twice
    the reduce-scatter volume a 0.4.3 ZeRO-1 run moves."""
    spec = _spec("deepspeed")
    old = estimate(EstimateContext.of(spec_with(spec, **{"training.engine_version": "0.4.3"})), LAYOUT)
    new = estimate(EstimateContext.of(spec_with(spec, **{"training.engine_version": "0.5"})), LAYOUT)
    assert new.comm.dp_reduce_s > 1.5 * old.comm.dp_reduce_s
    assert new.comm.dp_bytes > old.comm.dp_bytes


def test_partitioned_hand_overs_gather_three_times_per_micro_batch():
    """With tp > 1 DeepSpeed sends a 1/tp slice after its meta tensor and the receiver all-gathers it: per
    micro-batch 4 slices, 4 metas and 3 tp all-gathers (a send does not gather) on a middle stage."""
    from orchestrator.estimate.comm import all_gather_s, group_placement, p2p_s
    from orchestrator.estimate.engines import ds_pipe_hand_overs, ds_pipe_meta_bytes, ds_pipe_partitioned

    spec = _spec("deepspeed")
    hw = EstimateContext.of(spec).hw
    est = estimate(EstimateContext.of(spec), LAYOUT)
    big_spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, global_batch_size=512))
    big = estimate(EstimateContext.of(big_spec), LAYOUT)
    slice_bytes = 2048 * 4096 * 2 / LAYOUT.tp                   # gpt3-7.5b: seq 2048, h 4096, bf16
    gather = all_gather_s(slice_bytes * LAYOUT.tp, group_placement(LAYOUT.tp, 1, hw.gpus_per_node), hw)
    send, meta = p2p_s(slice_bytes, True, hw), p2p_s(ds_pipe_meta_bytes(LAYOUT.tp), True, hw)
    # the step's exposed p2p is m x per micro-batch + the tied embedding's sync: difference two batch sizes
    per_microbatch = (big.comm.pp_exposed_s - est.comm.pp_exposed_s) / (big.num_microbatches - est.num_microbatches)
    assert per_microbatch == pytest.approx(4 * (send + meta) + 3 * gather, rel=1e-6)
    # [ndim, *shape (3), num_parts, rank, *partition (tp + 1)] in int64 (runtime/utils.py to_meta)
    assert ds_pipe_meta_bytes(8) == 8 * (1 + 3 + 1 + 1 + 9) and not ds_pipe_partitioned("deepspeed", 1)
    assert not ds_pipe_partitioned("megatron", 8)
    assert ds_pipe_hand_overs(None) == ds_pipe_hand_overs("0.5.4")


def test_gradients_go_whole_between_stages_before_deepspeed_0_5_4():
    """Before PR #1407 (v0.5.4) SendGrad sends the full gradient and only the activations travel in slices:
    2 slices, 2 full tensors and 2 gathers per micro-batch; the full sends cost more than the gather they save."""
    from orchestrator.estimate.engines import PipeHandOvers, ds_pipe_hand_overs

    assert ds_pipe_hand_overs("0.5.3") == ds_pipe_hand_overs("0.5") == PipeHandOvers(slices=2, full=2, gathers=2)
    assert ds_pipe_hand_overs("0.5.4") == PipeHandOvers(slices=4, full=0, gathers=3)
    spec = _spec("deepspeed")
    old = estimate(EstimateContext.of(spec_with(spec, **{"training.engine_version": "0.5.3"})), LAYOUT)
    new = estimate(EstimateContext.of(spec_with(spec, **{"training.engine_version": "0.5.4"})), LAYOUT)
    assert old.comm.pp_exposed_s > new.comm.pp_exposed_s and old.step_time_s > new.step_time_s


def test_pipeline_gap_benchmark_takes_the_accuracy_tables_published_step():
    """benchmarks/ds_pipeline_gap.py measures each run's gap from the step benchmarks/accuracy.py compares with: the
    stated iteration time, else published_step_s, which counts GPT-NeoX's and GLM-130B's FLOPs their own way (a
    hardware-FLOP step would put GLM-130B's gap at 39 s instead of 10 s)."""
    import importlib.util
    from pathlib import Path

    from tests.published import EXTRA_CASES, published_step_s

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "ds_pipeline_gap.py"
    spec = importlib.util.spec_from_file_location("ds_pipeline_gap", path)
    gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gap)
    rows = {r["id"]: r for r in gap.gap_rows()}
    cases = {c["id"]: c for c in EXTRA_CASES}
    for name in ("neox_20b", "glm_130b", "bloom_176b"):
        assert rows[name]["published"] == pytest.approx(published_step_s(cases[name]))
    assert rows["mtnlg_530b_280nodes"]["published"] == cases["mtnlg_530b_280nodes"]["published"]["iteration_s"]
