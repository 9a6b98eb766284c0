"""Resize for real: a tiny-gpt-cpu run (2 procs, ZeRO-2 dp 2), resized from its step-4 checkpoint to 1
process (dp 1) through DeepSpeed's universal checkpoint, continues to the last step as the source did.

The source trains to the end (steps 1-6, checkpoints 4 and 6): its losses of steps 5-6 are the unresized
reference. The conversion runs in `orch launch`'s path before torchrun, the source run's files stay
byte-identical, the resized run records steps 5-6 once each, and their losses are the unresized run's (same
weights, optimizer state and samples; only the reduction order differs).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.deadlines import scaled_s
from tests.integration.train_support import JOB_TIMEOUT_S, job_env, load_metrics, train

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

ORCH = str(Path(sys.executable).parent / "orch")


def _orch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *args], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                          timeout=scaled_s(JOB_TIMEOUT_S))


def _digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_resized_run_continues_where_the_source_stopped(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "tiny-gpt-cpu.yaml").read_text())
    data["training"].update(train_iters=6, checkpoint={"dir": "checkpoints", "interval": 4})
    data["tracking"] = {"wandb": {"mode": "disabled"}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    source = tmp_path / "src"
    assert _orch("generate", str(spec), "-o", str(source)).returncode == 0
    train(source)
    expected = {r["step"]: r["loss"] for r in load_metrics(source)}
    assert sorted(expected) == list(range(1, 7))
    before = _digests(source)

    new = tmp_path / "resized"
    out = _orch("resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "--step", "4", "-o", str(new))
    assert out.returncode == 0, out.stderr
    resume = json.loads((new / "resume.json").read_text())
    assert resume["source_step"] == 4 and resume["conversion"]["changes"] == ["dp 2 -> 1"]

    convert = subprocess.run([sys.executable, "-m", "orchestrator.train.convert", str(new)], cwd=ROOT, env=job_env(),
                             capture_output=True, text=True, timeout=scaled_s(JOB_TIMEOUT_S))
    assert convert.returncode == 0 and "[orch-convert] converted" in convert.stderr, convert.stderr[-3000:]
    converted = new / "resume" / "universal" / "global_step4"
    assert (converted / "orch_checkpoint.json").is_file() and (converted / "zero").is_dir()

    launched = _orch("launch", str(new), "--wait")          # runs the conversion step again: reused
    log = (new / "logs" / "launch.log").read_text()
    assert launched.returncode == 0, f"{launched.stderr[-3000:]}\n{log[-6000:]}"
    assert "[orch-convert] converted checkpoint" in log and "verifies: reused" in log
    assert "resized run: resumed from" in log and "(universal, step 4)" in log

    assert _digests(source) == before                      # the source run is untouched
    assert [r["step"] for r in load_metrics(new)] == [5, 6]       # after the source's 1-4: every step once
    assert json.loads((new / "train_info.json").read_text())["start_step"] == 4
    status = _orch("status", str(new))
    assert f"resized continuation of {source.resolve()} from step 4" in status.stdout, status.stdout
    for record in load_metrics(new):
        assert record["loss"] == pytest.approx(expected[record["step"]], rel=1e-3), record["step"]
