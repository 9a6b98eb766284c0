"""run_doctor: start the probe on every rank through the run's launch path, within a bounded time.

- local: the run dir's ``launch_local.sh`` (torchrun on this host) with a free rendezvous port;
- pdsh: pdsh's host checks first (reachable over ssh, run dir, Python, a free port on the first host),
  then ``launch_pdsh.sh``; when it does not finish in time, the probe is stopped on every host;
- slurm: the partition must have enough usable nodes (``sinfo``), then ``sbatch launch.sbatch`` (srun on
  the job's nodes); a job still pending at the deadline is cancelled, with SLURM's reason.

Each runs with ``ORCH_ENTRY=orchestrator.doctor.probe``, so the scripts start the probe where they would
start the trainer. Nodes that never report are named as missing from the rendezvous. Nothing of the
training job's records (job.json, logs/exitcode, logs/pdsh_result.json) is touched. Like `orch launch`, it
refuses a run dir whose generated files differ from the manifest (unless allowed) and holds the run-dir
lock while it measures: never beside a live job.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrchError
from ..launch import backend_module
from ..launch.base import LOG_DIR, CommandRunner, JobRecord, LaunchPlan, tail_lines
from ..launch.guard import busy_message, check_intact, refuse_if_active
from ..rundir import RunDir, read_run_dir
from ..runlock import locked
from ..train.trainer import write_json
from .probe import REQUEST_DIR, request_path, result_path
from .report import DEFAULT_THRESHOLD, build_report

DOCTOR_FILE = "doctor.json"
ENTRY = "orchestrator.doctor.probe"
TIMEOUT_S = {"quick": 90.0, "full": 180.0}


@dataclass(frozen=True)
class DoctorOptions:
    backend: str | None = None
    mode: str = "full"                 # full | quick (the preflight of `orch launch --preflight`)
    threshold: float = DEFAULT_THRESHOLD
    timeout_s: float | None = None     # the whole probe, rendezvous included
    allow_modified: bool = False       # run generated files that differ from manifest.json (logged)
    check_manifest: bool = True        # False: the caller (`orch launch --preflight`) checked it already


def run_doctor(run_dir: str | Path, options: DoctorOptions = DoctorOptions(), *, runner: CommandRunner | None = None,
               note=print) -> dict:
    """Measure RUN_DIR's cluster; writes and returns doctor.json's content. Refused (SpecError) when a
    generated file was edited, unless ``options.allow_modified``; refused (RunDirBusy) while a job or another
    orch command holds the run dir."""
    run = read_run_dir(run_dir)
    backend = options.backend or run.spec.launch.backend
    backend_module(backend)   # validates the name
    if options.check_manifest:
        check_intact(run, allow_modified=options.allow_modified, dry_run=False, note=note)
    runner = runner or CommandRunner()
    with locked(run.path, busy_message(run.path)):
        refuse_if_active(run.path, runner)
        return _measure(run, backend, options, runner, note)


def _measure(run: RunDir, backend: str, options: DoctorOptions, runner: CommandRunner, note) -> dict:
    timeout_s = options.timeout_s or TIMEOUT_S[options.mode]
    token = uuid.uuid4().hex[:12]
    (run.path / REQUEST_DIR).mkdir(exist_ok=True)
    write_json(request_path(run.path, token), {"mode": options.mode, "token": token,
                                               "rendezvous_timeout_s": max(10.0, timeout_s * 0.8)})
    (run.path / LOG_DIR).mkdir(exist_ok=True)
    started = time.monotonic()
    hosts, problems, log = None, [], run.path / LOG_DIR / "doctor.log"
    try:
        launcher = {"local": _local, "pdsh": _pdsh, "slurm": _slurm}[backend]
        hosts, problems, log = launcher(run, token, timeout_s, runner, note)
    finally:
        request_path(run.path, token).unlink(missing_ok=True)
    result = _read_result(run.path, token)
    if result is None and not problems:
        last = " | ".join(line.strip() for line in tail_lines(log, 3))
        problems = [{"host": "-", "rank": None, "what": "launch",
                     "message": f"the probe ended without results; last lines of {log}: {last[-400:]}"}]
    report = build_report(result, run.spec, backend=backend, mode=options.mode, threshold=options.threshold,
                          hosts=hosts, launch_problems=problems, seconds=time.monotonic() - started,
                          cost_model=run.plan.get("cost_model"))
    write_json(run.path / DOCTOR_FILE, report)
    return report


def _read_result(run_dir: Path, token: str) -> dict | None:
    path = result_path(run_dir, token)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    path.unlink()
    return data


def _env(token: str, **extra) -> dict:
    return {"ORCH_PYTHON": os.environ.get("ORCH_PYTHON") or sys.executable, "ORCH_ENTRY": ENTRY, "ORCH_DOCTOR_TOKEN": token, **extra}


def _wait_group(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for a process started in its own session; False (and the group stopped) at the timeout."""
    from ..launch.local import stop_group  # noqa: PLC0415

    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        stop_group(proc.pid, grace_s=3)
        proc.wait()
        return False


def _timeout_problem(what: str, timeout_s: float, log: Path) -> dict:
    last = " | ".join(line.strip() for line in tail_lines(log, 3))
    return {"host": "-", "rank": None, "what": "rendezvous",
            "message": f"{what} did not finish within {timeout_s:.0f} s (a node did not join the rendezvous, or "
                       f"is too slow); last lines of {log}: {last[-400:]}"}


# --- local ------------------------------------------------------------------------------------------------

def _local(run: RunDir, token: str, timeout_s: float, runner: CommandRunner, note):
    from ..launch.local import free_port  # noqa: PLC0415

    plan = LaunchPlan(backend="local", argv=["bash", "launch_local.sh"], cwd=run.path,
                      env=_env(token, MASTER_PORT=str(free_port())))
    log = run.path / LOG_DIR / "doctor.log"
    note(f"doctor: torchrun on this host ({run.spec.world_size} rank(s)); log {log}")
    proc = runner.start(plan, log_path=log)
    if not _wait_group(proc, timeout_s):
        return None, [_timeout_problem("torchrun", timeout_s, log)], log
    return None, [], log


# --- pdsh -------------------------------------------------------------------------------------------------

def _pdsh(run: RunDir, token: str, timeout_s: float, runner: CommandRunner, note):
    from ..launch import pdsh  # noqa: PLC0415

    target = pdsh.target_of(run)
    hosts = list(target.hosts)
    try:
        port = pdsh.preflight(target, run.path.resolve(), os.environ.get("ORCH_PYTHON") or sys.executable, runner)
    except OrchError as e:
        return hosts, _host_problems(str(e), hosts, "preflight"), None
    run_id = uuid.uuid4().hex[:16]
    plan = LaunchPlan(backend="pdsh", argv=["bash", pdsh.SCRIPT], cwd=run.path,
                      env=_env(token, MASTER_PORT=str(port), ORCH_PDSH_RUN_ID=run_id))
    log = run.path / LOG_DIR / "doctor.log"
    note(f"doctor: pdsh on {', '.join(hosts)}; log {log}")
    proc = runner.start(plan, log_path=log)
    try:
        finished = proc.wait(timeout=timeout_s) is not None
    except subprocess.TimeoutExpired:
        finished = False
    if not finished:
        pdsh.stop_remote(target, run_id, runner)
        _wait_group(proc, 20)
        return hosts, [_timeout_problem("pdsh", timeout_s, log)], log
    return hosts, [], log


def _host_problems(message: str, hosts: list[str], what: str) -> list[dict]:
    """One problem per host named at the start of a line of a launcher's error (else one for all)."""
    found = []
    for line in message.splitlines():
        head = line.strip().split(":", 1)[0]
        if head in hosts:
            found.append({"host": head, "rank": None, "what": what, "message": line.strip()[len(head) + 1:].strip()})
    return found or [{"host": ",".join(hosts), "rank": None, "what": what, "message": message}]


# --- slurm ------------------------------------------------------------------------------------------------

def _slurm(run: RunDir, token: str, timeout_s: float, runner: CommandRunner, note):
    from ..launch import slurm  # noqa: PLC0415

    problems = slurm_node_problems(run, runner)
    if problems:
        return None, problems, None
    plan = slurm.build(run)
    result = slurm.run_slurm(runner, plan.argv, cwd=plan.cwd, env={**plan.env, **_env(token)})
    job_id = slurm.parse_sbatch_output(result.stdout, result.stderr)
    record = JobRecord(backend="slurm", job_id=job_id, run_dir=str(run.path), submitted_unix=time.time(),
                       log_path=str(run.path / LOG_DIR / f"slurm-{job_id}.out"))
    note(f"doctor: SLURM job {job_id} (srun on the job's nodes); log {record.log_path}")
    log = run.path / LOG_DIR / f"slurm-{job_id}.err"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if slurm.status(record, runner).finished:
            return None, [], log
        time.sleep(0.5)
    jobs = slurm.query(job_id, runner) or []
    state = ", ".join(sorted({f"{j.state} (reason {j.reason})" for j in jobs})) or "unknown"
    slurm.cancel(record, runner, wait_s=15)
    return None, [{"host": ",".join(sorted({j.nodes for j in jobs if j.nodes})) or "-", "rank": None,
                   "what": "rendezvous", "message": f"SLURM job {job_id} was still {state} after {timeout_s:.0f} s; "
                                                    "cancelled it"}], log


def slurm_node_problems(run: RunDir, runner: CommandRunner) -> list[dict]:
    """The partition must have num_nodes usable nodes (else the job would wait forever): sinfo's view."""
    s = run.spec.launch.slurm
    argv = ["sinfo", "-h", "-N", "-o", "%N %T"] + ([f"--partition={s.partition}"] if s.partition else [])
    from ..launch.slurm import run_slurm  # noqa: PLC0415

    out = run_slurm(runner, argv, check=False)
    if out.returncode != 0:
        return [{"host": "-", "rank": None, "what": "preflight",
                 "message": f"`{' '.join(argv)}` exited {out.returncode}: {(out.stderr or out.stdout).strip()[-300:]}"}]
    states = {}
    for line in out.stdout.splitlines():
        if line.strip():
            name, state = line.split()[:2]
            states[name] = state
    usable = sorted(n for n, st in states.items() if st.rstrip("*~#!%$@^-").lower() in USABLE)
    bad = [f"{n} {st}" for n, st in sorted(states.items()) if n not in usable]
    need = run.spec.cluster.num_nodes
    if len(usable) >= need:
        return []
    where = f"partition {s.partition}" if s.partition else "the default partition"
    return [{"host": ",".join(n.split()[0] for n in bad) or "-", "rank": None, "what": "preflight",
             "message": f"{where} has {len(usable)} usable node(s) ({', '.join(usable) or 'none'}), the spec needs "
                        f"num_nodes({need})" + (f"; not usable: {', '.join(bad)}" if bad else "")}]


USABLE = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
