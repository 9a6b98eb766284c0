"""--measured on the CPU target: the doctor's GEMM rate sets the speed of the whole core, not only its GEMMs."""
import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.catalog.gpus import GPUS
from orchestrator.doctor.measured import cpu_core_terms, measured_cost
from orchestrator.estimate.cost import CostModel
from orchestrator.plan import build_plan
from orchestrator.spec_loader import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = GPUS["cpu"]
SUSTAINED_FLOPS = CPU.peak_for("fp32") * CPU.matmul_efficiency * CPU.sustained_clock_fraction


def _doctor(tmp_path, gemm_flops: float) -> Path:
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps({"doctor_version": 1, "backend": "local", "time_unix": 0.0,
                                "spec": {"gpu": "cpu", "precision": "fp32"},
                                "measured": {"gemm_flops": gemm_flops}}))
    return path


def test_core_terms_scale_rates_by_the_fraction_and_host_times_by_its_inverse():
    cost = CostModel()
    terms = cpu_core_terms(cost, CPU, 0.5)
    host = [f.name for f in dataclasses.fields(CostModel) if f.name.endswith("_host_s")]
    assert len(host) >= 5 and set(host) <= set(terms)
    for name in host + ["kernel_gap_s"]:
        assert terms[name] == pytest.approx(2 * getattr(cost, name))
    assert terms["hbm_efficiency"] == pytest.approx(cost.hbm_efficiency / 2)
    assert terms["cpu_adam_params_per_s"] == pytest.approx(cost.cpu_adam_params_per_s / 2)
    assert terms["gelu_elems_per_s"] == pytest.approx(CPU.gelu_elems_per_s / 2)
    assert terms["attention_efficiency"] == pytest.approx(CPU.attention_efficiency * CPU.sustained_clock_fraction / 2)
    assert cpu_core_terms(cost, CPU, 1.0)["kernel_gap_s"] == cost.kernel_gap_s


@pytest.mark.parametrize("example", ["tiny-gpt-cpu", "tiny-gpt-cpu-pp2"])
def test_a_core_at_half_speed_doubles_the_planned_compute(tmp_path, example):
    spec = load_spec(EXAMPLES / f"{example}.yaml")
    at_catalog, _ = measured_cost(_doctor(tmp_path, SUSTAINED_FLOPS), spec)
    half, record = measured_cost(_doctor(tmp_path, SUSTAINED_FLOPS / 2), spec)
    assert record["figures"]["kernel_gap_s"]["core_fraction"] == pytest.approx(0.5)
    fast = build_plan(spec, cost=at_catalog).chosen["breakdown"]
    slow = build_plan(spec, cost=half).chosen["breakdown"]
    for term in ("compute_s", "engine_s", "optimizer_s"):
        assert slow[term] == pytest.approx(2 * fast[term], rel=1e-6), term


def test_a_16_bit_cpu_spec_takes_the_core_speed_from_the_fp32_gemm_and_the_gemm_rate_from_its_own():
    from orchestrator.doctor.measured import core_fraction
    from orchestrator.doctor.report import measured_figures

    ranks = [{"node_rank": 0, "gemm": {"flops": bf16, "dtype": "bfloat16"},
              "gemm_fp32": {"flops": fp32, "dtype": "float32"}}
             for bf16, fp32 in ((600e9, SUSTAINED_FLOPS / 2), (500e9, SUSTAINED_FLOPS))]
    figures = measured_figures(ranks)
    assert figures["gemm_flops"] == 500e9 and figures["gemm_fp32_flops"] == SUSTAINED_FLOPS / 2   # the slowest rank
    assert core_fraction(figures, CPU) == pytest.approx(0.5)
    assert core_fraction({"gemm_flops": SUSTAINED_FLOPS}, CPU) == pytest.approx(1.0)    # an fp32 spec's doctor.json
    assert "gemm_fp32_flops" not in measured_figures([{"node_rank": 0, "gemm": {"flops": 1e11, "dtype": "float32"}}])


def test_ranks_that_wait_for_each_other_sustain_the_slowest_rank_of_each_window():
    from orchestrator.doctor.report import measured_figures, synchronous_rate

    windows = [[40e9, 20e9], [20e9, 40e9]]        # each rank has the core in one window, a neighbour in the other
    assert synchronous_rate(windows) == pytest.approx(20e9)
    assert synchronous_rate([[40e9, 20e9]]) == pytest.approx(2 / (1 / 40e9 + 1 / 20e9))   # time adds up
    assert synchronous_rate([]) is None
    ranks = [{"node_rank": 0, "gemm": {"flops": max(w), "dtype": "float32", "window_flops": w}} for w in windows]
    figures = measured_figures(ranks)
    assert figures["gemm_flops"] == 40e9 and figures["gemm_sync_flops"] == pytest.approx(20e9)


def test_cpu_plans_with_the_synchronous_rate_gpus_keep_the_best_window(tmp_path):
    from orchestrator.doctor.measured import core_fraction

    measured = {"gemm_flops": SUSTAINED_FLOPS, "gemm_sync_flops": SUSTAINED_FLOPS / 2}
    assert core_fraction(measured, CPU) == pytest.approx(0.5)
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps({"doctor_version": 1, "backend": "local", "time_unix": 0.0,
                                "spec": {"gpu": "cpu", "precision": "fp32"}, "measured": measured}))
    cost, record = measured_cost(path, load_spec(EXAMPLES / "tiny-gpt-cpu.yaml"))
    assert record["figures"]["matmul_efficiency"]["from"] == "measured.gemm_sync_flops"
    assert cost.matmul_efficiency == pytest.approx(SUSTAINED_FLOPS / 2 / CPU.peak_for("fp32"))
