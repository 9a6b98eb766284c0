"""`orch launch` with the local backend: the real torchrun, the real trainer, on this machine."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.launch_support import HOSTILE, no_pwned
from tests.integration.train_support import job_env, make_run_dir
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
ORCH = str(Path(sys.executable).parent / "orch")
STEPS = 6
LONG_STEPS = 100_000


def orch(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *map(str, argv)], capture_output=True, text=True, env=env or job_env(),
                          timeout=scaled_s(timeout))


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """At a path with a space, quotes and shell syntax (launch_support.HOSTILE): the launch script and
    everything after it must pass it on as one word and never run it."""
    return make_run_dir(tmp_path / HOSTILE, **{"training.train_iters": STEPS, "training.checkpoint.interval": 3})


@pytest.fixture
def long_run_dir(tmp_path) -> Iterator[Path]:
    """A run far longer than any test waits: an interrupt or cancel always lands while it trains (with
    STEPS steps a loaded machine could deliver the first progress line after the job had ended). Whatever
    the test's outcome, nothing of it is left training afterwards."""
    run = make_run_dir(tmp_path / "long", **{"training.train_iters": LONG_STEPS,
                                            "training.checkpoint.interval": LONG_STEPS})
    yield run
    for pid in _pids_of(run):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _default_sigint() -> None:
    """In the child: SIGINT as a shell in a terminal leaves it. A process started in the background by a
    non-interactive shell (``nohup make test &``) inherits SIGINT ignored, and an ignored signal stays
    ignored across exec, so orch launch would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _pids_of(run: Path) -> list[int]:
    """Processes whose command line names this run dir (torchrun and the ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(run) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


def test_dry_run_prints_the_command_and_starts_nothing(run_dir):
    result = orch("launch", run_dir, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "launch_local.sh" in result.stdout and "MASTER_PORT=" in result.stdout
    assert f"ORCH_PYTHON={sys.executable}" in result.stdout
    assert not (run_dir / "job.json").exists() and not (run_dir / "logs").exists()


def test_wait_streams_one_line_per_step_and_completes(run_dir):
    result = orch("launch", run_dir, "--wait")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [f"{s}/{STEPS}" for s in range(1, STEPS + 1)]
    assert all("loss" in line and "tok/s" in line and "allreduce" in line for line in lines)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    status = orch("status", run_dir, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED"
    # The trainer got the run dir as one word: its checkpoints and metrics are in it, and nothing ran.
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step*")) == ["global_step3", "global_step6"]
    assert not no_pwned(run_dir.parent) and [p.name for p in run_dir.parent.iterdir()] == [HOSTILE]


def test_failing_rank_fails_the_launch_with_its_rank_and_log(run_dir):
    result = orch("launch", run_dir, "--wait", env=job_env(ORCH_FAULT_AT_STEP="3", ORCH_FAULT_RANK="1"))
    assert result.returncode == 3      # the rank's own exit code (EXIT_INJECTED_FAULT), not torchrun's 1
    assert "rank 1" in result.stderr and "injected fault at step 3" in result.stderr
    status = orch("status", run_dir, "--json")
    assert status.returncode == 1 and json.loads(status.stdout)["state"] == "FAILED"
    assert not _pids_of(run_dir)


def test_ctrl_c_stops_every_rank(long_run_dir):
    run_dir = long_run_dir
    proc = subprocess.Popen([ORCH, "launch", str(run_dir), "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=job_env(), start_new_session=True, preexec_fn=_default_sigint)
    first = proc.stdout.readline()  # the first progress line: training is under way
    assert first.startswith("step "), first + proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    code = proc.wait(timeout=scaled_s(150))     # a 100,000-step run: only the interrupt ends it this soon
    assert code == 130 and time.monotonic() - start < scaled_s(120)
    deadline = time.monotonic() + scaled_s(10)
    while _pids_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pids_of(run_dir)


def test_background_launch_then_status_and_cancel(long_run_dir):
    run_dir = long_run_dir
    started = orch("launch", run_dir)
    assert started.returncode == 0, started.stderr
    assert json.loads(orch("status", run_dir, "--json").stdout)["state"] == "RUNNING"
    cancelled = orch("cancel", run_dir)
    assert cancelled.returncode == 0, cancelled.stderr
    state = json.loads(orch("status", run_dir, "--json").stdout)["state"]
    assert state == "CANCELLED"
    assert not _pids_of(run_dir)
