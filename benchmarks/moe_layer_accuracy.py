"""Predicted vs measured forward and backward time of one MoE layer on H100 (Megatron-LM's moe_perf test).

    .venv/bin/python benchmarks/moe_layer_accuracy.py

NVIDIA's own per-layer benchmark (tests/data/megatron-moe-perf-h100.json, each row with its source): one
Megatron-Core MoELayer on 8 H100s of one node, ep 8, 4096 tokens per rank, force-balanced routing. It
isolates the MoE block (router, permutation, all-to-alls, grouped expert GEMMs) from attention, the
pipeline and the rest of the step, so it checks :func:`orchestrator.estimate.moe.moe_block_s` on its own.
Force-balanced routing is modelled as load imbalance 1 (capacity factor 1.0 bounds it there). The
statistics cover the bf16 rows with the alltoall dispatcher, which is what orch generates; the DeepEP /
HybridEP rows and the FP8 rows (the blockwise recipe, which orch does not generate) are printed for
reference. Nothing here is fitted to these figures.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.estimate.moe import moe_block_s  # noqa: E402
from orchestrator.estimate.precision import fp8_gemm_hardware  # noqa: E402
from orchestrator.estimate.step import EstimateContext  # noqa: E402
from tests.published_layouts import moe_layer_case_shape  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402

CASES = ROOT / "tests" / "data" / "megatron-moe-perf-h100.json"
GPU = "h100-sxm"


def predicted_ms(case: dict) -> tuple[float, float]:
    """(forward, backward) milliseconds the cost model predicts for a case's MoE block."""
    spec = parse_spec({"name": "moe-perf", "model": {"preset": "qwen3-30b-a3b"},
                       "cluster": {"gpu": GPU, "num_nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch_size": 8, "precision": "bf16", "engine": "megatron"}})
    hw = EstimateContext.of(spec).hw
    gemm_hw = fp8_gemm_hardware(hw, GPU) if case["precision"] != "bf16" else None
    f, b = moe_block_s(moe_layer_case_shape(case), hw, case["tp"], 1, case["ep"], 1, case["mbs"], gemm_hw)
    return f * 1e3, b * 1e3


def main() -> int:
    cases = json.loads(CASES.read_text())
    errors = []
    print(f"{'case':28} {'fwd meas':>8} {'pred':>6} {'err':>7}   {'bwd meas':>8} {'pred':>6} {'err':>7}")
    for case in cases:
        f, b = predicted_ms(case)
        ef, eb = f / case["forward_ms"] - 1, b / case["backward_ms"] - 1
        counted = case["precision"] == "bf16" and case["dispatcher"] == "alltoall"
        if counted:
            errors += [ef, eb]
        print(f"{case['id']:28} {case['forward_ms']:8.2f} {f:6.2f} {ef:+7.1%}   {case['backward_ms']:8.2f} {b:6.2f} "
              f"{eb:+7.1%}{'' if counted else '   (reference only)'}")
    print(f"bf16 alltoall rows: mean |error| {statistics.mean(abs(e) for e in errors):.1%}, "
          f"max {max(abs(e) for e in errors):.1%} ({len(errors)} figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
