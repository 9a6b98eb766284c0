"""MoE with expert parallelism 2 and DeepSpeed-Ulysses context parallelism 2, trained for real through
`orch launch --wait` on 2 CPU processes (gloo all-to-all), then resumed from a mid-run checkpoint.

MoE: every step's record carries alltoall_time_s > 0, expert_load_imbalance >= 1, a dropped fraction (the
test spec caps expert capacity at 1.0) and the aux loss, in metrics.jsonl, in the offline W&B run and in
`orch compare`; the checkpoint holds one file per expert (DeepSpeed-MoE's layout). Both: resuming from the
step-2 checkpoint reproduces the uninterrupted run's losses, so expert and dense state come back exactly.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.train import checkpoint
from tests.integration.train_support import job_env, load_metrics, make_run_dir, read_wandb_history, train
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

ORCH = str(Path(sys.executable).parent / "orch")
STEPS = 4
COMMON = {"training.train_iters": STEPS, "training.checkpoint.interval": 2, "training.engine": "deepspeed",
          "training.optimizer.lr": 3e-3, "training.lr_schedule.warmup_iters": 1, "tracking.wandb.mode": "disabled"}
CASES = {
    "moe-ep2": {"model.preset": "tiny-moe", "model.num_layers": 2,
                "model.moe": {"first_dense_layers": 1, "capacity_factor": 1.0},
                "parallelism.expert": 2, "parallelism.expert_tensor": 1, "tracking.wandb.mode": "offline"},
    "ulysses-cp2": {"parallelism.context": 2, "training.global_batch_size": 4},
}
MOE_FIELDS = ("expert_load_imbalance", "tokens_dropped_fraction", "moe_aux_loss")


def launch_wait(run_dir: Path) -> str:
    result = subprocess.run([ORCH, "launch", str(run_dir), "--wait"], capture_output=True, text=True,
                            env=job_env(), timeout=scaled_s(300))
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def resume_from(reference: Path, copy: Path, step: int) -> list[dict]:
    """A copy of the finished run with its checkpoints after ``step`` removed (resume takes the newest intact
    one, whatever ``latest`` says), trained to the end again."""
    shutil.copytree(reference, copy, ignore=shutil.ignore_patterns("wandb", "logs", "job.json"))
    ckpt = checkpoint.checkpoint_dir(copy, _spec(copy))
    for later in (s for s in checkpoint.saved_steps(ckpt) if s > step):
        shutil.rmtree(ckpt / checkpoint.tag_for(later))
    checkpoint.write_latest(ckpt, step)
    proc = train(copy, env=job_env(WANDB_MODE="disabled"))
    assert f"(step {step}); dropped {STEPS - step} metrics record(s)" in proc.stderr
    return load_metrics(copy)


@pytest.mark.parametrize("case", sorted(CASES))
def test_trains_through_orch_launch_and_resumes(tmp_path, case):
    reference = make_run_dir(tmp_path / "reference", **{**COMMON, **CASES[case]})
    out = launch_wait(reference)
    assert f"step {STEPS}/{STEPS}" in out
    records = load_metrics(reference)                        # validated against metrics.schema.json
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["alltoall_time_s"] > 0 for r in records)    # dispatch/combine or sequence/head exchanges
    info = json.loads((reference / "train_info.json").read_text())
    if case.startswith("moe"):
        _check_moe(reference, records, info)
    else:
        assert info["layout"].startswith("tp1-cp2-") and all(r[k] is None for r in records for k in MOE_FIELDS)

    resumed = resume_from(reference, tmp_path / "resumed", 2)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    for r, expected in zip(resumed, records):
        assert r["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-4), r["step"]
        if case.startswith("moe"):
            assert r["expert_load_imbalance"] == pytest.approx(expected["expert_load_imbalance"]), r["step"]


def _check_moe(run_dir: Path, records: list[dict], info: dict) -> None:
    assert "-ep2-" in info["layout"]
    for r in records:
        assert r["expert_load_imbalance"] >= 1.0
        assert 0.0 <= r["tokens_dropped_fraction"] < 1.0
        assert r["moe_aux_loss"] > 0
    assert any(r["tokens_dropped_fraction"] > 0 for r in records)   # capacity 1.0 with an imbalanced router
    tag = checkpoint.tag_for(STEPS)
    files = sorted(p.name for p in (checkpoint.checkpoint_dir(run_dir, _spec(run_dir)) / tag).glob("layer_*"))
    assert files == [f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(4)]   # one MoE layer, 4 experts
    history, _ = read_wandb_history(run_dir)
    logged = [row for row in history if "alltoall_time_s" in str(row)]
    assert len(logged) == STEPS and all("expert_load_imbalance" in str(row) for row in logged)
    shown = subprocess.run([ORCH, "compare", str(run_dir)], capture_output=True, text=True, env=job_env(), timeout=scaled_s(120))
    assert shown.returncode == 0, shown.stderr
    assert all(name in shown.stdout for name in ("all-to-all s", "expert load imbalance", "tokens dropped",
                                                 "MoE aux loss"))


def _spec(run_dir: Path):
    from orchestrator.rundir import read_run_dir

    return read_run_dir(run_dir).spec
