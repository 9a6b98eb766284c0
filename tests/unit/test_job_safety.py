"""One job per run dir, honest job states, tracking that never kills training (issue 13)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from orchestrator.errors import SpecError
from orchestrator.launch import local
from orchestrator.launch.base import CommandRunner, JobRecord, JobState, LaunchPlan
from orchestrator.launch.guard import refuse_if_active
from orchestrator.rundir import write_run_dir
from orchestrator.runlock import RunDirBusy, holders, try_lock
from orchestrator.train.trainer import injected_fault
from tests.conftest import fixed_plan, spec_data
from tests.deadlines import scaled_s


@pytest.fixture
def run_dir(tmp_path):
    return write_run_dir(fixed_plan(spec_data()), tmp_path / "run")


@pytest.mark.parametrize("value", ["abc", "-1", "3.5", ""])
def test_malformed_fault_injection_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv("ORCH_FAULT_AT_STEP", "3")
    monkeypatch.setenv("ORCH_FAULT_RANK", value or "x")
    with pytest.raises(SpecError, match="ORCH_FAULT_RANK"):
        injected_fault()
    monkeypatch.setenv("ORCH_FAULT_AT_STEP", value)
    monkeypatch.setenv("ORCH_FAULT_RANK", "1")
    if value:
        with pytest.raises(SpecError, match="ORCH_FAULT_AT_STEP"):
            injected_fault()
    else:
        assert injected_fault() is None


def test_trainer_exits_2_on_a_malformed_fault_variable(run_dir):
    env = {"ORCH_FAULT_AT_STEP": "abc", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "orchestrator.train", str(run_dir)], capture_output=True,
                            text=True, env=env, timeout=scaled_s(120))
    assert result.returncode == 2 and "ORCH_FAULT_AT_STEP" in result.stderr and "Traceback" not in result.stderr


def _job(run_dir, script: str) -> tuple[JobRecord, subprocess.Popen]:
    plan = LaunchPlan(backend="local", argv=["bash", "-c", script + '; code=$?; echo "$code" > logs/exitcode; '
                                             'exit "$code"'], cwd=run_dir)
    return local.submit(plan, CommandRunner())


ROOT_CAUSE = ("echo 'Root Cause (first observed failure):'; echo '[0]:'; echo '  rank      : {rank}'; "
              "echo '  exitcode  : 3'; false")


def test_second_failure_report_names_its_own_rank(run_dir):
    """launch.log used to be appended across launches: the second report found the first failure's rank."""
    record, proc = _job(run_dir, ROOT_CAUSE.format(rank=1))
    proc.wait(timeout=scaled_s(30))
    assert local.failure_report(record, None, 1).startswith("rank 1 failed")
    record, proc = _job(run_dir, ROOT_CAUSE.format(rank=0))
    proc.wait(timeout=scaled_s(30))
    assert local.failure_report(record, None, 1).startswith("rank 0 failed")
    assert "rank      : 1" in (run_dir / "logs" / "launch.previous.log").read_text()


def test_status_reports_the_stop_the_trainer_recorded(run_dir):
    """After a clean stop the trainer wrote exit 75 to train_status.json; torchrun's own code is 1."""
    record, proc = _job(run_dir, "false")
    proc.wait(timeout=scaled_s(30))
    assert local.status(record) is JobState.FAILED
    (run_dir / "train_status.json").write_text(json.dumps({"state": "preempted", "exit_code": 75,
                                                           "time_unix": time.time()}))
    assert local.status(record) is JobState.PREEMPTED
    record.extra["cancelled_unix"] = time.time()
    assert local.status(record) is JobState.CANCELLED
    (run_dir / "train_status.json").write_text(json.dumps({"state": "preempted", "exit_code": 75,
                                                           "time_unix": record.submitted_unix - 100}))
    assert local.status(record) is JobState.FAILED            # an earlier launch's stop does not count


def test_a_live_job_keeps_the_run_dir(run_dir):
    """The job inherits the lock: a second launch is refused naming the job, cancel finds every holder
    (also one in a session of its own), and nothing is left behind once they are gone."""
    from orchestrator.launch.run import submit_exclusive

    plan = LaunchPlan(backend="local", argv=["bash", "-c", "setsid sleep 300 & sleep 300"], cwd=run_dir)
    record = submit_exclusive(run_dir, local, plan, CommandRunner())
    try:
        with pytest.raises(RunDirBusy, match=f"local job {record.job_id} is RUNNING"):
            refuse_if_active(run_dir, CommandRunner())
        with pytest.raises(RunDirBusy, match=f"local job {record.job_id} still holds .orch.lock"):   # the lock
            submit_exclusive(run_dir, local, plan, CommandRunner())
        deadline = time.monotonic() + scaled_s(10)
        while len(holders(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(holders(run_dir)) >= 2               # bash, the sleeps (one in a session of its own)
        local.cancel(record, grace_s=2)
        assert holders(run_dir) == [] and local.status(record) is JobState.CANCELLED
    finally:
        local.stop_pids(lambda: holders(run_dir), grace_s=1)
    fd = try_lock(run_dir)
    assert fd is not None


def test_wandb_online_that_cannot_connect_falls_back_to_offline(run_dir, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from orchestrator.rundir import read_run_dir
    from orchestrator.spec import spec_to_data
    from orchestrator.telemetry.wandb_sink import open_wandb_sink

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")   # nothing listens: connection refused
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    run = read_run_dir(run_dir)
    sink = open_wandb_sink(run_dir=run.path, spec=run.spec, spec_data=spec_to_data(run.spec), chosen={},
                           layout_tag="t", engine="deepspeed")
    try:
        err = capsys.readouterr().err
        assert sink is not None and sink.run.settings.mode == "offline"
        assert "W&B online failed" in err and "aaaaaaaaaa" not in err   # the API key is never printed
    finally:
        sink.close()
