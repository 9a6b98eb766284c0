"""The fit rule: a layout fits within the device's capacity (HBM less what the driver keeps); the planner's
headroom (CostModel.hbm_headroom) is a policy for choosing. Layouts within the headroom are ranked first; only when
none is, the fastest within the capacity is planned, with a warning; NoFitError only beyond the capacity.

The capacity: PyTorch's OOM report gives "a total capacity of 79.18 GiB" on an 80 GB part
(catalog.gpus.DRIVER_RESERVED_FRACTION). The published run that needs the fallback: llm-foundry's MPT-1b without
activation checkpointing on 64 A100-80GB (scripts/train/benchmarking/README.md at commit 5f43bf160).
"""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.catalog.gpus import DRIVER_RESERVED_FRACTION, GPUS
from orchestrator.estimate.cost import CostModel
from orchestrator.plan import build_plan
from orchestrator.planner import NoFitError, search
from tests.published import MPT_FSDP, published_estimate, throughput_spec
from orchestrator.spec_loader import parse_spec

GiB = 2**30
MPT_1B = next(c for c in MPT_FSDP if c["id"] == "llmfoundry_mpt_1b_fsdp_64gpu")


def _search_as_run(case: dict, spec=None, **kwargs):
    """search() on the run's spec (which states the software it ran, as published_estimate plans it)."""
    return search(spec or throughput_spec(case), **kwargs)


def _small_spec():
    return parse_spec({"name": "h", "model": {"preset": "gpt3-1.7b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch_size": 64, "precision": "bf16"}})


def test_capacity_is_hbm_less_the_driver_reserve():
    """79.18 GiB of an 80 GiB A100; the CPU target keeps its whole share (no device driver)."""
    a100 = build_plan(_small_spec(), top_k=1).chosen["memory"]
    assert a100["capacity_bytes"] == pytest.approx(79.18 * GiB, rel=1e-6)
    assert a100["usable_bytes"] < a100["capacity_bytes"] < a100["hbm_bytes"]
    assert DRIVER_RESERVED_FRACTION == pytest.approx(0.01025, abs=1e-5)
    assert GPUS["cpu"].driver_reserved_fraction == 0.0


def test_plan_json_memory_carries_capacity_and_headroom_flag():
    mem = build_plan(_small_spec(), top_k=1).chosen["memory"]
    assert isinstance(mem["capacity_bytes"], int) and mem["within_headroom"] is True and mem["fits"] is True
    assert mem["total_bytes"] <= mem["usable_bytes"]


def test_within_headroom_is_ranked_first():
    """MPT-1b with recompute open: no recompute is faster but inside the headroom; full recompute is within it."""
    spec = throughput_spec(MPT_1B)
    spec = dataclasses.replace(spec, parallelism=dataclasses.replace(spec.parallelism, recompute=None))
    result = _search_as_run(MPT_1B, spec, top_k=2)
    assert result.chosen.layout.recompute == "full" and result.chosen.memory.within_headroom
    assert not any("inside the" in w for w in result.warnings)
    assert any(r.startswith("limited by memory") and "recompute=none" in r for r in result.reasons)


def test_fallback_plans_the_fastest_within_capacity_with_a_warning():
    """The published MPT-1b row (76.8 GiB modelled; 76.0 within the headroom, 79.2 capacity) is planned."""
    result = _search_as_run(MPT_1B, top_k=1)
    mem = result.chosen.memory
    assert mem.fits and not mem.within_headroom
    assert mem.usable_bytes < mem.total_bytes <= mem.capacity_bytes
    warning = next(w for w in result.warnings if "inside the 5% headroom" in w)
    assert warning in result.reasons
    assert f"{mem.total_bytes / GiB:.1f} GiB of {mem.capacity_bytes / GiB:.1f} GiB" in warning
    assert "OOM risk" in warning and "recompute: full" in warning and "micro_batch_size (now 20)" in warning
    assert "more GPUs" in warning


def test_orch_plan_prints_the_headroom_warning():
    from orchestrator.cli.plan import render_plan

    result = _search_as_run(MPT_1B, top_k=1)
    text = render_plan(throughput_spec(MPT_1B), result, width=400, wide=True)
    assert "- memory: 76.8 GiB of 79.2 GiB capacity (76.0 GiB within the headroom)" in text
    assert "- memory: inside the 5% headroom: 76.8 GiB of 79.2 GiB" in text


def test_no_fit_error_only_beyond_capacity():
    """With a headroom that leaves nothing, a layout within capacity is still planned; beyond capacity it is not."""
    everything_inside = CostModel(hbm_headroom=0.99)
    result = search(_small_spec(), top_k=1, cost=everything_inside)
    assert result.chosen.fits and not result.chosen.memory.within_headroom
    assert any("inside the 99% headroom" in w for w in result.warnings)
    big = parse_spec({"name": "n", "model": {"preset": "gpt3-175b"},
                      "cluster": {"gpu": "a100-80gb", "num_nodes": 1, "gpus_per_node": 8},
                      "training": {"global_batch_size": 8, "precision": "bf16"},
                      "parallelism": {"tensor": 8, "pipeline": 1, "zero_stage": 0, "micro_batch_size": 1}})
    with pytest.raises(NoFitError) as info:
        search(big, cost=everything_inside)
    message = str(info.value)
    assert "79.2 GiB capacity per GPU" in message and "99% headroom" in message


def test_published_mpt_1b_row_fits():
    est = published_estimate(MPT_1B)
    assert est.fits and est.layout.micro_batch_size == 20 and est.layout.recompute == "none"
