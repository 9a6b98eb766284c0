"""Hybrid sharding (parallelism.shard_degree): the rules, Megatron's arguments, and the cost model's closed
forms (model states 16 psi / shard_degree; ZeRO-3 traffic inside the shard group plus one gradient all-reduce
across the replicas per step). docs/hybrid-sharding.md."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.errors import SpecError
from orchestrator.estimate.comm import (DataParallelWork, Placement, all_reduce_s, data_parallel_comm,
                                        hybrid_data_parallel_comm, ring_bytes, shard_group_size, shard_placements)
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.hardware import hardware_for
from orchestrator.estimate.step import EstimateContext, estimate_layout, model_states
from orchestrator.layout import Layout, require_complete
from orchestrator.render.megatron import render_megatron_args
from orchestrator.spec_loader import parse_spec
from tests.conftest import fixed_plan, spec_data
from tests.megatron_layouts import MEGATRON_LAYOUTS

HYBRID = MEGATRON_LAYOUTS["zero3-hybrid-hs8"]     # gpt3-1.7b, 2 nodes x 8 H100, dp 16, ZeRO-3, shard 8


def spec(**overrides):
    return parse_spec(spec_data(**{**HYBRID, **overrides}))


def problem_of(**overrides):
    with pytest.raises(SpecError) as err:
        spec(**overrides)
    [p] = [p for p in err.value.problems if p.path == "parallelism.shard_degree"]
    return p


def test_shard_degree_must_divide_dp_and_the_message_shows_the_operands():
    p = problem_of(**{"parallelism.shard_degree": 6})
    assert "dp(16) % shard_degree(6) = 4, must be 0" in p.message and "divides 16" in p.hint


@pytest.mark.parametrize("overrides,words", [
    ({"parallelism.shard_degree": 1}, "must be > 1"),
    ({"parallelism.zero_stage": 0}, "got zero_stage(0): nothing is sharded"),
    ({"training.engine": "deepspeed"}, "removed MiCS"),
])
def test_shard_degree_refused_where_it_cannot_run(overrides, words):
    assert words in problem_of(**overrides).message


def test_layout_and_placements():
    lay = require_complete(spec())
    assert (lay.shard_degree, lay.replicas, shard_group_size(lay)) == (8, 2, 8)
    assert lay.tag().endswith("-z3-hs8-mb1")
    # the shard group fills one node (NVLink), the replica group holds one rank per node
    assert shard_placements(lay, 8) == (Placement(8, 8, 1), Placement(2, 1, 2))
    assert shard_placements(dataclasses.replace(lay, shard_degree=None), 8)[1] == Placement(1, 1, 1)


def test_megatron_gets_one_distributed_optimizer_instance_per_replica():
    tokens = render_megatron_args(fixed_plan(spec_data(**HYBRID)))
    i = tokens.index("--num-distributed-optimizer-instances")
    assert tokens[i + 1] == "2" and "optim_grads_params" in tokens
    plain = render_megatron_args(fixed_plan(spec_data(**{**HYBRID, "parallelism.shard_degree": None})))
    assert "--num-distributed-optimizer-instances" not in plain


def test_zero1_runs_the_distributed_optimizer_in_instances_without_fsdp():
    tokens = render_megatron_args(fixed_plan(spec_data(**MEGATRON_LAYOUTS["zero1-hybrid-hs8"])))
    assert tokens[tokens.index("--num-distributed-optimizer-instances") + 1] == "2"
    assert "--use-distributed-optimizer" in tokens and "--use-megatron-fsdp" not in tokens


@pytest.mark.parametrize("shard", [2, 8])
def test_zero1_and_zero2_states_follow_the_paper_over_the_shard_group(shard):
    """Rajbhandari et al. 2020, 3.1, with N = shard_degree: 4 + 12/N and 2 + 14/N bytes per parameter with
    16-bit gradients (training.grad_reduce_dtype bf16); Megatron's default fp32 gradient buffer adds 2 bytes
    per gradient element: 6 + 12/N and 2 + 16/N."""
    psi = 1.2e9
    for zero, paper, fp32_grads in ((1, 4 * psi + 12 * psi / shard, 6 * psi + 12 * psi / shard),
                                    (2, 2 * psi + 14 * psi / shard, 2 * psi + 16 * psi / shard)):
        for asked, expected in (("bf16", paper), (None, fp32_grads)):
            s = spec(**{"parallelism.zero_stage": zero, "parallelism.shard_degree": shard,
                        "training.grad_reduce_dtype": asked})
            states = model_states(EstimateContext.of(s), require_complete(s), psi, 24)
            assert states.total_bytes == pytest.approx(expected)


@pytest.mark.parametrize("shard", [2, 4, 8, 16])
def test_model_states_are_16_psi_over_shard_degree(shard):
    s = spec(**{"parallelism.shard_degree": shard, "training.grad_reduce_dtype": "bf16"})
    ctx, lay, psi = EstimateContext.of(s), require_complete(s), 1.2e9
    states = model_states(ctx, lay, psi, 24)
    assert states.total_bytes == pytest.approx(16 * psi / shard)
    assert (states.params_bytes, states.grads_bytes) == pytest.approx((2 * psi / shard, 2 * psi / shard))
    fp32 = spec(**{"parallelism.shard_degree": shard})   # Megatron FSDP's default: an fp32 gradient shard
    assert model_states(EstimateContext.of(fp32), require_complete(fp32), psi, 24).grads_bytes == \
        pytest.approx(4 * psi / shard)


def hw():
    return hardware_for(spec(), CostModel(collective_latency_s=0.0))


def work(**kw):
    base = dict(engine="megatron", zero_stage=3, param_elements=1.2e9, param_bytes=2, grad_bytes=2, layers=24,
                num_microbatches=4, full_recompute=False, forward_window_s=0.0, backward_window_s=0.0)
    return DataParallelWork(**{**base, **kw})


def test_comm_is_zero3_inside_the_shard_group_plus_one_replica_all_reduce_per_step():
    h, w = hw(), work()
    shard, replicas = Placement(8, 8, 1), Placement(2, 1, 2)
    params = grads = w.param_elements * 2
    hybrid = hybrid_data_parallel_comm(w, shard, replicas, 0.0, h)
    # per micro-batch: forward + backward gathers and a reduce-scatter over 8 ranks; per step: the 1/8 shard
    # all-reduced over the 2 replicas, one call per Megatron FSDP unit (a layer)
    inner = 4 * (2 * ring_bytes(params, 8) + ring_bytes(grads, 8))
    assert hybrid.bytes == pytest.approx(inner + ring_bytes(grads / 8, 2, "all_reduce"))
    zero3 = data_parallel_comm(w, shard, 0.0, h)
    assert hybrid.calls == zero3.calls + 24
    assert hybrid.time_s - zero3.time_s == pytest.approx(24 * all_reduce_s(grads / 8 / 24, replicas, h))
    # no compute to hide behind: all of it exposed; a long backward hides all but the last bucket
    assert hybrid.exposed_s == pytest.approx(hybrid.time_s)
    hidden = hybrid_data_parallel_comm(work(backward_window_s=100.0, forward_window_s=100.0), shard, replicas, 1.0, h)
    assert hidden.exposed_s < hybrid.exposed_s


def test_zero1_comm_is_reduce_scatter_and_gather_inside_plus_the_replica_all_reduce():
    """Megatron's distributed optimizer with instances (param_and_grad_buffer.py): per bucket a
    reduce-scatter inside the instance, then an all-reduce of the shard across the instances; the updated
    parameters all-gathered inside the instance."""
    h, w = hw(), work(zero_stage=1)
    shard, replicas = Placement(8, 8, 1), Placement(2, 1, 2)
    nbytes = w.param_elements * 2
    hybrid = hybrid_data_parallel_comm(w, shard, replicas, 0.0, h)
    assert hybrid.bytes == pytest.approx(2 * ring_bytes(nbytes, 8) + ring_bytes(nbytes / 8, 2, "all_reduce"))


def dp_seconds(**overrides):
    s = spec(**overrides)
    return estimate_layout(s, require_complete(s))


@pytest.mark.parametrize("inter_GBps,faster", [(12.5, True), (None, False)])
def test_sharded_inside_a_node_wins_where_the_network_is_slower_than_nvlink(inter_GBps, faster):
    """ZeRO-3 over all 16 ranks of 2 nodes gathers across the network every micro-batch; sharded inside each
    node it gathers over NVLink and sends only the gradient shard across, once per step. With one 100 Gb/s
    NIC's worth per GPU that wins; on H100 nodes with a 400 Gb/s NIC per GPU the 2-node ring runs near NVLink
    speed and the replica all-reduce costs more than it saves."""
    net = {} if inter_GBps is None else {"cluster.inter_node_bandwidth_GBps": inter_GBps}
    full, hybrid = dp_seconds(**net, **{"parallelism.shard_degree": None}), dp_seconds(**net)
    states = lambda e: e.memory.params_bytes + e.memory.grads_bytes + e.memory.optimizer_bytes  # noqa: E731
    assert states(hybrid) == pytest.approx(2 * states(full))
    assert (hybrid.comm.dp_s < full.comm.dp_s) is faster


def test_planner_keeps_the_specs_shard_degree_and_does_not_search_it():
    from orchestrator.planner import enumerate_layouts

    open_zero = {**HYBRID, "parallelism.zero_stage": None}
    kept = {(lay.zero_stage, lay.shard_degree) for lay in enumerate_layouts(spec(**open_zero))}
    assert kept == {(1, 8), (2, 8), (3, 8)}, "ZeRO-0 candidates are refused with a shard_degree"
    left_open = {**open_zero, "parallelism.shard_degree": None}
    assert {lay.shard_degree for lay in enumerate_layouts(spec(**left_open))} == {None}
