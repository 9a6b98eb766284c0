"""Nothing lost, nothing run that orch did not write (issue 13): what --force may replace, concurrent
generates, malformed run-dir JSON, the manifest check `orch launch` runs first."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from orchestrator import rundir
from orchestrator.errors import SpecError
from orchestrator.launch.base import CommandRunner
from orchestrator.rundir import read_run_dir, write_run_dir
from orchestrator.runlock import RunDirBusy, try_lock
from tests.conftest import fixed_plan, spec_data


@pytest.fixture
def plan():
    return fixed_plan(spec_data())


def test_force_refuses_a_directory_orch_did_not_generate(tmp_path, plan):
    out = tmp_path / "p"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("x")
    with pytest.raises(SpecError, match="not a run dir written by orch"):
        write_run_dir(plan, out, force=True)
    assert (out / "notes.txt").read_text() == "x" and (out / "sub").is_dir()


def test_force_names_training_outputs_and_keeps_them(tmp_path, plan):
    out = write_run_dir(plan, tmp_path / "run")
    (out / "checkpoints" / "global_step4").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "wandb").mkdir()
    (out / "logs").mkdir()
    with pytest.raises(SpecError) as info:
        write_run_dir(plan, out, force=True)
    message = str(info.value)
    assert all(name in message for name in ("checkpoints/", "metrics.jsonl", "wandb/", "logs/", "--discard-outputs"))
    assert (out / "checkpoints" / "global_step4").is_dir() and (out / "metrics.jsonl").is_file()


def test_force_replaces_generated_files_and_discards_outputs_only_when_told(tmp_path, plan):
    out = write_run_dir(plan, tmp_path / "run")
    (out / "ds_config.json").write_text("{}")             # an edited generated file is replaced
    assert write_run_dir(plan, out, force=True) == out
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 8
    (out / "metrics.jsonl").write_text("")
    write_run_dir(plan, out, force=True, discard_outputs=True)
    assert not (out / "metrics.jsonl").exists()


def test_force_refuses_a_run_dir_a_job_holds(tmp_path, plan):
    out = write_run_dir(plan, tmp_path / "run")
    fd = try_lock(out)                                     # what a running job holds
    try:
        with pytest.raises(RunDirBusy, match="in use by a running job"):
            write_run_dir(plan, out, force=True)
    finally:
        os.close(fd)
    write_run_dir(plan, out, force=True)                   # released when the job's last process exits


def test_concurrent_generate_without_force_cannot_both_succeed(tmp_path, plan, monkeypatch):
    """The other writer creates the directory after our existence check (the race): we must fail, and
    the other's run dir must stay as it wrote it."""
    out = tmp_path / "run"
    render = rundir.render_run_dir

    def racing_render(p):
        files = render(p)
        out.mkdir()
        (out / "manifest.json").write_text("the other writer's")
        return files

    monkeypatch.setattr(rundir, "render_run_dir", racing_render)
    with pytest.raises(SpecError, match="created by someone else meanwhile"):
        write_run_dir(plan, out)
    assert (out / "manifest.json").read_text() == "the other writer's"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]   # no temporary left


@pytest.mark.parametrize("name,text,message", [
    ("manifest.json", "[]", "manifest.json: must be an object with a 'files' object"),
    ("manifest.json", '{"files": ["a"]}', "manifest.json: must be an object with a 'files' object"),
    ("plan.json", "{}", "plan.json: must be an object with a 'chosen' layout object"),
    ("plan.json", '{"chosen": 3}', "plan.json: must be an object with a 'chosen' layout object"),
    ("ds_config.json", "null", "ds_config.json: must be a JSON object"),
    ("plan.json", "[" * 50000 + "]" * 50000, "nested more than"),
])
def test_malformed_run_dir_json_is_a_clean_error(tmp_path, plan, capsys, name, text, message):
    from tests.unit.test_input_limits import run_cli

    out = write_run_dir(plan, tmp_path / "run")
    (out / name).write_text(text)
    with pytest.raises(SpecError, match=message.split(": ")[-1][:20]):
        read_run_dir(out)
    code, stdout, stderr = run_cli(["validate", "--static", str(out)], capsys)
    assert code == 2 and message in stdout and "Traceback" not in stderr
    (out / "metrics.jsonl").write_text('{"step": 1, "step_time_s": 1.0}\n')
    code, stdout, stderr = run_cli(["compare", str(out)], capsys)
    assert code == 2 and message in stderr, stderr


def test_an_empty_manifest_does_not_switch_the_check_off(tmp_path, plan):
    from orchestrator.rundir import manifest_problems

    out = write_run_dir(plan, tmp_path / "run")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    problems = manifest_problems(read_run_dir(out))
    assert {p.path.rsplit("/", 1)[-1] for p in problems} >= {"launch_local.sh", "ds_config.json"}
    assert all("not listed in manifest.json" in p.message for p in problems)


class _NoTraining(CommandRunner):
    """The real runner, starting `true` instead of the job (the launch logic around it is what is tested)."""

    def start(self, plan, *, log_path=None):
        return super().start(dataclasses.replace(plan, argv=["true"]), log_path=log_path)


def _edit(out):
    with open(out / "launch_local.sh", "a") as f:
        f.write("echo tampered\n")


@pytest.mark.parametrize("empty_manifest", [False, True])
def test_launch_and_dry_run_refuse_edited_files(tmp_path, plan, capsys, empty_manifest):
    from tests.unit.test_input_limits import run_cli

    out = write_run_dir(plan, tmp_path / "run")
    _edit(out)
    if empty_manifest:
        manifest = json.loads((out / "manifest.json").read_text())
        (out / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    for argv in (["launch", str(out), "--dry-run"], ["launch", str(out)]):
        code, stdout, stderr = run_cli(argv, capsys)
        assert code == 2 and "launch_local.sh" in stderr and "--allow-modified" in stderr, stderr
    assert not (out / "job.json").exists() and not (out / "logs").exists()


def test_allow_modified_runs_and_logs_the_override(tmp_path, plan):
    from orchestrator.launch.run import launch_run_dir

    out = write_run_dir(plan, tmp_path / "run")
    _edit(out)
    notes = []
    assert launch_run_dir(out, allow_modified=True, runner=_NoTraining(), note=notes.append) == 0
    assert any("--allow-modified" in n and "launch_local.sh" in n for n in notes)
    logged = [json.loads(line) for line in (out / "logs" / "overrides.log").read_text().splitlines()]
    assert logged[0]["override"] == "--allow-modified" and "launch_local.sh" in logged[0]["problems"][0]
