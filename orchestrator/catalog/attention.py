"""Measured throughput of fused (flash) attention kernels, per kernel, GPU, head dimension and sequence length.

Data only: orchestrator/estimate/attention.py turns it into a kernel time. Every figure is a forward + backward
rate in TFLOP/s in the benchmark's own FLOP convention. The source of every row and which kernel each rate
stands for: docs/cost-model.md, "catalog/attention.py".
"""
from __future__ import annotations

# (sequence length, fwd + bwd TFLOP/s) at head dimension 64 and 128; causal; the figure's bars left to right.
_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
KERNEL_RATES: dict[tuple[str, str], dict[int, tuple[tuple[int, float], ...]]] = {
    ("fa2", "a100-80gb"): {
        64: tuple(zip(_SEQ, (88.0, 119.0, 140.0, 156.0, 165.0, 171.0))),
        128: tuple(zip(_SEQ, (99.0, 133.0, 155.0, 173.0, 182.0, 189.0))),
    },
    ("flash_attn_triton", "a100-80gb"): {
        64: tuple(zip(_SEQ, (58.0, 70.0, 77.0, 87.0, 92.0, 97.0))),
        128: tuple(zip(_SEQ, (55.0, 62.0, 69.0, 76.0, 80.0, 83.0))),
    },
}
KERNEL_RATES_SOURCE = ("Dao 2023, arXiv 2307.08691, Fig. 4 (c), (d): A100 80GB SXM4, causal, fwd + bwd TFLOP/s; "
                       "Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35")
