"""Helpers for the tests of user programs under orch (examples/programs): run dirs with a program.json, and
the checks every observed run must pass."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import EXAMPLES

PROGRAMS = EXAMPLES / "programs"
DS_TRAIN = PROGRAMS / "ds_train.py"
HF_TRAIN = PROGRAMS / "hf_train.py"
ENTRY = {"ORCH_ENTRY": "orchestrator.programs"}     # until the launch scripts choose it from program.kind


def write_program(run_dir: Path, argv: list[str], *, log_format: str = "deepspeed") -> Path:
    """RUN_DIR/program.json as `orch generate` writes it for program.kind: script."""
    import hashlib

    script = Path(argv[0])
    (run_dir / "program.json").write_text(json.dumps({
        "kind": "script", "argv": [str(a) for a in argv], "cwd": None, "log_format": log_format,
        "script_path": str(script), "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest()}))
    return run_dir


def ds_argv(steps: int, *extra: str) -> list[str]:
    return [str(DS_TRAIN), "--deepspeed_config", "{run_dir}/ds_config.json", "--steps", str(steps), *extra]


def hf_argv(steps: int, *, lr: float, warmup: int, micro: int, accumulation: int) -> list[str]:
    """The HF Trainer's arguments that agree with orch's ds_config (the Trainer refuses a mismatch)."""
    return [str(HF_TRAIN), "--deepspeed", "{run_dir}/ds_config.json", "--output_dir", "{run_dir}/hf_output",
            "--use_cpu", "--max_steps", str(steps), "--per_device_train_batch_size", str(micro),
            "--gradient_accumulation_steps", str(accumulation), "--learning_rate", str(lr),
            "--adam_beta1", "0.9", "--adam_beta2", "0.95", "--adam_epsilon", "1e-8", "--weight_decay", "0.1",
            "--max_grad_norm", "1.0", "--warmup_steps", str(warmup), "--lr_scheduler_type", "cosine",
            "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--num_samples", "256"]


def assert_observed(records: list[dict], steps: int, *, pipeline: bool = False, loss: bool = True,
                    bubble_every_step: bool = True) -> None:
    """Every step once, with the throughput, FLOPs, MFU, all-reduce (and bubble) figures measured.
    ``bubble_every_step`` False: a pipeline's bubble need only be > 0 at the median step (two nodes sharing
    two cores with the daemons: a stage can be starved of its core for a whole step, which hides its idle
    time in one step's figure)."""
    assert [r["step"] for r in records] == list(range(1, steps + 1)), records
    for r in records:
        for key in ("tokens_per_s", "tflops_per_gpu", "mfu", "allreduce_time_s", "step_time_s", "mem_peak_bytes"):
            assert r[key] > 0, (key, r)
        if not pipeline:
            assert r["bubble_fraction"] == 0, r
        elif bubble_every_step:
            assert r["bubble_fraction"] > 0, r
        assert r["telemetry_source"]["step_time_s"].startswith("host wall clock"), r["telemetry_source"]
        assert (r["loss"] is not None) == loss, r
        assert r["lr"] >= 0 and r["world_size"] >= 2
    if pipeline:
        bubbles = sorted(r["bubble_fraction"] for r in records)
        assert bubbles[len(bubbles) // 2] > 0, bubbles
