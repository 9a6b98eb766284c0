"""Helpers for the trainer's integration tests: run dirs and real torchrun jobs on this machine."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema

from orchestrator.resources import data_dir
from orchestrator.telemetry.sinks import read_metrics
from tests.conftest import ROOT, fixed_plan, spec_data
from tests.deadlines import Deadline, scaled_s

JOB_TIMEOUT_S = 300     # idle-machine figure: every use scales it (scaled_s)
# The spec of the shared ZeRO-1 / ZeRO-3 runs (conftest.zero_stage_runs): SHARED_RUN_STEPS steps, one checkpoint.
SHARED_RUN_STEPS = 10
SHARED_RUN_SPEC = {"training.train_iters": SHARED_RUN_STEPS, "training.checkpoint.interval": SHARED_RUN_STEPS,
                   "training.optimizer.lr": 3e-3, "training.lr_schedule.warmup_iters": 1}


def make_run_dir(path: Path, *, planned: bool = False, **overrides) -> Path:
    """A run dir for spec_data(**overrides): the planner's estimates in plan.json when ``planned``."""
    from orchestrator.rundir import write_run_dir

    data = spec_data(**overrides)
    if planned:
        from orchestrator.plan import build_plan
        from orchestrator.spec_loader import parse_spec

        plan = build_plan(parse_spec(data))
    else:
        plan = fixed_plan(data)
    return write_run_dir(plan, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(**extra) -> dict:
    """The job's environment: this one plus DeepSpeed's CPU settings and ``extra`` (None removes a name)."""
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def torchrun_argv(nproc: int, *module_and_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", *module_and_args]


def train(run_dir: Path, *args: str, nproc: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the trainer under torchrun to completion; fails the test with the log when it does not exit 0."""
    proc = subprocess.run(torchrun_argv(nproc, "orchestrator.train", str(run_dir), *args), cwd=ROOT,
                          env=env or job_env(), capture_output=True, text=True, timeout=scaled_s(JOB_TIMEOUT_S))
    assert proc.returncode == 0, f"trainer exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def start_train(run_dir: Path, *args: str, nproc: int = 2, env: dict | None = None) -> subprocess.Popen:
    """Start the trainer under torchrun in its own process group (so the test can kill the whole job)."""
    return subprocess.Popen(torchrun_argv(nproc, "orchestrator.train", str(run_dir), *args), cwd=ROOT,
                            env=env or job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for_records(job: subprocess.Popen, metrics: Path, count: int, timeout_s: float = 120) -> int:
    """Poll metrics.jsonl until it has ``count`` records; returns how many it had."""
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        n = len(read_metrics(metrics))
        if n >= count:
            return n
        if job.poll() is not None:
            raise AssertionError(f"the job ended ({job.returncode}) before {count} records:\n{job.stdout.read()}")
        time.sleep(0.02)
    raise AssertionError(f"no {count} records in {metrics} after {deadline}")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_job(job: subprocess.Popen, sig: int) -> str:
    """SIGKILL: every process of the job at once (a crashed node). SIGTERM/SIGINT: to torchrun, which
    forwards it to the workers. Returns the job's output."""
    if sig == signal.SIGKILL:
        for pid in [*descendants(job.pid), job.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        job.send_signal(sig)
    out, _ = job.communicate(timeout=scaled_s(JOB_TIMEOUT_S))
    return out


def metrics_schema() -> dict:
    return json.loads((data_dir("schemas") / "metrics.schema.json").read_text())


def load_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl records, each validated against schemas/metrics.schema.json."""
    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    schema = metrics_schema()
    for record in records:
        jsonschema.validate(record, schema)
    return records


def assert_loss_falls(records: list[dict], margin: float = 0.3) -> None:
    losses = [r["loss"] for r in records]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - margin, f"loss did not fall: {losses}"


def read_wandb_history(run_dir: Path) -> tuple[list[dict], dict]:
    """(history rows, summary) of the run dir's offline W&B run, read back with wandb's own reader."""
    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected exactly one W&B run, found {files}"
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(files[0])], capture_output=True,
                         text=True, timeout=scaled_s(120), check=True).stdout
    history = [json.loads(line)["history"]["item"] for line in out.splitlines()
               if line.strip() and json.loads(line).get("type") == "history"]
    summary = subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(files[0])],
                             capture_output=True, text=True, timeout=scaled_s(120), check=True).stdout
    return history, json.loads(summary)
