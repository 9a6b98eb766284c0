"""DeepSpeed-Ulysses context parallelism: attention over the whole sequence, each rank a share of the heads.

Outside attention every rank of a context-parallel group of size ``cp`` holds ``seq_length / cp``
consecutive positions of the same sequences (rank c the c-th chunk). Around the attention core one
all-to-all trades the sequence split for a head split (:func:`seq_to_heads`: [b, s/cp, H, d] ->
[b, s, H/cp, d]), so each rank computes exact causal attention for H/cp heads over all s positions, and
a second all-to-all trades it back (:func:`heads_to_seq`). Both are differentiable (alltoall.py), so the
backward pass makes the same two exchanges in reverse (Jacobs et al., "DeepSpeed Ulysses", 2023, sec. 3).

Needs heads % cp == 0 and seq_length % cp == 0 (spec rules). Key/value heads (GQA) that do not divide
by cp are repeated up to the query heads first.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .alltoall import all_to_all


@dataclass(frozen=True)
class ContextGroup:
    """This rank's context-parallel group: its process group, size and position (the sequence chunk)."""

    group: object
    size: int
    rank: int


def seq_to_heads(x: torch.Tensor, cp: ContextGroup) -> torch.Tensor:
    """[b, s/cp, H, d] (a chunk of the positions, all heads) -> [b, s, H/cp, d] (all positions, a share
    of the heads)."""
    b, s_local, heads, d = x.shape
    n = cp.size
    # Row blocks for the exchange: block j holds the head share of rank j.
    send = x.reshape(b, s_local, n, heads // n, d).permute(2, 1, 0, 3, 4)    # [n, s/cp, b, H/cp, d]
    recv = all_to_all(send, group=cp.group)                                    # block j: chunk j of the sequence
    return recv.reshape(n * s_local, b, heads // n, d).transpose(0, 1)


def heads_to_seq(x: torch.Tensor, cp: ContextGroup) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads`: [b, s, H/cp, d] -> [b, s/cp, H, d]."""
    b, s, heads_local, d = x.shape
    n = cp.size
    send = x.reshape(b, n, s // n, heads_local, d).permute(1, 2, 0, 3, 4)    # block j: chunk j of the sequence
    recv = all_to_all(send, group=cp.group)                                    # block j: the head share of rank j
    return recv.permute(2, 1, 0, 3, 4).reshape(b, s // n, n * heads_local, d)


def sequence_chunk(tensor: torch.Tensor, cp: ContextGroup | None) -> torch.Tensor:
    """This rank's positions of a [b, s, ...] batch (all of it without context parallelism)."""
    if cp is None or cp.size == 1:
        return tensor
    s_local = tensor.shape[1] // cp.size
    return tensor[:, cp.rank * s_local:(cp.rank + 1) * s_local].contiguous()
