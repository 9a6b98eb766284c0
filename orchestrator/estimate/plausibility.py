"""Is a predicted MFU plausible? A bound from what published runs reached on the same GPU.

The catalog lists, per GPU, published 16-bit training runs as (model parameters, MFU) with their source
(``GpuSpec.published_mfu``). A larger model has larger GEMMs and so reaches at least the efficiency of a
smaller one on the same part; the best MFU published for any model at least as large as the planned one
therefore bounds what the plan can honestly claim. A chosen layout predicted above it gets a warning that
names the bound and its source: the cost model is then likely optimistic for that layout (and a short
calibration run, `orch calibrate`, is the way to know). Nothing is clamped: the prediction stays as it is.

Only bf16/fp16 plans are checked (the published figures are 16-bit; FP8 MFU is counted against another peak).
"""
from __future__ import annotations

from ..catalog.gpus import GpuSpec

CHECKED_PRECISIONS = ("bf16", "fp16")


def mfu_bound(gpu: GpuSpec, model_params: float) -> tuple[float, float] | None:
    """(best published MFU, size of the model that reached it) over runs of at least ``model_params`` on
    ``gpu``; the largest published run's figure when the model is bigger than all of them; None if none."""
    runs = sorted(gpu.published_mfu)
    if not runs:
        return None
    larger = [r for r in runs if r[0] >= model_params] or runs[-1:]
    size, mfu = max(larger, key=lambda r: r[1])
    return mfu, size


def mfu_warnings(gpu: GpuSpec, precision: str, model_params: float, mfu: float) -> list[str]:
    """One warning line when ``mfu`` exceeds the published bound for this GPU and model size, else none."""
    bound = mfu_bound(gpu, model_params) if precision in CHECKED_PRECISIONS else None
    if bound is None or mfu <= bound[0]:
        return []
    best, size = bound
    return [f"warning: implausible prediction: MFU {mfu:.1%} exceeds {best:.1%}, the best published on {gpu.name} "
            f"for a model of {model_params / 1e9:.3g}B parameters or more (a {size / 1e9:.3g}B run; "
            f"{gpu.published_mfu_source}); the cost model is likely optimistic for this layout: measure it "
            f"(orch calibrate) before relying on its ranking."]
