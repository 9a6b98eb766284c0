"""The CPU target's kernel rates the cost model's "cpu" catalog entry holds, measured on one core.

    python benchmarks/cpu_kernels.py [--repeat 3]

* GEMM: the linear layers of orch's tiny-gpt at micro-batch 4 (512 rows; h 128, ffn 512, vocab 512), each as
  the trainer runs it: forward (F.linear with bias), data gradient (dy @ W) and weight gradient (dy^T @ x),
  and a 512^3 square product. The rate over the catalog peak (192 GFLOP/s: one AVX-512 core, 2 FMA units x
  16 fp32 lanes x ~3 GHz) is the core's sustained fraction (``sustained_clock_fraction``): the host VM's
  clock varies through the day (see the catalog entry), so run this a few times and take the median.
* GELU (tanh approximation, what the trainer and Megatron's bias-GeLU use) forward and backward over
  512 x 512 elements: on a CPU core its tanh costs more than its bytes (``gelu_elems_per_s``), unlike
  SiLU (SwiGLU) and the other element-wise kernels, printed for comparison with a copy.

Prints each rate (median of ``--repeat`` timings of 200 calls after 20 warm-up calls, one thread).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog.gpus import GPUS  # noqa: E402

PEAK = GPUS["cpu"].peak_flops["fp32"]
ROWS, HIDDEN, FFN, VOCAB = 512, 128, 512, 512


def _seconds(fn, calls: int, repeat: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def gemm_rate(repeat: int) -> float:
    """FLOP/s over the tiny-gpt's forward, data- and weight-gradient GEMMs, summed."""
    flops = seconds = 0.0
    for n_out, k_in in ((3 * HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN), (VOCAB, HIDDEN)):
        w, b = torch.randn(n_out, k_in), torch.randn(n_out)
        x, dy = torch.randn(ROWS, k_in), torch.randn(ROWS, n_out)
        for fn in (lambda: F.linear(x, w, b), lambda: dy @ w, lambda: dy.t() @ x):
            seconds += _seconds(fn, 200, repeat)
            flops += 2.0 * ROWS * n_out * k_in
    return flops / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rate = gemm_rate(args.repeat)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    square = 2 * 512 ** 3 / _seconds(lambda: a @ b, 40, args.repeat)
    print(f"GEMM, tiny-gpt training shapes: {rate / 1e9:.0f} GFLOP/s ({rate / PEAK:.2f} of the {PEAK / 1e9:.0f} "
          f"GFLOP/s peak); 512^3: {square / 1e9:.0f} GFLOP/s")
    x, dy = torch.randn(ROWS, FFN), torch.randn(ROWS, FFN)
    n = x.numel()
    for name, fn in (("gelu(tanh) forward", lambda: F.gelu(x, approximate="tanh")),
                     ("gelu(tanh) backward", lambda: torch.ops.aten.gelu_backward(dy, x, approximate="tanh")),
                     ("silu forward", lambda: F.silu(x)), ("copy", lambda: x.clone())):
        print(f"{name}: {n / _seconds(fn, 200, args.repeat) / 1e9:.2f} G elements/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
