"""Planner speed: the full search for a 1T-parameter GPT (preset gpt3-1t) on 3072 A100-80GB with every
parallelism field open (issue 3 target: under 2 s on a 2-core machine).

Each run starts from cold caches (the estimators memoise per process), so the time is what `orch plan`
pays. Prints the median time, the layouts considered and the layouts considered per second.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cold import cold_search  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402

RUNS = 5
TARGET_S = 2.0
SPEC = {"name": "gpt3-1t-3072xa100", "model": {"preset": "gpt3-1t"},
        "cluster": {"gpu": "a100-80gb", "num_nodes": 384, "gpus_per_node": 8},
        "training": {"global_batch_size": 3072, "precision": "bf16"}}


def main() -> int:
    spec = parse_spec(SPEC)
    times, result = [], None
    for _ in range(RUNS):
        t, _, result = cold_search(spec)
        times.append(t)
    median = statistics.median(times)
    print(f"search: gpt3-1t on {spec.world_size} x a100-80gb, every parallelism field open")
    print(f"  median of {RUNS} cold runs: {median:.3f} s (min {min(times):.3f}, max {max(times):.3f})")
    print(f"  layouts considered: {result.num_considered} ({result.num_fitting} fit); "
          f"{result.num_considered / median:,.0f} layouts/s")
    print(f"  chosen: {result.chosen.layout.tag()} recompute={result.chosen.layout.recompute} "
          f"sp={result.chosen.layout.sequence_parallel}, {result.chosen.step_time_s:.1f} s/step, "
          f"MFU {result.chosen.mfu:.1%}")
    ok = median < TARGET_S
    print(f"target: under {TARGET_S:.1f} s -> {'OK' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
