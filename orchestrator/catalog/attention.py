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


def fwd_bwd_rates(fwd_causal: tuple[float, ...], fwd_full: tuple[float, ...], bwd_full: tuple[float, ...]
                  ) -> tuple[float, ...]:
    """Causal forward + backward rates from a benchmark that prints the causal forward, the unmasked forward and
    the unmasked backward only (FlashAttention-3's H100 figures): the backward under the mask is taken to lose
    what the forward loses at that length (our estimate: both sweep the same masked key blocks), and the two
    passes add as time does, the backward doing FLASH_BWD_FACTOR (2.5) times the forward's FLOPs."""
    out = []
    for f, n, b in zip(fwd_causal, fwd_full, bwd_full):
        bwd = b * f / n
        out.append(round(3.5 / (1 / f + 2.5 / bwd), 1))
    return tuple(out)


# FlashAttention-2 on the H100 80GB SXM5 (bf16): the FlashAttention-2 bars of Shah et al. 2024,
# "FlashAttention-3" (arXiv 2407.08608), Fig. 5 (forward, causal and not, head dimension 64 and 128) and Fig. 6
# (backward, without mask), 16k tokens per batch, hidden 2048, at the same sequence lengths as _SEQ.
_H100_FA2 = {
    64: fwd_bwd_rates((180.0, 229.0, 262.0, 284.0, 295.0, 299.0), (282.0, 306.0, 318.0, 321.0, 322.0, 324.0),
                      (198.0, 238.0, 264.0, 279.0, 287.0, 291.0)),
    128: fwd_bwd_rates((191.0, 260.0, 298.0, 319.0, 333.0, 335.0), (309.0, 350.0, 362.0, 368.0, 370.0, 370.0),
                       (214.0, 260.0, 291.0, 310.0, 318.0, 322.0)),
}
KERNEL_RATES[("fa2", "h100-sxm")] = {d: tuple(zip(_SEQ, rates)) for d, rates in _H100_FA2.items()}
KERNEL_RATES_SOURCE = ("Dao 2023, arXiv 2307.08691, Fig. 4 (c), (d): A100 80GB SXM4, causal, fwd + bwd TFLOP/s; "
                       "Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35; H100 80GB "
                       "SXM5: Shah et al. 2024, arXiv 2407.08608, Fig. 5 and 6, FlashAttention-2 bars (fwd_bwd_rates)")
