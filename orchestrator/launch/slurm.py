"""The SLURM backend: ``sbatch`` the run dir's ``launch.sbatch``; state from ``scontrol``; ``scancel``.

Ranks start one torchrun per node (srun inside the batch script, node rank = SLURM_NODEID, rendezvous on
the first node of the job). The environment is exported to the job (``--export=ALL``): that is how
secrets such as WANDB_API_KEY reach the ranks without being written anywhere by orch.

Scheduler output is parsed strictly: anything unexpected raises an OrchError quoting what was seen.
Without accounting, SLURM forgets a job MinJobAge seconds after it ends; ``sacct`` is asked then.
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrchError
from ..render.scripts import ARRAY_ERROR, ARRAY_OUTPUT, SLURM_ERROR, SLURM_OUTPUT
from ..rundir import RunDir
from .base import (LOG_DIR, CommandRunner, JobRecord, JobState, LaunchPlan, rank_exit_code, tail_lines,
                   torchrun_failure)

SCRIPT = "launch.sbatch"
CANCEL_WAIT_S = 30          # how long `orch cancel` waits for the job's processes to be gone

# squeue/scontrol/sacct state names -> JobState. Every name SLURM 22.05-24.x documents; others are errors.
SLURM_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED, "STOPPED": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED, "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
    "PREEMPTED": JobState.PREEMPTED,
    "REQUEUED": JobState.REQUEUED, "REQUEUE_FED": JobState.REQUEUED, "REQUEUE_HOLD": JobState.REQUEUED,
    "NODE_FAIL": JobState.NODE_FAIL, "BOOT_FAIL": JobState.NODE_FAIL,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
}
_SBATCH_PARSABLE = re.compile(r"(\d+)(?:;([A-Za-z0-9_.-]+))?")
_JOB_ID = re.compile(r"\d+(_\d+)?")
_FIELD = re.compile(r"(?:^|\s)(JobId|ArrayJobId|ArrayTaskId|JobState|Reason|ExitCode|Restarts|NodeList)=(\S*)")
_EXIT = re.compile(r"(\d+):(\d+)")
_FORGOTTEN = ("Invalid job id specified", "Invalid job id")


@dataclass(frozen=True)
class SlurmJob:
    """One line of ``scontrol show job -o``: a job, or one task of an array job."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: int = 0
    restarts: int = 0
    nodes: str = ""

    @property
    def job_state(self) -> JobState:
        return parse_state(self.state)


# --- pure parts ---------------------------------------------------------------------------------------

def parse_state(text: str) -> JobState:
    """A SLURM state name ("RUNNING", "CANCELLED by 0", "CANCELLED+") as a JobState."""
    name = text.strip().split(" ")[0].rstrip("+")
    if name not in SLURM_STATES:
        raise OrchError(f"unknown SLURM job state {text!r} (known: {', '.join(sorted(SLURM_STATES))})")
    return SLURM_STATES[name]


def parse_sbatch_output(stdout: str, stderr: str = "") -> str:
    """The job id from ``sbatch --parsable`` ("123" or "123;cluster"); anything else is an error."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    match = _SBATCH_PARSABLE.fullmatch(lines[0]) if len(lines) == 1 else None
    if not match:
        raise OrchError(f"sbatch --parsable printed {stdout.strip()!r}, expected a job id such as '123' or "
                        f"'123;cluster'" + (f"; stderr: {stderr.strip()!r}" if stderr.strip() else ""))
    return match.group(1)


def parse_exit_code(text: str) -> int:
    """SLURM's "EXIT:SIGNAL" as a shell-style code (128 + signal when a signal ended it)."""
    match = _EXIT.fullmatch(text.strip())
    if not match:
        raise OrchError(f"unexpected SLURM exit code {text!r}, expected 'N:S' such as '0:0'")
    code, sig = int(match.group(1)), int(match.group(2))
    return 128 + sig if sig else code


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """``scontrol show job -o ID`` output: one job per line (array tasks are separate lines).

    Only the first occurrence of each field counts: JobState, ExitCode, ... come before free-text fields
    such as WorkDir or Command, whose values may contain spaces and '='.
    """
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields: dict[str, str] = {}
        for key, value in _FIELD.findall(line):
            fields.setdefault(key, value)
        missing = [k for k in ("JobId", "JobState", "ExitCode") if k not in fields]
        if missing:
            raise OrchError(f"scontrol show job printed a line without {', '.join(missing)}: {line.strip()[:300]!r}")
        job_id = fields["JobId"]
        if fields.get("ArrayJobId") and fields.get("ArrayTaskId") not in (None, "", "N/A"):
            job_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
        try:
            parse_state(fields["JobState"])  # validates
            jobs.append(SlurmJob(job_id=job_id, state=fields["JobState"], reason=fields.get("Reason", ""),
                                 exit_code=parse_exit_code(fields["ExitCode"]),
                                 restarts=int(fields.get("Restarts", "0") or 0), nodes=fields.get("NodeList", "")))
        except (OrchError, ValueError) as e:
            raise OrchError(f"scontrol show job printed {line.strip()[:300]!r}: {e}") from None
    if not jobs:
        raise OrchError(f"scontrol show job printed nothing parseable: {text.strip()[:300]!r}")
    return jobs


def parse_sacct(text: str) -> list[SlurmJob]:
    """``sacct -n -P -X -o JobID,State,ExitCode`` lines ("12|CANCELLED by 0|0:15")."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3 or not _JOB_ID.fullmatch(parts[0].split("[")[0].rstrip("_")):
            raise OrchError(f"sacct printed {line.strip()!r}, expected 'JOBID|STATE|EXIT:SIGNAL'")
        parse_state(parts[1])
        jobs.append(SlurmJob(job_id=parts[0], state=parts[1].split(" ")[0], exit_code=parse_exit_code(parts[2])))
    return jobs


def combined_state(jobs: list[SlurmJob]) -> JobState:
    """One state for a job or an array: running while any task runs, COMPLETED only when all did."""
    states = [job.job_state for job in jobs]
    for waiting in (JobState.RUNNING, JobState.REQUEUED, JobState.SUSPENDED, JobState.PENDING):
        if waiting in states:
            return waiting
    failed = [s for s in states if s is not JobState.COMPLETED]
    return failed[0] if failed else JobState.COMPLETED


# --- the backend ----------------------------------------------------------------------------------------

def build(run: RunDir, *, dependency: str | None = None) -> LaunchPlan:
    """``sbatch --parsable --export=ALL [--dependency=...] launch.sbatch`` from the run dir."""
    argv = ["sbatch", "--parsable", "--export=ALL"]
    if dependency:
        argv.append(f"--dependency={dependency}")
    argv.append(SCRIPT)
    script = (run.path / SCRIPT).read_text()
    return LaunchPlan(backend="slurm", argv=argv, cwd=run.path, env={"ORCH_PYTHON": sys.executable},
                      preview=f"# {SCRIPT}, which sbatch runs on the first node of the job:\n{script}")


def build_sweep(runs: list[RunDir], *, max_parallel: int | None = None,
                dependency: str | None = None) -> LaunchPlan:
    """One job array for several run dirs of the same shape: task i trains ``runs[i]``.

    Submitted from the first run dir with its script, which picks task i's run dir from
    ORCH_SWEEP_RUN_DIRS; every task's SLURM output goes to the first run dir's logs/ (slurm-ARRAY_i.out),
    its metrics and checkpoints to its own run dir. Run dirs whose #SBATCH lines differ (other than the
    job name) cannot share one array.
    """
    if not runs:
        raise OrchError("a sweep needs at least one run dir")
    shape = _sbatch_shape(runs[0])
    for run in runs[1:]:
        if _sbatch_shape(run) != shape:
            raise OrchError(f"{run.path}: its #SBATCH lines differ from {runs[0].path}'s; a job array needs "
                            "run dirs of one shape (nodes, GPUs, time, partition, ...)")
    if any("\n" in str(run.path) for run in runs):
        raise OrchError("a run dir path contains a newline; it cannot be passed to a job array")
    array = f"0-{len(runs) - 1}" + (f"%{max_parallel}" if max_parallel else "")
    first = build(runs[0], dependency=dependency)
    argv = [*first.argv[:-1], f"--array={array}", f"--output={ARRAY_OUTPUT}", f"--error={ARRAY_ERROR}",
            first.argv[-1]]
    env = {**first.env, "ORCH_SWEEP_RUN_DIRS": "\n".join(str(run.path.resolve()) for run in runs)}
    return LaunchPlan(backend="slurm", argv=argv, cwd=runs[0].path, env=env, preview=first.preview)


def _sbatch_shape(run: RunDir) -> list[str]:
    lines = (run.path / SCRIPT).read_text().splitlines()
    return [line for line in lines if line.startswith("#SBATCH") and not line.startswith("#SBATCH --job-name=")]


def submit(plan: LaunchPlan, runner: CommandRunner):
    """Run sbatch; returns (JobRecord, None). The record is saved in the run dir."""
    (plan.cwd / LOG_DIR).mkdir(exist_ok=True)   # slurmd does not create the --output directory
    result = run_slurm(runner, plan.argv, cwd=plan.cwd, env=plan.env)
    job_id = parse_sbatch_output(result.stdout, result.stderr)
    cwd = plan.cwd.resolve()
    record = JobRecord(backend="slurm", job_id=job_id, run_dir=str(cwd), submitted_unix=time.time(),
                       log_path=str(cwd / SLURM_OUTPUT.replace("%j", job_id)),
                       extra={"error_path": str(cwd / SLURM_ERROR.replace("%j", job_id))})
    record.save()
    return record, None


def submit_sweep(plan: LaunchPlan, runner: CommandRunner) -> list[JobRecord]:
    """Submit a plan of :func:`build_sweep`; saves a record ``ARRAYID_i`` in each member run dir."""
    for path in plan.env["ORCH_SWEEP_RUN_DIRS"].split("\n"):
        (Path(path) / LOG_DIR).mkdir(exist_ok=True)
    result = run_slurm(runner, plan.argv, cwd=plan.cwd, env=plan.env)
    array_id = parse_sbatch_output(result.stdout, result.stderr)
    records = []
    for i, path in enumerate(plan.env["ORCH_SWEEP_RUN_DIRS"].split("\n")):
        task = f"{array_id}_{i}"
        logs = plan.cwd.resolve() / LOG_DIR
        record = JobRecord(backend="slurm", job_id=task, run_dir=path, submitted_unix=time.time(),
                           log_path=str(logs / f"slurm-{task}.out"),
                           extra={"error_path": str(logs / f"slurm-{task}.err"), "array_job_id": array_id})
        record.save()
        records.append(record)
    return records


def query(job_id: str, runner: CommandRunner) -> list[SlurmJob] | None:
    """The job's (or array's) lines from scontrol; from sacct once scontrol forgot it; None if neither knows."""
    result = run_slurm(runner, ["scontrol", "show", "job", "-o", job_id], check=False)
    if result.returncode == 0 and result.stdout.strip():
        return parse_scontrol_jobs(result.stdout)
    seen = (result.stderr or result.stdout).strip()
    if not any(text in seen for text in _FORGOTTEN):
        raise OrchError(f"`scontrol show job -o {job_id}` exited {result.returncode}: {seen[-500:]!r}")
    acct = run_slurm(runner, ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"], check=False)
    if acct.returncode != 0 or not acct.stdout.strip():
        return None   # no accounting (or not recorded): SLURM no longer knows the job
    return parse_sacct(acct.stdout)


def status(record: JobRecord, runner: CommandRunner | None = None) -> JobState:
    jobs = query(record.job_id, runner or CommandRunner())
    return combined_state(jobs) if jobs else JobState.UNKNOWN


def exit_code(record: JobRecord, runner: CommandRunner | None = None) -> int:
    jobs = query(record.job_id, runner or CommandRunner())
    if not jobs:
        return 1
    code = max(job.exit_code for job in jobs) or (0 if combined_state(jobs) is JobState.COMPLETED else 1)
    return rank_exit_code(code, Path(record.extra.get("error_path", record.log_path)))


def cancel(record: JobRecord, runner: CommandRunner | None = None, *, wait_s: float = CANCEL_WAIT_S) -> bool:
    """scancel (SIGTERM to every rank: the trainer checkpoints), then wait until the job has ended. Returns
    False when SLURM says the job had already completed."""
    runner = runner or CommandRunner()
    if not _JOB_ID.fullmatch(record.job_id):     # JobRecord.load checks it too: never an option to scancel
        raise OrchError(f"refusing to scancel {record.job_id!r}: not a SLURM job id")
    result = run_slurm(runner, ["scancel", record.job_id], check=False)
    done = "already completing or completed" in result.stderr + result.stdout
    if result.returncode != 0 and not done:
        raise OrchError(f"`scancel {record.job_id}` exited {result.returncode}: "
                        f"{(result.stderr or result.stdout).strip()[-500:]}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        jobs = query(record.job_id, runner)
        if not jobs or all(job.job_state.finished and job.state != "COMPLETING" for job in jobs):
            break
        time.sleep(0.2)
    return not done


def failure_report(record: JobRecord, runner: CommandRunner | None, code: int) -> str:
    """The scheduler's reason, then the failing rank's last lines (from the job's output/error files)."""
    jobs = query(record.job_id, runner or CommandRunner()) or []
    reason = ", ".join(sorted({j.reason for j in jobs if j.reason and j.reason != "None"}))
    head = f"exit code {code}" + (f" (SLURM reason: {reason})" if reason else "")
    err, out = Path(record.extra.get("error_path", record.log_path)), Path(record.log_path)
    text = "\n".join(tail_lines(err, 400))
    found = torchrun_failure(text)
    if found:
        rank, rank_code = found
        prefix = re.compile(rf"^\[\S+ rank{rank}\]:")
        lines = [line for path in (out, err) for line in tail_lines(path, 2000) if prefix.match(line)][-20:]
        if lines:
            return (f"{head}; rank {rank} failed with exit code {rank_code}; its last lines "
                    f"(from {out.name} and {err.name}):\n" + "\n".join("  " + line for line in lines))
    return f"{head}; last lines of {err}:\n" + "\n".join("  " + line for line in tail_lines(err, 20))


def run_slurm(runner: CommandRunner, argv: list[str], *, cwd: Path | None = None, env: dict | None = None,
               check: bool = True):
    """Run one SLURM client command (sbatch, squeue, sacct, scancel, sinfo, ...) through ``runner``; a missing
    client is an OrchError that says how to get it."""
    try:
        return runner.run(argv, cwd=cwd, env=env, timeout_s=60, check=check)
    except OrchError as e:
        if "is not installed" in str(e):
            raise OrchError(f"SLURM's `{argv[0]}` is not on PATH: run orch on a SLURM login node, or install "
                            "the SLURM client (Debian/Ubuntu: apt-get install slurm-client)") from None
        raise
