"""One job per run dir and nothing run that orch did not write, with the real torchrun and trainer (issue 13)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.runlock import try_lock
from tests.integration.test_launch_local import _pids_of
from tests.integration.train_support import job_env, load_metrics, make_run_dir
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
ORCH = str(Path(sys.executable).parent / "orch")


def orch(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *map(str, argv)], capture_output=True, text=True, env=job_env(), timeout=scaled_s(timeout))


def test_nothing_in_the_run_dir_shadows_an_import(tmp_path):
    """The scripts run `python -m` from the run dir, which used to put it first on sys.path: a wandb.py,
    torch/ or orchestrator/ there ran instead of the real package."""
    run_dir = make_run_dir(tmp_path / "run", **{"tracking.wandb.mode": "disabled"})
    marker = tmp_path / "SHADOWED"
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("wandb.py", "deepspeed.py", "torch/__init__.py", "orchestrator/__init__.py"):
        (run_dir / name).parent.mkdir(exist_ok=True)
        (run_dir / name).write_text(payload)
    env = job_env(ORCH_PYTHON=sys.executable, MASTER_PORT="0")
    result = subprocess.run(["bash", "launch_local.sh", "--help"], cwd=run_dir, env=env, capture_output=True,
                            text=True, timeout=scaled_s(120))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Train a run dir written by `orch generate`" in result.stdout
    assert not marker.exists(), marker.read_text()


def _wait_records(run_dir: Path, count: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while len(load_metrics(run_dir)) < count:
        assert time.monotonic() < deadline, (run_dir / "logs" / "launch.log").read_text()[-3000:]
        time.sleep(0.2)


def _wait_gone(run_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _pids_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pids_of(run_dir), "processes still running: " + str(_pids_of(run_dir))


def test_one_job_per_run_dir_cancel_state_and_kill_9_of_the_group(tmp_path):
    run_dir = make_run_dir(tmp_path / "run", **{"training.train_iters": 400, "training.checkpoint.interval": 2,
                                                "tracking.wandb.mode": "disabled"})
    assert orch("launch", run_dir).returncode == 0
    job = json.loads((run_dir / "job.json").read_text())
    _wait_records(run_dir, 1)

    # A second launch while the first runs is refused by the run-dir lock (the job's processes hold it),
    # naming the job; job.json is untouched.
    second = orch("launch", run_dir)
    assert second.returncode == 1 and f"local job {job['job_id']} still holds .orch.lock" in second.stderr, \
        second.stderr
    assert json.loads((run_dir / "job.json").read_text())["job_id"] == job["job_id"]

    # A clean cancel: every rank checkpoints and exits 75; status says CANCELLED, not FAILED.
    assert orch("cancel", run_dir).returncode == 0
    status = orch("status", run_dir, "--json")
    assert json.loads(status.stdout)["state"] == "CANCELLED" and status.returncode == 0
    assert json.loads((run_dir / "train_status.json").read_text())["exit_code"] == 75
    _wait_gone(run_dir, 10)

    # kill -9 of the job's process group from outside orch: ranks (in sessions of their own) must not train
    # on, and the state says it failed (orch cancel did not stop it).
    assert orch("launch", run_dir).returncode == 0
    job = json.loads((run_dir / "job.json").read_text())
    done = len(load_metrics(run_dir))
    _wait_records(run_dir, done + 1)
    os.killpg(int(job["job_id"]), signal.SIGKILL)
    _wait_gone(run_dir, 60)
    killed = orch("status", run_dir, "--json")
    assert json.loads(killed.stdout)["state"] == "FAILED" and killed.returncode == 1, killed
    fd = try_lock(run_dir)                        # nothing is left holding the run dir
    assert fd is not None
    os.close(fd)
