"""The MFU plausibility guard: a plan above the best published MFU on its GPU (at a margin) is flagged, not clamped."""
import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.catalog.gpus import GPUS
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.flops import estimate_flops
from orchestrator.estimate.plausibility import MFU_MARGIN, mfu_bound, mfu_warnings
from orchestrator.estimate.step import EstimateContext
from orchestrator.planner import search
from tests.published_layouts import layout_case_spec, load_layout_cases
from orchestrator.spec_loader import parse_spec

A100, H100 = GPUS["a100-80gb"], GPUS["h100-sxm"]
DATA = Path(__file__).resolve().parents[1] / "data"


def test_bound_is_the_best_published_mfu_at_the_margin():
    assert mfu_bound(A100) == pytest.approx((0.6423 * (1 + MFU_MARGIN), 0.6423, 6.66e9))
    assert mfu_bound(H100) == pytest.approx((0.494 * (1 + MFU_MARGIN), 0.494, 16e9))
    assert mfu_bound(GPUS["l40s"]) is None                 # no published figure checked: no bound


def test_h100_figures_are_the_reference_runs_in_orchs_own_flop_count():
    """The catalog's H100 list is the bf16 dense H100 rows of tests/data, recomputed: it cannot drift from them."""
    measured = {}
    for case in load_layout_cases(DATA / "published-moe-cp-fp8.json"):
        if case["precision"] != "bf16" or case.get("group") != "bf16-dense":
            continue
        spec = layout_case_spec(case)
        ctx = EstimateContext.of(spec)
        batch, seq = spec.training.global_batch_size, spec.model.seq_length
        per_token = estimate_flops(ctx.shape, batch, "none").model_flops / (batch * seq)
        measured[case["id"]] = case["tokens_per_s_per_gpu"] * per_token / H100.peak_flops["bf16"]
    assert len(measured) == 9
    catalog = {round(m, 3) for _, m in H100.published_mfu}
    assert {round(m, 3) for m in measured.values()} <= catalog
    assert max(m for _, m in H100.published_mfu) == pytest.approx(max(measured.values()), abs=5e-4)


def test_warning_only_above_the_bound_and_only_for_16_bit_training():
    limit = mfu_bound(A100)[0]
    assert mfu_warnings(A100, "bf16", limit - 0.001) == []
    [line] = mfu_warnings(A100, "bf16", 0.80)
    assert "80.0%" in line and f"{limit:.1%}" in line and "64.2%" in line and "llm-foundry" in line
    assert mfu_warnings(A100, "fp8", 0.80) == []           # the published figures are 16-bit


def test_llama3_70b_on_32_h100_nodes_is_not_flagged(tmp_path, capsys):
    """`orch init --preset llama3-70b --gpu h100-sxm --nodes 32` + `orch plan`: predicted in the low 50s (NVIDIA's
    recipes' range) and no longer called implausible."""
    from tests.unit.test_cli_plan import run_cli

    path = tmp_path / "llama3-70b.yaml"
    assert run_cli(["init", "--preset", "llama3-70b", "--gpu", "h100-sxm", "--nodes", "32", "-o", str(path)],
                   capsys)[0] == 0
    code, out, err = run_cli(["plan", str(path), "--json"], capsys)
    assert code == 0
    assert 0.50 < json.loads(out)["chosen"]["mfu"] < mfu_bound(H100)[0]
    assert "implausible" not in err


def _spec():
    return parse_spec({"name": "s", "model": {"preset": "gpt3-1.7b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 4, "gpus_per_node": 8},
                       "training": {"global_batch_size": 512, "precision": "bf16"}})


def test_planner_flags_a_truly_implausible_prediction():
    """A cost model whose GEMMs and attention run at the dense peak predicts far beyond any published run."""
    ideal = dataclasses.replace(CostModel(), matmul_efficiency=1.0)
    result = search(_spec(), top_k=1, cost=ideal)
    assert result.chosen.mfu > mfu_bound(A100)[0]
    [warning] = result.warnings
    assert "implausible prediction" in warning and warning in result.reasons
    slow = search(_spec(), top_k=1, cost=dataclasses.replace(CostModel(), matmul_efficiency=0.5))
    assert slow.chosen.mfu < mfu_bound(A100)[0] and slow.warnings == []
