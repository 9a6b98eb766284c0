"""The local backend: torchrun with the plan's processes on this host (the default; works on a laptop).

It runs the run dir's own ``launch_local.sh`` (what a user would run by hand) with the current Python,
a free rendezvous port, and torchrun's per-rank logs under ``RUN_DIR/logs/torchrun``. ``orch cancel``
signals only the process group orch started (its leader's start time and boot id are in job.json) and the
processes holding the run dir's flock, and nothing once the job has finished.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from ..errors import OrchError
from ..resize import RESUME_FILE
from ..rundir import RunDir
from ..runlock import holders
from .base import (LOG_DIR, CommandRunner, JobRecord, JobState, LaunchFailed, LaunchPlan,  # noqa: F401
                   identity, is_started_process, rank_exit_code, tail_lines, torchrun_failure)

EXIT_CODE_FILE = "exitcode"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(run: RunDir, *, master_port: int | None = None) -> LaunchPlan:
    """The LaunchPlan of a local run: the generated script, wrapped to record its exit code."""
    logs = Path(LOG_DIR)
    env = {"ORCH_PYTHON": sys.executable, "MASTER_PORT": str(master_port or free_port()),
           "ORCH_TORCHRUN_ARGS": f"--log-dir {logs / 'torchrun'} --redirects 3 --tee 3"}
    wrapper = 'bash "$0"; code=$?; echo "$code" > "$1"; exit "$code"'
    argv = ["bash", "-c", wrapper, "launch_local.sh", str(logs / EXIT_CODE_FILE)]
    if (run.path / RESUME_FILE).is_file():      # a resized run: its conversion step runs before torchrun
        wrapper = '"$2" -m orchestrator.train.convert . && bash "$0"; code=$?; echo "$code" > "$1"; exit "$code"'
        argv = ["bash", "-c", wrapper, "launch_local.sh", str(logs / EXIT_CODE_FILE), sys.executable]
    return LaunchPlan(backend="local", argv=argv, cwd=run.path, env=env)


def submit(plan: LaunchPlan, runner: CommandRunner):
    """Start the job in the background; returns (JobRecord, Popen)."""
    logs = plan.cwd / LOG_DIR
    logs.mkdir(exist_ok=True)
    (logs / EXIT_CODE_FILE).unlink(missing_ok=True)
    log_path = logs / "launch.log"
    if log_path.exists():       # this launch's log only: a failure report must not find an earlier failure
        os.replace(log_path, logs / "launch.previous.log")
    proc = runner.start(plan, log_path=log_path)
    record = JobRecord(backend="local", job_id=str(proc.pid), run_dir=str(plan.cwd.resolve()),
                       submitted_unix=time.time(), log_path=str(log_path.resolve()), extra=identity(proc.pid))
    record.save()
    return record, proc


def status(record: JobRecord, runner: CommandRunner | None = None) -> JobState:
    """COMPLETED / FAILED / CANCELLED from the exit code the wrapper wrote; RUNNING while the process orch
    started lives or any process holds the run dir's flock; with neither, the job was killed: CANCELLED
    when `orch cancel` did it, else FAILED (killed from outside orch)."""
    code_file = Path(record.run_dir) / LOG_DIR / EXIT_CODE_FILE
    if code_file.is_file():
        text = code_file.read_text(errors="replace").strip()
        if text == "0":
            return JobState.COMPLETED
        stopped = _recorded_stop(record)
        if stopped:
            return stopped
        return JobState.CANCELLED if _ended_after_cancel(record, code_file) else JobState.FAILED
    if job_leader(record) or holders(record.run_dir):    # ranks outlive a killed torchrun
        return JobState.RUNNING
    return JobState.CANCELLED if _cancelled(record) else JobState.FAILED


def job_leader(record: JobRecord) -> int | None:
    """The pid of the job's process group leader when it is the very process orch started and still leads
    its own group; None otherwise (gone, a pid reused since, or a job.json naming some other process)."""
    if not is_started_process(record):
        return None
    pid = int(record.job_id)
    try:
        return pid if os.getpgid(pid) == pid and pid != os.getpgrp() else None
    except OSError:
        return None


def _cancelled(record: JobRecord) -> bool:
    return isinstance(record.extra.get("cancelled_unix"), (int, float))


def _ended_after_cancel(record: JobRecord, code_file: Path) -> bool:
    """The job ended after `orch cancel` asked it to: CANCELLED whatever code torchrun chose (a signal that
    lands while ranks are still starting makes torchrun exit 1), as SLURM reports an scancelled job."""
    cancelled = record.extra.get("cancelled_unix")
    if not isinstance(cancelled, (int, float)):
        return False
    try:
        return code_file.stat().st_mtime >= cancelled       # cancel records the time before it signals
    except OSError:
        return False


def _recorded_stop(record: JobRecord) -> JobState | None:
    """The trainer's own word on a non-zero exit: it checkpointed and stopped (exit 75) during this launch:
    CANCELLED when `orch cancel` asked for it, else PREEMPTED (a signal from elsewhere)."""
    from ..train.signals import EXIT_PREEMPTED  # noqa: PLC0415
    from ..train.trainer import STATUS_FILE  # noqa: PLC0415

    try:
        status_record = json.loads((Path(record.run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status_record, dict) or status_record.get("exit_code") != EXIT_PREEMPTED or \
            not isinstance(status_record.get("time_unix"), (int, float)) or \
            status_record["time_unix"] < record.submitted_unix:
        return None
    return JobState.CANCELLED if record.extra.get("cancelled_unix") else JobState.PREEMPTED


def cancel(record: JobRecord, runner: CommandRunner | None = None, *, grace_s: float = 10) -> bool:
    """Stop the job's process group (torchrun forwards the signal: ranks checkpoint and exit), then every
    process still holding the run-dir lock: ranks in sessions of their own, or orphaned by a killed
    torchrun, are found by the lock they hold, not by their group. A finished job is not signalled; a
    group is signalled only when its leader is the process orch started (:func:`job_leader`). Returns
    whether anything was asked to stop."""
    if status(record).finished:
        return False
    leader = job_leader(record)
    record.extra["cancelled_unix"] = time.time()
    record.save()
    if leader:
        stop_group(leader, grace_s=grace_s)
    stop_pids(lambda: holders(record.run_dir), grace_s=grace_s)
    return True


def stop_pids(find, *, grace_s: float) -> None:
    """SIGTERM, then SIGKILL, the processes ``find()`` returns until it returns none."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        pids = find()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in find() if _alive(p)]
        if not pids:
            return


def exit_code(record: JobRecord, runner: CommandRunner | None = None) -> int:
    """The job's exit code: the failed rank's own code where torchrun reports one (:func:`rank_exit_code`)."""
    code_file = Path(record.run_dir) / LOG_DIR / EXIT_CODE_FILE
    try:
        code = int(code_file.read_text().strip())
    except (OSError, ValueError):
        return 1
    return rank_exit_code(code, Path(record.run_dir) / LOG_DIR / "launch.log")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (finished, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_group(pgid: int, *, grace_s: float = 10) -> None:
    """SIGINT the job's process group (torchrun stops its workers), then SIGTERM, then SIGKILL. Only a real
    group of another process: killpg(1) would signal every process, killpg(0) orch's own group."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise OrchError(f"refusing to signal process group {pgid}: not a job's group")
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def failure_report(record: JobRecord, runner: CommandRunner | None, code: int) -> str:
    """Which rank failed and its last log lines, from torchrun's summary and per-rank logs."""
    run_dir = Path(record.run_dir)
    launch_log = run_dir / LOG_DIR / "launch.log"
    text = "\n".join(tail_lines(launch_log, 400))
    found = torchrun_failure(text)
    if not found:
        return f"the job exited with code {code}; last lines of {launch_log}:\n" + \
            "\n".join("  " + line for line in tail_lines(launch_log, 20))
    rank, rank_code = found
    logs = sorted((run_dir / LOG_DIR / "torchrun").glob(f"*/attempt_*/{rank}/stderr.log"),
                  key=lambda p: p.stat().st_mtime)
    lines = tail_lines(logs[-1], 20) if logs else tail_lines(launch_log, 20)
    return (f"rank {rank} failed with exit code {rank_code}; last lines of its log "
            f"({logs[-1] if logs else launch_log}):\n" + "\n".join("  " + line for line in lines))
