"""The CPU target predicts what it measures (tests/data/cpu-measured.json: medians measured on this machine)."""
import json
from pathlib import Path

from orchestrator.plan import build_plan
from orchestrator.spec_loader import parse_spec

RUNS = json.loads((Path(__file__).resolve().parents[1] / "data" / "cpu-measured.json").read_text())


def _predicted(run: dict) -> float:
    return build_plan(parse_spec(run["spec"])).chosen["tokens_per_s"]


def test_planner_ranks_the_measured_cpu_layouts_as_measured():
    measured = sorted(RUNS, key=lambda r: r["measured"]["tokens_per_s_median"])
    predicted = sorted(RUNS, key=_predicted)
    assert [r["id"] for r in predicted] == [r["id"] for r in measured]


def test_offload_is_never_planned_on_cpu():
    spec = dict(RUNS[0]["spec"], parallelism={})
    plan = build_plan(parse_spec(spec), top_k=50)
    assert len(plan.candidates) > 10
    assert all(c["offload"] == "none" for c in plan.candidates), "offload cannot pay off on CPU"
