"""A small fixed subset of benchmarks/layout_sweep.py: realistic fixed layouts plan or are refused with a
SpecError, never an exception, and the published-run kinds of issue 18 plan."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "layout_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("layout_sweep", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout_sweep"] = module      # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("layout_sweep", None)


def test_sweep_subset_raises_no_exception(sweep):
    """120 generated layouts (every model x GPU x engine pairing in turn) and the recipes: each plans or is
    refused with exit-2 SpecError; the sample is fixed (seed 0) and mixes both outcomes."""
    results = [sweep.run_case(c) for c in sweep.recipe_cases() + sweep.cases(120, seed=0)]
    crashed = [f"{r.case.label}\n{r.message}" for r in results if r.kind == "EXCEPTION"]
    assert not crashed, crashed[0]
    kinds = {r.kind for r in results}
    assert {"planned", "refused", "refused-mem"} <= kinds, kinds


def test_recipes_plan(sweep):
    """Every recipe layout plans, but Mixtral 8x7B under ZeRO-3 on 8 H100s: its 46.7B parameters' Adam state
    alone (12 bytes each over 8 GPUs) is 65 GiB a GPU, so it is refused for memory, naming 2 nodes."""
    results = {r.case.label: r for r in map(sweep.run_case, sweep.recipe_cases())}
    refused = {label: r.message for label, r in results.items() if r.kind != "planned"}
    assert list(refused) == ["recipe:fsdp-ep-mixtral-8h100"], refused
    assert results["recipe:fsdp-ep-mixtral-8h100"].kind == "refused-mem"
    assert "2 nodes x 8 would fit" in refused["recipe:fsdp-ep-mixtral-8h100"]


def test_sweep_rundir_sample_validates(sweep):
    """Two planned layouts (a Megatron interleaved pipeline with cp, an HSDP one) written as run dirs pass
    orch validate's static run-dir check."""
    cases = {c.label: c for c in sweep.recipe_cases()}
    for label in ("recipe:nemo-llama3-70b-fp8-cp2", "recipe:hsdp-llama2-13b-h100"):
        result = sweep.run_case(cases[label])
        assert result.kind == "planned", result.message
        assert sweep.check_rundir(result, deep=False) is None
