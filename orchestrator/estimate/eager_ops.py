"""Element-wise work run as separate eager PyTorch kernels where estimate/compute.py charges fused ones:
Megatron-Core's own fallbacks (gpt-oss: unfused YaRN RoPE, a clamped GLU, biased experts, recompute modules) and
model code written in eager PyTorch (torchtitan's Llama). Each function returns :class:`EagerWork`, the HBM
bytes and kernels a feature adds to one layer for one micro-batch on one rank.

The counts per element and their sources: docs/cost-model.md, "estimate/eager_ops.py".
"""
from __future__ import annotations

from dataclasses import dataclass

ROPE_FUSED_E = (2, 2)           # e per element of Q and K, (forward, backward): TE's fused RoPE
ROPE_UNFUSED_E = (12, 10)       # the unfused path (docs/cost-model.md)
ROPE_UNFUSED_KERNELS = (12, 5)  # per call (Q or K); the fused path is one kernel each way
GLU_CLAMP_E = (4, 5.5)          # per element of the 2f-wide fc1 output
GLU_CLAMP_MASK_BYTES = 4        # backward: the 1-byte masks of the clamp gradients, per element
GLU_CLAMP_KERNELS = (3, 9)
EXPERT_BIAS_E = (6, 8)          # per element of the h-wide fc2 output
EXPERT_BIAS_KERNELS = (2, 4)    # per local expert; plus one cat each way
NORM_E = 2                      # a norm's forward: read its input, write its output
FP32 = 4
# torchtitan's Llama layer (docs/cost-model.md), beyond estimate/compute.py's charges; (e, FP32) multiples per element
EAGER_RMSNORM_EXTRA = ((2, 7), (5, 19))         # (forward, backward), per element of a norm's s x h input
EAGER_RMSNORM_EXTRA_KERNELS = (7, 15)
COMPLEX_ROPE_EXTRA_FP32 = 4                     # per element of Q and K, each way
COMPLEX_ROPE_EXTRA_KERNELS = 2                  # per call (Q or K), each way
EAGER_SWIGLU_EXTRA_E = (2, 4)                   # per element of the f-wide activation
EAGER_SWIGLU_EXTRA_KERNELS = (1, 2)
PROJECTION_GRAD_SUMS = 3                        # wq/wk/wv: two sums, w1/w3: one; 3 e each per element of s x h


@dataclass(frozen=True)
class EagerWork:
    """Bytes and kernels a feature adds to one layer, forward and backward."""

    forward_bytes: float = 0.0
    backward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_kernels: int = 0

    def __add__(self, other: "EagerWork") -> "EagerWork":
        return EagerWork(self.forward_bytes + other.forward_bytes, self.backward_bytes + other.backward_bytes,
                         self.forward_kernels + other.forward_kernels, self.backward_kernels + other.backward_kernels)

    def times_s(self, hbm_Bps: float, kernel_gap_s: float) -> tuple[float, float]:
        """(forward, backward) seconds: the bytes at the sustained bandwidth, plus each kernel's gap."""
        return (self.forward_bytes / hbm_Bps + self.forward_kernels * kernel_gap_s,
                self.backward_bytes / hbm_Bps + self.backward_kernels * kernel_gap_s)


def unfused_rope_work(q_k_elements: float, e: int) -> EagerWork:
    """What the unfused RoPE adds over the fused one for Q and K of ``q_k_elements`` elements (two calls)."""
    (ff, fb), (uf, ub) = ROPE_FUSED_E, ROPE_UNFUSED_E
    kf, kb = ROPE_UNFUSED_KERNELS
    return EagerWork((uf - ff) * e * q_k_elements, (ub - fb) * e * q_k_elements, 2 * (kf - 1), 2 * (kb - 1))


def glu_clamp_work(fc1_elements: float, e: int) -> EagerWork:
    """The clamp and cat before a fused gated activation over ``fc1_elements`` (rows x 2f)."""
    f, b = GLU_CLAMP_E
    return EagerWork(f * e * fc1_elements, (b * e + GLU_CLAMP_MASK_BYTES) * fc1_elements, *GLU_CLAMP_KERNELS)


def expert_bias_work(fc2_elements: float, local_experts: int, e: int) -> EagerWork:
    """TEGroupedMLP's per-expert probability-weighted fc2 bias over ``fc2_elements`` (routed rows x h)."""
    f, b = EXPERT_BIAS_E
    kf, kb = EXPERT_BIAS_KERNELS
    return EagerWork(f * e * fc2_elements, b * e * fc2_elements, kf * local_experts + 1,
                     kb * local_experts + 1)


def norm_forward_work(elements: float, e: int) -> EagerWork:
    """One norm's forward over ``elements`` (a recomputed norm)."""
    return EagerWork(forward_bytes=NORM_E * e * elements, forward_kernels=1)


def eager_rmsnorm_work(elements: float, e: int) -> EagerWork:
    """What torchtitan's eager RMSNorm adds over a fused norm for an input of ``elements`` (docs/cost-model.md)."""
    ((fe, ff), (be, bf)), (kf, kb) = EAGER_RMSNORM_EXTRA, EAGER_RMSNORM_EXTRA_KERNELS
    return EagerWork((fe * e + ff * FP32) * elements, (be * e + bf * FP32) * elements, kf, kb)


def torchtitan_llama_work(tokens: float, hidden: int, q_width: float, kv_width: float, ffn_width: float,
                          e: int) -> EagerWork:
    """What torchtitan's Llama layer (model.py at 1ea476e9f, its norms aside) adds over a Megatron-Core layer for
    ``tokens`` rows on one rank: complex RoPE, eager SwiGLU, the summed gradients of its separate projections, its
    GQA ``repeat_kv`` copies, less the QKV and context copies it does not make (docs/cost-model.md). ``q_width``,
    ``kv_width`` (Q; K or V) and ``ffn_width`` (the activation) are per rank; ``hidden``, the projections' input,
    is whole on every tensor-parallel rank. Bytes may come out negative where the copies saved outweigh the rest."""
    rope = COMPLEX_ROPE_EXTRA_FP32 * FP32 * tokens * (q_width + kv_width)
    (sf, sb), (skf, skb) = EAGER_SWIGLU_EXTRA_E, EAGER_SWIGLU_EXTRA_KERNELS
    act = tokens * ffn_width
    copies_saved = 2 * e * tokens * ((q_width + 2 * kv_width) + q_width)
    grad_sums = PROJECTION_GRAD_SUMS * 3 * e * tokens * hidden
    gqa = kv_width < q_width
    repeat_kv = 2 * e * tokens * (q_width + kv_width) if gqa else 0.0
    rope_k = 2 * COMPLEX_ROPE_EXTRA_KERNELS
    return EagerWork(rope + sf * e * act - copies_saved + repeat_kv,
                     rope + sb * e * act + grad_sums - copies_saved + repeat_kv,
                     rope_k + skf - 2 + 2 * gqa, rope_k + skb + PROJECTION_GRAD_SUMS - 2 + 2 * gqa)
