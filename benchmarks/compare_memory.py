"""`orch compare` on a long run: peak memory and time for a generated ~200 MB metrics.jsonl.

Issue 21: holding one dict per line took 1.16 GB (5.5x the file) and 13 s; records are now streamed into
columns (orchestrator/records.py). Writes a planned run dir of the tiny CPU spec with SIZE_MB of metrics
records, runs `orch compare RUN` (tables, then --json) in a child process and prints its wall time, its
peak RSS (the child's rusage) and the ratio of that to the file's size.

    python benchmarks/compare_memory.py [SIZE_MB]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit.compare_support import make_run_dir, record  # noqa: E402


def write_metrics(path: Path, size_bytes: int) -> int:
    """Records of a steady run until the file holds size_bytes; returns the number of steps."""
    step, written = 0, 0
    with open(path, "w") as f:
        while written < size_bytes:
            step += 1
            line = json.dumps(record(step, 0.1 * (1 + 0.01 * (step % 7)))) + "\n"
            f.write(line)
            written += len(line)
    return step


def measure(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one child process (its own rusage, from wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.read().decode()}")
    return wall_s, usage.ru_maxrss * 1024         # KiB on Linux


def main() -> int:
    size_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 200.0
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run_dir(Path(tmp) / "run")
        steps = write_metrics(run / "metrics.jsonl", int(size_mb * 1e6))
        file_bytes = (run / "metrics.jsonl").stat().st_size
        orch = str(Path(sys.executable).parent / "orch")
        for extra in ([], ["--json"]):
            wall_s, peak_bytes = measure([orch, "compare", str(run), *extra])
            print(f"orch compare {' '.join(extra) or '(tables)'}: {wall_s:.1f} s, peak RSS {peak_bytes / 1e6:.0f} MB"
                  f" = {peak_bytes / file_bytes:.2f}x the file ({file_bytes / 1e6:.0f} MB, {steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
