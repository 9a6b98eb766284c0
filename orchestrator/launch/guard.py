"""What `orch launch` checks before it runs anything: the run dir is what orch generated (manifest), and no
other job uses it (the run-dir lock and the recorded job's state).

An edited generated file is refused unless the user passes ``--allow-modified``; that override is then
recorded in ``RUN_DIR/logs/overrides.log`` (time, files) and said on stderr, so a tampered run is never
silent.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from ..errors import Problem, SpecError
from ..rundir import RunDir, manifest_problems
from ..runlock import LOCK_FILE, RunDirBusy, holders
from .base import JOB_RECORD, LOG_DIR, JobRecord

OVERRIDES_LOG = "overrides.log"


def check_intact(run: RunDir, *, allow_modified: bool, dry_run: bool, note: Callable[[str], None]) -> None:
    """Refuse a run dir whose files differ from its manifest, unless allowed (then log the override)."""
    problems = manifest_problems(run)
    if not problems:
        return
    if not allow_modified:
        raise SpecError([*problems, Problem(str(run.path), "refusing to launch files orch did not write",
                                            "re-generate the run dir, or pass --allow-modified to run them anyway "
                                            "(the override is logged)")])
    files = sorted({p.path for p in problems})
    note(f"warning: --allow-modified: launching with {len(files)} file(s) that differ from manifest.json: "
         + ", ".join(files))
    if dry_run:
        return
    logs = run.path / LOG_DIR
    logs.mkdir(exist_ok=True)
    with open(logs / OVERRIDES_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"time_unix": time.time(), "override": "--allow-modified",
                            "problems": [str(p) for p in problems]}, sort_keys=True) + "\n")


def refuse_if_active(run_dir: Path, runner) -> None:
    """A job recorded in job.json that has not finished keeps the run dir: name it and refuse. A job.json
    orch did not write is refused too (SpecError naming it): what it says cannot be checked."""
    if not (run_dir / JOB_RECORD).exists() and not (run_dir / JOB_RECORD).is_symlink():
        return
    record = JobRecord.load(run_dir)
    from . import backend_module  # noqa: PLC0415

    state = backend_module(record.backend).status(record, runner)
    if not state.finished:
        raise RunDirBusy(f"{run_dir}: {record.backend} job {record.job_id} is {state.value}; one job per run dir: "
                         f"wait for it (orch status {run_dir}) or stop it (orch cancel {run_dir})")


def busy_message(run_dir: Path) -> str:
    """Why the lock is taken: the recorded job and the processes that hold it."""
    job = ""
    try:
        record = JobRecord.load(run_dir)
        job = f"{record.backend} job {record.job_id} "
    except Exception:  # noqa: BLE001  (the message only; the refusal stands either way)
        pass
    pids = holders(run_dir)
    who = f" (processes {', '.join(map(str, pids[:8]))})" if pids else ""
    return (f"{run_dir}: {job or 'another job or orch command '}still holds {LOCK_FILE}{who}; one job per run dir: "
            f"wait for it, or stop it with `orch cancel {run_dir}`")
