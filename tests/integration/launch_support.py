"""Helpers for the SLURM and pdsh launch tests: run dirs at hostile paths, `orch` in a subprocess, and a
look at the rank processes themselves (every "node" of the local cluster is this machine, so /proc shows
each rank's environment: which node started it, and whether the secret reached it)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from orchestrator.rundir import write_run_dir
from orchestrator.telemetry.sinks import read_metrics
from tests.conftest import fixed_plan, spec_data
from tests.deadlines import Deadline, scaled_s
from tests.integration.train_support import job_env

ORCH = str(Path(sys.executable).parent / "orch")
SECRET = "wandb-secret-0123456789abcdef"      # must reach the ranks, and no file
# A directory name that a shell would execute if any launcher let it reach one unquoted.
HOSTILE = "runs $(touch PWNED); x'y %h `touch PWNED`"
TWO_NODES = {"cluster.num_nodes": 2, "cluster.gpus_per_node": 1, "training.train_iters": 8,
             "training.optimizer.lr": 3e-3, "training.lr_schedule.warmup_iters": 1,
             "training.checkpoint.interval": 100, "tracking.wandb.mode": "disabled",
             "launch.slurm.time": "00:10:00", "launch.pdsh.hosts": ["orch-n1", "orch-n2"],
             "launch.pdsh.ssh_port": 2222}


def make_run(parent: Path, name: str = "tiny run", **overrides) -> Path:
    """A run dir of the tiny GPT for 2 nodes x 1 rank (ZeRO-2), under ``parent``."""
    parent.mkdir(parents=True, exist_ok=True)
    return write_run_dir(fixed_plan(spec_data(**{**TWO_NODES, **overrides})), parent / name)


def launch_env(daemon_env: dict[str, str], **extra) -> dict[str, str]:
    """The environment orch runs in: the job's (CPU DeepSpeed), gloo on loopback, the daemons' client
    settings, and a secret."""
    env = job_env(GLOO_SOCKET_IFNAME="lo", WANDB_API_KEY=SECRET, **extra)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return {**env, **daemon_env}


def orch(*args: str, env: dict, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run orch to its end; ``timeout_s`` is the idle-machine figure (tests/deadlines.py scales it)."""
    return subprocess.run([ORCH, *args], env=env, capture_output=True, text=True, timeout=scaled_s(timeout_s))


def start_orch(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([ORCH, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_records(run_dir: Path, count: int, timeout_s: float = 120, job: subprocess.Popen | None = None) -> int:
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        n = len(read_metrics(run_dir / "metrics.jsonl"))
        if n >= count:
            return n
        if job is not None and job.poll() is not None:
            raise AssertionError(f"orch ended ({job.returncode}) before {count} records:\n{job.stderr.read()}")
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} records in {run_dir / 'metrics.jsonl'} after {deadline}")


def _cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def processes_of(run_dir: Path) -> list[str]:
    """Command lines of live processes that name the run dir (ranks, torchrun, srun/ssh wrappers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            words = _cmdline(entry.name)
            if any(str(run_dir) in word for word in words):
                try:
                    if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                except (OSError, IndexError):
                    continue
                found.append(" ".join(words))
    return found


def rank_environments(run_dir: Path) -> dict[int, dict[str, str]]:
    """RANK -> environment of each live trainer process of the run dir."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        words = _cmdline(entry.name) if entry.name.isdigit() else []
        if words[-3:-1] == ["-m", "orchestrator.train"] and words[-1] == str(run_dir) and "-u" in words:
            try:
                raw = (entry / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
            if "RANK" in env:
                ranks[int(env["RANK"])] = env
    return ranks


def watch_ranks(run_dir: Path, job: subprocess.Popen, count: int, timeout_s: float = 120) -> dict[int, dict]:
    """Poll until ``count`` ranks of the run dir are alive; their environments."""
    deadline = Deadline(timeout_s)
    while not deadline.expired() and job.poll() is None:
        ranks = rank_environments(run_dir)
        if len(ranks) >= count:
            return ranks
        time.sleep(0.1)
    raise AssertionError(f"never saw {count} ranks of {run_dir} after {deadline} (orch exited {job.poll()})")


def wait_gone(run_dir: Path, timeout_s: float = 15) -> list[str]:
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        left = processes_of(run_dir)
        if not left:
            return []
        time.sleep(0.2)
    return processes_of(run_dir)


def files_holding(text: str, *roots: Path) -> list[Path]:
    """Every readable file under ``roots`` whose bytes contain ``text``."""
    needle = text.encode()
    hits = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            try:
                if path.is_file() and needle in path.read_bytes():
                    hits.append(path)
            except OSError:
                continue
    return hits


def no_pwned(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("PWNED*")] + [p for p in (Path.cwd() / "PWNED",) if p.exists()]


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
