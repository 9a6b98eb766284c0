"""Where step records go. Every sink has the same two methods: ``write(record)`` and ``close(...)``.

- :class:`JsonlSink`: ``metrics.jsonl`` in the run dir, one JSON object per line, flushed every step
  (a killed job keeps every step it finished). :func:`truncate_metrics` drops the records after a
  checkpoint when a job resumes, so the file ends up with each step exactly once.
- :class:`ConsoleSink`: one progress line per step on stdout, the line ``orch launch --wait`` streams.
- :class:`~orchestrator.telemetry.wandb_sink.WandbSink`: one W&B run per job.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Protocol, TextIO

from .record import MetricsRecord

METRICS_FILE = "metrics.jsonl"
PROGRESS_PREFIX = "[orch-train]"


class Sink(Protocol):
    def write(self, record: MetricsRecord) -> None: ...

    def close(self, *, exit_code: int = 0) -> None: ...


def record_dict(record: MetricsRecord) -> dict:
    """The record as JSON-ready data (non-finite floats become null, as JSON has no NaN)."""
    out = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        out[f.name] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


class JsonlSink:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: MetricsRecord) -> None:
        self._file.write(json.dumps(record_dict(record), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self, *, exit_code: int = 0) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The complete records of a metrics.jsonl (a torn last line from a killed job is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Keep only records with step <= last_step (atomically); returns how many were dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    records = read_metrics(path)
    kept = [r for r in records if isinstance(r.get("step"), int) and r["step"] <= last_step]
    dropped = len(path.read_text(encoding="utf-8").splitlines()) - len(kept)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def progress_line(record: MetricsRecord, total_steps: int) -> str:
    """`[orch-train] step 12/50 loss 4.3121 tokens/s 5120 tflops/gpu 0.0321 mfu 32.1% bubble 0.0%
    allreduce 12.3% mem 512 MiB`"""
    r = record
    return (f"{PROGRESS_PREFIX} step {r.step}/{total_steps} loss {r.loss:.4f} tokens/s {r.tokens_per_s:.0f} "
            f"tflops/gpu {r.tflops_per_gpu:.4f} mfu {100 * r.mfu:.1f}% bubble {100 * r.bubble_fraction:.1f}% "
            f"allreduce {100 * r.allreduce_overhead:.1f}% mem {r.mem_peak_bytes / 2**20:.0f} MiB")


class ConsoleSink:
    def __init__(self, total_steps: int, stream: TextIO | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout

    def write(self, record: MetricsRecord) -> None:
        print(progress_line(record, self.total_steps), file=self.stream, flush=True)

    def close(self, *, exit_code: int = 0) -> None:
        self.stream.flush()
