"""Predicted vs published tokens/s per GPU for MoE, context-parallel, FP8 and BF16 dense runs on H100.

    .venv/bin/python benchmarks/moe_cp_fp8_accuracy.py

Cases and their sources: tests/data/published-moe-cp-fp8.json. Layouts fixed as published, and the EP
all-to-all overlap as each recipe ran it; the cost model's constants are never fitted to these figures. Prints one row per case, then the mean absolute
error per group and overall.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.published_layouts import load_layout_cases, predicted_layout  # noqa: E402

CASES = ROOT / "tests" / "data" / "published-moe-cp-fp8.json"


def case_errors(cases: list[dict]) -> list[tuple[dict, dict, float]]:
    """(case, chosen LAYOUT, relative error of tokens/s per GPU) for every case."""
    out = []
    for case in cases:
        chosen = predicted_layout(case)
        predicted = chosen["tokens_per_s"] / case["gpus"]
        out.append((case, chosen, predicted / case["tokens_per_s_per_gpu"] - 1))
    return out


def main() -> int:
    rows = case_errors(load_layout_cases(CASES))
    groups: dict[str, list[float]] = {}
    print(f"{'case':38} {'layout':34} {'published':>9} {'predicted':>9} {'error':>7}")
    for case, chosen, err in rows:
        groups.setdefault(case["group"], []).append(abs(err))
        predicted = case["tokens_per_s_per_gpu"] * (1 + err)
        print(f"{case['id']:38} {chosen['tag'] + ' ' + chosen['recompute']:34} {case['tokens_per_s_per_gpu']:9.0f} "
              f"{predicted:9.0f} {err:+7.1%}")
    for group, errs in groups.items():
        print(f"group {group:10} mean |error| {statistics.mean(errs):6.1%}  max {max(errs):6.1%}  ({len(errs)} cases)")
    print(f"overall mean |error| {statistics.mean(abs(e) for _, _, e in rows):6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
