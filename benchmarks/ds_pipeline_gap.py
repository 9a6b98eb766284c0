"""Where the DeepSpeed pipeline-engine runs still differ from the model: the gap per step, per micro-batch and
in units of the predicted pipeline fill and drain (printed only; nothing is fitted back into the model).

    .venv/bin/python benchmarks/ds_pipeline_gap.py

For each published DeepSpeed pipeline run of :data:`tests.published.EXTRA_CASES` it prints the published
step (the stated iteration time, or the one its per-GPU throughput implies with benchmarks/accuracy.py's FLOP
count: ``published.published_step_s``, which counts GPT-NeoX's and GLM-130B's FLOPs as their sources do), the
predicted step, the gap, the gap over the predicted fill and drain (``breakdown.bubble_s``) and what the model
already counts for the engine itself (exposed hand-overs, the reduction after the flush, the host's
per-micro-batch work: ``pp_exposed_s + dp_exposed_s + engine_s``; docs/cost-model.md, "DeepSpeed's pipeline
engine: what was checked"). For runs of one
model at several micro-batch counts (MT-NLG: 240, 192, 160) it fits gap = a x m + b: a per-micro-batch cost would
show as a, a per-step cost as b.
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.published import EXTRA_CASES, published_estimate, published_step_s  # noqa: E402


def gap_rows() -> list[dict]:
    rows = []
    for case in EXTRA_CASES:
        pub = case["published"]
        if pub.get("engine") != "deepspeed" or pub["pp"] <= 1:
            continue
        est = published_estimate(case)
        # the stated iteration time where the paper gives one, else the one its TFLOP/s imply
        published_step = pub.get("iteration_s") or published_step_s(case)
        rows.append({"id": case["id"], "model": (case["model"]["layers"], case["model"]["hidden"]),
                     "m": est.num_microbatches, "predicted": est.step_time_s, "published": published_step,
                     "gap": published_step - est.step_time_s, "bubble": est.breakdown.bubble_s,
                     "engine": est.breakdown.pp_exposed_s + est.breakdown.dp_exposed_s + est.breakdown.engine_s})
    return rows


def main() -> int:
    rows = gap_rows()
    print(f"{'case':<22} {'m':>4} {'published s':>11} {'predicted s':>11} {'gap s':>7} {'gap/m ms':>8} "
          f"{'fill+drain s':>12} {'gap/fill+drain':>14} {'engine s':>8}")
    for r in rows:
        print(f"{r['id']:<22} {r['m']:>4} {r['published']:>11.1f} {r['predicted']:>11.1f} {r['gap']:>7.2f} "
              f"{1e3 * r['gap'] / r['m']:>8.1f} {r['bubble']:>12.2f} {r['gap'] / r['bubble']:>14.2f} {r['engine']:>8.2f}")
    by_model = defaultdict(list)
    for r in rows:
        by_model[r["model"]].append((r["m"], r["gap"]))
    for model, points in by_model.items():
        if len(points) >= 3:
            a, b = statistics.linear_regression(*zip(*points))      # least squares: gap = a x m + b
            print(f"layers x hidden {model}: gap = {1e3 * a:.1f} ms x m + {b:.2f} s over m = "
                  f"{sorted(m for m, _ in points)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
