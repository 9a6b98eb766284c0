"""Compute time of one transformer layer: GEMMs at a shape-dependent efficiency (tile and wave quantisation,
the short-K prologue, an HBM roofline), the attention core, memory-bound kernels over HBM bandwidth, dropout,
a gap per kernel, and the straggler stretch of synchronous training.

The model and its sources: docs/cost-model.md, "estimate/compute.py".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from math import ceil, log, pi, sqrt

from .attention import measured_attention_flops
from .eager_ops import EagerWork, eager_rmsnorm_work, torchtitan_llama_work, unfused_rope_work
from .hardware import Hardware
from .params import ModelShape

TILES = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.92), (128, 64, 0.80), (64, 128, 0.80), (64, 64, 0.65))
K_OVERHEAD = 64
FP32 = 4
MASK = 1
FLASH_BWD_FACTOR = 2.5
KERNELS_FWD = 20          # kernels of one layer's forward (GEMMs, fused element-wise, attention, copies)
KERNELS_BWD = 40
ADAM_BYTES_PER_PARAM = 36  # read master, m, v, fp32 grad; write master, m, v, 16-bit copy; norm; zeroing
# PyTorch's unfused AdamW (torch.optim.adam._single_tensor_adam, fp32, decoupled weight decay): one pass per
# op, counted: param.mul_ 8, exp_avg.lerp_ 12, exp_avg_sq.mul_ 8 + addcmul_ 12, sqrt 8, div 8, add_ 8,
# param.addcdiv_ 16.
ADAM_UNFUSED_BYTES_PER_PARAM = 80
# fp32 tensor passes per logit of Megatron-Core's vocab-parallel cross entropy beyond the casts (counted in
# docs/cost-model.md, "The loss's memory traffic"): unfused max 1, sub_ 2, exp 2, sum 1, div_ 2, backward mul_ 2;
# fused (--cross-entropy-loss-fusion) the max with the cast, sub/exp/sum 2, div 2, backward the softmax read and
# the in-place mul_'s write-back 2 (the bf16 gradient written beside it).
VOCAB_PARALLEL_FP32_PASSES = 10
VOCAB_PARALLEL_FUSED_FP32_PASSES = 6


@lru_cache(maxsize=65536)
def matmul_efficiency(m: int, n: int, k: int, num_sms: int, ceiling: float, batch: int = 1) -> float:
    """Achievable fraction of peak for an (m x k) @ (k x n) GEMM, ``batch`` times (docs/cost-model.md)."""
    if num_sms <= 1:     # a CPU core: no tiles, no GPU tile prologue (measured: no short-K penalty, catalog)
        return ceiling
    best = 0.0
    for tm, tn, rel in TILES:
        tiles = ceil(m / tm) * ceil(n / tn) * batch
        waves = ceil(tiles / num_sms)
        best = max(best, rel * m * n * batch / (waves * num_sms * tm * tn))
    return ceiling * best * k / (k + K_OVERHEAD)


@lru_cache(maxsize=65536)
def gemm_tiles(m: int, n: int, num_sms: int, batch: int = 1) -> int:
    """Output tiles of the tile shape :func:`matmul_efficiency` picks for an m x n GEMM on ``num_sms`` SMs."""
    best, tiles_of_best = -1.0, 1
    for tm, tn, rel in TILES:
        tiles = ceil(m / tm) * ceil(n / tn) * batch
        eff = rel * m * n * batch / (ceil(tiles / num_sms) * num_sms * tm * tn)
        if eff > best:
            best, tiles_of_best = eff, tiles
    return tiles_of_best


def matmul_time_s(m: int, n: int, k: int, hw: Hardware, batch: int = 1, accumulate_fp32: bool = False) -> float:
    """Roofline time of one GEMM: compute at the modelled efficiency, or its HBM traffic if slower."""
    flops = 2.0 * m * n * k * batch
    eff = matmul_efficiency(m, n, k, hw.num_sms, hw.matmul_efficiency, batch)
    e = hw.dtype_bytes
    out = 2 * FP32 if accumulate_fp32 else e
    traffic = batch * (e * (m * k + k * n) + out * m * n)
    return max(flops / (hw.peak_flops * eff), traffic / hw.hbm_Bps)


def linear_gemm_times_s(tokens: int, n_out: int, k_in: int, hw: Hardware) -> tuple[float, float, float]:
    """(forward, data gradient, weight gradient) GEMM times of one linear layer y = x W; the weight gradient's
    GEMM accumulates in fp32 in its epilogue when the accumulation is fused."""
    return (matmul_time_s(tokens, n_out, k_in, hw), matmul_time_s(tokens, k_in, n_out, hw),
            matmul_time_s(k_in, n_out, tokens, hw, accumulate_fp32=hw.fused_grad_accumulation))


def linear_times_s(tokens: int, n_out: int, k_in: int, hw: Hardware) -> tuple[float, float]:
    """(forward, backward) of one linear layer: y = x W; backward = data gradient + weight gradient.

    The weight gradient lands in an fp32 accumulator: inside the GEMM epilogue when fused, otherwise by a
    separate pass reading the 16-bit gradient and reading and writing the accumulator.
    """
    fwd, dgrad, wgrad = linear_gemm_times_s(tokens, n_out, k_in, hw)
    if not hw.fused_grad_accumulation:
        wgrad += k_in * n_out * (hw.dtype_bytes + 2 * FP32) / hw.hbm_Bps + hw.kernel_gap_s
    return fwd, dgrad + wgrad


@dataclass(frozen=True)
class LayerTimeEstimate:
    """Compute time of one transformer layer for one micro-batch on one TP rank (no communication)."""

    forward_s: float
    backward_s: float
    recompute_s: float       # extra forward work in the backward pass (selective / full recompute)
    matmul_forward_s: float
    attention_forward_s: float
    memory_bound_forward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def attention_linear_shapes(shape: ModelShape, tp: int) -> list[tuple[int, int]]:
    """(output width, input width) of the attention's two linear layers on one TP rank."""
    h, q = shape.hidden_size, shape.q_size
    return [((q + 2 * shape.kv_size) // tp, h), (h, q // tp)]


def mlp_linear_shapes(shape: ModelShape, ffn: int, tp: int) -> list[tuple[int, int]]:
    """(output width, input width) of an MLP's two linear layers (gate and up fused when gated)."""
    h = shape.hidden_size
    return [(ffn * (2 if shape.gated_mlp else 1) // tp, h), (h, ffn // tp)]


def linears_time_s(tokens: int, shapes: list[tuple[int, int]], hw: Hardware) -> tuple[float, float, float]:
    """(forward, backward, forward GEMMs only) of linear layers over ``tokens`` rows."""
    fwd = bwd = 0.0
    for n_out, k_in in shapes:
        f, b = linear_times_s(tokens, n_out, k_in, hw)
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd, fwd


def activation_times_s(shape: ModelShape, hw: Hardware, rows: float, width: float) -> tuple[float, float]:
    """(forward, backward) time of an MLP activation (GeLU, or SwiGLU's gate) over rows x width: its memory
    traffic over the sustained bandwidth; for GeLU where the hardware's GeLU rate is known (the CPU target: the
    tanh costs more than the bytes, catalog ``gelu_elems_per_s``), its elements at that rate where longer."""
    act, e = rows * width, hw.dtype_bytes
    rw_f, rw_b = (3, 5) if shape.gated_mlp else (2, 3)          # tensor reads + writes per element
    fwd, bwd = rw_f * e * act / hw.hbm_Bps, rw_b * e * act / hw.hbm_Bps
    if hw.gelu_elems_per_s and not shape.gated_mlp:
        fwd, bwd = max(fwd, act / hw.gelu_elems_per_s), max(bwd, act / hw.gelu_elems_per_s)
    return fwd, bwd


@dataclass(frozen=True)
class MlpTimes:
    """One layer's MLP block on one rank for one micro-batch (GEMMs and element-wise work)."""

    forward_s: float
    backward_s: float
    matmul_forward_s: float
    recompute_s: float = 0.0   # its own recomputation under ModelShape.recompute_modules (estimate/moe.py)


def dense_mlp_times(shape: ModelShape, hw: Hardware, tp: int, mb: int, gemm_hw: Hardware | None = None) -> MlpTimes:
    tokens = shape.seq_length * mb
    fwd, bwd, mm = linears_time_s(tokens, mlp_linear_shapes(shape, shape.ffn_hidden_size, tp), gemm_hw or hw)
    act_fwd, act_bwd = activation_times_s(shape, hw, tokens, shape.ffn_hidden_size / tp)
    return MlpTimes(fwd + act_fwd, bwd + act_bwd, mm)


def _attention_times_s(shape: ModelShape, hw: Hardware, tp: int, mb: int) -> tuple[float, float, float]:
    """(forward, backward, selective-recompute) time of the attention core on one TP rank."""
    s, d, heads = shape.seq_length, shape.head_dim, shape.num_attention_heads // tp
    if shape.flash_attention:
        measured = measured_attention_flops(shape.attention, hw.name, d, s)
        if measured is None:
            fwd = 4.0 * mb * heads * s * s * d * causal_fraction(s) / (hw.peak_flops * hw.attention_efficiency)
        else:   # the benchmark's causal FLOPs, half of 4 s^2 d per head (estimate/attention.py)
            fwd = 2.0 * mb * heads * s * s * d / (measured * hw.sustained_clock_fraction)
        return fwd, FLASH_BWD_FACTOR * fwd, 0.0
    batch = mb * heads
    scores = matmul_time_s(s, s, d, hw, batch)         # Q K^T
    context = matmul_time_s(s, d, s, hw, batch)        # P V
    e, elems = hw.dtype_bytes, batch * s * s
    dropout = (2 * e + MASK) * elems if shape.attention_dropout_p > 0 else 0    # dropout r/w + mask (fwd and bwd alike)
    softmax_fwd = (2 * e) * elems + dropout                         # softmax r/w
    softmax_bwd = (3 * e) * elems + dropout
    fwd = scores + context + softmax_fwd / hw.hbm_Bps
    bwd = 2 * (scores + context) + softmax_bwd / hw.hbm_Bps
    return fwd, bwd, fwd


def causal_fraction(seq: int, block: int = 128) -> float:
    """Share of the s x s score blocks a causal fused kernel computes (lower triangle incl. diagonal)."""
    nb = max(1, ceil(seq / block))
    return (nb + 1) / (2 * nb)


def _memory_bound_bytes(shape: ModelShape, e: int, tp: int, sp: bool, mb: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one layer's element-wise kernels on one TP rank, outside the MLP
    (norms, residuals and dropouts, QKV/context reshapes, RoPE). The two bias-dropout-adds read the branch
    output and the residual and write the sum (3 e per element), plus with dropout the mask (written forward,
    read backward)."""
    mask = MASK if shape.dropout > 0 else 0
    tokens = shape.seq_length * mb
    x = tokens * shape.hidden_size / (tp if sp else 1)      # tensors outside the TP region
    qkv = tokens * (shape.q_size + 2 * shape.kv_size) / tp
    ctx = tokens * shape.q_size / tp
    rope = 0 if shape.learned_positions else tokens * (shape.q_size + shape.kv_size) / tp
    fwd = 2 * (2 * e * x) + 2 * ((3 * e + mask) * x) + 2 * e * (qkv + ctx + rope)
    bwd = 2 * (3 * e * x) + 2 * ((3 * e + mask) * x) + 2 * e * (qkv + ctx + rope)
    return fwd, bwd


def _eager_work(shape: ModelShape, e: int, tp: int, sp: bool, mb: int) -> EagerWork:
    """What the layer's eager kernels add over the charges above (estimate/eager_ops.py): Megatron-Core's unfused
    RoPE, torchtitan's Llama layer and its eager norms; nothing for orch's own Megatron-Core layer."""
    tokens = shape.seq_length * mb
    work = EagerWork()
    if not (shape.fused_rope or shape.learned_positions):
        work += unfused_rope_work(tokens * (shape.q_size + shape.kv_size) / tp, e)
    if shape.layer_impl == "torchtitan_llama":
        work += torchtitan_llama_work(tokens, shape.hidden_size, shape.q_size / tp, shape.kv_size / tp,
                                      shape.ffn_hidden_size / tp, e)
    if shape.eager_norm:                        # the pre-attention and the pre-MLP norm
        norm = eager_rmsnorm_work(tokens * shape.hidden_size / (tp if sp else 1), e)
        work += norm + norm
    return work


@lru_cache(maxsize=65536)
def estimate_layer_time(shape: ModelShape, hw: Hardware, tp: int, mb: int, sp: bool, recompute: str,
                        gemm_hw: Hardware | None = None, mlp: MlpTimes | None = None) -> LayerTimeEstimate:
    """Forward, backward and recompute time of one layer for one micro-batch on one TP rank.

    ``gemm_hw``: the rates the linear layers run at when they differ (FP8, estimate/precision.py);
    ``mlp``: the MLP block when it is not the dense one (a MoE layer, estimate/moe.py)."""
    tokens = shape.seq_length * mb
    mm_fwd, mm_bwd, _ = linears_time_s(tokens, attention_linear_shapes(shape, tp), gemm_hw or hw)
    if mlp is None:   # a dense layer: Megatron's ``mlp`` recompute module redoes its MLP's forward
        mlp = dense_mlp_times(shape, hw, tp, mb, gemm_hw)
        if "mlp" in shape.recompute_modules:
            mlp = dataclasses.replace(mlp, recompute_s=mlp.recompute_s + mlp.forward_s)
    att_fwd, att_bwd, att_recompute = _attention_times_s(shape, hw, tp, mb)
    if not shape.recompute_core_attn:
        att_recompute = 0.0
    ew_fwd, ew_bwd = (b / hw.hbm_Bps for b in _memory_bound_bytes(shape, hw.dtype_bytes, tp, sp, mb))
    eager_f, eager_b = _eager_work(shape, hw.dtype_bytes, tp, sp, mb).times_s(hw.hbm_Bps, hw.kernel_gap_s)
    ew_fwd, ew_bwd = ew_fwd + eager_f, ew_bwd + eager_b
    fwd = mm_fwd + mlp.forward_s + att_fwd + ew_fwd + KERNELS_FWD * hw.kernel_gap_s
    bwd = mm_bwd + mlp.backward_s + att_bwd + ew_bwd + KERNELS_BWD * hw.kernel_gap_s
    extra = {"none": mlp.recompute_s, "selective": att_recompute + mlp.recompute_s, "full": fwd}[recompute]
    return LayerTimeEstimate(forward_s=fwd, backward_s=bwd, recompute_s=extra,
                             matmul_forward_s=mm_fwd + mlp.matmul_forward_s, attention_forward_s=att_fwd,
                             memory_bound_forward_s=ew_fwd)


@lru_cache(maxsize=16384)
def head_time_s(shape: ModelShape, hw: Hardware, tp: int, mb: int, padded_vocab: int) -> float:
    """Output layer (logits GEMM), the cross entropy (``shape.loss``) and final norm, forward + backward."""
    tokens = shape.seq_length * mb
    f, b = linear_times_s(tokens, padded_vocab // tp, shape.hidden_size, hw)
    e = hw.dtype_bytes
    loss_bytes = tokens * padded_vocab / tp * loss_bytes_per_logit_moved(shape.loss, e)
    norm_bytes = 5 * e * tokens * shape.hidden_size
    return f + b + (loss_bytes + norm_bytes) / hw.hbm_Bps + 8 * hw.kernel_gap_s


def loss_bytes_per_logit_moved(loss: str, e: int) -> float:
    """HBM bytes the cross entropy moves per logit element, forward + backward (docs/cost-model.md,
    "The loss's memory traffic"); ``e`` the logits' element size."""
    cast = e + FP32 if e != FP32 else 0     # .float() of 16-bit logits (a no-op on fp32 ones)
    if loss == "xentropy":
        # flash-attn's xentropy (csrc/xentropy at v0.2.8): one forward kernel reads the logits (an fp32
        # log-sum-exp per token out), one backward kernel reads them again and writes the gradient.
        return 3 * e
    if loss == "vocab_parallel":
        # Megatron-Core's _VocabParallelCrossEntropy (tensor_parallel/cross_entropy.py), one eager kernel per op:
        # forward .float(), max, in-place sub_, exp, sum, div_ over fp32 logits; backward the in-place mul_ by the
        # loss gradient and autograd's cast of the fp32 gradient back to the logits' dtype.
        return cast + VOCAB_PARALLEL_FP32_PASSES * FP32 + cast
    if loss == "vocab_parallel_fused":
        # --cross-entropy-loss-fusion (fusions/fused_cross_entropy.py): each @jit_fuser function one pass.
        return cast + VOCAB_PARALLEL_FUSED_FP32_PASSES * FP32 + e    # the gradient written in the logits' dtype
    return e + 3 * FP32 + e   # torch: logits in, fp32 softmax r/w, grad out


@lru_cache(maxsize=16384)
def embedding_time_s(shape: ModelShape, hw: Hardware, tp: int, mb: int, padded_vocab: int) -> float:
    """Embedding lookup forward and its gradient scatter-add backward, into a dense gradient of the whole
    (padded vocab / tp) x h table that each micro-batch's backward zero-fills and the engine then accumulates
    into its fp32 gradient buffer (docs/cost-model.md, "The embedding's dense gradient")."""
    tokens, e = shape.seq_length * mb, hw.dtype_bytes
    table = padded_vocab / tp * shape.hidden_size
    dense_grad = table * (e + e + 2 * FP32)       # zero-fill; accumulate: read it, read and write the fp32 buffer
    return (3 * e * tokens * shape.hidden_size + dense_grad) / hw.hbm_Bps + 6 * hw.kernel_gap_s


def straggler_factor(num_gpus: int, spread: float) -> float:
    """Slowdown of synchronous work paced by the slowest of ``num_gpus`` GPUs whose speeds vary by
    ``spread`` (relative standard deviation): 1 + spread * E[max of n standard normals], with the
    extreme-value approximation sqrt(2 ln n) - (ln ln n + ln 4 pi) / (2 sqrt(2 ln n)) (exact enough for
    n >= 8; 0.56 at n = 2, where the formula is replaced by the exact 1/sqrt(pi))."""
    if num_gpus <= 1 or spread <= 0:
        return 1.0
    if num_gpus == 2:
        return 1 + spread / sqrt(pi)
    a = sqrt(2 * log(num_gpus))
    return 1 + spread * max(0.0, a - (log(log(num_gpus)) + log(4 * pi)) / (2 * a))


def optimizer_step_s(local_params: float, hw: Hardware, *, fused: bool = True) -> float:
    """Adam step over the parameters whose optimizer states this GPU owns (memory-bound)."""
    return (ADAM_BYTES_PER_PARAM if fused else ADAM_UNFUSED_BYTES_PER_PARAM) * local_params / hw.hbm_Bps
