"""FLOPs per training step: model FLOPs (what MFU counts) and hardware FLOPs (with recompute, for HFU).

Narayanan et al. 2021 (SC21, arXiv 2104.04473), section 5.1, eq. 3: with full activation recomputation a
GPT step of B sequences of length s, l layers, width h and vocabulary V costs
    F = 96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h))
(each layer 24*B*s*h^2 + 4*B*s^2*h forward, run three times forward-equivalent for backward and once more
for the recomputation; the logits 2*B*s*h*V forward, three times). Without recomputation the layer factor
is 3, giving 72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)) (note: V/(12lh), not V/(16lh)).

The general form used for any model counts 2 FLOPs per multiply-add of every weight matrix per token (so
GQA and gated MLPs are exact), attention scores and values 4*s*h per token per layer, and the logits;
norms, biases and element-wise work are not counted (they are not matrix FLOPs). A MoE layer counts the
weights a token passes through: attention, the router, its top-k experts and the shared expert (Megatron-Core
MoE docs' model-FLOPs convention; :func:`~orchestrator.estimate.params.active_layer_matrix_params`). Attention is counted
over the full s x s square, as eq. 3 does, even where a causal kernel skips the masked half.
Selective recompute re-runs only the attention core (4*B*s^2*h per layer) and the matrices of the recompute
modules (``ModelShape.recompute_modules``: ``moe`` the router and the token's experts and shared expert,
``shared_experts`` the shared expert, ``mlp`` a dense layer's MLP; the others are element-wise); without
``core_attn`` in a spec's list (``recompute_core_attn`` False) not the attention core. Full recompute re-runs
the whole layer forward (of its share of the layers: step.py full_recompute_share).
"""
from __future__ import annotations

from dataclasses import dataclass

from .params import ModelShape, active_layer_matrix_params, mlp_matrix_params


@dataclass(frozen=True)
class FlopsEstimate:
    """FLOPs of one optimizer step over the whole cluster."""

    model_flops: float          # forward + backward, no recomputation
    hardware_flops: float       # what the GPUs execute, recomputation included
    layer_forward_flops: float  # one layer, one sequence
    attention_forward_flops: float  # the s^2 part of one layer, one sequence
    logits_forward_flops: float     # output layer, one sequence


def narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool = True) -> float:
    """Eq. 3 of Narayanan et al. 2021 (recompute=True) or its no-recompute counterpart."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab
    if recompute:
        return 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    return 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))


def layer_forward_flops(shape: ModelShape) -> tuple[float, float]:
    """(matrix FLOPs, attention-core FLOPs) of one layer's forward pass for one sequence."""
    s = shape.seq_length
    return 2 * s * active_layer_matrix_params(shape), 4 * s * s * shape.q_size


def module_recompute_flops(shape: ModelShape) -> float:
    """Matrix FLOPs the recompute modules redo per layer (mean over the layers) for one sequence."""
    mods, s = shape.recompute_modules, shape.seq_length
    if not mods:
        return 0.0
    dense = 2 * s * mlp_matrix_params(shape, shape.ffn_hidden_size) if "mlp" in mods else 0.0
    moe = shape.moe
    if moe is None:
        return dense
    routed = shape.hidden_size * moe.num_experts + moe.router_topk * mlp_matrix_params(shape, moe.expert_ffn)
    shared = mlp_matrix_params(shape, moe.shared_ffn)
    block = 2 * s * (routed + shared) if "moe" in mods else 2 * s * shared if "shared_experts" in mods else 0.0
    share = shape.num_moe_layers / shape.num_layers
    return (1 - share) * dense + share * block


def estimate_flops(shape: ModelShape, global_batch: int, recompute: str = "none",
                   full_share: float = 1.0) -> FlopsEstimate:
    """Model and hardware FLOPs of one step (``global_batch`` sequences); ``full_share``: the share of the
    layers a full recompute recomputes."""
    matrix, attention = layer_forward_flops(shape)
    layer = matrix + attention
    logits = 2 * shape.seq_length * shape.hidden_size * shape.vocab_size
    forward = shape.num_layers * layer + logits
    model = 3 * forward * global_batch
    core = attention if shape.recompute_core_attn else 0.0
    modules = module_recompute_flops(shape)
    extra = {"none": modules, "selective": core + modules, "full": layer * full_share}[recompute]
    hardware = model + shape.num_layers * extra * global_batch
    return FlopsEstimate(model_flops=model, hardware_flops=hardware, layer_forward_flops=layer,
                         attention_forward_flops=attention, logits_forward_flops=logits)
