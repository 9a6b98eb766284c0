"""User programs under orch, for real (CPU, gloo): examples/programs/ds_train.py (DeepSpeed's tutorial style;
ZeRO-1, -2, -3 and a PipelineModule with pp = 2) and hf_train.py (the Hugging Face Trainer with --deepspeed),
each started by `orch launch --wait` as `python -m orchestrator.programs RUN_DIR` on every rank, observed by
the telemetry wrapper without a line of them changed.

Checks: metrics.jsonl and the W&B offline run carry per-step tokens/s, TFLOP/s, MFU and all-reduce time (bubble
for the pipeline); the wrapper's all-reduce and step times agree with torch.profiler's over the same steps
(within 10%); orch compare / calibrate take such a run beside one of orch's own trainer; a SIGTERM reaches the
script and the attempt is recorded. The SLURM and pdsh backends run every variant (test_programs_cluster.py).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.program_support import ENTRY, assert_observed, ds_argv, hf_argv, write_program
from tests.integration.train_support import descendants, job_env, load_metrics, make_run_dir, read_wandb_history, train
from tests.conftest import run_cli

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

ORCH = str(Path(sys.executable).parent / "orch")
STEPS = 6
COMMON = {"training.train_iters": STEPS, "training.checkpoint.interval": STEPS, "training.optimizer.lr": 3e-3,
          "training.lr_schedule.warmup_iters": 1}


def launch(run: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([ORCH, "launch", str(run), "--wait"], capture_output=True, text=True,
                          env=job_env(**ENTRY), timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def program_run(path: Path, argv: list[str] | None, *, log_format: str = "deepspeed", wandb: str = "disabled",
                **overrides) -> Path:
    run = make_run_dir(path, planned=True, **{**COMMON, "tracking.wandb.mode": wandb, **overrides})
    return write_program(run, argv, log_format=log_format) if argv else run


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory) -> Path:
    """ZeRO-2, W&B offline, torch.profiler on in the script: trained once for several tests. The model is
    widened (h 256: 13 MB per gradient all-reduce) so that a collective's fixed costs (a thread's wake-up on a
    loaded machine) do not dominate the comparison with the profiler."""
    root = tmp_path_factory.mktemp("programs")
    run = program_run(root / "z2", ds_argv(STEPS, "--profile", "{run_dir}/profile", "--hidden-size", "256"),
                      wandb="offline", **{"parallelism.zero_stage": 2, "model.hidden_size": 256})
    launch(run)
    return run


def test_zero2_script_metrics_and_wandb_run(zero2_run):
    records = load_metrics(zero2_run)
    assert_observed(records, STEPS)
    assert all(r["comm_bytes"] > 0 and r["grad_norm"] > 0 for r in records)
    assert records[0]["telemetry_source"]["loss"].startswith("deepspeed engine.backward")
    history, summary = read_wandb_history(zero2_run)
    assert [int(h["step"]) for h in history] == list(range(1, STEPS + 1))
    for row, record in zip(history, records):
        for key in ("tokens_per_s", "tflops_per_gpu", "mfu", "allreduce_time_s"):
            assert row[key] == pytest.approx(record[key]) and row[key] > 0, key
    chosen = json.loads((zero2_run / "plan.json").read_text())["chosen"]
    assert summary["summary"]["predicted/tokens_per_s"] == pytest.approx(chosen["tokens_per_s"])
    status = json.loads((zero2_run / "train_status.json").read_text())
    assert (status["state"], status["exit_code"], status["step"]) == ("finished", 0, STEPS)


def _ranges(trace: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Per step of one rank's trace: (the script's own 'train_step N' range, s; time in gloo all-reduces of
    the program's groups, s). A gloo thread that ran the wrapper's own reduction (inside 'orch-telemetry')
    belongs to the wrapper's side group and is left out."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = {int(e["name"].split()[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("train_step ")}
    ours = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "orch-telemetry"]
    reduces = [e for e in events if e["name"] == "gloo:all_reduce"]
    side = {e["tid"] for e in reduces if any(a <= e["ts"] <= b for a, b in ours)}
    comm = dict.fromkeys(steps, 0.0)
    for e in reduces:
        if e["tid"] not in side:
            for step, (a, b) in steps.items():
                if a <= e["ts"] < b:
                    comm[step] += e["dur"] / 1e6
    return {s: (b - a) / 1e6 for s, (a, b) in steps.items()}, comm


def test_wrapper_agrees_with_torch_profiler(zero2_run):
    """Independent measurement: torch.profiler, started by the script itself, over the same steps (2..N; step
    1 starts at different points): the slowest rank's step time and all-reduce time within 10%."""
    records = {r["step"]: r for r in load_metrics(zero2_run)}
    per_rank = [_ranges(zero2_run / "profile" / f"trace-rank{rank}.json") for rank in (0, 1)]
    steps = range(2, STEPS + 1)
    profiled_step = sum(max(rank[0][s] for rank in per_rank) for s in steps)
    profiled_comm = sum(max(rank[1][s] for rank in per_rank) for s in steps)
    wrapper_step = sum(records[s]["step_time_s"] for s in steps)
    wrapper_comm = sum(records[s]["allreduce_time_s"] for s in steps)
    assert profiled_comm > 0
    print(f"steps 2-{STEPS}: step time wrapper {wrapper_step:.4f} s, profiler {profiled_step:.4f} s; all-reduce "
          f"wrapper {wrapper_comm:.4f} s, profiler {profiled_comm:.4f} s")
    assert wrapper_step == pytest.approx(profiled_step, rel=0.10), (wrapper_step, profiled_step)
    assert wrapper_comm == pytest.approx(profiled_comm, rel=0.10), (wrapper_comm, profiled_comm)


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_stage_script(stage, tmp_path):
    run = program_run(tmp_path / f"z{stage}", ds_argv(STEPS), **{"parallelism.zero_stage": stage})
    launch(run)
    records = load_metrics(run)
    assert_observed(records, STEPS)
    if stage == 3:     # ZeRO-3 gathers parameters before each use
        assert all(r["allgather_time_s"] > 0 for r in records)


def test_pipeline_script_pp2_dp2(tmp_path):
    """PipelineModule over 2 stages x 2 data-parallel replicas (4 processes): bubble and all-reduce > 0."""
    run = program_run(tmp_path / "pipe", ds_argv(4, "--pipeline-parallel-size", "2"),
                      **{"training.train_iters": 4, "cluster.gpus_per_node": 4, "parallelism.pipeline": 2,
                         "parallelism.zero_stage": 1})
    launch(run)
    records = load_metrics(run)
    assert_observed(records, 4, pipeline=True)
    assert all(r["other_comm_time_s"] > 0 for r in records)            # the stages' send/recv
    assert records[0]["telemetry_source"]["compute_time_s"].startswith("deepspeed pipeline instructions")
    assert records[0]["telemetry_source"]["loss"].startswith("deepspeed PipelineEngine.train_batch")


def test_hf_trainer_script(tmp_path):
    run = program_run(tmp_path / "hf", None, wandb="offline")
    config = json.loads((run / "ds_config.json").read_text())
    write_program(run, hf_argv(STEPS, lr=3e-3, warmup=1, micro=config["train_micro_batch_size_per_gpu"],
                               accumulation=config["gradient_accumulation_steps"]), log_format="hf")
    launch(run)
    records = load_metrics(run)
    assert_observed(records, STEPS)
    logged = re.findall(r"\{'loss': '([0-9.]+)'", (run / "logs" / "launch.log").read_text())
    # the loss the Trainer logs (rank 0's) is the one the wrapper picked up from DeepSpeed (mean over ranks)
    assert [float(v) for v in logged] == pytest.approx([r["loss"] for r in records], rel=0.1)
    history, _ = read_wandb_history(run)
    assert len(history) == STEPS and all(h["tokens_per_s"] > 0 for h in history)


def test_compare_and_calibrate_beside_the_orch_trainer(zero2_run, tmp_path, capsys):
    own = make_run_dir(tmp_path / "orch", planned=True, **COMMON, **{"parallelism.zero_stage": 2,
                                                                     "model.hidden_size": 256,
                                                                     "tracking.wandb.mode": "offline"})
    train(own)
    code, out, err = run_cli(["compare", str(zero2_run), str(own), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["diff"] == {"layout": [], "spec": []}          # the same spec: only the program differs
    for run in data["runs"]:
        assert run["steps"]["recorded"] == STEPS
        assert run["measured"]["tokens_per_s"] > 0 and run["measured"]["allreduce_time_s"] > 0
    calib = tmp_path / "calib.json"
    code, out, err = run_cli(["calibrate", str(zero2_run), str(own), "-o", str(calib)], capsys)
    assert code == 0, err
    assert json.loads(calib.read_text())["cluster"]["gpu"] == "cpu"


def test_sigterm_reaches_the_script_and_the_attempt_is_recorded(tmp_path):
    """SIGTERM to the job (torchrun forwards it, as on preemption): the script, which handles no signal, ends
    by it as it would without orch; the steps it finished are in metrics.jsonl and train_status.json says so."""
    run = program_run(tmp_path / "long", ds_argv(100_000), **{"training.train_iters": 100_000})
    started = subprocess.run([ORCH, "launch", str(run)], capture_output=True, text=True, env=job_env(**ENTRY),
                             timeout=120)
    assert started.returncode == 0, started.stderr
    job = int(json.loads((run / "job.json").read_text())["job_id"])
    try:
        deadline = time.monotonic() + 180
        while len(load_metrics(run)) < 2:
            assert time.monotonic() < deadline, (run / "logs" / "launch.log").read_text()[-3000:]
            time.sleep(0.2)
        torchrun = [p for p in descendants(job) if b"torch.distributed.run" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(torchrun[0], signal.SIGTERM)          # torchrun passes it to every rank
        deadline = time.monotonic() + 120
        while not (run / "logs" / "exitcode").is_file():
            assert time.monotonic() < deadline, (run / "logs" / "launch.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for pid in descendants(job):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    status = json.loads((run / "train_status.json").read_text())
    assert status["state"] == "preempted" and status["signal"] == "SIGTERM", status
    assert status["exit_code"] == 128 + signal.SIGTERM and status["step"] >= 2
    records = load_metrics(run)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert int((run / "logs" / "exitcode").read_text()) != 0
    state = json.loads(subprocess.run([ORCH, "status", str(run), "--json"], capture_output=True, text=True,
                                      env=job_env(), timeout=60).stdout)["state"]
    assert state in ("FAILED", "PREEMPTED", "CANCELLED"), state
