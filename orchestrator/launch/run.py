"""launch_run_dir: build, submit, and (with wait) follow a job to its end, for any backend."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..rundir import read_run_dir
from . import backend_module
from ..runlock import RunDirBusy, share, try_lock
from .base import CommandRunner, JobRecord, JobState, LaunchFailed
from .guard import busy_message, check_intact, refuse_if_active
from .progress import METRICS, follow, format_progress


def launch_run_dir(run_dir: str | Path, *, backend: str | None = None, dry_run: bool = False,
                   wait: bool = False, timeout_s: float | None = None, runner: CommandRunner | None = None,
                   echo: Callable[[str], None] = print, note: Callable[[str], None] = print,
                   allow_modified: bool = False) -> int:
    """Start RUN_DIR's job; returns the exit code (0, or the job's code with wait).

    Refused (before anything runs, --dry-run included) when a generated file differs from the manifest,
    unless ``allow_modified``; refused when another job holds the run dir.
    """
    run = read_run_dir(run_dir)
    check_intact(run, allow_modified=allow_modified, dry_run=dry_run, note=note)
    name = backend or run.spec.launch.backend
    module = backend_module(name)
    plan = module.build(run)
    if dry_run:
        echo(plan.describe())
        return 0
    runner = runner or CommandRunner()
    metrics = run.path / METRICS
    offset = metrics.stat().st_size if metrics.is_file() else 0
    record = submit_exclusive(run.path, module, plan, runner)
    note(f"started {name} job {record.job_id}; logs in {run.path / 'logs'}")
    if not wait:
        note(f"follow it with: orch status {run.path}")
        return 0
    return wait_for(module, record, runner, metrics=metrics, offset=offset, timeout_s=timeout_s,
                    train_iters=run.spec.training.train_iters, echo=echo, note=note)


def submit_exclusive(run_dir: Path, module, plan, runner: CommandRunner) -> JobRecord:
    """Submit under the run-dir lock, after checking that no recorded job is still active. The job inherits
    the lock (downgraded to shared: its ranks take it shared too), so it is held while any process of
    the job lives and released by the kernel when the last one exits."""
    fd = try_lock(run_dir)
    if fd is None:
        raise RunDirBusy(busy_message(run_dir))
    try:
        refuse_if_active(run_dir, runner)
        share(fd)
        return module.submit(replace(plan, inherit_fds=(fd,)), runner)[0]
    finally:
        os.close(fd)


def wait_for(module, record: JobRecord, runner: CommandRunner, *, metrics: Path, offset: int,
             timeout_s: float | None, train_iters: int, echo, note) -> int:
    """Print a progress line per step until the job ends; raise LaunchFailed when it did not complete."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    state = JobState.UNKNOWN

    def done() -> bool:
        nonlocal state
        previous, state = state, module.status(record, runner)
        if previous is not JobState.UNKNOWN and state is not previous and not state.finished:
            note(f"job {record.job_id} {state.value}")   # e.g. requeued: PENDING, then RUNNING again
        if deadline and time.monotonic() > deadline and not state.finished:
            module.cancel(record, runner)
            raise LaunchFailed(f"job {record.job_id} still {state.value} after {timeout_s:.0f} s; cancelled it", 1)
        return state.finished

    try:
        for rec in follow(metrics, done, offset=offset):
            echo(format_progress(rec, train_iters))
    except KeyboardInterrupt:
        note("interrupted: stopping every rank ...")
        module.cancel(record, runner)
        return 130
    if state is JobState.COMPLETED:
        note(f"job {record.job_id} {state.value}")
        return 0
    code = module.exit_code(record, runner)
    raise LaunchFailed(f"job {record.job_id} {state.value}: " + module.failure_report(record, runner, code),
                       code or 1)
