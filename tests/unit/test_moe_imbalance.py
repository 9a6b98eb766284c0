"""Load imbalance of a MoE layer's expert ranks: trained routers (the aux-loss estimate), token-drop (bounded by
the capacity factor) and forced balance (random logits: sampling noise only, checked against a simulation)."""
from __future__ import annotations

import dataclasses
import random
import statistics

import pytest

from orchestrator.estimate.moe import DROPLESS_IMBALANCE, expert_work, random_routing_imbalance
from orchestrator.estimate.params import model_shape
from tests.published_layouts import layout_case_shape_fields, layout_case_spec, load_layout_cases
from tests.conftest import ROOT

CASES = ROOT / "tests/data/published-moe-cp-fp8.json"


def _moe_shape(**moe):
    """Qwen3-30B-A3B (128 experts, top 8) as a published row's spec resolves it, on its trained router."""
    case = next(c for c in load_layout_cases(CASES) if c["id"] == "mbridge2606_qwen3_30b_a3b_fp8")
    shape = dataclasses.replace(model_shape(layout_case_spec(case)), router_force_balance=False)
    return dataclasses.replace(shape, moe=dataclasses.replace(shape.moe, **moe)) if moe else shape


def _simulated_max_over_mean(experts: int, topk: int, ep: int, tokens: int, trials: int, rng: random.Random) -> float:
    ratios = []
    for _ in range(trials):
        loads = [0] * ep
        for _ in range(tokens):
            for e in rng.sample(range(experts), topk):
                loads[e * ep // experts] += 1
        ratios.append(max(loads) / (tokens * topk / ep))
    return statistics.fmean(ratios)


@pytest.mark.parametrize("experts,topk,ep,tokens", [(16, 2, 4, 2000), (64, 8, 8, 1500)])
def test_forced_balance_imbalance_matches_random_routing(experts, topk, ep, tokens):
    simulated = _simulated_max_over_mean(experts, topk, ep, tokens, trials=60, rng=random.Random(7))
    modelled = random_routing_imbalance(experts, topk, ep, tokens)
    assert modelled > 1.0
    assert modelled - 1 == pytest.approx(simulated - 1, rel=0.3)


def test_forced_balance_noise_shrinks_with_tokens_and_grows_with_ranks():
    assert random_routing_imbalance(128, 8, 8, 8 * 4096) < random_routing_imbalance(128, 8, 8, 8 * 1024)
    assert random_routing_imbalance(128, 8, 32, 32 * 4096) > random_routing_imbalance(128, 8, 8, 8 * 4096)
    assert random_routing_imbalance(128, 8, 1, 4096) == 1.0          # one rank holds every expert
    assert random_routing_imbalance(8, 8, 4, 4096) == 1.0            # every token visits every expert


def test_imbalance_by_routing_regime():
    trained = expert_work(_moe_shape(), tp=1, cp=1, ep=8, etp=1, mb=1)
    assert trained.imbalance == DROPLESS_IMBALANCE
    dropped = expert_work(_moe_shape(capacity_factor=1.0), tp=1, cp=1, ep=8, etp=1, mb=1)
    assert dropped.imbalance == 1.0
    forced = expert_work(dataclasses.replace(_moe_shape(), router_force_balance=True), tp=1, cp=1, ep=8, etp=1, mb=1)
    assert 1.0 < forced.imbalance < 1.02
    assert forced.routed_rows < trained.routed_rows


def test_the_published_rows_state_their_routing():
    """A force-balanced row is dropless and cites the forcing; a dropless row routed on its trained router (the
    Megatron-Core README's Mixtral runs, which predate the flag) says so, so no row takes the default silently."""
    cases = [c for c in load_layout_cases(CASES) if c.get("group") == "moe"]
    for case in cases:
        forced = layout_case_shape_fields(case).get("router_force_balance", False)
        source = case["source"].lower()
        if forced:
            assert case.get("capacity_factor") is None and "force" in source, case["id"]
        elif case.get("capacity_factor") is None:
            assert "not force-balanced" in source, case["id"]
    assert any(c.get("capacity_factor") is None and not c.get("router_force_balance") for c in cases)
