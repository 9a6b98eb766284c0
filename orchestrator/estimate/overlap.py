"""What hidden communication costs the compute it hides behind: a NCCL kernel holds SMs while it runs, and
the GEMMs launched meanwhile get fewer. How much that slows a GEMM depends on how the BLAS schedules its
tiles: one CTA per tile (waves over the free SMs), or persistent CTAs with a static tile schedule (Hopper:
the CTAs that find no free SM run their whole share after the others, a second round).

The model and its sources: docs/cost-model.md, "estimate/overlap.py".
"""
from __future__ import annotations

from functools import lru_cache
from math import ceil

from .compute import attention_linear_shapes, gemm_tiles, mlp_linear_shapes
from .hardware import Hardware
from .params import ModelShape


def layer_gemms(shape: ModelShape, tp: int, tokens: int) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of one dense layer's GEMMs on a TP rank: each linear's forward, data and weight gradient."""
    shapes = attention_linear_shapes(shape, tp) + mlp_linear_shapes(shape, shape.ffn_hidden_size, tp)
    out = []
    for n_out, k_in in shapes:
        out += [(tokens, n_out, k_in), (tokens, k_in, n_out), (k_in, n_out, tokens)]
    return tuple(out)


def gemm_slowdown(m: int, n: int, num_sms: int, taken: int, persistent: bool) -> float:
    """Time of one GEMM while ``taken`` SMs run another kernel, over its time on all ``num_sms``.

    One CTA per tile (CUTLASS's conventional GEMMs "launch a number of threadblocks equal to the number of
    tiles"): the tiles run in waves over the free SMs. Persistent with a static schedule (CUTLASS 3's sm90
    kernels; the grid is min(tiles, SMs) CTAs, each owning a fixed share of the tiles): the CTAs beyond the
    free SMs wait for a whole CTA's share, "susceptible to workload imbalance if the resources of some SMs are
    unavailable" (CUTLASS docs, "Blackwell Cluster Launch Control", which fixes it with dynamic scheduling)."""
    free = num_sms - taken
    if free <= 0:
        return float("inf")
    tiles = gemm_tiles(m, n, num_sms)
    if persistent:
        grid = min(tiles, num_sms)
        return float(ceil(grid / free))
    return ceil(tiles / free) / ceil(tiles / num_sms)


@lru_cache(maxsize=4096)
def nccl_overlap_slowdown(gemms: tuple[tuple[int, int, int], ...], gemm_share: float, hw: Hardware,
                          taken: int) -> float:
    """How much slower a layer's compute runs while a NCCL kernel holds ``taken`` SMs: its GEMMs (``gemm_share``
    of its time, each weighted by its FLOPs) by :func:`gemm_slowdown`, the rest (element-wise and attention
    kernels, many small CTAs) by the share of SMs left."""
    if hw.num_sms <= taken:
        return float("inf")
    linear = hw.num_sms / (hw.num_sms - taken)
    flops = [m * n * k for m, n, k in gemms]
    total = sum(flops)
    if not total:
        return linear
    gemm = sum(f * gemm_slowdown(m, n, hw.num_sms, taken, hw.persistent_gemm)
               for f, (m, n, _) in zip(flops, gemms)) / total
    return gemm_share * gemm + (1 - gemm_share) * linear


def contention_s(hidden_s: float, slowdown: float) -> float:
    """Compute time lost behind ``hidden_s`` of hidden communication when compute runs ``slowdown`` times slower
    meanwhile: what it does in that time at 1/slowdown of its pace, the rest is pushed out."""
    if hidden_s <= 0:
        return 0.0
    return hidden_s * (1 - 1 / slowdown) if slowdown != float("inf") else hidden_s
