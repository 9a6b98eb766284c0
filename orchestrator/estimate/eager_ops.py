"""Element-wise work run as separate eager PyTorch kernels where estimate/compute.py charges fused ones: Megatron-Core's
own fallbacks (gpt-oss) and model code written in eager PyTorch (torchtitan's Llama).

Each function returns :class:`EagerWork`: the HBM bytes and the kernels, forward and backward, that a feature
adds to one layer for one micro-batch on one rank, counted from the Megatron-Core code the Megatron-Bridge 25.11
container pins (submodule 92c8482e6d of NVIDIA-NeMo/Megatron-Bridge 97ad8cc6f; the same code at the 26.02 and
26.04.01 containers' pins 9ed8b0c4ac and 4415119414). Bytes are counted per element in units of ``e`` (the 16-bit activation size): a kernel that reads
r and writes w tensors of the element's size moves (r + w) e. Autograd's views (split, chunk, narrow) launch
nothing; a backward through ``torch.cat`` or ``chunk`` of a tensor whose parts all receive gradients
concatenates them (read and write, 2 e). gpt-oss (openai/gpt-oss-120b, Megatron-Bridge GPTOSSProvider) is the
model that uses them:

* **RoPE with a YaRN attention factor** (``ModelShape.fused_rope`` False). megatron/core/models/common/embeddings/
  rope_utils.py ``apply_rotary_pos_emb`` runs Transformer Engine's fused RoPE only when ``mscale`` is 1 and
  otherwise falls back to ``_apply_rotary_pos_emb_bshd`` (warning "mscale=... is not supported by TE's fused
  RoPE"); attention.py passes YaRN's concentration factor 0.1 ln(factor) + 1 (1.35 for gpt-oss's factor 32;
  yarn_rotary_pos_embedding.py ``_yarn_get_mscale``). Per call (Q, then K): cos and sin of the frequencies
  times mscale cast to the activation type (six small kernels), then ``t * cos``, ``-x2`` (half of t),
  ``cat(-x2, x1)``, ``* sin``, the sum, and ``cat((t, t_pass))`` (a copy: t_pass is empty): 12 e per element
  forward against the fused kernel's 2 e; backward ``* sin``, ``-`` (half), the chunk's ``cat``, ``* cos`` and
  the sum of the two paths: 10 e against 2 e.
* **A clamped gated activation** (``ModelShape.glu_clamp``). fusions/fused_bias_geglu.py
  ``weighted_bias_quick_geglu_impl`` (what moe/experts.py TEGroupedMLP calls with ``activation_func_clamp_value``
  set; gpt-oss has no dense MLP) clamps the two halves of the fc1 output and concatenates them in eager
  PyTorch before its fused kernel: per element of the 2f-wide fc1 output, forward 2 e (the two clamps, each
  over half) + 2 e (the cat); backward the two clamp gradients and the chunk's cat (2 e). PyTorch's clamp
  gradient (torch/csrc/autograd/FunctionsManual.cpp ``clamp_backward``, scalar bounds) is
  ``where(self <= max, grad, 0)`` for the upper bound alone (a compare writing a 1-byte mask, then the where:
  3 e + 2 bytes per element) and ``where((self >= min).logical_and_(self <= max), grad, 0)`` for both (4 e +
  6 bytes), over half the elements each, after a zero scalar each: 5.5 e + 4 bytes, nine kernels.
* **Biased experts** (``ModelShape.bias`` with MoE). moe/experts.py TEGroupedMLP builds fc2 with
  ``skip_bias_add=True`` and adds the bias weighted by the routing probability per local expert in Python
  (``_apply_bias``: ``t + b * p`` for each expert's rows, then ``torch.cat``; the probabilities have the
  router logits' 16-bit type, ``type_as(logits)`` in moe_utils.py ``topk_routing_with_score_function``, as
  the fused router's output in TE 2.9 router.cpp, gpt-oss setting no fp32 router). Per element of the h-wide fc2
  output: forward ``b * p`` writes 1 e, the sum 3 e, the cat 2 e (6 e), two kernels per expert and the cat;
  backward the gradients of b and p (each a product, 2 e, and its reduction, 1 e) and the split's cat (2 e):
  8 e, four kernels per expert and the cat.
* **Recompute modules** (``ModelShape.recompute_modules``, Megatron's --recompute-modules beyond core
  attention; transformer_layer.py, experts.py). ``moe_act`` wraps the experts' activation (with its clamp) in
  ``CheckpointWithoutOutput``: its forward runs again before fc2's backward. ``layernorm`` recomputes the norms
  that are modules of their own: in a MoE layer the pre-MLP norm (TENorm before the router; the input norm
  is fused into the QKV linear in the TE spec, an IdentityOp that is not recomputed), one norm forward
  (read and write, 2 e per element of the s x h input).

PyTorch-eager model code that is not Megatron-Core's (``ModelShape.layer_impl``, ``ModelShape.eager_norm``): the
layer of torchtitan's Llama at commit 1ea476e9f (torchtitan/models/llama/model.py, norms.py; its
docs/performance.md rows ran FSDP2 with ``compile = false`` in every train config, so nothing is fused), counted
per element against what estimate/compute.py charges a Megatron-Core layer (:func:`torchtitan_llama_work`; FP32 = 4
bytes for its fp32 intermediates). Backward formulas from PyTorch's tools/autograd/derivatives.yaml (mul.Tensor,
pow.Tensor_Scalar, rsqrt, mean.dim, _to_copy, expand, silu) and FunctionsManual.cpp (``pow_backward``: ``grad *
(2 * self.pow(1))``, where ``pow`` with exponent 1 is a copy, Pow.cpp); an input used twice gets its gradients
summed (read two, write one).

* **Eager RMSNorm** (``eager_norm``; norms.py ``RMSNorm``, the ``norm_type = "rmsnorm"`` of the 70B train
  configs; ``fused_rmsnorm``, a Triton kernel reading x and writing y once, is what orch already charges).
  Forward ``x.float()`` (e + FP32), ``pow(2)`` (2 FP32), ``mean`` (FP32), ``+ eps`` and ``rsqrt`` (per row),
  ``x * r`` (2 FP32), ``type_as`` (FP32 + e), ``* weight`` (2 e): 4 e + 7 FP32 in eight kernels against the fused
  2 e in one. Backward: ``* weight`` (2 e for x, 3 e and the 1 e reduction for the weight), ``type_as`` (e +
  FP32), ``x * r`` (2 FP32 for x, 3 FP32 and the 1 FP32 reduction for r), ``mean`` (the expanded quotient,
  FP32), ``pow`` (the copy 2 FP32, ``2 *`` 2 FP32, ``grad *`` 3 FP32), the sum of x's two gradients (3 FP32),
  ``x.float()`` (FP32 + e): 8 e + 19 FP32 in sixteen kernels (three of them per row, rsqrt's) against 3 e in one.
* **RoPE as an fp32 complex multiply** (``apply_rotary_emb``), per element of Q and K: ``float()`` (e + FP32),
  the complex product with ``freqs_cis`` (2 FP32), ``type_as`` (FP32 + e), three kernels; its backward mirrors
  it (``_to_copy``, ``grad * freqs.conj()``, ``_to_copy``): 2 e + 4 FP32 each way against the fused 2 e.
* **SwiGLU as ``silu(w1 x) * w3 x``**, per element of the f-wide activation: forward ``silu`` (2 e) and the
  product (3 e), two kernels against the fused 3 e; backward the two products' gradients (3 e each) and
  ``silu_backward`` (3 e), three kernels against the fused 5 e.
* **Separate projections and no reshape copies.** ``wq``, ``wk``, ``wv`` and ``w1``, ``w3`` are separate linears
  of the same normed input: their data gradients are summed (three sums of 3 e per element of s x h, none
  forward), where Megatron-Core's fused QKV and fc1 need none; Q, K, V are contiguous outputs viewed as heads and
  SDPA's flash output ``transpose(1, 2).contiguous()`` is already contiguous (aten's flash path returns the
  (b, s, h, d) buffer transposed), so the QKV and context copies orch charges (2 e per element each way) are not
  made. Grouped-query attention's ``repeat_kv`` (``expand`` then ``reshape``) copies K and V to all heads
  (e (kv + q) each, forward) and sums them back (``expand``'s backward, the same bytes). The two copies not made
  take a kernel each way off, the sums and ``repeat_kv`` add theirs. The three Q/K/V GEMMs and the two fc1 GEMMs
  are timed as Megatron-Core's fused ones (the same FLOPs), and the model's final norm, once per step, is left at
  the fused charge (head_time_s).

Time only: the activation memory model (estimate/activations.py) neither adds what the clamp's autograd keeps
(the unclamped fc1 output) nor drops what the recompute modules discard (the norm's output, what the activation
saves and its output), so such a run's activation bytes are approximate; nor, for torchtitan's layer, what its eager
SwiGLU (the silu output) and eager RMSNorm (the fp32 input) keep beyond the fused kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

ROPE_FUSED_E = (2, 2)           # e per element of Q and K, (forward, backward): TE's fused RoPE
ROPE_UNFUSED_E = (12, 10)       # the unfused path (module doc)
ROPE_UNFUSED_KERNELS = (12, 5)  # per call (Q or K); the fused path is one kernel each way
GLU_CLAMP_E = (4, 5.5)          # per element of the 2f-wide fc1 output
GLU_CLAMP_MASK_BYTES = 4        # backward: the 1-byte masks of the clamp gradients, per element
GLU_CLAMP_KERNELS = (3, 9)
EXPERT_BIAS_E = (6, 8)          # per element of the h-wide fc2 output
EXPERT_BIAS_KERNELS = (2, 4)    # per local expert; plus one cat each way
NORM_E = 2                      # a norm's forward: read its input, write its output
FP32 = 4
# torchtitan's Llama layer (module doc), beyond what estimate/compute.py charges; (e, FP32) multiples per element
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
    """What torchtitan's eager RMSNorm adds over a fused norm for an input of ``elements`` (module doc)."""
    ((fe, ff), (be, bf)), (kf, kb) = EAGER_RMSNORM_EXTRA, EAGER_RMSNORM_EXTRA_KERNELS
    return EagerWork((fe * e + ff * FP32) * elements, (be * e + bf * FP32) * elements, kf, kb)


def torchtitan_llama_work(tokens: float, hidden: int, q_width: float, kv_width: float, ffn_width: float,
                          e: int) -> EagerWork:
    """What torchtitan's Llama layer (model.py at 1ea476e9f, its norms aside) adds over a Megatron-Core layer for
    ``tokens`` rows on one rank: complex RoPE, eager SwiGLU, the summed gradients of its separate projections, its
    GQA ``repeat_kv`` copies, less the QKV and context copies it does not make (module doc). ``q_width``,
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
