"""Synthetic run dirs for the compare/calibrate unit tests: real plan.json, made-up metrics.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import spec_data

GBS, SEQ, WORLD = 8, 128, 2


def record(step: int, step_time_s: float, *, compute_s: float | None = None, allreduce_s: float = 0.01,
           exposed_s: float | None = None, bubble: float = 0.0, mem: int = 100 * 2**20, flops: float = 1e10,
           peak: float = 1e11) -> dict:
    """A metrics record following schemas/metrics.schema.json, with consistent derived fields."""
    compute_s = 0.8 * step_time_s if compute_s is None else compute_s
    exposed_s = allreduce_s if exposed_s is None else exposed_s
    tflops = flops / (step_time_s * WORLD) / 1e12
    return {"step": step, "time_unix": 1.8e9 + step, "loss": 6.0 - 0.1 * step, "step_time_s": step_time_s,
            "tokens_per_s": GBS * SEQ / step_time_s, "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / peak,
            "bubble_fraction": bubble, "allreduce_time_s": allreduce_s, "allreduce_overhead": allreduce_s / step_time_s,
            "comm_exposed_s": exposed_s, "mem_peak_bytes": mem, "lr": 1e-3, "grad_norm": 1.0,
            "bubble_fraction_mean": bubble, "hfu": tflops * 1e12 / peak, "compute_time_s": compute_s,
            "allgather_time_s": 0.0, "other_comm_time_s": 0.0, "comm_bytes": 1000, "allreduce_busbw_GBps": 0.1,
            "world_size": WORLD}


def write_metrics(run_dir: Path, records: list[dict]) -> Path:
    path = Path(run_dir) / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_run_dir(path: Path, records: list[dict] | None = None, **overrides) -> Path:
    """A planned run dir of spec_data(**overrides) (predictions in plan.json) with ``records`` as metrics."""
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir
    from orchestrator.spec_loader import parse_spec

    out = write_run_dir(build_plan(parse_spec(spec_data(**overrides))), path)
    if records is not None:
        write_metrics(out, records)
    return out


def steady(num_steps: int, step_time_s: float, warm_factor: float = 3.0, **kw) -> list[dict]:
    """num_steps records: the first three slower (warm-up), then step_time_s growing slowly."""
    out = []
    for step in range(1, num_steps + 1):
        t = step_time_s * (warm_factor if step <= 3 else 1 + 0.01 * step)
        out.append(record(step, t, **kw))
    return out
