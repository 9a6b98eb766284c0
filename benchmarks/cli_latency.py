"""CLI start-up latency: `orch --help` and `orch generate` against `python -c pass`, in one run.

The target (issue 2): both under 0.5 s on a 2-core laptop, because they import no torch, deepspeed,
megatron or wandb. Prints the median of N runs and the ratio to the bare interpreter.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 7


def median_s(argv: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    orch = [str(Path(sys.executable).parent / "orch")]
    baseline = median_s([sys.executable, "-c", "pass"])
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "orch --help": orch + ["--help"],
            "orch validate --static (spec)": orch + ["validate", "--static", "examples/tiny-gpt-cpu.yaml"],
            "orch generate (tiny, fixed layout)": orch + ["generate", "examples/tiny-gpt-cpu.yaml", "-o",
                                                          f"{tmp}/run", "--force"],
        }
        print(f"{'command':<40} {'median s':>9} {'vs python -c pass':>18}")
        print(f"{'python -c pass':<40} {baseline:9.3f} {1.0:17.1f}x")
        worst = 0.0
        for name, argv in cases.items():
            t = median_s(argv)
            worst = max(worst, t)
            print(f"{name:<40} {t:9.3f} {t / baseline:17.1f}x")
    print(f"target: every command under 0.500 s -> {'OK' if worst < 0.5 else 'MISSED'} (worst {worst:.3f} s)")
    return 0 if worst < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
