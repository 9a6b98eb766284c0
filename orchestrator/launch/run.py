"""launch_run_dir: build, submit, and (with wait) follow a job to its end, for any backend."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..errors import OrchError, Problem, SpecError
from ..rundir import RunDir, program_drift, read_run_dir
from . import backend_module
from ..runlock import locked, share
from .base import CommandRunner, JobRecord, JobState, LaunchFailed
from .guard import busy_message, check_intact, refuse_if_active
from .progress import METRICS, StartupWatch, follow, format_progress


def launch_run_dir(run_dir: str | Path, *, backend: str | None = None, dry_run: bool = False,
                   wait: bool = False, timeout_s: float | None = None, runner: CommandRunner | None = None,
                   echo: Callable[[str], None] = print, note: Callable[[str], None] = print,
                   allow_modified: bool = False, preflight: bool = False,
                   preflight_timeout_s: float | None = None) -> int:
    """Start RUN_DIR's job; returns the exit code (0, or the job's code with wait).

    Refused (before anything runs, --dry-run included) when a generated file differs from the manifest,
    unless ``allow_modified``; refused when another job holds the run dir. With ``preflight``, the quick
    part of ``orch doctor`` runs first on the job's nodes, through the same backend, within
    ``preflight_timeout_s``; a node that fails it stops the launch (OrchError naming it).
    """
    run = read_run_dir(run_dir)
    check_intact(run, allow_modified=allow_modified, dry_run=dry_run, note=note)
    for warning in program_drift(run):
        note(f"warning: {warning}")
    name = backend or run.spec.launch.backend
    module = backend_module(name)
    plan = module.build(run)
    refusal = (local_refusal(run) if name == "local" else None) or checkpoint_refusal(run)
    if dry_run:
        echo(plan.describe())
        if run.spec.program is not None:
            echo(describe_program(run.path))
        if refusal:
            note(f"note: run for real, this would be refused: {refusal.problems[0]}")
        return 0
    if refusal:
        raise refusal
    trained = already_trained(run, note) if run.spec.program is None else None   # a program keeps its own
    if trained:
        note(trained)
        return 0
    runner = runner or CommandRunner()
    if preflight:
        run_preflight(run.path, name, runner, note, preflight_timeout_s)
    metrics = run.path / METRICS
    offset = metrics.stat().st_size if metrics.is_file() else 0
    record = submit_exclusive(run.path, module, plan, runner)
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

    options = DoctorOptions(backend=backend, mode="quick", timeout_s=timeout_s, check_manifest=False)  # checked
    report = run_doctor(run_dir, options, runner=runner, note=note)
    if not report["healthy"]:
        raise OrchError(f"preflight failed ({report['seconds']:.0f} s), nothing was started: "
                        f"{offender_summary(report)}; details in {run_dir / 'doctor.json'}")
    note(f"preflight: {len(report['nodes'])} node(s), {len(report['ranks'])} rank(s) healthy "
         f"({report['seconds']:.0f} s)")


def submit_exclusive(run_dir: Path, module, plan, runner: CommandRunner) -> JobRecord:
    """Submit under the run-dir lock, after checking that no recorded job is still active. The job inherits
    the lock (downgraded to shared: its ranks take it shared too), so it is held while any process of
    the job lives and released by the kernel when the last one exits."""
    with locked(run_dir, busy_message(run_dir)) as fd:
        refuse_if_active(run_dir, runner)
        share(fd)
        return module.submit(replace(plan, inherit_fds=(fd,)), runner)[0]


def wait_for(module, record: JobRecord, runner: CommandRunner, *, metrics: Path, offset: int,
             timeout_s: float | None, train_iters: int, echo, note) -> int:
    """Print a progress line per step until the job ends; raise LaunchFailed when it did not complete."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    state = JobState.UNKNOWN
    starting = StartupWatch(record.log_path, note)

    def done() -> bool:
        nonlocal state
        starting.poll()
        previous, state = state, module.status(record, runner)
        if previous is not JobState.UNKNOWN and state is not previous and not state.finished:
            note(f"job {record.job_id} {state.value}")   # e.g. requeued: PENDING, then RUNNING again
        if deadline and time.monotonic() > deadline and not state.finished:
            module.cancel(record, runner)
            raise LaunchFailed(f"job {record.job_id} still {state.value} after {timeout_s:.0f} s; cancelled it", 1)
        return state.finished

    try:
        for rec in follow(metrics, done, offset=offset):
            starting.stop()
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


def local_refusal(run: RunDir) -> SpecError | None:
    """Why the local backend cannot run this spec (None when it can): torchrun on one host cannot stand in
    for several nodes; it would wait for the other nodes' rendezvous forever."""
    nodes = run.spec.cluster.num_nodes
    if nodes == 1:
        return None
    return SpecError([Problem("launch.backend", f"'local' runs torchrun on this host only, but cluster.num_nodes is "
                              f"{nodes}: the other {nodes - 1} node(s) would never join",
                              f"launch it on the cluster: `orch launch {run.path} --backend slurm` (or "
                              "`--backend pdsh` with launch.pdsh.hosts), or set cluster.num_nodes: 1 to try it "
                              "on this machine")])


def checkpoint_refusal(run: RunDir) -> SpecError | None:
    """Why the job could not keep its checkpoints where the spec says (None when it can): outside the run
    dir, or where a file is in the way (found now, not at the first save)."""
    from ..train.checkpoint import checkpoint_dir_problem  # noqa: PLC0415

    problem = checkpoint_dir_problem(run.path, run.spec.training.checkpoint.dir)
    return SpecError(problem) if problem else None


def already_trained(run: RunDir, note: Callable[[str], None] = print) -> str | None:
    """A note when the run dir's newest checkpoint that verifies (sizes and sha256 recorded when it was
    written) is its last step: launching again would train nothing. Newer or final checkpoints that do
    not verify are named through ``note``: the job falls back to the newest one that does."""
    from ..train.checkpoint import checkpoint_dir, resume_choice, saved_steps, tag_for  # noqa: PLC0415  (no torch)

    ckpt, total = checkpoint_dir(run.path, run.spec), run.spec.training.train_iters
    if not saved_steps(ckpt) or saved_steps(ckpt)[0] < total:
        return None                  # training is left either way: the job itself verifies what it loads
    choice = resume_choice(ckpt)
    for step, problem in choice.unusable:
        note(f"warning: checkpoint {ckpt / tag_for(step)} is unusable ({problem}); the job will set it aside "
             f"and resume from " + (f"{tag_for(choice.step)}" if choice.step is not None else "step 0 (no "
                                    "checkpoint verifies)"))
    step = choice.step
    if step is None or step < total:
        return None
    return (f"{run.path} is already trained: its checkpoint {ckpt / tag_for(step)} is step {step} of "
            f"{total} and verifies; nothing to launch. To train again from step 0, write a fresh run dir (`orch "
            f"generate SPEC -o {run.path} --force --discard-outputs`) or remove {ckpt}")


def describe_program(run_dir: Path) -> str:
    """What each rank's `python -m orchestrator.programs RUN_DIR` runs, shell-pasteable (--dry-run)."""
    import shlex  # noqa: PLC0415

    from ..programs import load_program, substitute_run_dir  # noqa: PLC0415

    program = load_program(run_dir)
    argv = " ".join(shlex.quote(a) for a in substitute_run_dir(program["argv"], run_dir))
    cwd = f"cd {shlex.quote(program['cwd'])} && " if program.get("cwd") else ""
    return (f"# every rank: python -m orchestrator.programs {shlex.quote(str(run_dir))}, which runs "
            f"({program['kind']}, under orch's telemetry):\n{cwd}python {argv}")
