"""What every launch backend shares: the LaunchPlan, the job record, job states and the one runner.

A backend builds a :class:`LaunchPlan` purely from a run dir (argv, environment, working directory);
:class:`CommandRunner` is the only place that starts processes, so tests can see exactly what runs.
The job record (``RUN_DIR/job.json``) remembers what was started for ``orch status`` / ``orch cancel``:
absolute paths, and for a process orch started its start time and the boot id, so that a signal only ever
reaches that process (never a pid reused since, or one an edited job.json names).
"""
from __future__ import annotations

import enum
import json
import math
import os
import re
import shlex
import stat
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import OrchError, Problem, SpecError
from ..render.scripts import SECRET_ENV  # noqa: F401  (credentials: environment only, never written)

JOB_RECORD = "job.json"
LOG_DIR = "logs"
RECORD_MAX_BYTES = 1 << 20
_PID = re.compile(r"[1-9][0-9]{0,9}")
_SLURM_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")
_BACKENDS = ("local", "slurm", "pdsh")


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
        """RUN_DIR/job.json, checked (SpecError naming the file and field when it is not what orch writes);
        its paths are absolute, and it must name the run dir it lies in."""
        path = Path(run_dir) / JOB_RECORD
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise NotLaunched(f"{run_dir}: nothing was launched from this run dir (no {JOB_RECORD}); "
                              f"start it with `orch launch {run_dir}`") from None
        except OSError as e:
            raise SpecError(Problem(str(path), f"cannot read it: {e.strerror}")) from None
        if not stat.S_ISREG(info.st_mode) or info.st_size > RECORD_MAX_BYTES:
            raise _bad(path, "", "not a regular file of at most 1 MiB (orch writes a small JSON file here)")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                data = json.loads(f.read(RECORD_MAX_BYTES + 1).decode())
        except OSError as e:
            raise SpecError(Problem(str(path), f"cannot read it: {e.strerror}")) from None
        except (ValueError, RecursionError) as e:
            raise _bad(path, "", f"not valid JSON ({str(e)[:120]})") from None
        return JobRecord(**check_record(data, path, Path(run_dir)))


def _bad(path: Path, field_name: str, message: str) -> SpecError:
    where = f"{path}: {field_name}" if field_name else str(path)
    return SpecError(Problem(where, message, f"orch writes {JOB_RECORD} at launch; if no job of this run dir is "
                             f"running, delete {path} (nothing will be signalled for it)"))


def check_record(data, path: Path, run_dir: Path) -> dict:
    """The fields of a job.json, checked against what orch writes; raises SpecError naming the field."""
    if not isinstance(data, dict):
        raise _bad(path, "", f"expected a JSON object, found {type(data).__name__}")
    for name, kind in (("backend", str), ("job_id", str), ("run_dir", str), ("log_path", str), ("extra", dict)):
        if name in data and not isinstance(data[name], kind):
            raise _bad(path, name, f"expected a {'JSON object' if kind is dict else 'string'}, found "
                                   f"{type(data[name]).__name__}")
    for name in ("backend", "job_id", "run_dir", "submitted_unix"):
        if name not in data:
            raise _bad(path, name, "missing")
    if data["backend"] not in _BACKENDS:
        raise _bad(path, "backend", f"{data['backend']!r} is not one of {', '.join(_BACKENDS)}")
    submitted = data["submitted_unix"]
    if isinstance(submitted, bool) or not isinstance(submitted, (int, float)) or not math.isfinite(submitted):
        raise _bad(path, "submitted_unix", f"expected a finite number, found {submitted!r}")
    job_id = data["job_id"]
    if data["backend"] == "slurm":
        if not _SLURM_JOB_ID.fullmatch(job_id):
            raise _bad(path, "job_id", f"{job_id[:40]!r} is not a SLURM job id (digits, or ARRAY_TASK)")
    elif not _PID.fullmatch(job_id) or int(job_id) <= 1 or int(job_id) in (os.getpid(), os.getpgrp()):
        raise _bad(path, "job_id", f"{job_id[:40]!r} is not the process id of a job orch started (an integer > 1, "
                                   "not this orch process or its group)")
    recorded = Path(data["run_dir"])
    here = Path(os.path.abspath(run_dir))
    if recorded.is_absolute() and not _same_dir(recorded, here):
        raise _bad(path, "run_dir", f"names {str(recorded)[:200]}, not the run dir it lies in ({here}): a copied, "
                                    "moved or edited job.json")
    extra = data.get("extra", {})
    check_extra(data["backend"], extra, path)
    log_path = data.get("log_path", "")
    if log_path and not Path(log_path).is_absolute():    # written by an older orch, relative to its cwd
        log_path = str(here / LOG_DIR / Path(log_path).name)
    return {"backend": data["backend"], "job_id": job_id, "run_dir": str(here), "submitted_unix": float(submitted),
            "log_path": log_path, "extra": dict(extra)}


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_EXTRA_TYPES = {"start_ticks": int, "boot_id": str, "cancelled_unix": (int, float), "run_id": str, "hosts": list,
                "ssh_port": int, "fanout": int, "master_port": int, "error_path": str, "array_job_id": str}


def check_extra(backend: str, extra: dict, path: Path) -> None:
    for name, kind in _EXTRA_TYPES.items():
        value = extra.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise _bad(path, f"extra.{name}", f"unexpected value {str(value)[:40]!r}")
    cancelled = extra.get("cancelled_unix")
    if cancelled is not None and not math.isfinite(cancelled):
        raise _bad(path, "extra.cancelled_unix", f"expected a finite number, found {cancelled!r}")
    if backend == "pdsh":
        for name in ("run_id", "hosts", "ssh_port", "fanout"):
            if name not in extra:
                raise _bad(path, f"extra.{name}", "missing (the pdsh backend records it at launch)")
        if not re.fullmatch(r"[0-9a-f]{1,64}", extra["run_id"]):
            raise _bad(path, "extra.run_id", f"{extra['run_id'][:40]!r} is not a run id orch writes (hex digits)")
        if not extra["hosts"] or not all(isinstance(h, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,253}", h)
                                         for h in extra["hosts"]):
            raise _bad(path, "extra.hosts", "expected a non-empty list of host names")
        if not 1 <= extra["ssh_port"] <= 65535 or extra["fanout"] < 1:
            raise _bad(path, "extra.ssh_port", "ssh_port must be 1-65535 and fanout at least 1")


# --- the processes orch started ------------------------------------------------------------------------

def boot_id() -> str:
    """This boot's id (/proc/sys/kernel/random/boot_id): start times in clock ticks count from boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot: /proc/PID/stat field 22), None when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def identity(pid: int) -> dict:
    """What job.json records of a process orch just started, to know it again later."""
    return {"start_ticks": (process_stat(pid) or ("", 0))[1], "boot_id": boot_id()}


def is_started_process(record: "JobRecord") -> bool:
    """The record's job_id is the very process orch started: alive (not a zombie), the same start time,
    in the same boot. False for a record without a start time (nothing proves it is that process)."""
    ticks = record.extra.get("start_ticks")
    if not _PID.fullmatch(record.job_id) or not isinstance(ticks, int) or not ticks:
        return False
    stat_now = process_stat(int(record.job_id))
    recorded_boot = record.extra.get("boot_id")
    return (stat_now is not None and stat_now[0] not in ("Z", "X") and stat_now[1] == ticks
            and (recorded_boot is None or recorded_boot == boot_id()))


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
