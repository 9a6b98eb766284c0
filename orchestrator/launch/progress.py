"""Follow a run's metrics.jsonl while the job runs: one progress line per optimizer step."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterator

METRICS = "metrics.jsonl"


def format_progress(record: dict, train_iters: int | None = None) -> str:
    """'step 12/50  loss 4.211  1,234 tok/s  bubble 0.25  allreduce 12.0%' from a metrics record."""
    step = f"step {record.get('step')}" + (f"/{train_iters}" if train_iters else "")
    parts = [step]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    if record.get("tokens_per_s") is not None:
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if record.get("bubble_fraction") is not None:
        parts.append(f"bubble {record['bubble_fraction']:.2f}")
    if record.get("allreduce_overhead") is not None:
        parts.append(f"allreduce {100 * record['allreduce_overhead']:.1f}%")
    return "  ".join(parts)


def follow(path: Path, done: Callable[[], bool], *, poll_s: float = 0.5, offset: int = 0) -> Iterator[dict]:
    """Yield metrics records appended to ``path`` after byte ``offset`` until ``done()``, then the rest."""
    partial = ""
    while True:
        finished = done()
        if path.is_file():
            with open(path) as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
            lines = (partial + chunk).split("\n")
            partial = lines.pop()
            for line in lines:
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        continue
        if finished:
            return
        time.sleep(poll_s)
