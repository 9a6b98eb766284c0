"""model.moe.token_dispatcher: the Megatron-LM flags and TransformerConfig keys it writes, and what is refused."""
from __future__ import annotations

import pytest

from orchestrator.estimate.step import EstimateContext
from orchestrator.generate_rules import generate_problems
from orchestrator.render.megatron import render_megatron_args, render_megatron_config
from orchestrator.spec_loader import parse_spec
from tests.conftest import fixed_plan, spec_data
from tests.megatron_layouts import MEGATRON_LAYOUTS, MOE_SMALL
from tests.unit.test_render_megatron import values


def _plan(name: str):
    return fixed_plan(spec_data(**MEGATRON_LAYOUTS[name]))


@pytest.mark.parametrize("name, kind, backend", [("mixtral-tp2-ep8-sp", "alltoall", None),
                                                 ("qwen3-ep8-flex-hybridep", "flex", "hybridep"),
                                                 ("mixtral-ep8-flex-deepep", "flex", "deepep"),
                                                 ("moe-capacity-allgather", "allgather", None)])
def test_dispatcher_flags_and_config(name, kind, backend):
    plan = _plan(name)
    v, config = values(render_megatron_args(plan)), render_megatron_config(plan)
    assert v["--moe-token-dispatcher-type"] == [kind] and config["moe_token_dispatcher_type"] == kind
    assert v.get("--moe-flex-dispatcher-backend") == ([backend] if backend else None)
    assert config.get("moe_flex_dispatcher_backend") == backend
    assert generate_problems(plan.spec) == []


def test_allgather_turns_the_ep_overlap_off_in_the_flags_and_the_cost_model():
    overlapped = _plan("qwen3-ep8-flex-hybridep")
    assert "--overlap-moe-expert-parallel-comm" in render_megatron_args(overlapped)
    data = {**MEGATRON_LAYOUTS["qwen3-ep8-flex-hybridep"], "model.moe.token_dispatcher": "allgather"}
    plan = fixed_plan(spec_data(**data))
    assert "--overlap-moe-expert-parallel-comm" not in render_megatron_args(plan)
    assert render_megatron_config(plan)["overlap_moe_expert_parallel_comm"] is False
    from orchestrator.estimate.step import uses_ep_overlap

    assert uses_ep_overlap(EstimateContext.of(plan.spec), plan.layout) is False
    assert uses_ep_overlap(EstimateContext.of(overlapped.spec), overlapped.layout) is True


def _paths(**overrides) -> list[str]:
    return [p.path for p in generate_problems(parse_spec(spec_data(**overrides)))]


def test_refused_by_name():
    capacity = {**MEGATRON_LAYOUTS["moe-top1-capacity-shared-dense-etp2"]}
    deepep = {**capacity, "model.moe": {**MOE_SMALL, "token_dispatcher": "flex_deepep"}}
    assert _paths(**deepep) == ["model.moe.token_dispatcher"]      # DeepEP refuses padding to capacity
    [problem] = generate_problems(parse_spec(spec_data(**deepep)))
    assert "--moe-pad-expert-input-to-capacity" in problem.message and "flex_hybridep" in problem.hint
    assert _paths(**{**capacity, "model.moe": {**MOE_SMALL, "token_dispatcher": "flex_hybridep"}}) == []
    gathered = {**MEGATRON_LAYOUTS["moe-capacity-allgather"], "parallelism.overlap_moe_expert_parallel_comm": True}
    assert _paths(**gathered) == ["model.moe.token_dispatcher"]
    cpu = {**MEGATRON_LAYOUTS["tiny-moe-ep2-cpu"], "training.engine": "megatron",
           "model.moe.token_dispatcher": "flex_hybridep"}
    assert _paths(**cpu) == ["model.moe.token_dispatcher"]
    assert _paths(**{**cpu, "model.moe.token_dispatcher": "allgather"}) == []


def test_the_reference_trainer_runs_only_the_alltoall():
    base = {**MEGATRON_LAYOUTS["tiny-moe-ep2-cpu"], "training.engine": "deepspeed"}
    assert _paths(**{**base, "model.moe.token_dispatcher": "alltoall"}) == []
    assert _paths(**{**base, "model.moe.token_dispatcher": "allgather"}) == ["model.moe.token_dispatcher"]


def test_groups_reached_is_the_expected_count_of_distinct_groups():
    from itertools import combinations

    from orchestrator.estimate.moe import groups_reached
    experts, topk, groups = 8, 3, 4
    picks = list(combinations(range(experts), topk))
    exact = sum(len({e // (experts // groups) for e in pick}) for pick in picks) / len(picks)
    assert abs(groups_reached(experts, topk, groups) - exact) < 1e-12
    assert groups_reached(128, 8, 1) == 1.0 and abs(groups_reached(128, 8, 128) - 8) < 1e-9


def _comm(dispatcher: str, ep: int):
    import dataclasses

    from orchestrator.estimate.moe import expert_layer_comm
    spec = fixed_plan(spec_data(**MEGATRON_LAYOUTS["qwen3-ep8-flex-hybridep"])).spec
    ctx = EstimateContext.of(spec)
    shape = dataclasses.replace(ctx.shape, moe=dataclasses.replace(ctx.shape.moe, dispatcher=dispatcher))
    return expert_layer_comm(shape, ctx.hw, 1, 1, ep, 1, 1)


def test_flex_sends_each_token_once_per_remote_node_and_the_same_inside_one():
    # Qwen3-30B-A3B (128 experts, top 8) over ep 16 = 2 nodes: the alltoall sends 4 of a token's 8 copies
    # over the network, HybridEP / DeepEP ~1 (one per remote node): a quarter of the network time
    alltoall, hybrid, deep = _comm("alltoall", 16), _comm("flex_hybridep", 16), _comm("flex_deepep", 16)
    assert hybrid == deep and hybrid.seconds < 0.3 * alltoall.seconds
    assert _comm("flex_hybridep", 8) == _comm("alltoall", 8)      # one node: costed as the alltoall
    # allgather: every token on every rank (2x the alltoall's bytes at top 8 of ep 16), but NCCL's ring crosses
    # each node boundary once per byte, so it beats the alltoall's 4 network copies and not the flex's one
    gathered = _comm("allgather", 16)
    assert gathered.bytes == 2 * alltoall.bytes and hybrid.seconds < gathered.seconds < alltoall.seconds
