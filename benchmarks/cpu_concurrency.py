"""What one CPU training process sustains while the other rank computes too (the `cpu` catalog target).

    .venv/bin/python benchmarks/cpu_concurrency.py [KIND ...]      (KIND: matmul copy model gloo; default all)

Runs the same single-threaded work (torch.set_num_threads(1), as torchrun's OMP_NUM_THREADS=1 gives each
rank) in 1 process, then in 2 processes at once, and prints each process's rate: an fp32 matmul at the
tiny-gpt shapes (GFLOP/s), a memory-bound copy (GB/s read + written) and orch's trainer model itself
(tiny-gpt forward + backward at micro-batch 4, no DeepSpeed: steps/s); then gloo all_reduce between the
2 processes of the size DeepSpeed reduces for tiny-gpt (3.5 MB of fp32 gradients), once idle and once while
each process also keeps its core busy in a second thread (as when the other ranks compute). The ratio 2-process / 1-process
is what a rank keeps of its core's speed while the other rank works: the catalog's `cpu` entry
(concurrent_compute_fraction) cites it. Needs an idle machine (load average < 1.5): other work on the
cores reads as a slowdown.
"""
import multiprocessing as mp
import statistics
import time

import torch

SECONDS = 3.0


def _work(kind: str, start, out) -> None:
    torch.set_num_threads(1)
    if kind == "matmul":
        a, b = torch.randn(512, 256), torch.randn(256, 1024)      # mb 4 x seq 128 tokens, hidden 256, 4h
        unit, fn = 2 * 512 * 256 * 1024 / 1e9, lambda: torch.matmul(a, b)
    elif kind == "model":                                          # orch's trainer: tiny-gpt, mb 4, fwd + bwd
        from orchestrator.spec_loader import parse_spec
        from orchestrator.train.model import GPT
        spec = parse_spec({"name": "t", "model": {"preset": "tiny-gpt"}, "cluster": {"gpu": "cpu"},
                           "training": {"global_batch_size": 8, "train_iters": 1}, "data": {"synthetic": True}})
        model = GPT(spec.model)
        tokens = torch.randint(0, 512, (4, 128))

        def step():
            model(tokens, tokens).backward()
        unit, fn = 1.0, step                                       # rate: steps per second
    else:
        x = torch.randn(16 * 2**20)                                # 64 MiB: out of L2, in the shared L3
        y = torch.empty_like(x)
        unit, fn = 2 * x.numel() * 4 / 1e9, lambda: y.copy_(x)
    for _ in range(20):
        fn()
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < SECONDS:
        fn(); n += 1
    out.put(n * unit / (time.perf_counter() - t0))


def rate(kind: str, procs: int) -> float:
    """Mean per-process rate of `procs` processes running `kind` at the same time."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_work, args=(kind, start, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    rates = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return statistics.mean(rates)


def _gloo(rank: int, busy: bool, out) -> None:
    import os
    import threading

    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.randn(875_000)                                       # 3.5 MB
    stop = threading.Event()
    if busy:
        a = torch.randn(512, 512)
        threading.Thread(target=lambda: [torch.matmul(a, a) for _ in iter(stop.is_set, True)], daemon=True).start()
    times = []
    for _ in range(40):
        dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t0)
    stop.set()
    if rank == 0:
        out.put(statistics.median(times[10:]))
    dist.destroy_process_group()


def gloo_all_reduce_s(busy: bool) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ps = [ctx.Process(target=_gloo, args=(r, busy, out)) for r in range(2)]
    for p in ps:
        p.start()
    t = out.get()
    for p in ps:
        p.join()
    return t


if __name__ == "__main__":
    import sys
    kinds = sys.argv[1:] or ["matmul", "copy", "model", "gloo"]
    for kind, units in (("matmul", "GFLOP/s"), ("copy", "GB/s"), ("model", "fwd+bwd/s")):
        if kind not in kinds:
            continue
        one = statistics.median(rate(kind, 1) for _ in range(3))
        two = statistics.median(rate(kind, 2) for _ in range(3))
        print(f"{kind:6} 1 process {one:7.1f} {units}   2 processes {two:7.1f} {units} each   ratio {two / one:.2f}")
    for busy in (False, True) if "gloo" in kinds else ():
        t = gloo_all_reduce_s(busy)
        print(f"gloo all_reduce 3.5 MB, 2 processes{' (cores busy)' if busy else ''}: {t * 1e3:.2f} ms, "
              f"busbw {3.5e6 / t / 1e9:.2f} GB/s (n=2: busbw = algbw)")
