"""launch_run_dir: build, submit, and (with wait) follow a job to its end, for any backend."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..errors import OrchError
from ..rundir import read_run_dir
from . import backend_module
from .base import CommandRunner, JobRecord, JobState, LaunchFailed
from .progress import METRICS, follow, format_progress


def launch_run_dir(run_dir: str | Path, *, backend: str | None = None, dry_run: bool = False,
                   wait: bool = False, timeout_s: float | None = None, runner: CommandRunner | None = None,
                   echo: Callable[[str], None] = print, note: Callable[[str], None] = print,
                   preflight: bool = False, preflight_timeout_s: float | None = None) -> int:
    """Start RUN_DIR's job; returns the exit code (0, or the job's code with wait).

    With ``preflight``, the quick part of ``orch doctor`` runs first on the job's nodes, through the same
    backend, within ``preflight_timeout_s``; a node that fails it stops the launch (OrchError naming it).
    """
    run = read_run_dir(run_dir)
    name = backend or run.spec.launch.backend
    module = backend_module(name)
    plan = module.build(run)
    if dry_run:
        echo(plan.describe())
        return 0
    runner = runner or CommandRunner()
    if preflight:
        run_preflight(run.path, name, runner, note, preflight_timeout_s)
    metrics = run.path / METRICS
    offset = metrics.stat().st_size if metrics.is_file() else 0
    record = module.submit(plan, runner)[0]
    note(f"started {name} job {record.job_id}; logs in {run.path / 'logs'}")
    if not wait:
        note(f"follow it with: orch status {run.path}")
        return 0
    return wait_for(module, record, runner, metrics=metrics, offset=offset, timeout_s=timeout_s,
                    train_iters=run.spec.training.train_iters, echo=echo, note=note)


def run_preflight(run_dir: Path, backend: str, runner: CommandRunner, note, timeout_s: float | None) -> None:
    """``orch doctor --quick`` on the job's nodes; OrchError naming every offender when one fails it."""
    from ..doctor.report import offender_summary  # noqa: PLC0415
    from ..doctor.run import DoctorOptions, run_doctor  # noqa: PLC0415

    report = run_doctor(run_dir, DoctorOptions(backend=backend, mode="quick", timeout_s=timeout_s), runner=runner,
                        note=note)
    if not report["healthy"]:
        raise OrchError(f"preflight failed ({report['seconds']:.0f} s), nothing was started: "
                        f"{offender_summary(report)}; details in {run_dir / 'doctor.json'}")
    note(f"preflight: {len(report['nodes'])} node(s), {len(report['ranks'])} rank(s) healthy "
         f"({report['seconds']:.0f} s)")


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
