"""Second pins on rules a mutation spot-check found held by one test each: the batch rule's dp factor,
ep | num_experts, and the bubble's worst-stage aggregation. Each case here fails if the factor, the
divisor or the aggregation is dropped or swapped."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.layout import Layout, rule_batch
from orchestrator.parallel_rules import rule_ep_divides_experts
from orchestrator.spec_loader import parse_spec
from orchestrator.telemetry.metrics import ROW, RunConstants, build_record
from tests.conftest import spec_data

DENSE = {"model.preset": "gpt3-7.5b", "cluster.gpu": "a100-80gb", "cluster.num_nodes": 8,
         "cluster.gpus_per_node": 8, "training.precision": "bf16"}


@pytest.mark.parametrize("batch, mb, dp, ok", [
    (96, 4, 8, True),      # 96 = 4 * 8 * 3
    (96, 4, 16, False),    # 96 % 4 == 0 but 96 % (4 * 16) != 0: only the dp factor refuses it
    (96, 1, 64, False),    # micro-batch 1: the rule is the dp factor alone
    (128, 1, 64, True),
    (48, 16, 3, True),     # dp 3 divides, 48 % 16 == 0
    (40, 16, 1, False),    # the mb factor alone refuses it
])
def test_batch_rule_needs_both_the_micro_batch_and_the_dp_factor(batch, mb, dp, ok):
    spec = parse_spec(spec_data(**DENSE, **{"training.global_batch_size": 64 * 16}))
    spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, global_batch_size=batch))
    problem = rule_batch(spec, Layout(micro_batch_size=mb, dp=dp))
    assert (problem is None) == ok, problem
    if problem is not None:
        assert f"dp({dp})" in problem.message and f"= {mb * dp})" in problem.message


@pytest.mark.parametrize("experts, ep, ok", [(8, 8, True), (8, 4, True), (8, 1, True), (8, 3, False),
                                             (6, 4, False), (12, 8, False), (64, 16, True)])
def test_ep_must_divide_the_experts(experts, ep, ok):
    spec = parse_spec(spec_data(**{"model.preset": "tiny-moe"}))
    moe = dataclasses.replace(spec.model.moe, num_experts=experts)
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, moe=moe))
    problem = rule_ep_divides_experts(spec, Layout(ep=ep))
    assert (problem is None) == ok, problem
    if problem is not None:
        assert f"num_experts({experts}) % ep({ep}) = {experts % ep}" in problem.message


def _row(step_s: float, compute_s: float) -> dict:
    row = dict.fromkeys(ROW, 0.0)
    row.update(step_time_s=step_s, compute_time_s=compute_s)
    return row


def test_bubble_is_the_worst_stage_wherever_it_is():
    """Three ranks of a 3-stage pipeline: the idlest is the middle one (neither first, last, nor slowest)."""
    c = RunConstants(global_batch_size=8, seq_length=128, world_size=3, pp=3, model_flops_per_step=1e12,
                     hardware_flops_per_step=1e12, peak_flops=1e11)
    rows = [_row(2.0, 1.8), _row(2.0, 1.0), _row(2.0, 1.6)]
    r = build_record(c, rows, step=1, time_unix=0.0, lr=None, grad_norm=None)
    assert r.bubble_fraction == pytest.approx(0.5)                       # 1 - 1.0 / 2.0, the middle stage
    assert r.bubble_fraction_mean == pytest.approx((0.1 + 0.5 + 0.2) / 3)
    assert r.bubble_fraction > r.bubble_fraction_mean


def test_a_string_that_yaml_1_2_reads_as_a_float_round_trips_quoted():
    """spec.resolved.yaml is read back by a YAML 1.2-style loader (1.0e12 is a number): orch's dumper must quote
    '5e-05' (a string to PyYAML's 1.1 resolver), or a program argument would come back as a float."""
    from orchestrator.userfiles import dump_yaml, parse_yaml

    data = {"program": {"args": ["--learning_rate", "5e-05", "1E3", "x1e5"]}, "training": {"total_tokens": 1.0e12}}
    assert parse_yaml(dump_yaml(data), "t.yaml") == data
