"""The reference trainer for real: DeepSpeed on CPU, 2 processes on gloo (torchrun), tiny GPTs, few steps.

Covers ZeRO 0-3 (fp32, and bf16 + optimizer offload at stage 3) with falling loss, the ZeRO-3 shard per
rank, the measured pipeline bubble against (p-1)/(m+p-1), the all-reduce overhead with dp=2 and dp=1,
metrics.jsonl against its schema, and the W&B offline run read back with wandb's reader.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.train_support import (SHARED_RUN_STEPS, assert_loss_falls, job_env, load_metrics,
                                             make_run_dir, read_wandb_history, train)
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

FAST = {"training.optimizer.lr": 3e-3, "training.lr_schedule.warmup_iters": 1,
        "training.train_iters": SHARED_RUN_STEPS, "tracking.wandb.mode": "disabled"}
FAKE_KEY = "0123456789abcdef0123456789abcdefORCHFAKE"


def _info(run_dir) -> dict:
    return json.loads((run_dir / "train_info.json").read_text())


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_zero_stage_trains_fp32(tmp_path, stage, request):
    """ZeRO-1 and ZeRO-3: the session's shared runs (conftest.zero_stage_runs, also compared and calibrated by
    test_compare_real.py); ZeRO-0 trained here, as many steps."""
    if stage in (1, 3):
        run_dir = request.getfixturevalue("zero_stage_runs")[stage]
    else:
        run_dir = make_run_dir(tmp_path / "run", **FAST, **{"parallelism.zero_stage": stage})
        train(run_dir)
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, SHARED_RUN_STEPS + 1))
    assert_loss_falls(records)
    assert all(r["allreduce_overhead"] > 0 and r["allreduce_time_s"] > 0 for r in records)   # dp = 2
    assert all(r["bubble_fraction"] == 0 and r["comm_bytes"] > 0 for r in records)
    shards = [rank["param_shard_fraction"] for rank in _info(run_dir)["ranks"]]
    assert shards == pytest.approx([0.5, 0.5] if stage == 3 else [1.0, 1.0], abs=0.005)


def test_zero3_bf16_with_optimizer_offload(tmp_path):
    run_dir = make_run_dir(tmp_path / "run", **FAST, **{"parallelism.zero_stage": 3, "training.precision": "bf16",
                                                        "parallelism.offload": "optimizer"})
    train(run_dir)
    records = load_metrics(run_dir)
    assert_loss_falls(records)
    info = _info(run_dir)
    assert [r["param_shard_fraction"] for r in info["ranks"]] == pytest.approx([0.5, 0.5], abs=0.005)
    assert sum(r["local_param_numel"] for r in info["ranks"]) >= info["param_count"]


@pytest.fixture(scope="module")
def zero2_wandb_run(tmp_path_factory):
    """ZeRO-2 fp32 on 2 processes, planned (predictions in plan.json), W&B offline, a fake API key set."""
    run_dir = make_run_dir(tmp_path_factory.mktemp("z2") / "run", planned=True,
                           **{**FAST, "tracking.wandb.mode": "offline", "training.train_iters": 12,
                              "training.checkpoint.interval": 4})
    proc = train(run_dir, env=job_env(WANDB_API_KEY=FAKE_KEY, WANDB_MODE=None))
    return run_dir, proc


def test_zero2_trains_and_metrics_validate(zero2_wandb_run):
    run_dir, proc = zero2_wandb_run
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert_loss_falls(records)
    for r in records:
        assert r["allreduce_overhead"] == pytest.approx(r["allreduce_time_s"] / r["step_time_s"])
        assert 0 < r["comm_exposed_s"] <= r["allreduce_time_s"] + 1e-9
        assert r["tokens_per_s"] == pytest.approx(8 * 128 / r["step_time_s"])
        assert r["mem_peak_bytes"] > 2**20 and r["grad_norm"] > 0 and r["world_size"] == 2
    assert sum("[orch-train] step " in line for line in proc.stdout.splitlines()) == 12


def test_wandb_offline_run_matches_metrics(zero2_wandb_run):
    run_dir, _ = zero2_wandb_run
    records = {r["step"]: r for r in load_metrics(run_dir)}
    history, summary = read_wandb_history(run_dir)
    assert sorted(row["step"] for row in history) == sorted(records)
    for row in history:
        record = records[row["step"]]
        for name, value in record.items():
            if value is None:
                assert row.get(name) is None
            elif isinstance(value, str):       # e.g. slowest_host
                assert row[name] == value, name
            else:
                assert row[name] == pytest.approx(value, rel=1e-12), name
    assert summary["name"] == "tiny" and summary["project"] == "orch"
    assert "tp1-pp1-dp2-z2-mb2" in summary["tags"]
    config = summary["config"]
    assert config["spec"]["name"] == "tiny" and config["layout"] == "tp1-pp1-dp2-z2-mb2"
    assert config["plan"]["dp"] == 2
    predicted = {k: v for k, v in summary["summary"].items() if k.startswith("predicted/")}
    assert predicted["predicted/step_time_s"] == pytest.approx(config["plan"]["step_time_s"])
    assert {"predicted/tokens_per_s", "predicted/mfu", "predicted/bubble_fraction"} <= set(predicted)
    assert all(config[k] == v for k, v in predicted.items())


def test_wandb_api_key_is_written_nowhere(zero2_wandb_run):
    run_dir, proc = zero2_wandb_run
    assert FAKE_KEY not in proc.stdout + proc.stderr
    checked = 0
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path
            checked += 1
    assert checked > 10 and list(run_dir.glob("wandb/offline-run-*/logs/debug*.log"))


def test_pipeline_bubble_matches_1f1b(tmp_path):
    """pp=2, m=4 micro-batches: the measured bubble is within 0.15 of (p-1)/(m+p-1) = 0.2.

    Stages are widened (h 512) so that a micro-batch's forward/backward (tens of ms) dominates the fixed
    per-step work. The comparison uses the least disturbed step after the first: on a shared 2-core
    machine another process descheduling one stage shows up as the other stage waiting (idle), which
    inflates single steps, never deflates them.
    """
    run_dir = make_run_dir(tmp_path / "run", **{**FAST, "training.train_iters": 7, "parallelism.pipeline": 2,
                                                "parallelism.zero_stage": 1, "model.hidden_size": 512,
                                                "model.num_attention_heads": 8})
    train(run_dir)
    records = load_metrics(run_dir)
    p, m = 2, 8 // 2
    expected = (p - 1) / (m + p - 1)
    steady = [r["bubble_fraction"] for r in records[1:]]                  # step 1 includes warm-up
    assert all(0 < b < 1 for b in steady)
    assert abs(min(steady) - expected) <= 0.15, steady
    assert all(r["bubble_fraction_mean"] <= r["bubble_fraction"] + 1e-12 for r in records)
    assert all(r["allreduce_time_s"] == 0 and r["allreduce_overhead"] == 0 for r in records)    # dp = 1
    assert all(r["other_comm_time_s"] > 0 for r in records)                                      # p2p
    assert [rank["layers"] for rank in _info(run_dir)["ranks"]] == [[0, 4], [4, 8]]
    assert_loss_falls(records, margin=0.1)


def test_uneven_pipeline_split_places_exact_layer_counts_and_trains(tmp_path):
    """tiny-gpt with 5 layers on pp=2 as first 2 + last 3 (Megatron: with no middle stage first + last must
    be num_layers). DeepSpeed's partition methods cannot express it; orch's PipelineModule subclass must
    put the embeddings + 2 blocks on stage 0 and 3 blocks + final norm + output on stage 1."""
    run_dir = make_run_dir(tmp_path / "run", **{**FAST, "training.train_iters": 8, "model.num_layers": 5,
                                                "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                                "parallelism.first_stage_layers": 2,
                                                "parallelism.last_stage_layers": 3})
    train(run_dir)
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [rank["layers"] for rank in _info(run_dir)["ranks"]] == [[0, 4], [4, 9]]   # 2 + 2 blocks, 3 + 2
    assert_loss_falls(records, margin=0.1)


def test_single_process_has_no_allreduce(tmp_path):
    """dp = 1 in one process, started without torchrun."""
    run_dir = make_run_dir(tmp_path / "run", **{**FAST, "cluster.gpus_per_node": 1, "parallelism.zero_stage": 0,
                                                "training.train_iters": 6})
    proc = subprocess.run([sys.executable, "-m", "orchestrator.train", str(run_dir)], cwd=ROOT, env=job_env(),
                          capture_output=True, text=True, timeout=scaled_s(300))
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = load_metrics(run_dir)
    assert len(records) == 6
    assert all(r["allreduce_time_s"] == 0 and r["allreduce_overhead"] == 0 and r["comm_exposed_s"] == 0
               for r in records)
    assert all(math.isfinite(r["loss"]) and r["world_size"] == 1 for r in records)


def test_pipeline_llama_shape_with_full_recompute(tmp_path):
    """GQA, SwiGLU, RMSNorm, rope, untied output, bf16 and activation checkpointing through the pipeline."""
    run_dir = make_run_dir(tmp_path / "run", **{**FAST, "training.train_iters": 4, "parallelism.pipeline": 2,
                                                "parallelism.zero_stage": 0, "parallelism.recompute": "full",
                                                "training.precision": "bf16", "model.gated_mlp": True,
                                                "model.num_query_groups": 2, "model.normalization": "rmsnorm",
                                                "model.position_embedding": "rope", "model.tie_embeddings": False,
                                                "model.add_bias_linear": False})
    train(run_dir)
    records = load_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["loss"] < records[0]["loss"] and all(0 < r["bubble_fraction"] < 1 for r in records)
    assert all(r["hfu"] > r["mfu"] for r in records)          # full recompute: hardware FLOPs > model FLOPs


TEARDOWN_ABORT = """\
import atexit, os, sys

def _abort_in_teardown():     # what a C++ destructor's std::terminate does to a finished rank (ENV-NOTES.md)
    if "orchestrator.train.trainer" in sys.modules:
        os.abort()

atexit.register(_abort_in_teardown)
"""


def test_a_finished_run_exits_0_whatever_the_interpreter_teardown_does(tmp_path):
    """A rank that finished leaves with os._exit (orchestrator/train/__main__.py): an abort in the interpreter's
    teardown (here an atexit hook that calls abort(), as gloo's and DeepSpeed's threads can in their static
    destructors) no longer turns a finished run into a failed one. The hook is shown to fire in a process that
    imports the trainer and exits the ordinary way."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TEARDOWN_ABORT)
    env = job_env()
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{env['PYTHONPATH']}"
    control = subprocess.run([sys.executable, "-c", "import orchestrator.train.trainer"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=scaled_s(120))
    assert control.returncode == -signal.SIGABRT, control.stderr[-2000:]
    run_dir = make_run_dir(tmp_path / "run", **{**FAST, "cluster.gpus_per_node": 1, "parallelism.zero_stage": 0,
                                                "training.train_iters": 3})
    proc = subprocess.run([sys.executable, "-m", "orchestrator.train", str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=scaled_s(300))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["step"] for r in load_metrics(run_dir)] == [1, 2, 3]
    assert json.loads((run_dir / "train_status.json").read_text())["state"] == "finished"
