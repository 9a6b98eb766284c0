"""Collectives as NCCL runs them (ring / tree, LL / Simple, per-hop latency), placement, DP/TP/PP traffic."""
from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator.estimate.comm import (NCCL_BASE_US, NCCL_HOP_US, DataParallelWork, Placement, all_gather_s,
                                        all_reduce_s, data_parallel_comm, group_placement, nccl_collective,
                                        reduce_scatter_s, ring_bytes, tensor_parallel_layer_comm,
                                        zero3_gather_host_s)
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.hardware import hardware_for
from orchestrator.spec_loader import parse_spec


def hw(**cluster):
    spec = parse_spec({"name": "c", "model": {"preset": "gpt3-1.7b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 4, "gpus_per_node": 8, **cluster},
                       "training": {"global_batch_size": 512}})
    return hardware_for(spec, CostModel(collective_latency_s=0.0))


def test_ring_volumes():
    assert ring_bytes(1e9, 8, "all_reduce") == pytest.approx(2 * 7 / 8 * 1e9)
    assert ring_bytes(1e9, 8) == pytest.approx(7 / 8 * 1e9)
    assert ring_bytes(1e9, 1) == 0


@pytest.mark.parametrize("size,stride,expected", [(8, 1, (8, 8, 1)), (32, 1, (32, 8, 4)), (4, 8, (4, 1, 4)),
                                                  (16, 2, (16, 4, 4)), (2, 4, (2, 2, 1)), (1, 1, (1, 1, 1))])
def test_placement_rank_order(size, stride, expected):
    """tp adjacent, dp stride tp, pp stride tp*dp (Megatron's tp-cp-ep-dp-pp order)."""
    assert group_placement(size, stride, 8) == Placement(*expected)


def test_large_intra_node_all_reduce_runs_at_busbw():
    h = hw(intra_node_bandwidth_GBps=200)
    c = nccl_collective("all_reduce", 1e9, Placement(8, 8, 1), h)
    assert c.protocol == "Simple"
    assert c.seconds == pytest.approx(2 * 7 / 8 * 1e9 / 200e9, rel=0.01)   # latency is noise at 1 GB


def test_ring_across_nodes_uses_every_nic_of_the_group():
    h = hw(intra_node_bandwidth_GBps=200, inter_node_bandwidth_GBps=20)
    # 8 GPUs per node drive 8 NICs: busbw = min(200, 8 * 20) = 160 GB/s
    assert reduce_scatter_s(1e9, Placement(32, 8, 4), h) == pytest.approx(31 / 32 * 1e9 / 160e9, rel=0.03)
    # one GPU per node (tp fills the node): its own NIC only
    assert reduce_scatter_s(1e9, Placement(4, 1, 4), h) == pytest.approx(3 / 4 * 1e9 / 20e9, rel=0.01)


def test_small_message_latency_grows_with_the_ring_not_log2_nodes():
    """NCCL's ring: base + (n - nodes) intra hops + (nodes - 1) network hops (tuning.cc), LL for tiny buffers."""
    h = hw()
    small = [all_gather_s(4096, Placement(n, 8, n // 8), h) for n in (64, 128, 256, 512)]
    steps = [(n - n // 8) * NCCL_HOP_US["nvlink"][("ring", "LL")] * 1.8 + (n // 8 - 1) * NCCL_HOP_US["net"][("ring", "LL")]
             for n in (64, 128, 256, 512)]
    for t, lat in zip(small, steps):
        assert t == pytest.approx((NCCL_BASE_US[("ring", "LL")] + lat) * 1e-6, rel=0.05)
    assert small[3] / small[0] > 6          # ~linear in the ring length (log2 would give 1.5x)


def test_tree_all_reduce_wins_small_messages_at_scale():
    c = nccl_collective("all_reduce", 65536, Placement(1024, 8, 128), hw())
    assert c.algorithm == "tree"
    assert nccl_collective("all_gather", 65536, Placement(1024, 8, 128), hw()).algorithm == "ring"


def test_spec_bandwidth_overrides_catalog():
    assert hw(inter_node_bandwidth_GBps=12.5).inter_Bps == 12.5e9
    assert hw().inter_Bps == pytest.approx(25e9 * CostModel().inter_node_efficiency)


def work(**kw):
    base = dict(engine="deepspeed", zero_stage=0, param_elements=5e8, param_bytes=2, grad_bytes=2, layers=24,
                num_microbatches=4, full_recompute=False, forward_window_s=0.0, backward_window_s=0.0)
    return DataParallelWork(**{**base, **kw})


def test_dp_volume_by_zero_stage():
    h = hw()
    pl = Placement(32, 8, 4)
    one = ring_bytes(1e9, 32)
    assert data_parallel_comm(work(zero_stage=0), pl, 0.0, h).bytes == pytest.approx(2 * one)      # all-reduce
    assert data_parallel_comm(work(zero_stage=1), pl, 0.0, h).bytes == pytest.approx(2 * one)      # RS + AG
    assert data_parallel_comm(work(zero_stage=2), pl, 0.0, h).bytes == pytest.approx(5 * one)      # RS per mb + AG
    assert data_parallel_comm(work(zero_stage=3), pl, 0.0, h).bytes == pytest.approx(4 * 3 * one)  # 1.5x AR per pass
    # DeepSpeed >= 0.12.4 all-reduces the ZeRO-1/2 gradient buckets: an all-reduce's volume, then the AG
    assert data_parallel_comm(work(zero_stage=1, bucket_all_reduce=True), pl, 0.0, h).bytes == pytest.approx(3 * one)
    assert data_parallel_comm(work(zero_stage=2, bucket_all_reduce=True), pl, 0.0, h).bytes == pytest.approx(9 * one)


def test_dp_calls_follow_the_engines_buckets_and_units():
    """ZeRO-3: DeepSpeed gathers per module (4 per layer + embedding), Megatron FSDP per layer; the
    reduce buckets are the ones orch writes (5e8 elements) or Megatron's max(40M, 1M x dp)."""
    h, pl = hw(), Placement(32, 8, 4)
    ds = data_parallel_comm(work(zero_stage=3, num_microbatches=1), pl, 0.0, h)
    mg = data_parallel_comm(work(zero_stage=3, num_microbatches=1, engine="megatron"), pl, 0.0, h)
    assert ds.calls == 2 * (24 * 4 + 1) + 1 and mg.calls == 2 * (24 + 1) + 24
    assert ds.time_s > mg.time_s                         # same bytes, more latency
    ddp = data_parallel_comm(work(zero_stage=0, engine="megatron", param_elements=4e8), pl, 0.0, h)
    assert ddp.calls == 10                               # 4e8 / 40M


def test_dp_overlap_hides_all_but_the_last_bucket():
    h, pl = hw(), Placement(32, 8, 4)
    exposed = data_parallel_comm(work(engine="megatron", param_elements=4e8), pl, 1.0, h)
    hidden = data_parallel_comm(work(engine="megatron", param_elements=4e8, backward_window_s=100.0), pl, 1.0, h)
    assert exposed.exposed_s == pytest.approx(exposed.time_s)
    assert hidden.exposed_s == pytest.approx(exposed.time_s / 10)


def test_tp_layer_comm_four_all_reduces_six_with_full_recompute():
    h = hw()
    pl = Placement(8, 8, 1)
    nbytes = 2048 * 4096 * 2
    b, t = tensor_parallel_layer_comm(tokens=2048, hidden=4096, pl=pl, sp=False, full_recompute=False, hw=h)
    assert b == pytest.approx(4 * ring_bytes(nbytes, 8, "all_reduce"))
    assert t == pytest.approx(4 * all_reduce_s(nbytes, pl, h))
    b6, _ = tensor_parallel_layer_comm(tokens=2048, hidden=4096, pl=pl, sp=False, full_recompute=True, hw=h)
    assert b6 == pytest.approx(1.5 * b)
    bsp, tsp = tensor_parallel_layer_comm(tokens=2048, hidden=4096, pl=pl, sp=True, full_recompute=False, hw=h)
    assert bsp == pytest.approx(b) and t < tsp < 1.1 * t   # same volume as RS + AG pairs, twice the calls


def test_deepspeed_zero3_runtime_by_release():
    """Release boundaries read from DeepSpeed's history (estimate/engines.py): contiguous gradients by
    default from 0.4.3 (#1199), _all_gather_base from 0.5.5 (#1188), coalesced asynchronous fetch from 0.6.0
    (#1453); None is the DeepSpeed orch writes configs for."""
    from orchestrator.estimate.engines import Zero3Runtime, ds_zero3_runtime

    bucket = 50_000_000      # stage3_prefetch_bucket_size then; its live-parameter gate is open in steady state
    assert ds_zero3_runtime("0.3") == Zero3Runtime(synchronous_fetch=True, list_gathers=True, allreduce_gradients=True,
                                                   prefetch_elements=bucket)
    assert ds_zero3_runtime("0.4.3") == Zero3Runtime(synchronous_fetch=True, list_gathers=True,
                                                     list_reduce_scatters=True, prefetch_elements=bucket)
    assert ds_zero3_runtime("0.5.5") == Zero3Runtime(synchronous_fetch=True, list_reduce_scatters=True,
                                                     prefetch_elements=bucket)
    assert ds_zero3_runtime("0.6.0") == ds_zero3_runtime(None) == Zero3Runtime()


def test_legacy_deepspeed_zero3_hides_the_ring_but_not_the_per_rank_host_loop():
    """DeepSpeed 0.3.x still prefetches the next module behind the current one's compute, so with ample
    compute the NCCL time hides; what the host does between the fetch's synchronize and the compute launch
    (zeroing the buffer, the per-rank list loop, ProcessGroupNCCL's n copies) does not, and it grows with the
    ring: at a fixed per-rank volume the exposed time rises by about (gathers) x (added ranks) x (loop + copy)."""
    from orchestrator.estimate.engines import ds_zero3_runtime

    h = hw(num_nodes=192)
    kw = dict(zero_stage=3, num_microbatches=1, forward_window_s=100.0, backward_window_s=200.0,
              rank_host_s=CostModel().ds_list_rank_host_s, param_elements=1e10)   # modules > the 5e7 prefetch
    now = data_parallel_comm(work(**kw, zero3=ds_zero3_runtime(None)), Placement(1536, 8, 192), 1.0, h)
    old = {n: data_parallel_comm(work(**kw, zero3=ds_zero3_runtime("0.3")), Placement(n, 8, n // 8), 1.0, h)
           for n in (384, 1536)}
    assert now.exposed_s < 0.01 * now.time_s
    gathers = 2 * (24 * 4 + 1)                                    # forward + backward (no recompute, no reuse)
    per_rank = CostModel().ds_list_rank_host_s + h.kernel_gap_s
    grown = old[1536].exposed_s - old[384].exposed_s
    assert grown == pytest.approx(gathers * (1536 - 384) * per_rank, rel=0.05)
    legacy = work(**kw, zero3=ds_zero3_runtime("0.3"))
    units, pl = 24 * 4 + 1, Placement(1536, 8, 192)
    host = gathers * zero3_gather_host_s(legacy, 1e10 * 2 / units, 1536, h)
    assert host > 0.5 * old[1536].exposed_s             # the ring itself hides: the first gather of each pass at most
    assert old[1536].exposed_s - host <= 2.01 * all_gather_s(1e10 * 2 / units, pl, h)


def test_legacy_deepspeed_zero3_waits_for_all_but_the_last_gather_of_a_prefetch():
    """Modules smaller than DeepSpeed 0.3.x's 5e7-element prefetch bucket come several to a prefetch, and each
    gather's torch.cuda.synchronize() waits for the one before while the compute is not yet launched: with
    ~5M-element modules (10 to a prefetch) 9 in 10 gathers stay exposed however much compute there is."""
    from orchestrator.estimate.engines import ds_zero3_runtime

    h, pl = hw(num_nodes=8), Placement(64, 8, 8)
    kw = dict(zero_stage=3, num_microbatches=1, forward_window_s=100.0, backward_window_s=200.0, param_elements=5e8)
    old = data_parallel_comm(work(**kw, zero3=ds_zero3_runtime("0.5.5")), pl, 1.0, h)
    now = data_parallel_comm(work(**kw, zero3=ds_zero3_runtime(None)), pl, 1.0, h)
    gathers_s = old.time_s - old.reduce_s
    assert 0.9 * gathers_s <= old.exposed_s <= gathers_s and now.exposed_s < 0.01 * now.time_s


def test_legacy_deepspeed_zero3_all_reduces_gradients_in_the_reduce_buckets():
    """Before 0.4.3 ZeRO-3 all-reduced full gradients per reduce bucket (contiguous_gradients off):
    twice the reduce-scatter's bytes, one call per 5e8-element bucket; later, per parameter or per bucket."""
    from orchestrator.estimate.engines import (DS_MAX_REUSE_DISTANCE, DS_REDUCE_BUCKET_ELEMENTS,
                                               ds_zero3_fetch_schedule, ds_zero3_runtime)

    h, pl = hw(num_nodes=8), Placement(64, 8, 8)
    kw = dict(zero_stage=3, num_microbatches=1, param_elements=2e9)
    old, mid, now = (data_parallel_comm(work(**kw, zero3=ds_zero3_runtime(v)), pl, 0.0, h)
                     for v in ("0.3", "0.4.3", None))
    gathers = 2 * (24 * 4 + 1)
    assert now.calls == gathers + 4 == gathers + 2e9 // DS_REDUCE_BUCKET_ELEMENTS
    rt = ds_zero3_runtime("0.3")
    events = ds_zero3_fetch_schedule((round(2e9 / (24 * 4 + 1)),) * 4, 24, False, DS_MAX_REUSE_DISTANCE,
                                     rt.max_live_elements, rt.prefetch_elements)
    legacy_gathers = 2 + sum(bool(ev.gathered) + len(ev.prefetched) for ev in events)   # + the embedding's two
    assert old.calls == legacy_gathers + 4 and legacy_gathers < gathers       # the backward reuses some modules
    assert mid.calls - old.calls == 24 * 4 + 1 - 4                 # one reduce-scatter per parameter (same gathers)
    assert old.bytes - mid.bytes == pytest.approx(ring_bytes(2e9 * 2, 64))   # all-reduce = 2x reduce-scatter


def test_zero3_reduce_calls_follow_the_bucket_orch_writes():
    """The reduce calls the planner counts are the reduce_bucket_size orch writes into ds_config.json."""
    from orchestrator.render.deepspeed import render_ds_config
    from tests.conftest import fixed_plan, spec_data

    config = render_ds_config(fixed_plan(spec_data(**{"parallelism.zero_stage": 3})))
    bucket = config["zero_optimization"]["reduce_bucket_size"]
    for elements in (0.5 * bucket, 3.2 * bucket):
        dp = data_parallel_comm(work(zero_stage=3, num_microbatches=1, param_elements=elements), Placement(32, 8, 4),
                                0.0, hw())
        assert dp.calls - 2 * (24 * 4 + 1) == math.ceil(elements / bucket)


def test_deepspeed_keeps_recomputed_modules_gathered_within_the_reuse_distance():
    """stage3_max_reuse_distance (1e9, what orch writes): a module used again within 1e9 elements of other
    modules stays gathered. GPT-3 175B (h 12288): only the MLP-out weight survives from the recompute to
    the backward (2/3 of a pass re-gathered, + the recompute's pass); a 1.3B-sized model keeps all four (and the last layers' recompute finds them still gathered);
    a model smaller than the distance is never re-gathered."""
    from orchestrator.estimate.engines import ds_backward_regather_share

    def mods(h):
        return (3 * h * h, h * h, 4 * h * h, 4 * h * h)
    assert ds_backward_regather_share(mods(12288), 96, True) == pytest.approx(1 + 8 / 12)
    assert ds_backward_regather_share(mods(12288), 96, False) < 1
    assert 0.5 < ds_backward_regather_share(mods(2048), 24, True) < 1   # and the last layers' recompute
    assert ds_backward_regather_share(mods(256), 4, True) == 0
    assert ds_backward_regather_share(mods(12288), 96, True, max_reuse=0) == pytest.approx(2)


def test_legacy_prefetch_is_skipped_while_a_module_over_max_live_is_gathered():
    """DeepSpeed before 0.6 prefetches only while fewer than stage3_max_live_parameters (1e9) elements are
    gathered (stage3.py prefetch_next_sub_modules). GPT-3 175B's modules (<= 6e8) are always prefetched after
    the first; 530B's QKV (1.26e9) and MLP weights (1.68e9) close the gate: in the forward the QKV, attention
    output and MLP-out weights are gathered synchronously, only the MLP-in weight behind the attention output."""
    from orchestrator.estimate.engines import ds_zero3_fetch_schedule

    def forward(h, max_live):
        mods = (3 * h * h, h * h, 4 * h * h, 4 * h * h)
        events = ds_zero3_fetch_schedule(mods, 8, True, 10**9, max_live, 5 * 10**7)
        return [ev for ev in events if ev.phase == "f"][4:8], mods     # a middle layer
    gpt3, _ = forward(12288, 10**9)
    assert [ev.gathered for ev in gpt3] == [0, 0, 0, 0] and all(ev.prefetched for ev in gpt3)
    big, mods = forward(20480, 10**9)
    assert [ev.gathered for ev in big] == [mods[0], mods[1], 0, mods[3]]
    assert [ev.prefetched for ev in big] == [(), (mods[2],), (), ()]
    ungated, _ = forward(20480, 10**12)
    assert [ev.gathered for ev in ungated] == [0, 0, 0, 0]


def test_legacy_zero3_synchronous_fetches_are_exposed_whatever_the_compute():
    """With ample compute, DeepSpeed 0.3's prefetched gathers hide (only the host work around each stays),
    530B-sized modules too once the live-parameter gate is open (every step after the first few: engines.py
    DS_LEGACY_MAX_LIVE_PARAMETERS); while it closes, a synchronous fetch is exposed whole: more than a forward
    pass's ring time over the step."""
    from orchestrator.estimate.engines import DS_LEGACY_MAX_LIVE_PARAMETERS, ds_zero3_runtime

    h, pl = hw(num_nodes=280), Placement(2240, 8, 280)
    gated = dataclasses.replace(ds_zero3_runtime("0.3"), max_live_elements=DS_LEGACY_MAX_LIVE_PARAMETERS)
    exposed = {}
    for hidden in (12288, 20480):
        mods = (3 * hidden**2, hidden**2, 4 * hidden**2, 4 * hidden**2)
        for rt in (ds_zero3_runtime("0.3"), gated):
            w = work(zero_stage=3, num_microbatches=1, layers=8, param_elements=8 * sum(mods), modules=mods,
                     full_recompute=True, forward_window_s=1e3, backward_window_s=3e3, zero3=rt)
            dp = data_parallel_comm(w, pl, 1.0, h)
            no_host = data_parallel_comm(dataclasses.replace(w, zero3=dataclasses.replace(rt, list_gathers=False)),
                                         pl, 1.0, h)
            ring_f = 8 * sum(all_gather_s(e * 2, pl, h) for e in mods)
            exposed[hidden, rt is gated] = (dp.exposed_s, no_host.exposed_s, ring_f)
    for key in ((12288, False), (12288, True), (20480, False)):
        e = exposed[key]
        assert e[1] < 0.3 * e[2]             # the ring hides: the first gather, the last reduction, the zeroing
        assert e[0] > e[1]                   # the per-rank list loop and copies come on top
    big = exposed[20480, True]
    assert big[1] > 0.7 * big[2]             # synchronous fetches: more than a forward pass of ring time


def test_legacy_live_gate_opens_as_its_counter_loses_the_resident_parameters():
    """DeepSpeed 0.3.12-0.5.10's coordinator decrements its live-parameter count for the resident parameters
    at every backward (_partition_all_parameters) and never counts them in (_post_step regathers them outside
    it): the gate compares stage3_max_live_parameters with a count 13h per layer lower each step. For the 530B
    model (h 20480, 105 layers) the gated schedule is the ungated one from 25 steps on, not at 24."""
    from orchestrator.estimate.engines import DS_LEGACY_MAX_LIVE_PARAMETERS as live, ds_zero3_fetch_schedule

    h, layers = 20480, 105
    mods, resident = (3 * h * h, h * h, 4 * h * h, 4 * h * h), 13 * h * layers + 2 * h

    def schedule(max_live):
        return ds_zero3_fetch_schedule(mods, layers, True, 10**9, max_live, 5 * 10**7)
    ungated = schedule(0)
    assert schedule(live) != ungated
    assert schedule(live + 24 * resident) != ungated
    assert schedule(live + 25 * resident) == ungated


def test_gloo_reduce_scatter_is_an_all_reduce_of_a_clone():
    """PyTorch's gloo backend reduce-scatters by all-reducing a clone (ProcessGroupGloo.cpp
    reduce_scatter_tensor_coalesced): on CPU a reduce-scatter costs the all-reduce plus the clone and the chunk
    copy; on GPUs NCCL's ring reduce-scatter moves half an all-reduce's bytes. (Measured for 3.5 MB: 2.8 ms
    against 1.6 ms, a ratio of 1.75; the modelled copies give 1.19, so the rest of gloo's cost is not modelled.)"""
    spec = parse_spec({"name": "c", "model": {"preset": "tiny-gpt"},
                       "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 2},
                       "training": {"global_batch_size": 8, "precision": "fp32"}})
    cpu, pl = hardware_for(spec, CostModel()), Placement(2, 2, 1)
    copies = 2 * 3.5e6 * 1.5 / cpu.hbm_Bps
    assert reduce_scatter_s(3.5e6, pl, cpu) == pytest.approx(all_reduce_s(3.5e6, pl, cpu) + copies)
    gpu = hw()
    assert reduce_scatter_s(1e9, Placement(8, 8, 1), gpu) < 0.6 * all_reduce_s(1e9, Placement(8, 8, 1), gpu)
