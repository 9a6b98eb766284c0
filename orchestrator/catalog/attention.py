"""Measured throughput of fused (flash) attention kernels, per kernel, GPU, head dimension and sequence length.

Data only: orchestrator/estimate/attention.py turns it into a kernel time. Every figure is a forward + backward
rate in TFLOP/s of a causal self-attention, in the benchmark's own FLOP convention: forward 4 * s^2 * d * heads
* batch, halved for the causal mask, backward 2.5x the forward (fwd + bwd = 3.5x), bf16/fp16 inputs. A rate
holds for the GPU at its benchmark clock (a short run, as the catalog's MAMF figures; the estimator scales it by
the GPU's ``sustained_clock_fraction``).

Source of every row here: Dao 2023, "FlashAttention-2" (arXiv 2307.08691), Fig. 4 (c) and (d), "Attention
forward + backward speed (A100 80GB SXM4)", with causal mask, head dimension 64 and 128, sequence length
512 .. 16k at 16k tokens per batch (batch 32 .. 1) and hidden 2048 (32 or 16 heads); the same figure, with each
bar's value printed on it, is assets/flash2_a100_fwd_bwd_benchmark.png of Dao-AILab/flash-attention, added by
the FlashAttention-2 release commit 4f285b35 (2023-07-17). Its benchmark script (benchmarks/benchmark_causal.py
at that commit) times "Flash" (flash-attn 1.x, CUDA) and "Flash2". Which kernel the "FlashAttention Triton" bars
ran is not certain: that script's (commented-out) "Triton" entry is OpenAI Triton's triton.ops.flash_attention
(its ``attention_triton``), while the same script before the release (e.g. commit 4360cfc6) gave the label
"FlashAttention Triton" to flash-attn's own flash_attn_triton.py. Those bars are not used; at 2k tokens (the
sequence length of the MPT rows that use ``flash_attn_triton``) they lie within 3% of the FlashAttention bars
that are (causal, head dim 64: 79 against 77 TFLOP/s; 128: 68 against 69), so either reading gives nearly the
rate used there.

Kernels (:data:`KERNEL_RATES` keys):

* ``fa2``: FlashAttention-2 (flash-attn >= 2.0, CUDA). PyTorch's scaled_dot_product_attention runs it as its
  flash backend since PyTorch 2.2 (v2.2.0 release notes: "scaled_dot_product_attention (SDPA) now supports
  FlashAttention-2"). Rates: the figure's FlashAttention-2 bars.
* ``flash_attn_triton``: flash-attn 1.x's Triton kernel (flash_attn/flash_attn_triton.py, at v1.0.3.post0
  "tested with triton==2.0.0.dev20221202"), what llm-foundry's MPT runs as ``attn_impl: triton``. Its module
  docstring: "Triton forward is generally faster than CUDA forward, while Triton backward is generally slower
  than CUDA backward. Overall Triton forward + backward is slightly slower than CUDA forward + backward", the
  CUDA version being flash-attn 1.x. No benchmark known to be of that kernel was found (see above); the
  figure's FlashAttention (flash-attn 1.x CUDA) bars are used: an upper bound on its speed by its author's statement.

Only the A100 80GB is listed (the GPU measured). Other GPUs and kernels use the GPU's catalog figure
(gpus.py ``attention_efficiency``).
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
