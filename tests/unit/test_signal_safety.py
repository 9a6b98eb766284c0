"""`orch cancel` signals only what orch started; lock holders are flock holders; job.json is checked (issue 21).

The signalling scenarios run inside a private PID namespace (tests/pidns.py, tests/unit/signal_scenario.py):
a regression there (kill(-1), a wrong group) can reach only the scenario's processes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import OrchError, SpecError
from orchestrator.launch import local, pdsh, slurm
from orchestrator.launch.base import JobRecord, JobState
from orchestrator.runlock import LOCK_FILE, holders, try_lock
from tests.pidns import run_in_pid_namespace

SCENARIO = Path(__file__).with_name("signal_scenario.py")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return run_in_pid_namespace(SCENARIO, str(tmp_path_factory.mktemp("signals")))


def _clean(answer: dict, code: int, *words: str) -> None:
    assert answer["rc"] == code and "Traceback" not in answer["err"], answer
    for word in words:
        assert word in answer["err"], answer


def test_a_finished_run_signals_nothing_even_naming_a_live_process(scenario):
    answer = scenario["finished"]
    assert answer["alive"] and answer["rc"] == 0 and "nothing signalled" in answer["out"], answer


@pytest.mark.parametrize("case", ["no_start_time", "other_start_time", "other_boot"])
def test_a_pid_that_is_not_the_process_orch_started_is_not_signalled(scenario, case):
    answer = scenario[case]
    assert answer["alive"], answer
    assert json.loads(answer["status"]["out"])["state"] == "FAILED"     # not RUNNING: that process is not the job
    assert answer["rc"] == 0 and "nothing signalled" in answer["out"], answer


@pytest.mark.parametrize("job_id", ["1", "0", "-1", "abc", "2.5", "", " 7"])
def test_forged_job_ids_are_refused_naming_the_field(scenario, job_id):
    answer = scenario[f"id {job_id!r}"]
    assert answer["alive"], answer
    _clean(answer, 2, "job.json: job_id")


def test_orchs_own_process_and_group_are_refused(tmp_path):
    for job_id in (os.getpid(), os.getpgrp()):
        _record(tmp_path, job_id=str(job_id))
        with pytest.raises(SpecError, match="job.json: job_id"):
            JobRecord.load(tmp_path)


def test_opening_the_lock_file_is_not_holding_it(scenario):
    answer = scenario["opened_lock"]
    assert json.loads(answer["status"]["out"])["state"] == "FAILED", answer
    assert answer["alive"], answer


def test_a_symlinked_lock_file_is_refused(scenario):
    answer = scenario["symlink_lock"]
    assert answer["alive"], answer
    _clean(answer["status"], 2, LOCK_FILE, "symlink")
    _clean(answer, 2, LOCK_FILE, "symlink")


def test_a_real_flock_holder_is_running_and_cancel_stops_it(scenario):
    answer = scenario["real_holder"]
    assert json.loads(answer["status"]["out"])["state"] == "RUNNING", answer
    assert answer["rc"] == 0 and answer["stopped"], answer
    assert json.loads(answer["after"]["out"])["state"] == "CANCELLED", answer


def test_absolute_paths_cancel_from_another_cwd_and_leave_a_namesake_alone(scenario):
    answer = scenario["cwd"]
    assert Path(answer["recorded_run_dir"]).is_absolute() and answer["recorded_run_dir"].endswith("/a/runA")
    _clean(answer["copied"], 2, "job.json: run_dir")            # a job.json copied into another dir
    assert answer["leader_alive_after_copied_cancel"]
    assert json.loads(answer["status"]["out"])["state"] == "RUNNING", answer
    assert answer["cancel"]["rc"] == 0 and answer["job_gone"], answer
    assert json.loads(answer["after"]["out"])["state"] == "CANCELLED", answer
    assert answer["neighbour_alive"] and not answer["neighbour_job_json"], answer


def test_a_completed_run_is_completed_from_any_cwd(scenario):
    answer = scenario["completed_elsewhere"]
    assert answer["rc"] == 0 and json.loads(answer["out"])["state"] == "COMPLETED", answer


def test_a_job_killed_from_outside_is_failed_not_cancelled(scenario):
    answer = scenario["killed_outside"]
    assert answer["status"]["rc"] == 1 and json.loads(answer["status"]["out"])["state"] == "FAILED", answer
    assert answer["cancel"]["rc"] == 0 and "nothing signalled" in answer["cancel"]["out"], answer


# --- in-process: the parts that signal nothing --------------------------------------------------------

def _record(tmp_path: Path, **fields) -> Path:
    data = {"backend": "local", "job_id": "4194999", "run_dir": str(tmp_path), "submitted_unix": 0.0,
            "log_path": "", "extra": {}, **fields}
    (tmp_path / "job.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("fields, where", [
    ({"backend": "slurm", "job_id": "--user=root"}, "job_id"), ({"backend": "slurm", "job_id": "12 13"}, "job_id"),
    ({"backend": "nope"}, "backend"), ({"submitted_unix": "x"}, "submitted_unix"),
    ({"submitted_unix": float("nan")}, "submitted_unix"), ({"extra": []}, "extra"),
    ({"run_dir": "/elsewhere"}, "run_dir"), ({"backend": "pdsh"}, "extra.run_id"),
    ({"extra": {"start_ticks": "5"}}, "extra.start_ticks"), ({"job_id": 5}, "job_id"),
])
def test_malformed_job_json_names_the_field(tmp_path, fields, where):
    _record(tmp_path, **fields)
    with pytest.raises(SpecError, match=f"job.json: {where}"):
        JobRecord.load(tmp_path)


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b"\xff\xfe", b"[" * 100000, b"null"])
def test_unreadable_job_json_is_a_usage_error(tmp_path, content):
    (tmp_path / "job.json").write_bytes(content)
    with pytest.raises(SpecError, match="job.json"):
        JobRecord.load(tmp_path)


def test_a_job_json_that_is_a_symlink_or_a_directory_is_refused(tmp_path):
    other = tmp_path / "other.json"
    _record(tmp_path)
    os.replace(tmp_path / "job.json", other)
    (tmp_path / "job.json").symlink_to(other)
    with pytest.raises(SpecError, match="not a regular file"):
        JobRecord.load(tmp_path)
    (tmp_path / "job.json").unlink()
    (tmp_path / "job.json").mkdir()
    with pytest.raises(SpecError, match="not a regular file"):
        JobRecord.load(tmp_path)


def test_an_older_relative_record_is_read_against_its_own_run_dir(tmp_path):
    _record(tmp_path, run_dir="runA", log_path="runA/logs/launch.log")
    record = JobRecord.load(tmp_path)
    assert record.run_dir == str(tmp_path) and record.log_path == str(tmp_path / "logs" / "launch.log")


def test_scancel_never_gets_an_option(tmp_path):
    from tests.unit.test_launch_slurm import FakeRunner

    runner = FakeRunner({})
    record = JobRecord(backend="slurm", job_id="-u", run_dir=str(tmp_path), submitted_unix=0.0)
    with pytest.raises(OrchError, match="not a SLURM job id"):
        slurm.cancel(record, runner)
    assert runner.calls == []


def test_stop_group_refuses_every_process_and_its_own_group():
    for pgid in (-1, 0, 1, os.getpgrp()):
        with pytest.raises(OrchError, match="refusing to signal"):
            local.stop_group(pgid)


def test_lock_holders_are_the_flock_holders_only(tmp_path):
    lock = tmp_path / LOCK_FILE
    lock.write_text("")
    hold = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print('held', flush=True)\ntime.sleep(300)\n")
    with open(lock) as f:
        reader = subprocess.Popen(["sleep", "300"], stdin=f)
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert holders(tmp_path) == [holder.pid]          # not the sleep that only opened the file
        fd = try_lock(tmp_path)
        assert fd is None                                  # shared by the holder: no exclusive taker
    finally:
        for proc in (reader, holder):
            proc.kill()
            proc.wait()
    assert holders(tmp_path) == []


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    lock, target = tmp_path / LOCK_FILE, tmp_path / "target"
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    for take in (holders, try_lock):
        with pytest.raises(SpecError, match=LOCK_FILE):
            take(tmp_path)
    assert not target.exists()                             # the symlink was not followed to create it


def test_local_status_cancelled_only_when_orch_cancel_asked(tmp_path):
    """Exit 143 or 130 written by the wrapper (a signal from elsewhere) is FAILED; after `orch cancel`,
    CANCELLED. No exit code and no live process: FAILED, unless orch cancel did it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    record = JobRecord(backend="local", job_id="4194999", run_dir=str(tmp_path), submitted_unix=time.time() - 60)
    assert local.status(record) is JobState.FAILED
    record.extra["cancelled_unix"] = time.time()
    assert local.status(record) is JobState.CANCELLED
    for code in ("143", "130"):
        (logs / local.EXIT_CODE_FILE).write_text(code + "\n")
        assert local.status(JobRecord(**{**record.__dict__, "extra": {}})) is JobState.FAILED


def test_pdsh_checks_the_boot_and_a_cancelled_result_it_did_not_ask_for(tmp_path):
    from orchestrator.launch.base import identity

    (tmp_path / "logs").mkdir()
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        extra = {"run_id": "ab", "hosts": ["h"], "ssh_port": 22, "fanout": 1, **identity(proc.pid)}
        record = JobRecord(backend="pdsh", job_id=str(proc.pid), run_dir=str(tmp_path), submitted_unix=0, extra=extra)
        assert pdsh.status(record) is JobState.RUNNING
        other_boot = JobRecord(**{**record.__dict__, "extra": {**extra, "boot_id": "x"}})
        assert not pdsh.supervisor_alive(other_boot)
    finally:
        proc.kill()
        proc.wait()
    pdsh.write_result(tmp_path / "logs" / pdsh.RESULT_FILE, {"state": "CANCELLED", "exit_code": 143})
    assert pdsh.status(record) is JobState.FAILED                  # the supervisor was signalled from elsewhere
    record.extra["cancelled_unix"] = time.time()
    assert pdsh.status(record) is JobState.CANCELLED
    (tmp_path / "logs" / pdsh.RESULT_FILE).write_text('{"state": "bogus"}')
    assert pdsh.read_result(record) is None


def test_submit_records_absolute_paths_and_the_leaders_identity(tmp_path, monkeypatch):
    from orchestrator.launch.base import CommandRunner, LaunchPlan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runA").mkdir()
    plan = LaunchPlan(backend="local", argv=["bash", "-c", "true"], cwd=Path("runA"))
    record, proc = local.submit(plan, CommandRunner())
    proc.wait(timeout=30)
    saved = json.loads((tmp_path / "runA" / "job.json").read_text())
    assert saved["run_dir"] == str(tmp_path / "runA") and Path(saved["log_path"]).is_absolute()
    assert saved["extra"]["start_ticks"] > 0 and saved["extra"]["boot_id"]


def test_straggler_json_must_be_what_the_trainer_writes(tmp_path):
    from orchestrator.telemetry.straggler import read_straggler

    assert read_straggler(tmp_path) is None
    path = tmp_path / "straggler.json"
    for content, where in (("[1]", "JSON object"), ('{"rank": "x"}', "straggler.json: rank"), ("{", "valid JSON"),
                           ('{"rank": 1, "host": "h", "spread": NaN, "since_step": 1, "step": 2}', "spread")):
        path.write_text(content)
        with pytest.raises(SpecError, match=where):
            read_straggler(tmp_path)
    path.write_text(json.dumps({"rank": 1, "host": "h", "spread": 1.5, "since_step": 1, "step": 2}))
    assert read_straggler(tmp_path)["rank"] == 1


def test_pid_namespace_contains_a_kill_of_every_process(tmp_path):
    """The guard the scenarios rely on: kill(-1) inside the namespace spares the processes outside it."""
    outside = subprocess.Popen(["sleep", "300"], start_new_session=True)
    script = tmp_path / "kill_all.py"
    script.write_text("import json, os, signal, subprocess\n"
                      "assert os.environ.get('ORCH_TEST_PIDNS') == '1' and os.getppid() == 1\n"
                      "p = subprocess.Popen(['sleep', '300'])\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nos.kill(-1, signal.SIGTERM)\n"
                      "print(json.dumps({'inside_killed': p.wait(timeout=30) == -signal.SIGTERM}))\n")
    try:
        assert run_in_pid_namespace(script)["inside_killed"]
        assert outside.poll() is None
    finally:
        outside.kill()
        outside.wait()


# --- launch and doctor: refused before anything runs ----------------------------------------------------

def _main(*argv) -> tuple[int, str]:
    import contextlib
    import io

    from orchestrator.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(list(argv))
            return 0, err.getvalue()
        except SystemExit as e:
            return e.code, err.getvalue()


@pytest.fixture
def generated(tmp_path):
    from orchestrator.rundir import write_run_dir
    from tests.conftest import fixed_plan, spec_data

    return write_run_dir(fixed_plan(spec_data()), tmp_path / "run")


def test_launch_refuses_a_malformed_job_json_and_a_lock_directory(generated):
    (generated / "job.json").write_text('{"backend": "local", "job_id": "1"}')
    code, err = _main("launch", str(generated))
    assert code == 2 and "job.json: " in err and "Traceback" not in err, err
    assert (generated / "job.json").read_text() == '{"backend": "local", "job_id": "1"}'   # nothing started
    (generated / "job.json").unlink()
    (generated / LOCK_FILE).unlink()                  # the first launch created it
    (generated / LOCK_FILE).mkdir()
    code, err = _main("launch", str(generated))
    assert code == 2 and LOCK_FILE in err and "not a regular file" in err, err
    assert not (generated / "job.json").exists()


def test_doctor_refuses_a_tampered_script_and_a_busy_run_dir(generated):
    from orchestrator.launch.base import CommandRunner, LaunchPlan

    script = generated / "launch_local.sh"
    script.write_text(script.read_text() + "\necho tampered\n")
    code, err = _main("doctor", str(generated), "--quick")
    assert code == 2 and "launch_local.sh" in err and "--allow-modified" in err, err
    fd = try_lock(generated)                          # another orch command holds the run dir
    try:
        code, err = _main("doctor", str(generated), "--quick", "--allow-modified")
        assert code == 1 and "still holds .orch.lock" in err, err
    finally:
        os.close(fd)
    record, proc = local.submit(LaunchPlan(backend="local", argv=["sleep", "300"], cwd=generated), CommandRunner())
    try:                                              # a recorded job that runs (without the lock)
        code, err = _main("doctor", str(generated), "--quick", "--allow-modified")
        assert code == 1 and f"local job {record.job_id} is RUNNING" in err, err
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not (generated / "doctor.json").exists()
