"""What every launch backend shares: the LaunchPlan, the job record, job states and the one runner.

A backend builds a :class:`LaunchPlan` purely from a run dir (argv, environment, working directory);
:class:`CommandRunner` is the only place that starts processes, so tests can see exactly what runs.
The job record (``RUN_DIR/job.json``) remembers what was started for ``orch status`` / ``orch cancel``.
"""
from __future__ import annotations

import enum
import json
import os
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import OrchError
from ..render.scripts import SECRET_ENV  # noqa: F401  (credentials: environment only, never written)

JOB_RECORD = "job.json"
LOG_DIR = "logs"


class JobState(enum.Enum):
    """Scheduler-neutral job states (SLURM's names where they exist)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.REQUEUED,
                            JobState.UNKNOWN)


class LaunchFailed(OrchError):
    """The job ran and failed; exit_code is the child's."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class NotLaunched(OrchError):
    """`orch status` / `orch cancel` on a run dir nothing was launched from: a usage mistake (exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class LaunchPlan:
    """Exactly what a backend will run: argv in cwd with env added to the caller's environment.

    ``preview`` is shown after the command by ``--dry-run``: what that command runs in turn (the batch
    script a scheduler receives, the pdsh command line), so the dry run shows everything that would run.
    """

    backend: str
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    preview: str = ""
    inherit_fds: tuple[int, ...] = ()      # descriptors the started process keeps (the run-dir lock)

    def describe(self) -> str:
        """Shell-pasteable form: cd, the added environment (secrets masked), the command, the preview."""
        env = " ".join(f"{k}={shlex.quote('***' if k in SECRET_ENV else v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        line = f"cd {shlex.quote(str(self.cwd))} && {env + ' ' if env else ''}{cmd}"
        return f"{line}\n{self.preview.rstrip()}" if self.preview else line


@dataclass
class JobRecord:
    """What was started, persisted as RUN_DIR/job.json."""

    backend: str
    job_id: str
    run_dir: str
    submitted_unix: float
    log_path: str = ""
    extra: dict = field(default_factory=dict)

    def save(self) -> None:
        path = Path(self.run_dir) / JOB_RECORD
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), sort_keys=True, indent=2) + "\n")
        os.replace(tmp, path)

    @staticmethod
    def load(run_dir: str | Path) -> "JobRecord":
        path = Path(run_dir) / JOB_RECORD
        if not path.is_file():
            raise NotLaunched(f"{run_dir}: nothing was launched from this run dir (no {JOB_RECORD}); "
                              f"start it with `orch launch {run_dir}`")
        return JobRecord(**json.loads(path.read_text()))


class CommandRunner:
    """The one boundary where orch starts processes."""

    def run(self, argv: list[str], *, cwd: Path | None = None, env: dict | None = None,
            timeout_s: float | None = 60, check: bool = True) -> subprocess.CompletedProcess:
        try:
            result = subprocess.run(argv, cwd=cwd, env=_merged(env), capture_output=True, text=True,
                                    timeout=timeout_s)
        except FileNotFoundError:
            raise OrchError(f"`{argv[0]}` is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise OrchError(f"`{' '.join(argv)}` did not answer within {timeout_s} s") from None
        if check and result.returncode != 0:
            raise OrchError(f"`{' '.join(argv)}` exited {result.returncode}: "
                            f"{(result.stderr or result.stdout).strip()[-2000:]}")
        return result

    def start(self, plan: LaunchPlan, *, log_path: Path | None = None) -> subprocess.Popen:
        """Start a LaunchPlan in its own session (so the whole process group can be signalled)."""
        out = open(log_path, "ab") if log_path else None  # noqa: SIM115 (the child owns it)
        try:
            return subprocess.Popen(plan.argv, cwd=plan.cwd, env=_merged(plan.env), start_new_session=True,
                                    stdout=out or None, stderr=subprocess.STDOUT if out else None,
                                    pass_fds=plan.inherit_fds)
        except FileNotFoundError:
            raise OrchError(f"`{plan.argv[0]}` is not installed or not on PATH") from None
        finally:
            if out:
                out.close()

    def start_piped(self, argv: list[str], *, cwd: Path | None = None, env: dict | None = None) -> subprocess.Popen:
        """Start argv with stdout and stderr together on a text pipe (for a supervisor that reads it)."""
        try:
            return subprocess.Popen(argv, cwd=cwd, env=_merged(env), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        except FileNotFoundError:
            raise OrchError(f"`{argv[0]}` is not installed or not on PATH") from None


def _merged(env: dict | None) -> dict | None:
    return {**os.environ, **env} if env else None


def tail_lines(path: Path, n: int = 20) -> list[str]:
    """The last n lines of a text file ([] when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)
_EXITCODE = re.compile(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", re.S)


def torchrun_failure(text: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failed worker from torchrun's error summary, if present."""
    rank, code = _ROOT_CAUSE.search(text), _EXITCODE.search(text)
    return (int(rank.group(1)), int(code.group(1))) if rank and code else None


def rank_exit_code(code: int, *logs: Path) -> int:
    """The job's exit code as the user should see it: torchrun (and so srun, pdsh) exits 1 whatever its failed
    worker's code was; when torchrun's summary in ``logs`` names the worker's own code, that one (a worker
    killed by signal N: 128 + N, as a shell reports it)."""
    if code != 1:
        return code
    found = torchrun_failure("\n".join(line for log in logs for line in tail_lines(log, 400)))
    if not found or found[1] == 0:
        return code
    return found[1] if found[1] > 0 else 128 - found[1]
