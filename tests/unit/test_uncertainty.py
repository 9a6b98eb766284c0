"""Honest error bars: every LAYOUT says how far its tokens/s is expected to be off, and why."""
from __future__ import annotations

import importlib.util

from orchestrator.estimate.residuals import RESIDUALS
from orchestrator.estimate.uncertainty import NOT_WIDENING, REGIMES, layout_uncertainty, regime_of
from orchestrator.plan import build_plan
from orchestrator.spec_loader import parse_spec
from tests.conftest import ROOT, spec_data


def test_regimes_follow_engine_and_layout():
    assert regime_of("megatron", "a100-80gb", 8, 1) == "Megatron PTD-P"
    assert regime_of("deepspeed", "a100-80gb", 12, 1) == "DeepSpeed pipeline"
    assert regime_of("deepspeed", "a100-80gb", 1, 3) == "ZeRO-3 / FSDP"
    assert regime_of("megatron", "h100-sxm", 1, 3) == "ZeRO-3 / FSDP"
    assert regime_of("deepspeed", "cpu", 2, 0) == "CPU"


def test_every_layout_carries_its_uncertainty():
    plan = build_plan(parse_spec(spec_data(**{"parallelism": {}})), top_k=3)
    for layout in [plan.chosen, *plan.candidates]:
        u = layout["uncertainty"]
        assert u["regime"] == "CPU" and 0 < u["relative_error"] < 5 and u["basis"]


def test_thin_regimes_are_widened_and_say_so():
    thin = [r for r in REGIMES if RESIDUALS.get(r, {}).get("n", 0) < 3]
    covered = max(v["rms"] for k, v in RESIDUALS.items() if v["n"] >= 3 and k not in NOT_WIDENING)
    for regime in thin:
        u = layout_uncertainty(regime)
        assert u["relative_error"] >= covered - 1e-9
        assert "widest" in u["basis"]
    assert "calibration" in layout_uncertainty("Megatron PTD-P", calibrated=True)["basis"]


def test_residual_table_is_up_to_date():
    """orchestrator/estimate/residuals.py is what `benchmarks/accuracy.py --write` computes now."""
    spec = importlib.util.spec_from_file_location("accuracy", ROOT / "benchmarks" / "accuracy.py")
    accuracy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(accuracy)
    table = accuracy.residual_table(accuracy.regime_rows())
    fresh = {k: {"n": v["n"], "rms": v["rms"], "mean_abs": v["mean_abs"], "source": v["source"]}
             for k, v in table.items() if v["n"]}
    assert fresh == RESIDUALS, "run `python benchmarks/accuracy.py --write`"
