"""Files of measured numbers that orch reads (doctor.json, calib.json, metrics.jsonl; issue 21): NaN,
infinities, overflowing floats, huge integers, booleans, wrong shapes, devices and FIFOs are exit 2 naming
the file and the field, never a plan of "nan s/step", a traceback or a hang."""
from __future__ import annotations

import json
import math
import os

import pytest
import yaml

from tests.conftest import spec_data
from tests.conftest import run_cli

BIG_INT = "1" + "0" * 400


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data()))
    return str(path)


def doctor_text(measured: str, gpus_per_node: int = 2) -> str:
    return ('{"doctor_version": 1, "spec": {"gpu": "cpu", "precision": "fp32", "gpus_per_node": %d}, '
            '"measured": %s}' % (gpus_per_node, measured))


BAD_DOCTOR = [
    ("nan", doctor_text('{"gemm_flops": NaN}'), "measured.gemm_flops: NaN is not a finite number"),
    ("inf", doctor_text('{"intra_node_bandwidth_GBps": Infinity}'), "measured.intra_node_bandwidth_GBps: Infinity"),
    ("overflow", doctor_text('{"gemm_flops": 1e999}'), "measured.gemm_flops: 1e999 is not a finite number"),
    ("1e308", doctor_text('{"allreduce_latency_s": 1e308, "allreduce_latency_ranks": 2}'),
     "measured.allreduce_latency_s: 1e+308 is not a number in"),
    ("bool", doctor_text('{"allreduce_latency_s": true, "allreduce_latency_ranks": 2}'),
     "measured.allreduce_latency_s: True is not a number"),
    ("huge-int", doctor_text('{"gemm_flops": %s}' % BIG_INT), "measured.gemm_flops: 1000"),
    ("ranks-bool", doctor_text('{"allreduce_latency_s": 1e-4, "allreduce_latency_ranks": true}'),
     "measured.allreduce_latency_ranks"),
    ("negative", doctor_text('{"inter_node_bandwidth_GBps": -5}'), "measured.inter_node_bandwidth_GBps: -5"),
    ("list", "[1, 2]", "not a doctor.json of version 1"),
    ("measured-list", doctor_text("[1]"), "not a doctor.json of version 1"),
    ("spec-list", '{"doctor_version": 1, "spec": [], "measured": {}}', "spec: must be an object"),
    ("other-gpus-per-node", doctor_text('{"gemm_flops": 1e11}', gpus_per_node=8),
     "spec.gpus_per_node: made with 8 GPUs per node, but the spec's cluster.gpus_per_node is 2"),
]


@pytest.mark.parametrize("command", ["plan", "generate"])
@pytest.mark.parametrize("text, message", [c[1:] for c in BAD_DOCTOR], ids=[c[0] for c in BAD_DOCTOR])
def test_bad_doctor_json_exit_2_naming_the_field(tmp_path, capsys, spec, command, text, message):
    path = tmp_path / "doctor.json"
    path.write_text(text)
    extra = ["-o", str(tmp_path / "run")] if command == "generate" else []
    code, out, err = run_cli([command, spec, "--measured", str(path), *extra], capsys)
    assert code == 2 and str(path) in err and message in err, err
    assert out == "" and not (tmp_path / "run").exists()


def test_good_doctor_json_still_plans(tmp_path, capsys, spec):
    path = tmp_path / "doctor.json"
    path.write_text(doctor_text('{"gemm_flops": 1e11, "allreduce_latency_s": 1e-4, "allreduce_latency_ranks": 2}'))
    code, out, err = run_cli(["plan", spec, "--measured", str(path), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["measured"]["figures"]["matmul_efficiency"]["value"] > 0


BAD_CALIB = [
    ("nan", '{"cost_model": {"dp_overlap": NaN}}', "cost_model.dp_overlap: NaN is not a finite number"),
    ("overflow", '{"cost_model": {"kernel_gap_s": 1e999}}', "cost_model.kernel_gap_s: 1e999"),
    ("1e308", '{"cost_model": {"kernel_gap_s": 1e308}}', "cost_model.kernel_gap_s: 1e+308 is out of range"),
    ("tiny-efficiency", '{"cost_model": {"matmul_efficiency": 1e-300}}', "cost_model.matmul_efficiency: 1e-300"),
    ("huge-int", '{"cost_model": {"comm_channels": %s}}' % BIG_INT, "cost_model.comm_channels"),
    ("bool", '{"cost_model": {"kernel_gap_s": true}}', "cost_model.kernel_gap_s"),
    ("list", "[]", "calib.json must be a JSON object"),
    ("other-gpus-per-node", '{"cost_model": {}, "cluster": {"gpu": "cpu", "gpus_per_node": 8}}',
     "cluster.gpus_per_node: made with 8 GPUs per node, but the spec's cluster.gpus_per_node is 2"),
    ("gpus-per-node-bool", '{"cost_model": {}, "cluster": {"gpus_per_node": true}}',
     "cluster.gpus_per_node: must be an integer"),
]


@pytest.mark.parametrize("text, message", [c[1:] for c in BAD_CALIB], ids=[c[0] for c in BAD_CALIB])
def test_bad_calib_json_exit_2_naming_the_field(tmp_path, capsys, spec, text, message):
    path = tmp_path / "calib.json"
    path.write_text(text)
    code, out, err = run_cli(["plan", spec, "--calibration", str(path)], capsys)
    assert code == 2 and str(path) in err and message in err, err


@pytest.mark.parametrize("option", ["--measured", "--calibration"])
def test_devices_fifos_and_huge_files_are_refused_without_reading(tmp_path, capsys, spec, option):
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)          # opening it for reading would block until a writer came
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(17 << 20)  # sparse: over the 16 MiB cap
    for path, message in ((zero, "not a regular file (a device)"), (fifo, "not a regular file (a FIFO)"),
                          (tmp_path, "directory"), (big, "larger than")):
        code, _, err = run_cli(["plan", spec, option, str(path)], capsys)
        assert code == 2 and str(path) in err and message in err, err


def test_a_spec_that_is_a_fifo_is_refused(tmp_path, capsys):
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    code, out, _ = run_cli(["validate", str(fifo)], capsys)
    assert code == 2 and "not a regular file (a FIFO)" in out


def test_plan_json_never_holds_nan():
    from orchestrator.errors import OrchError
    from orchestrator.rundir import dump_json

    for bad in (math.nan, math.inf):
        with pytest.raises(OrchError, match="non-finite number"):
            dump_json({"step_time_s": bad})


# --- metrics.jsonl through compare and calibrate -----------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.unit.compare_support import make_run_dir, steady

    root = tmp_path_factory.mktemp("runs")
    return {name: make_run_dir(root / name, steady(10, 0.1), **over) for name, over in
            (("a", {}), ("b", {}), ("mb4", {"parallelism.micro_batch_size": 4}))}


BAD_RECORDS = [
    ("negative", {"step_time_s": -1.0}, "step_time_s must be in [1e-09, 1e+06], got -1.0"),
    ("1e308", {"step_time_s": 1e308, "tokens_per_s": 1e308}, "step_time_s must be in"),
    ("string", {"compute_time_s": "abc"}, "compute_time_s must be a number, got 'abc'"),
    ("bool", {"moe_aux_loss": True}, "moe_aux_loss must be a number, got True"),
    ("huge-step", {"step": 10**30}, "step must be an integer in [1, "),
    ("negative-rate", {"tokens_per_s": -5.0}, "tokens_per_s must be in [0, 1e+15]"),
    ("huge-int", {"step_time_s": 10**400}, "step_time_s must be in"),      # found by the property test
]


@pytest.mark.parametrize("command", ["compare", "calibrate"])
@pytest.mark.parametrize("change, message", [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_bad_metrics_values_exit_2_naming_the_run_and_field(tmp_path, capsys, trained, command, change, message):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["a"], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[5] = json.dumps({**json.loads(lines[5]), **change})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    extra = ["-o", str(tmp_path / "calib.json")] if command == "calibrate" else []
    code, out, err = run_cli([command, str(run), str(trained["b"]), *extra], capsys)
    assert code == 2 and f"{run}/metrics.jsonl:6" in err and message in err, err
    assert not (tmp_path / "calib.json").exists()


def test_identical_runs_tie_instead_of_naming_a_winner(capsys, trained):
    code, out, err = run_cli(["compare", str(trained["a"]), str(trained["b"]), "--json"], capsys)
    winner = json.loads(out)["winner"]
    assert code == 0 and winner["label"] is None and len(winner["tie"]) == 2 and winner["speedup"] == 1.0
    code, out, _ = run_cli(["compare", str(trained["a"]), str(trained["b"])], capsys)
    assert code == 0 and "tie (1.000x" in out and "wins" not in out


def test_a_clear_speedup_still_wins(tmp_path, capsys, trained):
    from tests.unit.compare_support import make_run_dir, steady

    fast = make_run_dir(tmp_path / "fast", steady(10, 0.05))
    code, out, _ = run_cli(["compare", str(fast), str(trained["a"]), "--json"], capsys)
    winner = json.loads(out)["winner"]
    assert code == 0 and winner["index"] == 0 and winner["speedup"] > 1.9 and "tie" not in winner


def test_the_same_run_twice_fits_no_more_terms_than_once(tmp_path, capsys, trained):
    from orchestrator.calibrate import calibrate

    once, twice = calibrate([str(trained["a"])]), calibrate([str(trained["a"]), str(trained["a"])])
    assert set(twice.fitted) == set(once.fitted) and "dp_overlap" not in twice.fitted
    assert any("dp_overlap not fitted" in w for w in twice.warnings)


def test_metrics_are_kept_as_columns_not_dicts(trained):
    from orchestrator.records import Records
    from orchestrator.runs import load_run

    run = load_run(str(trained["a"]))
    assert isinstance(run.records, Records) and len(run.records) == 10
    assert run.records[2:].column("step") == list(range(3, 11)) and run.records[-1]["step"] == 10
    assert run.records[0].get("alltoall_time_s") is None and isinstance(run.records[0]["mem_peak_bytes"], int)


# --- command-line options and validate's paths ---------------------------------------------------------------

@pytest.mark.parametrize("argv, option", [
    (["doctor", "RUN", "--threshold", "nan"], "--threshold"), (["doctor", "RUN", "--timeout", "nan"], "--timeout"),
    (["doctor", "RUN", "--timeout", "inf"], "--timeout"), (["launch", "RUN", "--timeout", "nan"], "--timeout"),
    (["launch", "RUN", "--preflight-timeout", "inf"], "--preflight-timeout")])
def test_float_options_must_be_finite(tmp_path, capsys, argv, option):
    argv = [str(tmp_path) if a == "RUN" else a for a in argv]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and option in err and "not a finite number" in err, err


@pytest.mark.parametrize("name", ["a\nb", "x" * 65, "", "a b", "../x", "-x"])
def test_init_name_follows_the_spec_name_rule(tmp_path, capsys, name):
    code, out, err = run_cli(["init", "--name", name, "-o", str(tmp_path / "s.yaml")], capsys)
    assert code == 2 and "--name" in err and "Traceback" not in err and not (tmp_path / "s.yaml").exists()


def test_validate_reports_every_path_past_an_unreadable_one(tmp_path, capsys, spec):
    unreadable = "x" * 300          # ENAMETOOLONG: unreadable even for root
    code, out, err = run_cli(["validate", "--static", spec, unreadable, str(tmp_path / "missing"), spec], capsys)
    assert code == 2 and f"{unreadable}: cannot read: File name too long" in out
    assert f"{tmp_path / 'missing'}: no such file" in out and "[4/4] checking" in err


@pytest.mark.parametrize("name", ["ds_config.json", "megatron_config.json"])
def test_deeply_nested_json_is_a_problem_not_a_recursion_error(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_text('{"train_batch_size": 8, "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}")
    code, out, err = run_cli(["validate", str(path)], capsys)     # without --static: the prefetch reads it too
    assert code == 2 and f"{path}: nested more than 64 levels deep" in out, out + err


# --- spec values --------------------------------------------------------------------------------------------

BAD_SPEC_VALUES = [
    ("tag-empty", {"tracking.wandb.tags": ["ok", ""]}, "tracking.wandb.tags[1]", "1 to 64 characters"),
    ("tag-65", {"tracking.wandb.tags": ["x" * 65]}, "tracking.wandb.tags[0]", "1 to 64 characters"),
    ("pdsh-duplicate", {"launch.pdsh.hosts": ["n1", "N1"], "cluster.num_nodes": 2, "cluster.gpus_per_node": 1},
     "launch.pdsh.hosts[1]", "listed twice"),
    ("lr-1e308", {"training.optimizer.lr": 1e308}, "training.optimizer.lr", "above 10 training diverges"),
    ("aux-1e300", {"model.preset": None, "model.num_layers": 2, "model.hidden_size": 64,
                   "model.num_attention_heads": 4, "model.vocab_size": 128, "model.seq_length": 32,
                   "model.moe": {"num_experts": 4, "aux_loss_coeff": 1e300}}, "model.moe.aux_loss_coeff", "above 1"),
    ("capacity-1e-300", {"model.preset": None, "model.num_layers": 2, "model.hidden_size": 64,
                         "model.num_attention_heads": 4, "model.vocab_size": 128, "model.seq_length": 32,
                         "model.moe": {"num_experts": 4, "capacity_factor": 1e-300}},
     "model.moe.capacity_factor", "below 0.01"),
    ("data-path-flag", {"data.synthetic": False, "data.path": "--mock-data"}, "data.path", "starts with '-'"),
    ("tokenizer-flag", {"data.synthetic": False, "data.path": "/d", "data.tokenizer": "-x"}, "data.tokenizer",
     "starts with '-'"),
    ("checkpoint-dir-flag", {"training.checkpoint.dir": "--save"}, "training.checkpoint.dir", "starts with '-'"),
    ("name-flag", {"name": "-run"}, "name", "starts with '-'"),
]


@pytest.mark.parametrize("command", ["validate", "generate"])
@pytest.mark.parametrize("overrides, field, message", [c[1:] for c in BAD_SPEC_VALUES],
                         ids=[c[0] for c in BAD_SPEC_VALUES])
def test_bad_spec_values_exit_2_naming_the_field(tmp_path, capsys, command, overrides, field, message):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(**overrides)))
    extra = ["-o", str(tmp_path / "run")] if command == "generate" else []
    code, out, err = run_cli([command, str(path), *extra], capsys)
    text = out + err
    assert code == 2 and f"{field}: " in text and message in text, text
    assert not (tmp_path / "run").exists()


def test_sane_values_at_the_bounds_pass(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(**{"training.optimizer.lr": 10, "tracking.wandb.tags": ["x" * 64],
                                                "data.synthetic": False, "data.path": "./--mock-data"})))
    code, out, err = run_cli(["validate", str(path)], capsys)
    assert code == 0, out + err


def test_a_flag_where_a_megatron_value_belongs_is_a_problem(tmp_path, capsys):
    from tests.unit.compare_support import make_run_dir

    run = make_run_dir(tmp_path / "run", **{"training.engine": "megatron"})
    args = run / "megatron_args.txt"
    args.write_text(args.read_text().replace("--mock-data\n", "--data-path\n--mock-data\n", 1))
    code, out, _ = run_cli(["validate", "--static", str(run)], capsys)
    assert code == 2 and "--data-path takes values but got none: the next line '--mock-data' is a flag" in out
    (tmp_path / "m_args.txt").write_text("--tokenizer-model\n-foo\n--lr\n-0.5\n")
    code, out, _ = run_cli(["validate", "--static", str(tmp_path / "m_args.txt")], capsys)
    assert code == 2 and "the value '-foo' starts with '-'" in out and "'-0.5' starts" not in out


@pytest.mark.parametrize("command", ["compare", "calibrate"])
@pytest.mark.parametrize("value, message", [(math.nan, "nan is not a finite number"),
                                            (1e308, "1e+308 is not a finite number below 1e+30"),
                                            ("x", "must be a number, got 'x'"), (True, "must be a number, got True")])
def test_a_damaged_plan_json_exit_2_naming_the_field(tmp_path, capsys, trained, command, value, message):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["a"], run)
    plan = json.loads((run / "plan.json").read_text())
    plan["chosen"]["step_time_s"] = value
    plan["chosen"]["memory"] = [1]
    (run / "plan.json").write_text(json.dumps(plan))
    extra = ["-o", str(tmp_path / "calib.json")] if command == "calibrate" else []
    code, out, err = run_cli([command, str(run), "--json", *extra], capsys)
    assert code == 2 and out == "" and f"{run}: plan.json: chosen.step_time_s: {message}" in err, err
    assert f"{run}: plan.json: chosen.memory: must be an object, got [1]" in err


def test_a_wandb_log_that_is_a_fifo_is_refused_without_reading(tmp_path, capsys):
    offline = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    offline.mkdir(parents=True)
    os.mkfifo(offline / "run-abc.wandb")      # wandb's reader would wait for a writer
    code, _, err = run_cli(["compare", str(tmp_path / "wandb")], capsys)
    assert code == 2 and f"{offline / 'run-abc.wandb'}: not a regular file" in err
