"""Context parallelism: what one of cp ranks computes, holds and exchanges.

Megatron-Core context parallelism (Megatron-Core docs, "context_parallel"; ring attention, Liu et al. 2023,
arXiv 2310.01889) splits every sequence into 2*cp chunks and gives rank r chunks r and 2cp-1-r, which
balances the causal mask's work. Every rank runs the linear layers, norms and MLP on its s/cp tokens and
stores s/cp tokens' activations; attention needs all keys and values, so the ranks pass their K/V chunks
round a ring (--cp-comm-type p2p): cp-1 steps, each overlapped with the attention of the block already
held. Backward passes K/V again with their gradients (twice the bytes). What a step's transfer takes
beyond that step's attention compute stays exposed.

Per rank, the attention core over s/cp queries and all s keys (causal, balanced) costs 1/cp of the full
sequence's attention, i.e. cp times what a sequence of s/cp tokens would cost on its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from .comm import group_placement, p2p_s
from .compute import LayerTimeEstimate, causal_fraction
from .hardware import Hardware
from .params import ModelShape

FLASH_BWD_FACTOR = 2.5   # as estimate/compute.py: a fused attention backward costs 2.5x its forward


@lru_cache(maxsize=1024)
def rank_shape(shape: ModelShape, cp: int) -> ModelShape:
    """The shape one context-parallel rank works on: s/cp tokens per sequence."""
    return shape if cp == 1 else dataclasses.replace(shape, seq_length=shape.seq_length // cp)


def attention_scale(shape: ModelShape, cp: int) -> float:
    """Attention work of a rank over that of a standalone s/cp-token sequence (causal blocks counted)."""
    if cp == 1:
        return 1.0
    s = shape.seq_length
    return cp * causal_fraction(s) / causal_fraction(s // cp)


def with_full_attention(layer: LayerTimeEstimate, shape: ModelShape, cp: int,
                        kernel_gap_s: float = 0.0) -> LayerTimeEstimate:
    """A rank's layer time (computed on the s/cp shape) with its attention over all s keys. The ring runs
    the attention as one kernel per step and chunk pair (2 * cp - 1 more launches forward, as many backward,
    each also correcting the running softmax)."""
    if cp == 1:
        return layer
    extra = (attention_scale(shape, cp) - 1) * layer.attention_forward_s + (2 * cp - 1) * kernel_gap_s
    recompute = layer.recompute_s + (extra if layer.recompute_s >= layer.forward_s else 0.0)
    return dataclasses.replace(layer, forward_s=layer.forward_s + extra,
                               backward_s=layer.backward_s + FLASH_BWD_FACTOR * extra, recompute_s=recompute,
                               attention_forward_s=layer.attention_forward_s + extra)


@dataclass(frozen=True)
class ContextComm:
    """K/V ring exchange of one layer, one micro-batch, one rank."""

    bytes: float
    seconds: float
    exposed_s: float


@lru_cache(maxsize=16384)
def context_layer_comm(shape: ModelShape, hw: Hardware, tp: int, cp: int, mb: int,
                       attention_forward_s: float) -> ContextComm:
    """cp-1 ring steps forward (K and V chunks) and cp-1 backward (K, V and their gradients), each hidden
    behind the attention of one block (1/cp of the rank's attention) when it is not longer than that."""
    if cp == 1:
        return ContextComm(0.0, 0.0, 0.0)
    kv_heads_width = max(1, shape.kv_size // tp) if shape.num_query_groups >= tp else shape.head_dim
    chunk = 2 * (shape.seq_length // cp) * mb * kv_heads_width * hw.dtype_bytes   # K and V of s/cp tokens
    pl = group_placement(cp, tp, hw.gpus_per_node)
    inter = pl.num_nodes > 1
    step_f, step_b = p2p_s(chunk, inter, hw), p2p_s(2 * chunk, inter, hw)
    block_f = attention_forward_s / cp
    block_b = FLASH_BWD_FACTOR * block_f
    steps = cp - 1
    exposed = steps * (max(0.0, step_f - block_f) + max(0.0, step_b - block_b))
    return ContextComm(bytes=steps * 3 * chunk, seconds=steps * (step_f + step_b), exposed_s=exposed)
