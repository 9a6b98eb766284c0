"""Planner speed for MoE: Mixtral-8x7B with every parallelism field open (tp, pp, vpp, cp, ep, etp, ZeRO,
micro-batch, recompute) on 64 and on 4096 H100 (issue 10 targets: under 2 s and under 5 s).

    .venv/bin/python benchmarks/planner_speed_moe.py

Each run starts from cold caches, as `orch plan` does. Prints the median of 3 runs per size, wall and CPU
time (on a shared machine the wall time includes waiting for a core).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cold import cold_search  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402

RUNS = 3
TARGETS = {64: 2.0, 4096: 5.0}


def mixtral(gpus: int) -> dict:
    return {"name": f"mixtral-{gpus}", "model": {"preset": "mixtral-8x7b"},
            "cluster": {"gpu": "h100-sxm", "num_nodes": gpus // 8, "gpus_per_node": 8},
            "training": {"global_batch_size": max(256, gpus)}}


def main() -> int:
    ok = True
    for gpus, target in TARGETS.items():
        spec = parse_spec(mixtral(gpus))
        runs = [cold_search(spec) for _ in range(RUNS)]
        median = statistics.median(t for t, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        result = runs[-1][2]
        print(f"mixtral-8x7b on {gpus} x h100-sxm, all open: median {median:.2f} s wall, {cpu:.2f} s CPU "
              f"of {RUNS} cold runs "
              f"({result.num_considered} layouts, chose {result.chosen.layout.tag()}); target {target:.0f} s "
              f"-> {'OK' if median < target else 'MISSED'}")
        ok &= median < target
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
