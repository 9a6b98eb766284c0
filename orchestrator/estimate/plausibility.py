"""Is a predicted MFU plausible? A bound from the best 16-bit run published on the same GPU, at a margin.

The bound is the best MFU in ``GpuSpec.published_mfu`` (any model size: the published tables are not monotonic
in size) times ``1 + MFU_MARGIN``; a chosen layout above it gets a warning naming the bound and its source.
Nothing is clamped. Only bf16/fp16 plans are checked; docs/plan-picture-and-cost.md gives the reasoning.
"""
from __future__ import annotations

from ..catalog.gpus import GpuSpec

CHECKED_PRECISIONS = ("bf16", "fp16")
# Published figures lag the software: Megatron-Core's Mixtral 8x7B bf16 rate rose 438 -> 468 TFLOP/s per GPU
# (+7%) from MCore v0.8 to v0.9 (2024-08-02 -> 2024-11-21, megatron/core/transformer/moe/README.md), and
# NVIDIA's later 2024 recipes are reported in the low-to-mid 50s for 70B-405B on H100 (orch holds no such row),
# where the best table orch holds (Megatron-LM, 2024-07-15) reaches 49.4%. 12% above the best published figure
# covers that and still flags what no release has come near (set 2026-12-01 from tests/data/*.json).
MFU_MARGIN = 0.12


def mfu_bound(gpu: GpuSpec) -> tuple[float, float, float] | None:
    """(bound, best published MFU, size of the model that reached it) on ``gpu``; None without published figures."""
    if not gpu.published_mfu:
        return None
    size, best = max(gpu.published_mfu, key=lambda r: (r[1], -r[0]))
    return best * (1 + MFU_MARGIN), best, size


def mfu_warnings(gpu: GpuSpec, precision: str, mfu: float) -> list[str]:
    """One warning line when ``mfu`` exceeds the bound for this GPU, else none."""
    bound = mfu_bound(gpu) if precision in CHECKED_PRECISIONS else None
    if bound is None or mfu <= bound[0]:
        return []
    limit, best, size = bound
    return [f"warning: implausible prediction: MFU {mfu:.1%} exceeds {limit:.1%}, {MFU_MARGIN:.0%} above the best "
            f"published 16-bit MFU on {gpu.name} ({best:.1%}, a {size / 1e9:.3g}B run; {gpu.published_mfu_source}); "
            f"the cost model is likely optimistic for this layout: measure it (orch calibrate) before relying on "
            f"its ranking."]
