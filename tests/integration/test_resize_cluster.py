"""Resize through the real local SLURM cluster and over pdsh: the conversion step runs inside the new job.

One source run trains on SLURM at ZeRO-2 dp 2 (2 nodes x 1 rank) to step 20, checkpointing at 10 and 20:
its losses of steps 11-20 are the unresized reference. Resized from its step-10 checkpoint to 1 node (dp 1,
a universal checkpoint), the new run's job converts as its own step on the first node, before the ranks
start, and continues: steps 11-20 recorded once each, with the source's losses; the source run's files stay
byte-identical; resized to ZeRO-1 pp 2 (one stage per node) it loads parameter by parameter (universal-params)
and continues the same way. A conversion that fails (the source checkpoint corrupted after the resize) fails the job
before any rank starts; that run dir sits under a directory named like a shell injection. (The converting
runs do not: DeepSpeed 0.19.8's ds_to_universal builds a regex from the output path unescaped, so a path
holding `$`, `(` or `)` fails there, outside orch's scripts.)
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.launch_support import HOSTILE, launch_env, make_run, no_pwned, orch, steps
from tests.integration.train_support import load_metrics
from tests.deadlines import scaled_s

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
pytest.importorskip("deepspeed")

SOURCE = {"training.train_iters": 20, "training.checkpoint.interval": 10}


def _digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def source(slurm_cluster, tmp_path_factory):
    """The trained source run dir, its losses by step, and its files' digests once it ended."""
    run = make_run(tmp_path_factory.mktemp("resize") / "runs", "source",
                   **{**SOURCE, "launch.slurm.partition": slurm_cluster.partition})
    env = launch_env(slurm_cluster.env)
    done = orch("launch", str(run), "--backend", "slurm", "--wait", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = {r["step"]: r["loss"] for r in load_metrics(run)}
    assert sorted(losses) == list(range(1, 21))
    return run, losses, _digests(run), env


def _resize(src: Path, out: Path, env: dict) -> Path:
    made = orch("resize", str(src), "--nodes", "1", "--gpus-per-node", "1", "--step", "10", "-o", str(out), env=env)
    assert made.returncode == 0, made.stderr
    assert json.loads((out / "resume.json").read_text())["conversion"]["changes"] == ["dp 2 -> 1"]
    return out


def _job_log(run: Path) -> str:
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    return (run / "logs" / f"slurm-{job_id}.out").read_text() + (run / "logs" / f"slurm-{job_id}.err").read_text()


def _continues(new: Path, losses: dict) -> None:
    assert steps(new) == list(range(11, 21))                  # after the source's 1-10: every step once
    for record in load_metrics(new):
        assert record["loss"] == pytest.approx(losses[record["step"]], rel=1e-3), record["step"]


def test_resized_run_converts_in_its_own_job_step_and_continues(source):
    src, losses, before, env = source
    new = _resize(src, src.parent / "resized", env)
    done = orch("launch", str(new), "--backend", "slurm", "--wait", env=env)
    log = _job_log(new)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{log[-4000:]}"
    # The conversion is step 0 of the job, on the first node, and done before step 1 starts the ranks.
    convert = re.search(r"^orch: step (\d+)\.0 on orch-n1: converting the checkpoint", log, re.M)
    assert convert, log[-4000:]
    assert "[orch-convert] converted" in log and "the checkpoint conversion step is done" in log
    assert f"starts torchrun --node_rank=0 (step {convert.group(1)}.1)" in log
    assert log.index("the checkpoint conversion step is done") < log.index("starts torchrun")
    _continues(new, losses)
    assert (new / "resume" / "universal" / "global_step10" / "orch_checkpoint.json").is_file()
    # A requeued start runs the step again: the run's own checkpoint wins, nothing is converted.
    rerun = subprocess.run([sys.executable, "-m", "orchestrator.train.convert", str(new)], env=env,
                           capture_output=True, text=True, timeout=scaled_s(60))
    assert rerun.returncode == 0 and "a checkpoint of its own (step 20)" in rerun.stderr, rerun.stderr
    assert _digests(src) == before                          # the source run is untouched


def test_resized_to_pp2_on_two_nodes_loads_parameter_by_parameter_and_continues(source):
    """ZeRO-2 dp 2 -> ZeRO-1 pp 2 (one stage per node; DeepSpeed's pipeline takes ZeRO 0-1) on SLURM: the universal-params load, after the same job step."""
    src, losses, before, env = source
    new = src.parent / "resized-pp2"
    made = orch("resize", str(src), "--nodes", "2", "--gpus-per-node", "1", "--pipeline", "2", "--zero-stage", "1", "--step", "10",
                "-o", str(new), env=env)
    assert made.returncode == 0, made.stderr
    conversion = json.loads((new / "resume.json").read_text())["conversion"]
    assert conversion["method"] == "universal-params" and "pp 1 -> 2" in conversion["changes"], conversion
    done = orch("launch", str(new), "--backend", "slurm", "--wait", env=env)
    log = _job_log(new)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{log[-4000:]}"
    assert log.index("the checkpoint conversion step is done") < log.index("starts torchrun")
    _continues(new, losses)
    assert _digests(src) == before


def _resized_copy(src: Path, parent: Path, env: dict) -> tuple[Path, Path]:
    """A copy of the source (its checkpoint to be broken) and a run dir resized from it, under ``parent``."""
    copy = Path(shutil.copytree(src, parent / "source-copy", ignore=shutil.ignore_patterns("job.json")))
    return copy, _resize(copy, parent / "resized-broken", env)


def test_a_failing_conversion_fails_the_job_before_any_rank_starts(source, tmp_path):
    src, _, before, env = source
    copy, new = _resized_copy(src, tmp_path / HOSTILE, env)
    victim = max((copy / "checkpoints" / "global_step10").glob("*.pt"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))                          # same size, other bytes: the manifest catches it
    done = orch("launch", str(new), "--backend", "slurm", "--wait", env=env)
    log = _job_log(new)
    assert done.returncode == 1, f"{done.stderr[-2000:]}\n{log[-4000:]}"
    assert "orch-convert: error: source checkpoint" in log and "sha256 differs" in log
    assert "the checkpoint conversion step failed with exit code 1; no rank started" in log
    assert "starts torchrun" not in log and not (new / "metrics.jsonl").exists()
    assert not (new / "resume" / "universal").exists()       # nothing half-written
    status = orch("status", str(new), "--json", env=env)
    assert json.loads(status.stdout)["state"] == "FAILED"
    assert _digests(src) == before
    assert not no_pwned(tmp_path)


@pytest.mark.pdsh
def test_over_pdsh_the_first_host_converts_before_the_ranks_start(source, ssh_hosts):
    src, losses, before, _ = source
    env = launch_env(ssh_hosts.env)
    new = _resize(src, src.parent / "resized-pdsh", env)
    done = orch("launch", str(new), "--backend", "pdsh", "--wait", env=env)
    log = (new / "logs" / "launch.log").read_text()
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{log[-4000:]}"
    assert "orch: converting the checkpoint of the resized run on orch-n1 before any rank starts" in log
    assert re.search(r"^orch-n1: \[orch-convert\] converted", log, re.M), log[-4000:]
    assert log.index("orch: the checkpoint conversion is done") < log.index("orch-n1: [rank0]:")
    _continues(new, losses)
    assert _digests(src) == before


@pytest.mark.pdsh
def test_over_pdsh_a_failing_conversion_fails_the_job_on_the_first_host(source, ssh_hosts, tmp_path):
    src, _, before, _ = source
    env = launch_env(ssh_hosts.env)
    copy, new = _resized_copy(src, tmp_path / HOSTILE, env)
    (copy / "checkpoints" / "global_step10" / "orch_checkpoint.json").unlink()
    done = orch("launch", str(new), "--backend", "pdsh", "--wait", env=env)
    log = (new / "logs" / "launch.log").read_text()
    assert done.returncode == 1, f"{done.stderr[-2000:]}\n{log[-4000:]}"
    assert "orch-n1: orch-convert: error: source checkpoint" in log and "incomplete" in log
    assert "failed with exit code 1; no rank started" in log and "[rank0]" not in log
    result = json.loads((new / "logs" / "pdsh_result.json").read_text())
    assert (result["state"], result["failed_host"], result["exit_code"]) == ("FAILED", "orch-n1", 1)
    assert not (new / "metrics.jsonl").exists()
    assert _digests(src) == before
    assert not no_pwned(tmp_path)
