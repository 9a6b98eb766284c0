"""Transformer Engine's userbuffers TP overlap (Megatron's --tp-comm-overlap): what each GEMM's collective
leaves exposed.

With sequence parallelism each linear layer gathers its input or reduce-scatters its output over the tp ranks,
and TE overlaps each collective with one GEMM by the method its default config names for that GEMM
(transformer_engine/pytorch/module/base.py ``initialize_ub``, ``methods`` and ``get_default_config``, TE 1.x
to 2.x; Megatron-LM passes no ``ub_cfgs`` without --tp-comm-overlap-cfg): ``ring_exchange`` for the
all-gathers before qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad (tp chunks, the first on the local shard),
``pipeline`` with 4 splits for the reduce-scatters after proj_fprop and fc2_fprop (the last chunk's exposed),
``bulk`` for the backward's re-gather of the input beside the data-gradient GEMM and the data gradient's
reduce-scatter beside the weight-gradient GEMM. Under FP8 the all-gather buffers are FP8 (``fp8_buf``
defaults to the all-gather layers): one byte an element. docs/cost-model.md, "estimate/tp_overlap.py".
"""
from __future__ import annotations

from .comm import Placement, all_gather_s, reduce_scatter_s
from .compute import attention_linear_shapes, linear_gemm_times_s, mlp_linear_shapes
from .hardware import Hardware
from .params import ModelShape

# TE initialize_ub get_default_config: "num_splits": tp_size if method == "ring_exchange" else 4
PIPELINE_SPLITS = 4
FP8_BYTES = 1


def ring_exchange_exposed_s(ag_s: float, gemm_s: float, tp: int) -> float:
    """All-gather overlapped chunk by chunk: the first chunk computes on the local shard, so the tp - 1 shards
    travel behind tp - 1 of the tp GEMM chunks."""
    return max(0.0, ag_s - gemm_s * (tp - 1) / tp)


def pipeline_rs_exposed_s(rs_s: float, gemm_s: float, splits: int = PIPELINE_SPLITS) -> float:
    """Reduce-scatter of a GEMM split in ``splits`` chunks: chunk i's behind chunk i + 1's GEMM, the last one
    after the GEMM has ended."""
    return rs_s / splits + max(0.0, (rs_s - gemm_s) * (splits - 1) / splits)


def bulk_exposed_s(comm_s: float, gemm_s: float) -> float:
    """A whole collective beside a whole GEMM: exposed where it outlasts it."""
    return max(0.0, comm_s - gemm_s)


def userbuffers_exposed_s(shape: ModelShape, tp: int, tokens: int, pl: Placement, hw: Hardware,
                          gemm_hw: Hardware, fp8: bool, recomputed_forward: bool) -> float:
    """Exposed TP communication of one dense layer for one micro-batch on one rank under TE's userbuffers
    overlap: per block (attention, MLP) a column-parallel linear (gathers its input) and a row-parallel one
    (reduce-scatters its output). ``gemm_hw``: the rates the linear layers run at (FP8: estimate/precision.py);
    ``recomputed_forward``: full recompute runs the forward's collectives again."""
    if tp <= 1:
        return 0.0
    elements = tokens * shape.hidden_size
    ag = all_gather_s(elements * (FP8_BYTES if fp8 else hw.dtype_bytes), pl, hw)
    rs = reduce_scatter_s(elements * hw.dtype_bytes, pl, hw)
    forward = backward = 0.0
    blocks = (attention_linear_shapes(shape, tp), mlp_linear_shapes(shape, shape.ffn_hidden_size, tp))
    for (col_out, col_in), (row_out, row_in) in blocks:
        col_f, col_d, col_w = linear_gemm_times_s(tokens, col_out, col_in, gemm_hw)
        row_f, row_d, _ = linear_gemm_times_s(tokens, row_out, row_in, gemm_hw)
        forward += ring_exchange_exposed_s(ag, col_f, tp) + pipeline_rs_exposed_s(rs, row_f)
        backward += (ring_exchange_exposed_s(ag, row_d, tp)           # the output gradient gathered (row dgrad)
                     + bulk_exposed_s(ag, col_d) + bulk_exposed_s(rs, col_w))
    return forward * (2 if recomputed_forward else 1) + backward


__all__ = ["PIPELINE_SPLITS", "bulk_exposed_s", "pipeline_rs_exposed_s", "ring_exchange_exposed_s",
           "userbuffers_exposed_s"]
