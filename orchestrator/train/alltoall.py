"""All-to-all with a correct backward, the one collective that expert and Ulysses parallelism share.

:func:`all_to_all` exchanges the rows (dim 0) of a tensor within a process group: rank r sends
``in_splits[d]`` rows to rank d and receives ``out_splits[s]`` rows from rank s (``None``: equal
splits). Its gradient is the inverse exchange (the same call with the splits swapped), which
:class:`_AllToAll` implements as an autograd function, so tokens dispatched to remote experts, or
heads handed to the rank that holds them, carry their gradients back home.

The collective is ``torch.distributed.all_to_all_single``, looked up at call time, so a telemetry
:class:`~orchestrator.telemetry.comm.CommTimer` installed on ``torch.distributed`` times every call
(forward and backward) as ``alltoall_time_s``. gloo, NCCL and the CPU backend all implement it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def exchange(x: torch.Tensor, out_splits: list[int] | None, in_splits: list[int] | None, group) -> torch.Tensor:
    """One all_to_all_single of the rows of ``x`` (no autograd)."""
    x = x.contiguous()
    rows = x.shape[0] if out_splits is None else sum(out_splits)
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int] | None = None, in_splits: list[int] | None = None,
               group=None) -> torch.Tensor:
    """Exchange the rows of ``x`` within ``group``; differentiable (see the module doc)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)
