"""Per layer and micro-batch: published vs predicted time of the MoE runs, beside the model's layer time and
host launch time.

    .venv/bin/python benchmarks/moe_layer_time.py

Published: the step time the case's tokens/s implies, spread over its micro-batches and the layers one rank
holds (num_layers / pp); the pipeline fill and the optimizer step are inside it (a few percent at these
micro-batch counts). Predicted: the same from the cost model's step time. Layer: the model's forward +
backward of the mean layer (its GPU work, or its host launch floor where that is longer) plus its expert
all-to-all (none hidden). Host: the model's host launch time of a MoE layer (estimate/moe.py moe_host_s,
forward + backward, with the case's FP8 scaling recipe). A run whose published time per layer and micro-batch
stays the same when its micro-batch (its tokens) doubles is paced by a per-micro-batch cost, not by its GPU
work. Nothing here is fitted; it prints what the model and the published figures say.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.estimate.layer import LayerKey, rank_layer  # noqa: E402
from orchestrator.estimate.moe import moe_host_s  # noqa: E402
from orchestrator.estimate.step import EstimateContext  # noqa: E402
from tests.published_layouts import (layout_case_spec, load_layout_cases,  # noqa: E402
                                            predicted_layout)

CASES = ROOT / "tests" / "data" / "published-moe-cp-fp8.json"


def layer_row(case: dict) -> dict:
    """Milliseconds per layer and micro-batch for one MoE case: published, predicted, model layer, host."""
    chosen = predicted_layout(case)
    spec = layout_case_spec(case)
    ctx = EstimateContext.of(spec)
    m, pp = chosen["num_microbatches"], chosen["pp"]
    per = m * ctx.shape.num_layers / pp
    published_step_s = case["gbs"] * case["seq"] / (case["gpus"] * case["tokens_per_s_per_gpu"])
    key = LayerKey(tp=chosen["tp"], cp=chosen["cp"], ep=chosen["ep"], etp=chosen["etp"],
                   mb=chosen["micro_batch_size"], sp=bool(chosen["sequence_parallel"]), recompute=chosen["recompute"])
    rl = rank_layer(ctx.shape, ctx.hw, ctx.gpu, ctx.precision, key, ctx.fp8_recipe)
    host = sum(moe_host_s(ctx.shape, chosen["ep"], ctx.precision == "fp8", ctx.fp8_recipe))
    return {"published_ms": 1e3 * published_step_s / per, "predicted_ms": 1e3 * chosen["step_time_s"] / per,
            "layer_ms": 1e3 * (rl.time.forward_s + rl.time.backward_s + rl.ep_s), "host_ms": 1e3 * host,
            "tokens": case["seq"] * chosen["micro_batch_size"],
            "local_experts": ctx.shape.moe.num_experts // chosen["ep"], "tag": chosen["tag"]}


def main() -> int:
    print(f"{'case':38} {'layout':34} {'tokens':>6} {'E/ep':>4} {'published':>9} {'predicted':>9} {'layer':>6} "
          f"{'host':>6}   (ms per layer and micro-batch)")
    for case in load_layout_cases(CASES):
        if case["group"] != "moe":
            continue
        r = layer_row(case)
        print(f"{case['id']:38} {r['tag']:34} {r['tokens']:6d} {r['local_experts']:4d} {r['published_ms']:9.2f} "
              f"{r['predicted_ms']:9.2f} {r['layer_ms']:6.2f} {r['host_ms']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
