"""orch calibrate on synthetic runs: the fit recovers a known cost model; calib.json is validated;
orch plan / generate --calibration use it."""
from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator.calibrate import (CalibrationFile, Observation, calibrate, load_calibration, predict,
                                    reduction_time_s, write_calibration)
from orchestrator.errors import SpecError
from orchestrator.estimate import CostModel
from orchestrator.layout import require_complete
from orchestrator.spec_loader import parse_spec
from tests.conftest import EXAMPLES, spec_data
from tests.unit.compare_support import make_run_dir, record
from tests.conftest import run_cli

TRUE = CostModel(matmul_efficiency=0.3, attention_efficiency=0.15, kernel_gap_s=2e-5, intra_node_efficiency=0.3,
                 dp_overlap=0.25)
LAYOUTS = {"z1-mb1": {"parallelism.zero_stage": 1, "parallelism.micro_batch_size": 1},
           "z2-mb2": {"parallelism.zero_stage": 2, "parallelism.micro_batch_size": 2},
           "z0-mb4": {"parallelism.zero_stage": 0, "parallelism.micro_batch_size": 4},
           "pp2-mb2": {"parallelism.pipeline": 2, "parallelism.zero_stage": 1, "parallelism.micro_batch_size": 2}}


def truth(overrides: dict) -> dict:
    """What a run of this layout would measure if TRUE were the machine."""
    spec = parse_spec(spec_data(**overrides))
    obs = Observation(source="x", label="x", spec=spec, layout=require_complete(spec), measured={})
    return predict(obs, TRUE)


def synthetic_run(path, overrides: dict, steps: int = 6):
    t = truth(overrides)
    records = [record(s, t["step_time_s"], compute_s=t["compute_s"], allreduce_s=t["dp_reduction_s"])
               for s in range(1, steps + 1)]
    return make_run_dir(path, records, **overrides)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cal")
    return {name: synthetic_run(root / name, overrides) for name, overrides in LAYOUTS.items()}


def test_fit_recovers_a_known_cost_model(runs):
    cal = calibrate([str(p) for p in runs.values()])
    assert cal.error_before_pct > 20 and cal.error_after_pct < 0.5
    assert set(cal.fitted) == {"matmul_efficiency", "attention_efficiency", "kernel_gap_s", "intra_node_efficiency",
                               "dp_overlap"}
    # On the CPU target GEMMs and fused attention both run at a fixed fraction of one core's peak (no tile or
    # short-K effects), so these runs only pin their combined compute time, not each efficiency: check that.
    fitted = dataclasses.replace(TRUE, **cal.fitted)
    for overrides in LAYOUTS.values():
        spec = parse_spec(spec_data(**overrides))
        obs = Observation(source="x", label="x", spec=spec, layout=require_complete(spec), measured={})
        assert predict(obs, fitted)["compute_s"] == pytest.approx(truth(overrides)["compute_s"], rel=0.01)
    assert cal.fitted["kernel_gap_s"] == pytest.approx(2e-5, rel=0.05)
    assert cal.fitted["intra_node_efficiency"] == pytest.approx(0.3, rel=0.02)


def test_held_out_layout_predicted_after_calibration(runs):
    train = [str(runs[n]) for n in ("z1-mb1", "z0-mb4", "pp2-mb2")]
    cal = calibrate(train)
    held = truth(LAYOUTS["z2-mb2"])
    spec = parse_spec(spec_data(**LAYOUTS["z2-mb2"]))
    obs = Observation(source="x", label="x", spec=spec, layout=require_complete(spec), measured={})
    after, before = predict(obs, cal.cost), predict(obs, CostModel())
    assert abs(after["step_time_s"] / held["step_time_s"] - 1) < 0.01
    assert abs(before["step_time_s"] / held["step_time_s"] - 1) > 0.1


def test_only_identifiable_terms_are_fitted(runs):
    one = calibrate([str(runs["z2-mb2"])])
    assert "kernel_gap_s" not in one.fitted            # one micro-batch size: not separable from efficiency
    pp_only = calibrate([str(runs["pp2-mb2"])])
    assert set(pp_only.fitted) == {"matmul_efficiency", "attention_efficiency"}   # dp = 1: no DP terms


def test_calib_json_roundtrip_and_plan_uses_it(runs, tmp_path, capsys):
    cal = calibrate([str(p) for p in runs.values()])
    path = write_calibration(cal, tmp_path / "calib.json")
    data = json.loads(path.read_text())
    assert set(data) == {"calibration_version", "orch_version", "cluster", "cost_model", "fit"}
    assert data["cluster"]["gpu"] == "cpu" and data["cluster"]["precision"] == "fp32"
    loaded = load_calibration(path)
    assert dataclasses.asdict(loaded.cost) == dataclasses.asdict(cal.cost)
    tiny = str(EXAMPLES / "tiny-gpt-cpu.yaml")
    code, out, err = run_cli(["plan", tiny, "--json", "--calibration", str(path)], capsys)
    assert code == 0 and "calibrated by" in err
    calibrated = json.loads(out)["chosen"]["step_time_s"]
    code, out, _ = run_cli(["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--json"], capsys)
    assert calibrated != pytest.approx(json.loads(out)["chosen"]["step_time_s"], rel=0.01)
    code, _, err = run_cli(["generate", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "-o", str(tmp_path / "gen"),
                            "--calibration", str(path)], capsys)
    assert code == 0, err
    plan = json.loads((tmp_path / "gen" / "plan.json").read_text())
    assert plan["chosen"]["step_time_s"] == pytest.approx(calibrated, rel=1e-12)


def test_cli_calibrate_writes_and_prints(runs, tmp_path, capsys):
    out_path = tmp_path / "c.json"
    code, out, err = run_cli(["calibrate", *map(str, runs.values()), "-o", str(out_path)], capsys)
    assert code == 0, err
    assert out_path.is_file() and f"wrote {out_path}" in err
    assert "fitted cost-model terms" in out and "intra_node_efficiency" in out and "calibrated" in out
    code, out, _ = run_cli(["calibrate", *map(str, runs.values()), "-o", str(out_path), "--json", "--force"], capsys)
    assert json.loads(out) == json.loads(out_path.read_text())


def test_mixing_clusters_or_precisions_is_refused(runs, tmp_path, capsys):
    bf16 = synthetic_run(tmp_path / "bf16", {"training.precision": "bf16"})
    big = synthetic_run(tmp_path / "a100", {"cluster.gpu": "a100-80gb"})
    code, _, err = run_cli(["calibrate", str(runs["z2-mb2"]), str(bf16), str(big), "-o", str(tmp_path / "c.json")],
                           capsys)
    assert code == 2 and "different clusters or precisions" in err
    assert "precision=bf16" in err and "gpu=a100-80gb" in err
    assert not (tmp_path / "c.json").exists()


def test_bad_runs_exit_2(runs, tmp_path, capsys):
    code, _, err = run_cli(["calibrate", str(runs["z2-mb2"]), str(tmp_path / "missing"), "-o",
                            str(tmp_path / "c.json")], capsys)
    assert code == 2 and "no such run dir" in err


BAD_FILES = [
    ("[1, 2]", "must be a JSON object"),
    ("{", "invalid JSON"),
    ('{"cost_model": {"dp_overlapp": 0.5}}', "did you mean 'dp_overlap'"),
    ('{"cost_model": {"dp_overlap": "0.5"}}', "cost_model.dp_overlap: must be a number"),
    ('{"cost_model": {"fused_grad_accumulation": 1}}', "must be true or false"),
    ('{"cost_model": {"cuda_context_bytes": 1.5}}', "must be an integer"),
    ('{"cost_model": {"matmul_efficiency": 1.5}}', "cost_model.matmul_efficiency: 1.5 is out of range"),
    ('{"cost_model": {}, "clustr": {}}', "clustr: unknown key (did you mean 'cluster'?)"),
    ('{"cost_model": {}, "cluster": {"gpu": 3}}', "cluster.gpu: must be a string"),
    ('{"cost_model": {}, "calibration_version": 2}', "calibration_version: 2 is not 1"),
    ('{"cluster": {}}', "cost_model: required key is missing"),
    ('{"cost_model": []}', "must be an object of CostModel terms"),
]


@pytest.mark.parametrize("text, message", BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_invalid_calib_json_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "calib.json"
    path.write_text(text)
    code, out, err = run_cli(["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--calibration", str(path)], capsys)
    assert code == 2 and message in err and out == ""


def test_all_calib_json_problems_at_once(tmp_path):
    path = tmp_path / "calib.json"
    path.write_text('{"cost_model": {"dp_overlapp": 1, "kernel_gap_s": "x", "matmul_efficiency": 3}, "clustr": {}}')
    with pytest.raises(SpecError) as info:
        load_calibration(path)
    assert len(info.value.problems) == 4


def test_calibration_for_another_gpu_is_refused(capsys, tmp_path):
    cal = CalibrationFile(path="c.json", cost=TRUE, cluster={"gpu": "cpu", "precision": "fp32"})
    assert cal.cost_for(parse_spec(spec_data())) is TRUE
    with pytest.raises(SpecError, match="fitted on 'cpu' runs, but the spec's cluster.gpu is 'h100-sxm'"):
        cal.cost_for(parse_spec(spec_data(**{"cluster.gpu": "h100-sxm", "training.precision": "fp32"})))
    path = tmp_path / "calib.json"
    path.write_text(json.dumps({"cost_model": {"dp_overlap": 0.5}, "cluster": {"gpu": "cpu"}}))
    code, _, err = run_cli(["plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--calibration", str(path)], capsys)
    assert code == 2 and "cluster.gpu" in err


def test_reduction_time_counts_passes():
    spec = parse_spec(spec_data(**{"parallelism.zero_stage": 0}))
    lay = require_complete(spec)
    one = reduction_time_s(spec, dataclasses.replace(lay, zero_stage=1), CostModel())
    # DeepSpeed >= 0.12.4 all-reduces ZeRO-1/2 gradient buckets (engines.DS_BUCKET_ALL_REDUCE_SINCE)
    assert reduction_time_s(spec, lay, CostModel()) == pytest.approx(one, rel=0.05)
    assert reduction_time_s(spec, dataclasses.replace(lay, zero_stage=2), CostModel()) == pytest.approx(2 * one, rel=0.05)  # m=2


def test_one_run_fits_fewer_terms_than_it_measured_and_warns(runs, tmp_path, capsys):
    one = calibrate([str(runs["z2-mb2"])])      # measures compute, reduction and step time: 3 values
    assert set(one.fitted) == {"matmul_efficiency", "attention_efficiency", "intra_node_efficiency"}
    assert any(w.startswith("dp_overlap not fitted") for w in one.warnings)
    code, _, err = run_cli(["calibrate", str(runs["z2-mb2"]), "-o", str(tmp_path / "c.json")], capsys)
    assert code == 0 and "warning: dp_overlap not fitted (kept the default)" in err
    assert json.loads((tmp_path / "c.json").read_text())["fit"]["warnings"] == one.warnings


def test_a_term_at_the_edge_of_its_range_is_not_fitted(tmp_path, capsys):
    def slow_reduction(path, overrides):   # reductions 10^6 x slower than any bandwidth in range explains
        t = truth(overrides)
        records = [record(s, t["step_time_s"], compute_s=t["compute_s"], allreduce_s=1e6 * t["dp_reduction_s"])
                   for s in range(1, 7)]
        return make_run_dir(path, records, **overrides)

    paths = [slow_reduction(tmp_path / n, LAYOUTS[n]) for n in ("z1-mb1", "z2-mb2", "z0-mb4")]
    cal = calibrate([str(p) for p in paths])
    assert "intra_node_efficiency" not in cal.fitted
    assert any(w.startswith("intra_node_efficiency not fitted (kept the default): the fit ran to the edge")
               for w in cal.warnings)


def test_calibrated_plan_prints_no_zero_rate(runs, tmp_path, capsys):
    path = write_calibration(calibrate([str(p) for p in runs.values()]), tmp_path / "calib.json")
    code, out, err = run_cli(["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--calibration", str(path), "--wide"],
                             capsys)
    assert code == 0, err
    network = next(line for line in out.splitlines() if line.startswith("- network:"))
    assert " 0 GB/s" not in network and "TP " not in network     # tp = 1: no TP figure, and no rate reads 0
    assert "GB/s" in network or "inside one node" in network


def test_cli_tables_fit_80_columns(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["calibrate", *map(str, runs.values()), "-o", str(tmp_path / "c.json")], capsys)
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80 and "\x1b[" not in out
    assert "matmul_efficiency" in out and "typical error" in out
