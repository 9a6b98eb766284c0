"""The rate a fused (flash) attention kernel runs at, by kernel, GPU, head dimension and sequence length.

``ModelShape.attention`` names the kernel (:data:`ATTENTION_IMPLS`):

* ``catalog``: the GPU's catalog figure (catalog/gpus.py ``attention_efficiency``, one fraction of peak per GPU),
  what orch plans its own runs with (Megatron-Core's flash backend through Transformer Engine, the reference
  trainer's scaled_dot_product_attention) and what a published run gets where its kernel is not stated
  (the Megatron-LM / NeMo runs on Transformer Engine).
* ``fa2`` (FlashAttention-2, also PyTorch SDPA's flash backend) and ``flash_attn_triton`` (flash-attn 1.x's
  Triton kernel, llm-foundry's MPT ``attn_impl: triton``): measured rates where catalog/attention.py lists
  them (A100 80GB; FlashAttention-2 on the H100 80GB too), else the catalog figure.

A measured rate is read off the benchmark's sequence lengths, interpolated linearly in log2(sequence length)
between them and held at the end values outside (the kernels' efficiency rises with the number of key blocks a
query block sweeps and saturates by 8k-16k, Fig. 4 of arXiv 2307.08691), and between head dimensions 64 and 128
linearly in the head dimension (our estimate: only 64 and 128 are measured; below 64 the 64 rate, above 128 the
128 rate). The rate counts the benchmark's FLOPs (causal: half of 4 s^2 d per head; compute.py
``_attention_times_s`` counts them the same way when it uses one) and is scaled by the GPU's sustained clock.
"""
from __future__ import annotations

from bisect import bisect_right
from math import log2

from ..catalog.attention import KERNEL_RATES

ATTENTION_IMPLS = ("catalog", "fa2", "flash_attn_triton")
TFLOPS = 1e12


def measured_attention_flops(impl: str, gpu: str, head_dim: int, seq: int) -> float | None:
    """Forward + backward FLOP/s (benchmark clock, catalog/attention.py convention) of kernel ``impl`` on
    catalog GPU ``gpu``; None where no measurement is listed (the catalog figure applies)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r} (one of {', '.join(ATTENTION_IMPLS)})")
    series = KERNEL_RATES.get((impl, gpu))
    if series is None:
        return None
    lo, hi = min(series), max(series)
    d = min(max(head_dim, lo), hi)
    r_lo, r_hi = _along_seq(series[lo], seq), _along_seq(series[hi], seq)
    return TFLOPS * (r_lo + (r_hi - r_lo) * (d - lo) / (hi - lo))


def _along_seq(points: tuple[tuple[int, float], ...], seq: int) -> float:
    """The rate at ``seq``: linear in log2(seq) between measured lengths, the end value outside them."""
    seqs = [s for s, _ in points]
    i = bisect_right(seqs, seq)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (s0, r0), (s1, r1) = points[i - 1], points[i]
    return r0 + (r1 - r0) * (log2(seq) - log2(s0)) / (log2(s1) - log2(s0))
