"""Host time per rank of DeepSpeed 0.3.x-0.5.x ZeRO-3's per-rank Python loops (CostModel.ds_list_rank_host_s,
CostModel.ds_persistent_copy_host_s).

Before DeepSpeed 0.5.5, ``partition_parameters._allgather_param`` builds the all-gather's output list in
Python, one iteration per rank of the group: a ``narrow`` view of the flat buffer, a
``dist.get_rank(group=...)`` comparison, the list append (``_reduce_scatter_gradient`` walks the ranks the
same way for its input views, up to 0.6.0). The loop never touches the device, so it is timed here on CPU
tensors, in a one-process gloo group, exactly as written there. After every optimizer step,
``_allgather_params`` (the synchronous gather of the persistent parameters, ``_post_step``) copies each
persistent parameter's n slices out of the gathered list, one ``narrow``/``view``/``narrow``/``copy_`` per
rank and parameter; timed the same way on CPU tensors (on a GPU each ``copy_`` also launches a kernel,
counted as CostModel.kernel_gap_s). Prints the median and minimum microseconds per rank over 15 runs of a
1536-rank loop (the machine is shared: take the minimum).

    .venv/bin/python benchmarks/ds_list_host.py

It runs as written under torch 1.8.1 too (Python 3.8), the PyTorch the 2021 releases ran with.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

RANKS = 1536
ELEMENTS = 64


def per_rank_loop(flat: torch.Tensor, own: torch.Tensor, group) -> list[torch.Tensor]:
    partitions = []
    for i in range(RANKS):
        partitions.append(flat.narrow(0, ELEMENTS * i, ELEMENTS))
        if i == dist.get_rank(group=group):
            partitions[i].data.copy_(own.data, non_blocking=True)
    return partitions


def persistent_copy_loop(partitions: list[torch.Tensor], replicated: torch.Tensor) -> None:
    for i in range(RANKS):
        part_to_copy = partitions[i].narrow(0, 0, ELEMENTS // 2)
        replicated.view(-1).narrow(0, i * (ELEMENTS // 2), ELEMENTS // 2).copy_(part_to_copy)


def timed(fn, *args) -> list[float]:
    times = []
    for _ in range(15):
        t = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t) / RANKS * 1e6)
    return times


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        flat, own = torch.zeros(RANKS * ELEMENTS), torch.zeros(ELEMENTS)
        for name, times in (("per-rank list loop", timed(per_rank_loop, flat, own, group)),
                            ("persistent-parameter copy loop", timed(persistent_copy_loop,
                                                                     per_rank_loop(flat, own, group),
                                                                     torch.zeros(RANKS * ELEMENTS // 2)))):
            print(f"{name}: median {statistics.median(times):.2f} us, min {min(times):.2f} us per rank "
                  f"({RANKS} ranks, torch {torch.__version__})")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
