"""program: in the spec (orch | megatron-lm | script): rules, paths, program.json, launch scripts, manifest,
the edited-script report, --dry-run, and the Megatron-LM iteration-line parser."""
from __future__ import annotations

import json
import os
from datetime import datetime

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.programs import RUN_DIR_TOKEN, substitute_run_dir
from orchestrator.programs.argv import program_warnings, render_program
from orchestrator.programs.megatron_log import parse_iteration_line
from orchestrator.spec import spec_sha256, spec_to_data
from orchestrator.spec_loader import load_spec, parse_spec
from tests.conftest import fixed_plan, spec_data
from tests.conftest import run_cli


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "code" / "train.py"
    path.parent.mkdir()
    path.write_text("print('training')\n")
    return path


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text("# Megatron-LM's entry\n")
    return root


def script_spec(path, **program) -> dict:
    return spec_data(**{"program": {"kind": "script", "path": str(path), **program}})


def megatron_spec(root, **program) -> dict:
    return spec_data(**{"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 2, "training.engine": "megatron",
                        "training.precision": "bf16", "program": {"kind": "megatron-lm", "megatron_lm": str(root),
                                                                  **program}})


def write_spec(tmp_path, data: dict, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def problems_of(data: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return {p.path: str(p) for p in info.value.problems}


# --- the spec section -----------------------------------------------------------------------------------

def test_no_program_section_leaves_the_resolved_spec_and_its_hash_unchanged():
    plain, explicit = parse_spec(spec_data()), parse_spec(spec_data(**{"program": {"kind": "orch"}}))
    assert "program" not in spec_to_data(plain) and explicit.program is None
    assert spec_sha256(plain) == spec_sha256(explicit)


def test_relative_script_path_resolves_against_the_spec_file_and_is_recorded_absolute(tmp_path, script, monkeypatch):
    monkeypatch.chdir("/")
    spec = load_spec(write_spec(tmp_path, script_spec("code/train.py")))
    assert spec.program.path == str(script)
    assert spec.program.ds_config_arg == "--deepspeed_config" and spec.program.log_format == "deepspeed"
    assert spec_to_data(spec)["program"]["path"] == str(script)


def test_environment_variables_in_paths_expand_and_an_unset_one_is_named(tmp_path, checkout, monkeypatch):
    monkeypatch.setenv("MY_MEGATRON", str(checkout))
    spec = parse_spec(megatron_spec("${MY_MEGATRON}"))
    assert spec.program.megatron_lm == str(checkout) and spec.program.entry == "pretrain_gpt.py"
    monkeypatch.delenv("MY_MEGATRON")
    assert "not set" in problems_of(megatron_spec("$MY_MEGATRON"))["program.megatron_lm"]


def test_a_misspelled_program_key_gets_did_you_mean(script):
    found = problems_of(script_spec(script, ds_config_args="--deepspeed"))
    assert "did you mean 'ds_config_arg'" in found["program.ds_config_args"]


@pytest.mark.parametrize("engine, kind, needs", [("megatron", "script", "deepspeed"), ("deepspeed", "megatron-lm", "megatron")])
def test_each_kind_needs_its_engine(engine, kind, needs, script, checkout):
    data = script_spec(script) if kind == "script" else megatron_spec(checkout)
    data["training"]["engine"] = engine
    assert f"needs engine {needs}" in problems_of(data)["training.engine"]


def test_fields_of_another_kind_and_missing_required_ones_are_named(script, checkout):
    found = problems_of(script_spec(script, megatron_lm=str(checkout)))
    assert "only kind megatron-lm takes it" in found["program.megatron_lm"]
    found = problems_of(spec_data(**{"program": {"kind": "script"}}))
    assert "required with kind script" in found["program.path"]
    found = problems_of(spec_data(**{"program": {"kind": "orch", "args": ["--x"]}}))
    assert "program.args" in found


def test_the_hf_trainer_trains_data_parallel_only(script):
    data = script_spec(script, ds_config_arg="--deepspeed")
    data["parallelism"]["pipeline"] = 2
    assert "data-parallel only" in problems_of(data)["parallelism.pipeline"]


def test_megatron_args_flags_are_checked_against_megatron_lms_flag_table(checkout):
    found = problems_of(megatron_spec(checkout, args=["--use-flsh-attn"]))
    assert "did you mean '--use-flash-attn'" in found["program.args[0]"]


@pytest.mark.parametrize("case, field, words", [
    ("missing script", "program.path", "does not exist"),
    ("not python", "program.path", "is not a .py file"),
    ("unreadable", "program.path", "is not readable"),
    ("missing checkout", "program.megatron_lm", "is not a directory"),
    ("missing entry", "program.entry", "pretrain_gpt.py"),
])
def test_generate_refuses_missing_program_files_with_exit_2_and_writes_nothing(case, field, words, tmp_path, script,
                                                                                checkout, capsys):
    if case == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads every file")
    data = {"missing script": lambda: script_spec(tmp_path / "nope.py"),
            "not python": lambda: script_spec(script.with_suffix(".sh").resolve()),
            "unreadable": lambda: script_spec(script),
            "missing checkout": lambda: megatron_spec(tmp_path / "no-checkout"),
            "missing entry": lambda: megatron_spec(checkout, entry="pretrain_llama.py")}[case]()
    script.with_suffix(".sh").write_text("echo\n")
    if case == "unreadable":
        script.chmod(0)
    out = tmp_path / "run"
    code, _, err = run_cli(["generate", str(write_spec(tmp_path, data)), "-o", str(out)], capsys)
    assert code == 2 and f"{field}:" in err and words in err, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]


# --- program.json and the launch scripts ----------------------------------------------------------------

def test_script_argv_hands_over_ds_config_with_the_scripts_flag(script):
    plan = fixed_plan(script_spec(script, args=["--epochs", "1"]))
    program = render_program(plan)
    assert program["argv"] == [str(script), "--epochs", "1", "--deepspeed_config", f"{RUN_DIR_TOKEN}/ds_config.json"]
    assert program["cwd"] is None and program["log_format"] == "deepspeed"
    assert substitute_run_dir(program["argv"], "/runs/a")[-1] == "/runs/a/ds_config.json"
    import hashlib
    assert program["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()


def test_hf_trainer_argv_agrees_with_ds_config_and_the_users_overridden_flags_are_named(script):
    from orchestrator.render.deepspeed import render_ds_config

    plan = fixed_plan(script_spec(script, ds_config_arg="--deepspeed", args=["--learning-rate", "5e-5", "--foo"]))
    argv = render_program(plan)["argv"]
    flags = dict(zip(argv[6::2], argv[7::2]))
    ds = render_ds_config(plan)
    assert argv[:6] == [str(script), "--learning-rate", "5e-5", "--foo", "--deepspeed", f"{RUN_DIR_TOKEN}/ds_config.json"]
    assert float(flags["--learning_rate"]) == ds["optimizer"]["params"]["lr"]
    assert [float(flags["--adam_beta1"]), float(flags["--adam_beta2"])] == ds["optimizer"]["params"]["betas"]
    assert int(flags["--per_device_train_batch_size"]) == ds["train_micro_batch_size_per_gpu"]
    assert int(flags["--gradient_accumulation_steps"]) == ds["gradient_accumulation_steps"]
    assert float(flags["--max_grad_norm"]) == ds["gradient_clipping"]
    assert int(flags["--max_steps"]) == ds["scheduler"]["params"]["total_num_steps"]
    assert int(flags["--warmup_steps"]) == ds["scheduler"]["params"]["warmup_num_steps"]
    assert flags["--report_to"] == "none" and flags["--bf16"] == "false" and flags["--use_cpu"] == "true"
    [warning] = program_warnings(plan)
    assert "--learning-rate" in warning and "--foo" not in warning


def test_megatron_argv_adds_logging_in_the_run_dir_and_runs_in_the_checkout(checkout):
    from orchestrator.render.megatron import render_megatron_args

    plan = fixed_plan(megatron_spec(checkout, args=["--lr", "1e-4"]))
    program = render_program(plan)
    argv = program["argv"]
    assert argv[0] == str(checkout / "pretrain_gpt.py") and program["cwd"] == str(checkout)
    assert len(argv) > len(render_megatron_args(plan)) and program["log_format"] == "megatron"
    after = {flag: argv[argv.index(flag) + 1] for flag in ("--save", "--load", "--wandb-save-dir", "--tensorboard-dir",
                                                           "--timing-log-level", "--wandb-project", "--wandb-exp-name")}
    assert after["--save"] == after["--load"] == f"{RUN_DIR_TOKEN}/checkpoints"
    assert after["--wandb-save-dir"] == f"{RUN_DIR_TOKEN}/wandb" and after["--tensorboard-dir"] == f"{RUN_DIR_TOKEN}/tensorboard"
    assert after["--timing-log-level"] == "0" and after["--wandb-exp-name"] == "tiny"
    assert {"--log-throughput", "--log-timers-to-tensorboard", "--mock-data"} <= set(argv)
    assert argv[-2:] == ["--lr", "1e-4"] and "--lr" in program_warnings(plan)[0]
    from orchestrator.render.scripts import env_assignments   # Megatron's wandb.init takes mode and group from here

    assert env_assignments(plan) | {"WANDB_MODE": "offline", "WANDB_RUN_GROUP": "tiny"} == env_assignments(plan)
    assert "WANDB_MODE" not in env_assignments(fixed_plan(spec_data()))


def test_launch_scripts_start_the_program_runner_and_orch_entry_still_overrides(tmp_path, script):
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir

    run = write_run_dir(build_plan(load_spec(write_spec(tmp_path, script_spec(script)))), tmp_path / "run")
    orch = write_run_dir(build_plan(parse_spec(spec_data())), tmp_path / "orch")
    for name in ("launch_local.sh", "launch.sbatch", "launch_pdsh.sh"):
        assert "${ORCH_ENTRY:-orchestrator.programs}" in (run / name).read_text(), name
        assert "${ORCH_ENTRY:-orchestrator.train}" in (orch / name).read_text(), name
    assert not (orch / "program.json").exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert "program.json" in manifest["files"] and manifest["program"]["script_path"] == str(script)


def test_an_edited_script_is_reported_by_validate_and_launch_and_dry_run_shows_the_argv(tmp_path, script, capsys):
    spec_path = write_spec(tmp_path, script_spec(script, args=["--note", "two words"]))
    run = tmp_path / "run"
    assert run_cli(["generate", str(spec_path), "-o", str(run)], capsys)[0] == 0
    script.write_text("print('edited')\n")
    code, _, err = run_cli(["validate", str(run), "--static"], capsys)
    assert code == 0 and "changed since `orch generate`" in err, err
    code, out, err = run_cli(["launch", str(run), "--dry-run"], capsys)
    assert code == 0 and "changed since `orch generate`" in err
    assert f"python {script} --note 'two words' --deepspeed_config {run}/ds_config.json" in out, out
    script.unlink()
    code, out, err = run_cli(["validate", str(run), "--static"], capsys)
    assert code == 2 and "program.path" in out and "does not exist" in out, out


def test_a_run_dir_without_its_program_json_is_refused(tmp_path, script, capsys):
    run = tmp_path / "run"
    assert run_cli(["generate", str(write_spec(tmp_path, script_spec(script))), "-o", str(run)], capsys)[0] == 0
    (run / "program.json").unlink()
    code, out, _ = run_cli(["validate", str(run), "--static"], capsys)
    assert code == 2 and "program.json" in out


# --- Megatron-LM's iteration line (core_v0.16.1 training_log) -------------------------------------------

def megatron_line(iteration=7, train_iters=500, consumed=448, elapsed_ms=1234.56, tflops=312.44, lr=2.5e-4,
                  batch=64, losses=(("lm loss", 7.123456),), loss_scale=1.0, grad_norm=1.5, skipped=0, nan=0,
                  throughput=True) -> str:
    """A line laid out as training_log lays it out: its labels and number formats, field by field."""
    text = f" [{datetime(2026, 12, 1, 12, 0, 0, 123456).strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    text += f" iteration {iteration:8d}/{train_iters:8d} |"
    text += f" consumed samples: {consumed:12d} |"
    text += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if throughput:
        text += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    text += f" learning rate: {lr:.6E} |"
    text += f" global batch size: {batch:5d} |"
    for name, value in losses:
        text += f" {name}: {value:.6E} |"
    text += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        text += f" grad norm: {grad_norm:.3f} |"
    text += f" number of skipped iterations: {skipped:3d} |"
    text += f" number of nan iterations: {nan:3d} |"
    return text


def test_parse_iteration_line_reads_every_figure():
    record = parse_iteration_line(megatron_line(skipped=2))
    assert record["iteration"] == 7 and record["train_iters"] == 500 and record["consumed_samples"] == 448
    assert record["elapsed_time_per_iteration_ms"] == pytest.approx(1234.6)
    assert record["throughput_tflops_per_gpu"] == pytest.approx(312.4)
    assert record["learning_rate"] == pytest.approx(2.5e-4) and record["global_batch_size"] == 64
    assert record["lm_loss"] == pytest.approx(7.123456) and record["grad_norm"] == pytest.approx(1.5)
    assert record["skipped_iterations"] == 2 and record["nan_iterations"] == 0 and record["loss_scale"] == 1.0


def test_parse_iteration_line_leaves_what_megatron_did_not_print_as_none_and_keeps_other_losses():
    line = "[rank7]:" + megatron_line(throughput=False, grad_norm=None,
                                      losses=(("lm loss", 2.5), ("load_balancing_loss", 0.01), ("mtp_1 loss", 2.75)))
    record = parse_iteration_line(line)
    assert record["throughput_tflops_per_gpu"] is None and record["grad_norm"] is None
    assert record["losses"] == {"lm loss": 2.5, "load_balancing_loss": 0.01, "mtp_1 loss": 2.75}


@pytest.mark.parametrize("line", ["", "building GPT model ...", " [2026-12-01 12:00:00] iteration 3/10 |",
                                  "validation loss at iteration 100 | lm loss value: 1.0E+00 |"])
def test_parse_iteration_line_ignores_other_lines(line):
    assert parse_iteration_line(line) is None


def test_generate_force_replaces_a_program_run_dir_and_dry_run_shows_the_checkout(tmp_path, checkout, capsys):
    spec_path = write_spec(tmp_path, megatron_spec(checkout))
    run = tmp_path / "run"
    assert run_cli(["generate", str(spec_path), "-o", str(run)], capsys)[0] == 0
    assert run_cli(["generate", str(spec_path), "-o", str(run), "--force"], capsys)[0] == 0
    code, out, _ = run_cli(["launch", str(run), "--dry-run"], capsys)
    assert code == 0 and f"cd {checkout} && python {checkout}/pretrain_gpt.py --tensor-model-parallel-size" in out
    assert f"--save {run}/checkpoints" in out
