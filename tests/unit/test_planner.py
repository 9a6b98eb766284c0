"""The planner: fixed fields constrain, rules and memory filter, ranking, explanations, no-fit errors."""
from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.estimate import estimate_layout
from orchestrator.layout import layout_from_spec
from orchestrator.rules import check_layout
from orchestrator.planner import NoFitError, enumerate_layouts, search
from orchestrator.spec_loader import parse_spec


def spec(preset="gpt3-7.5b", gpu="a100-80gb", nodes=2, batch=128, **par):
    return parse_spec({"name": "p", "model": {"preset": preset},
                       "cluster": {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": 8},
                       "training": {"global_batch_size": batch, "precision": "bf16"}, "parallelism": par})


def test_ranked_by_step_time_and_all_fit_and_follow_rules():
    s = spec()
    result = search(s, top_k=8)
    times = [c.step_time_s for c in result.candidates]
    assert times == sorted(times)
    assert result.chosen is result.candidates[0]
    assert all(c.fits for c in result.candidates)
    assert all(not check_layout(s, c.layout) for c in result.candidates)
    assert result.num_considered >= result.num_fitting >= len(result.candidates) == 8


def test_chosen_matches_estimate_layout():
    s = spec()
    chosen = search(s).chosen
    again = estimate_layout(s, chosen.layout)
    assert again.step_time_s == pytest.approx(chosen.step_time_s)
    assert again.memory.total_bytes == pytest.approx(chosen.memory.total_bytes)


def test_fixed_fields_constrain_the_search():
    s = spec(tensor=2, recompute="full", zero_stage=1)
    lays = list(enumerate_layouts(s))
    assert lays and all(l.tp == 2 and l.recompute == "full" and l.zero_stage == 1 for l in lays)
    assert all(l.tp * l.cp * l.pp * l.dp == 16 for l in lays)


def test_fully_fixed_spec_has_one_candidate():
    s = spec(tensor=2, pipeline=2, virtual_pipeline=1, data=4, zero_stage=1, micro_batch_size=2,
             sequence_parallel=True, recompute="selective", offload="none")
    result = search(s, top_k=5)
    assert len(result.candidates) == 1 and result.num_considered == 1
    assert result.chosen.layout == layout_from_spec(s)


def test_enumeration_covers_every_open_field():
    lays = list(enumerate_layouts(spec(nodes=1, batch=64)))
    assert {l.tp for l in lays} == {1, 2, 4, 8}
    assert {l.zero_stage for l in lays} == {0, 1, 2, 3}
    assert {l.recompute for l in lays} == {"none", "full"}          # selective == none with flash attention
    assert {l.offload for l in lays} == {"none", "optimizer", "optimizer+params"}
    assert {l.sequence_parallel for l in lays} == {False, True}
    assert any(l.vpp > 1 for l in lays) and any(l.pp > 1 for l in lays)
    assert all(not l.sequence_parallel for l in lays if l.tp == 1)
    assert all(l.offload == "none" and l.zero_stage <= 1 for l in lays if l.pp > 1)


def test_reasons_explain_winner_and_limits():
    result = search(spec())
    text = "\n".join(result.reasons)
    assert result.chosen.layout.tag() in text
    assert "memory:" in text and "time:" in text and "largest overhead" in text


def test_memory_limit_is_named_when_it_binds():
    result = search(spec(preset="gpt3-39b", nodes=4, batch=256))
    assert any("limited by memory" in r for r in result.reasons)


def test_nothing_fits_raises_no_fit_with_closest_and_hints():
    s = spec(preset="gpt3-1t", gpu="a100-40gb", nodes=1, batch=8)   # even host memory cannot hold 16 TB
    with pytest.raises(NoFitError) as info:
        search(s)
    err = info.value
    assert err.exit_code == 2 and isinstance(err, SpecError)
    message = str(err)
    assert "closest" in message and "params" in message and "activations" in message
    assert "more GPUs" in message and "nodes" in message


def test_fixed_layout_that_does_not_fit_reports_breakdown():
    s = spec(preset="gpt3-18b", nodes=1, batch=8, tensor=1, pipeline=1, virtual_pipeline=1, zero_stage=0,
             micro_batch_size=1, sequence_parallel=False, recompute="none", offload="none")
    with pytest.raises(NoFitError) as info:
        search(s)
    message = str(info.value)
    assert "the layout fixed in the spec" in message and "does not fit" in message
    assert "optimizer" in message and "GiB" in message
    assert "leave the parallelism fields open" in message


def test_no_layout_follows_the_rules_is_a_spec_error():
    s = parse_spec({"name": "r", "model": {"preset": "gpt3-1.7b"},          # sp needs tp > 1; 1 GPU per node
                    "cluster": {"gpu": "a100-80gb", "num_nodes": 2, "gpus_per_node": 1},
                    "training": {"global_batch_size": 8}, "parallelism": {"sequence_parallel": True}})
    with pytest.raises(SpecError, match="no layout satisfies the rules") as info:
        search(s)
    assert not isinstance(info.value, NoFitError)


def test_full_1t_search_completes():
    """The 1T / 3072-GPU search of issue 3 (its speed is measured by benchmarks/planner_speed.py)."""
    s = parse_spec({"name": "t", "model": {"preset": "gpt3-1t"},
                    "cluster": {"gpu": "a100-80gb", "num_nodes": 384, "gpus_per_node": 8},
                    "training": {"global_batch_size": 3072}})
    result = search(s)
    assert result.num_considered > 1000
    assert result.chosen.layout.tp == 8 and result.chosen.fits


# --- uneven pipeline splits ---------------------------------------------------------------------------

def test_pipeline_degrees_that_do_not_divide_the_layers_get_the_balanced_split():
    """126 layers (llama3-405b) on 128 GPUs: pp = 16 is searched as 7 + 14x8 + 7, and every enumerated
    layout states a split exactly when pp does not divide 126."""
    from orchestrator.stages import balanced_split

    s = spec("llama3-405b", "h100-sxm", nodes=16, batch=64, tensor=8, zero_stage=1, recompute="full")
    lays = list(enumerate_layouts(s))
    assert {l.pp for l in lays} == {1, 2, 4, 8, 16}           # divisors of 128 / tp; only 1 and 2 divide 126
    for lay in lays:
        if lay.account_split:      # Megatron's embedding/loss-accounted split: (126 + 2) / pp per stage
            assert not lay.is_uneven and 128 % lay.pp == 0 and (128 // lay.pp) % lay.vpp == 0
            continue
        assert lay.is_uneven == (126 % lay.pp != 0)
        if lay.is_uneven:
            assert (lay.first_stage_layers, lay.last_stage_layers) == balanced_split(126, lay.pp, lay.vpp)
    assert any(l.pp == 16 and (l.first_stage_layers, l.last_stage_layers) == (7, 7) for l in lays)
    # pp = 16 interleaves only with the embedding and the loss counted: 7 + 14x8 + 7 has gcd 1
    assert {l.vpp for l in lays if l.pp == 16 and l.account_split} == {1, 2, 4}
    assert all(not check_layout(s, l) for l in lays)


def test_uneven_interleaving_only_where_every_stage_count_divides_by_v():
    with pytest.raises(SpecError, match=r"num_layers\(126\) % pp\(16\)"):   # a fixed pp needs the split given
        spec("llama3-405b", "h100-sxm", nodes=16, batch=64, tensor=8, pipeline=16, account_for_embedding_loss=False)
    spec("llama3-405b", "h100-sxm", nodes=16, batch=64, tensor=8, pipeline=16)   # ... or (Megatron) accounted
    s = spec("llama3-405b", "h100-sxm", nodes=16, batch=64, tensor=8, pipeline=16, zero_stage=1,
             recompute="full", micro_batch_size=1, first_stage_layers=6, last_stage_layers=8)
    lays = list(enumerate_layouts(s))
    assert {l.vpp for l in lays} == {1, 2}                     # gcd(6, 8, 8) = 2
    assert all((l.first_stage_layers, l.last_stage_layers) == (6, 8) for l in lays)


def test_fixed_split_constrains_every_pipeline_degree():
    s = spec("llama3-405b", "h100-sxm", nodes=16, batch=64, tensor=8, zero_stage=1, recompute="full",
             first_stage_layers=7, last_stage_layers=7)
    lays = list(enumerate_layouts(s))
    assert lays and all((l.first_stage_layers, l.last_stage_layers) == (7, 7) for l in lays)
    # 112 middle layers divide over pp - 2 = 2 and 14 middle stages, not 6; pp = 2 would need 7 + 7 = 126
    assert {l.pp for l in lays} == {4, 16}


def test_bloom_plans_its_published_uneven_split():
    from tests.published import BLOOM_176B, throughput_spec

    chosen = search(throughput_spec(BLOOM_176B), top_k=1).chosen
    assert chosen.layout.tag() == "tp4-pp12-f5l5-dp8-z1-mb2" and chosen.fits


def test_a_fixed_module_recompute_that_does_not_fit_is_refused_for_its_memory():
    """A fully fixed layout with recompute_modules (gpt-oss-120b's published layout at ZeRO-0: ~81 GiB of model
    states and activations on an 80 GB H100) is refused as not fitting, with the memory breakdown; the planner's
    pruning of its own module-recompute candidates once dropped it and said no layout met the rules."""
    from pathlib import Path

    from orchestrator.spec import read_spec_data

    specs = Path(__file__).parents[1] / "data" / "published-specs"
    data = read_spec_data(specs / "mbridge2511_gpt_oss_120b_bf16.yaml")
    assert data["parallelism"]["recompute_modules"] == ["layernorm", "moe_act"]
    data["parallelism"]["zero_stage"] = 0
    with pytest.raises(NoFitError) as err:
        search(parse_spec(data), top_k=1)
    message = str(err.value)
    assert "capacity per GPU" in message and "no layout satisfies the rules" not in message
