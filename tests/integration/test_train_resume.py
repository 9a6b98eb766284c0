"""Kill and resume for real: SIGKILL a job mid-way, resume, SIGTERM it (checkpoint + exit 75), resume again.

The final metrics.jsonl holds every step exactly once, and the losses are those of an uninterrupted run
of the same spec (data and state are restored exactly), so no step was lost or repeated.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.train import checkpoint
from orchestrator.train.signals import EXIT_PREEMPTED
from tests.conftest import ROOT
from tests.integration.train_support import (job_env, kill_job, load_metrics, make_run_dir, start_train,
                                             torchrun_argv, train, wait_for_records)
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

SPEC = {"training.optimizer.lr": 3e-3, "training.lr_schedule.warmup_iters": 1, "training.train_iters": 24,
        "training.checkpoint.interval": 4, "tracking.wandb.mode": "disabled"}


def test_kill_and_resume_loses_and_repeats_no_step(tmp_path):
    reference = make_run_dir(tmp_path / "reference", **SPEC)
    train(reference)
    expected = {r["step"]: r["loss"] for r in load_metrics(reference)}
    assert sorted(expected) == list(range(1, 25))

    run_dir = make_run_dir(tmp_path / "run", **SPEC)
    metrics, ckpt = run_dir / "metrics.jsonl", checkpoint.checkpoint_dir(run_dir, _spec(run_dir))

    # 1. SIGKILL the whole job once it is past the first checkpoint (step 4).
    job = start_train(run_dir)
    wait_for_records(job, metrics, 6)
    kill_job(job, signal.SIGKILL)
    killed_at = len(load_metrics(run_dir))
    saved = checkpoint.latest_step(ckpt)
    assert saved is not None and saved >= 4 and saved % 4 == 0

    # 2. Resume; SIGTERM torchrun (it forwards the signal): every rank checkpoints the step it is in, exit 75.
    (run_dir / "train_info.json").unlink()
    job = start_train(run_dir)
    _wait_resumed(job, run_dir, saved)
    out = kill_job(job, signal.SIGTERM)
    assert f"(step {saved}); dropped {killed_at - saved} metrics record(s)" in out
    status = json.loads((run_dir / "train_status.json").read_text())
    assert status["exit_code"] == EXIT_PREEMPTED and status["state"] == "preempted", out[-3000:]
    assert "stop requested (SIGTERM)" in out
    stopped = [r["step"] for r in load_metrics(run_dir)]
    assert stopped == list(range(1, stopped[-1] + 1))
    assert checkpoint.latest_step(ckpt) == stopped[-1] == status["checkpoint_step"]   # nothing to redo

    # 3. Resume to the end.
    proc = train(run_dir)
    assert f"(step {stopped[-1]}); dropped 0 metrics record(s)" in proc.stderr
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, 25))
    for r in records:
        assert r["loss"] == pytest.approx(expected[r["step"]], rel=1e-4, abs=1e-4), r["step"]
    info = json.loads((run_dir / "train_info.json").read_text())
    assert info["start_step"] == stopped[-1]
    assert killed_at >= 6 and saved < killed_at


def _spec(run_dir):
    from orchestrator.rundir import read_run_dir

    return read_run_dir(run_dir).spec


def _wait_resumed(job, run_dir, saved: int) -> None:
    """Wait until the resumed job has started (train_info.json) and written 2 steps past its checkpoint."""
    info = run_dir / "train_info.json"
    deadline = time.monotonic() + scaled_s(120)
    while not info.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.02)
    assert json.loads(info.read_text())["start_step"] == saved
    wait_for_records(job, run_dir / "metrics.jsonl", saved + 2)
    steps = [r["step"] for r in load_metrics(run_dir)]
    assert steps[: saved + 1] == list(range(1, saved + 2)), "records after the checkpoint were not dropped"


def test_fault_plus_corrupt_newest_checkpoint_plus_garbage_metrics_resumes_exactly_once(tmp_path):
    """A rank fails after the step-4 checkpoint; then the newest checkpoint's shard is truncated and
    garbage (non-UTF-8 bytes, non-object JSON, a torn line) is appended to metrics.jsonl. The relaunch
    sets step 4 aside, resumes from step 2, and the file ends with every step exactly once."""
    spec = {**SPEC, "training.train_iters": 6, "training.checkpoint.interval": 2}
    run_dir = make_run_dir(tmp_path / "run", **spec)
    ckpt = checkpoint.checkpoint_dir(run_dir, _spec(run_dir))
    failed = subprocess.run(torchrun_argv(2, "orchestrator.train", str(run_dir)), cwd=ROOT, capture_output=True,
                            text=True, timeout=scaled_s(300), env=job_env(ORCH_FAULT_AT_STEP="5", ORCH_FAULT_RANK="1"))
    assert failed.returncode != 0 and "injected fault at step 5" in failed.stderr, failed.stderr[-3000:]
    first = {r["step"]: r["loss"] for r in load_metrics(run_dir)}
    assert sorted(first) == list(range(1, 5)) and checkpoint.saved_steps(ckpt) == [4, 2]
    assert checkpoint.step_problem(ckpt, 4) is None                     # verified when written

    shard = sorted((ckpt / "global_step4").glob("*optim_states.pt"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a truncated shard
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(b'\xff\xfe\x00garbage\n[1, 2, 3]\n"step"\n{"step": 3, "loss": 0.0}\n{"step": 12, "lo')

    proc = train(run_dir)
    assert "global_step4 is unusable" in proc.stderr and "(step 2); dropped" in proc.stderr, proc.stderr[-3000:]
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, 7))
    for step in range(1, 3):                                            # what the kept checkpoint covers
        assert records[step - 1]["loss"] == first[step]
    assert checkpoint.resume_choice(ckpt).step == 6 and checkpoint.latest_step(ckpt) == 6
    assert [p.name.split(".")[0] for p in ckpt.glob("global_step4.unusable-*")] == ["global_step4"]

    # The final checkpoint is overwritten (same size): `orch launch` must not call the run trained; the
    # job falls back to step 4 and trains steps 5 and 6 again.
    shard = sorted((ckpt / "global_step6").glob("*model_states.pt"))[0]
    shard.write_bytes(b"\0" * shard.stat().st_size)
    relaunch = subprocess.run([str(Path(sys.executable).parent / "orch"), "launch", str(run_dir), "--wait"],
                              capture_output=True, text=True, timeout=300, env=job_env())
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert "already trained" not in relaunch.stderr and "global_step6 is unusable" in relaunch.stderr
    assert "resume from global_step4" in relaunch.stderr
    assert [r["step"] for r in load_metrics(run_dir)] == list(range(1, 7))
    assert checkpoint.resume_choice(ckpt).step == 6
