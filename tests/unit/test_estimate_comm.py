"""Collectives: ring volumes (nccl-tests), hierarchical all-reduce across nodes, placement, DP/TP/PP traffic."""
from __future__ import annotations

import pytest

from orchestrator.estimate.comm import (Placement, all_reduce_s, data_parallel_comm, group_placement,
                                        reduce_scatter_s, ring_bytes, tensor_parallel_layer_comm)
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.hardware import hardware_for
from orchestrator.spec import parse_spec


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


def test_intra_node_all_reduce_uses_busbw():
    h = hw(intra_node_bandwidth_GBps=200)
    assert all_reduce_s(1e9, Placement(8, 8, 1), h) == pytest.approx(2 * 7 / 8 * 1e9 / 200e9)


def test_hierarchical_all_reduce_across_nodes():
    h = hw(intra_node_bandwidth_GBps=200, inter_node_bandwidth_GBps=20)
    t = all_reduce_s(1e9, Placement(32, 8, 4), h)
    intra = 7 / 8 * 1e9 / 200e9
    inter = 3 / 4 * 1e9 / 8 / 20e9
    assert t == pytest.approx(2 * (intra + inter))
    # one GPU per node (tp fills the node): the whole buffer crosses each GPU's NIC
    assert reduce_scatter_s(1e9, Placement(4, 1, 4), h) == pytest.approx(3 / 4 * 1e9 / 20e9)


def test_spec_bandwidth_overrides_catalog():
    assert hw(inter_node_bandwidth_GBps=12.5).inter_Bps == 12.5e9
    assert hw().inter_Bps == pytest.approx(25e9 * CostModel().inter_node_efficiency)


def test_dp_volume_by_zero_stage():
    h = hw()
    pl = Placement(32, 8, 4)
    kw = dict(param_bytes=1e9, pl=pl, num_microbatches=4, full_recompute=False, forward_window_s=0.0,
              backward_window_s=0.0, overlap=0.0, hw=h)
    one = ring_bytes(1e9, 32)
    assert data_parallel_comm(zero_stage=0, **kw).bytes == pytest.approx(2 * one)       # all-reduce
    assert data_parallel_comm(zero_stage=1, **kw).bytes == pytest.approx(2 * one)       # RS + AG
    assert data_parallel_comm(zero_stage=2, **kw).bytes == pytest.approx(5 * one)       # RS per micro-batch + AG
    assert data_parallel_comm(zero_stage=3, **kw).bytes == pytest.approx(4 * 3 * one)   # 1.5x all-reduce per pass


def test_dp_overlap_hides_behind_backward():
    h = hw()
    kw = dict(param_bytes=1e9, pl=Placement(32, 8, 4), zero_stage=0, num_microbatches=4, full_recompute=False,
              forward_window_s=0.0, hw=h)
    exposed = data_parallel_comm(backward_window_s=0.0, overlap=1.0, **kw)
    hidden = data_parallel_comm(backward_window_s=100.0, overlap=1.0, **kw)
    assert exposed.exposed_s == pytest.approx(exposed.time_s)
    assert hidden.exposed_s == 0.0


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
    assert bsp == pytest.approx(b) and tsp == pytest.approx(t)   # same volume as RS + AG pairs
