"""--measured on CPU from the doctor's model probe: the trainer's own kernels set the rank's speed."""
import json
from pathlib import Path

import pytest

from orchestrator.catalog.gpus import GPUS
from orchestrator.doctor.measured import catalog_micro_batch_s, kernel_mix_terms, load_doctor, measured_cost
from orchestrator.errors import SpecError
from orchestrator.estimate.cost import CostModel
from orchestrator.plan import build_plan
from orchestrator.spec_loader import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = GPUS["cpu"]
SUSTAINED_FLOPS = CPU.peak_for("fp32") * CPU.matmul_efficiency * CPU.sustained_clock_fraction


def _doctor(tmp_path, **measured) -> Path:
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps({"doctor_version": 1, "backend": "local", "time_unix": 0.0,
                                "spec": {"gpu": "cpu", "precision": "fp32"},
                                "measured": {"gemm_flops": SUSTAINED_FLOPS, **measured}}))
    return path


def _step_s(spec, cost) -> float:
    return build_plan(spec, cost=cost).chosen["step_time_s"]


@pytest.mark.parametrize("example", ["tiny-gpt-cpu", "tiny-gpt-cpu-pp2"])
def test_the_model_probe_sets_the_core_fraction_and_the_planned_micro_batch_matches_it(tmp_path, example):
    spec = load_spec(EXAMPLES / f"{example}.yaml")
    mb = build_plan(spec).chosen["micro_batch_size"]
    catalog = catalog_micro_batch_s(spec, CostModel(), mb)
    # the GEMM probe says catalog speed; the trainer's kernels run 3x slower: the model probe wins
    cost, record = measured_cost(_doctor(tmp_path, model_step_s=3 * catalog, model_step_micro_batch=mb), spec)
    fraction = record["figures"]["kernel_gap_s"]["core_fraction"]
    assert fraction == pytest.approx(1 / 3, rel=0.02)
    assert record["figures"]["kernel_gap_s"]["from"] == "measured.model_step_s"
    assert catalog_micro_batch_s(spec, cost, mb) == pytest.approx(3 * catalog, rel=1e-3)
    gemm_only, _ = measured_cost(_doctor(tmp_path), spec)
    assert _step_s(spec, cost) > 2.5 * _step_s(spec, gemm_only)


@pytest.mark.parametrize("example", ["tiny-gpt-cpu", "tiny-gpt-cpu-pp2"])
def test_the_probes_two_parts_set_the_forward_backward_fraction_and_the_optimizer_rate(tmp_path, example):
    spec = load_spec(EXAMPLES / f"{example}.yaml")
    mb = build_plan(spec).chosen["micro_batch_size"]
    compute = catalog_micro_batch_s(spec, CostModel(), mb, optimizer=False)
    params = 875_264
    # forward + backward 2x slower than the catalog; the optimizer steps 1e8 parameters a second
    doctor = _doctor(tmp_path, model_step_s=2 * compute + params / 1e8, model_step_micro_batch=mb,
                     model_fwd_bwd_s=2 * compute, model_optimizer_s=params / 1e8, model_optimizer_params=params)
    cost, record = measured_cost(doctor, spec)
    assert record["figures"]["kernel_gap_s"]["core_fraction"] == pytest.approx(0.5, rel=0.02)
    assert record["figures"]["kernel_gap_s"]["from"] == "measured.model_fwd_bwd_s"
    assert record["figures"]["optimizer_params_per_s"] == {"value": pytest.approx(1e8), "params": params,
                                                           "from": "measured.model_optimizer_s"}
    assert catalog_micro_batch_s(spec, cost, mb, optimizer=False) == pytest.approx(2 * compute, rel=1e-3)
    plan = build_plan(spec, cost=cost).chosen
    owned = plan["memory"]["optimizer_bytes"] / 8          # fp32 Adam: m and v, 8 bytes per owned parameter
    assert plan["breakdown"]["optimizer_s"] == pytest.approx(owned / 1e8, rel=1e-6)
    # the whole step as one figure (an older doctor.json) fits one fraction to the sum instead
    _, whole = measured_cost(_doctor(tmp_path, model_step_s=2 * compute + params / 1e8, model_step_micro_batch=mb),
                             spec)
    assert "optimizer_params_per_s" not in whole["figures"]
    assert whole["figures"]["kernel_gap_s"]["from"] == "measured.model_step_s"


def test_without_the_model_probe_the_gemm_probe_sets_the_fraction_as_before(tmp_path):
    spec = load_spec(EXAMPLES / "tiny-gpt-cpu.yaml")
    _, record = measured_cost(_doctor(tmp_path, gemm_flops=SUSTAINED_FLOPS / 2), spec)
    assert record["figures"]["kernel_gap_s"]["from"] == "measured.gemm_flops"
    assert record["figures"]["kernel_gap_s"]["core_fraction"] == pytest.approx(0.5)
    assert kernel_mix_terms(spec, {"gemm_flops": 1e11}, CostModel(), CPU) is None


def test_the_fraction_scales_every_core_term_alike():
    spec = load_spec(EXAMPLES / "tiny-gpt-cpu.yaml")
    catalog = catalog_micro_batch_s(spec, CostModel(), 4)
    fraction, terms, source = kernel_mix_terms(spec, {"model_step_s": 2 * catalog, "model_step_micro_batch": 4},
                                               CostModel(), CPU)
    assert source == "model_step_s"                           # an older probe: solved on the whole step
    assert fraction == pytest.approx(0.5, rel=0.02)
    assert terms["kernel_gap_s"] == pytest.approx(CostModel().kernel_gap_s / fraction)
    assert terms["hbm_efficiency"] == pytest.approx(CostModel().hbm_efficiency * fraction)
    assert terms["matmul_efficiency"] == pytest.approx(CPU.matmul_efficiency * CPU.sustained_clock_fraction * fraction)


def test_ranks_that_wait_for_each_other_take_each_windows_slowest_model_step():
    from orchestrator.doctor.report import measured_figures, synchronous_seconds

    assert synchronous_seconds([[0.1, 0.3], [0.3, 0.1]]) == pytest.approx(0.3)
    assert synchronous_seconds([]) is None
    assert synchronous_seconds([[0.1, 0.1, 0.5, 0.1], [0.1, 0.2, 0.1, 0.1]]) == pytest.approx(0.15)  # one burst
    ranks = [{"node_rank": 0, "gemm": {"flops": 1e11, "dtype": "float32"},
              "model_step": {"micro_batch": 4, "window_s": w, "step_s": min(w)}} for w in ([0.1, 0.3], [0.2, 0.2])]
    figures = measured_figures(ranks)
    assert figures["model_step_s"] == pytest.approx(0.25) and figures["model_step_micro_batch"] == 4
    assert "model_fwd_bwd_s" not in figures                   # an older probe: the whole step only
    parts = [{"node_rank": 0, "gemm": {"flops": 1e11, "dtype": "float32"},
              "model_step": {"micro_batch": 4, "window_s": [0.3, 0.3], "step_s": 0.3, "optimizer_params": 10,
                             "fwd_bwd_window_s": fb, "optimizer_window_s": [0.05, 0.05]}}
             for fb in ([0.2, 0.25], [0.25, 0.2])]
    figures = measured_figures(parts)
    assert figures["model_fwd_bwd_s"] == pytest.approx(0.25) and figures["model_optimizer_s"] == pytest.approx(0.05)
    assert figures["model_optimizer_params"] == 10


@pytest.mark.parametrize("measured, field", [({"model_step_s": -1.0}, "model_step_s"),
                                             ({"model_optimizer_s": 0.0}, "model_optimizer_s"),
                                             ({"model_optimizer_params": 1.5}, "model_optimizer_params"),
                                             ({"model_step_s": 0.1, "model_step_micro_batch": 0},
                                              "model_step_micro_batch")])
def test_a_damaged_model_probe_figure_is_refused_by_name(tmp_path, measured, field):
    with pytest.raises(SpecError, match=f"measured.{field}"):
        load_doctor(_doctor(tmp_path, **measured))


def test_the_probe_measures_gloo_at_the_trainers_gradient_bytes():
    from orchestrator.doctor.probe import CPU_BUCKET_MAX_BYTES, gradient_bucket_bytes

    assert gradient_bucket_bytes({"memory": {"params_bytes": 3_501_056, "grads_bytes": 3_501_056}}, 1 << 20) == 3_501_056
    assert gradient_bucket_bytes({"memory": {"params_bytes": 1 << 40}}, 1 << 20) == CPU_BUCKET_MAX_BYTES
    assert gradient_bucket_bytes({}, 1 << 20) == 1 << 20


def test_the_model_probe_runs_the_trainers_step_and_reports_windows():
    import torch

    from orchestrator.doctor.probe import measure_model_step, model_probe_fits

    spec = load_spec(EXAMPLES / "tiny-gpt-cpu.yaml")
    assert model_probe_fits(spec)
    out = measure_model_step(torch, spec.model, 1, 0.02, 2, lambda: None)
    assert out["micro_batch"] == 1 and len(out["window_s"]) == 2 and all(t > 0 for t in out["window_s"])
    for whole, fb, opt in zip(out["window_s"], out["fwd_bwd_window_s"], out["optimizer_window_s"]):
        assert 0 < fb < whole and 0 < opt < whole        # medians of the parts, each below the whole step's
    assert out["optimizer_params"] == sum(p.numel() for p in __import__("orchestrator.train.model", fromlist=["GPT"])
                                          .GPT(spec.model).parameters())

