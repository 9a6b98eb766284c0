"""What Megatron's per-module recompute (``ModelShape.recompute_modules``) no longer stores.

Per layer of each kind, one micro-batch, one rank, in Korthikanti et al. 2022's accounting (activations.py:
x = e*s*b*h, divided by t with sequence parallelism, f the MLP width, r the rank's routed rows), from
Megatron-Core core_v0.16.1 (transformer_layer.py, mlp.py, moe/moe_layer.py, moe/experts.py):
  layernorm       the norm outputs of the norms that are modules of their own (output-discarding checkpoint):
                  in the Transformer Engine layer orch writes on GPUs, the MoE layers' pre-MLP norm (x); the
                  input norm and a dense layer's norms are fused into the next linear (nothing). With the
                  local layer (CPU) both norms of every layer (2x).
  moe_act         the experts' activation output, fc2's input: e*r*f_e/etp (output-discarding).
  shared_experts  the shared experts' MLP activations: e*s*b*(2 or 3)*f_s/t (normal checkpoint: its input is
                  the pre-MLP norm output, kept).
  moe             the whole MoE block: its permuted tokens and experts' activations, e*r*(h + (2|3)*f_e/etp),
                  and the shared experts'; subsumes moe_act and shared_experts.
  mlp             a dense layer's MLP: e*s*b*(2|3)*f/t, and with the TE layer the fused norm's output (fc1's
                  input, x) that the checkpoint's input replaces.
  core_attn       the s^2 attention terms (activations.py, ``recompute_core_attn``).
The backward recomputes one module at a time: the transient is the largest recomputed module's activations.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .context import rank_shape
from .moe import expert_work
from .params import ModelShape


@dataclass(frozen=True)
class ModuleSavings:
    """Bytes per mean layer no longer stored, and the transient of the largest recomputed module."""

    stored_bytes: float
    working_bytes: float


@lru_cache(maxsize=16384)
def module_savings(shape: ModelShape, tp: int, cp: int, ep: int, etp: int, mb: int, sp: bool,
                   dtype_bytes: int, fused_norms: bool = True) -> ModuleSavings:
    """What ``shape.recompute_modules`` saves (module doc); ``fused_norms``: the Transformer Engine layer."""
    mods = set(shape.recompute_modules)
    if not mods:
        return ModuleSavings(0.0, 0.0)
    rs = rank_shape(shape, cp)
    e, tokens, h = dtype_bytes, rs.seq_length * mb, shape.hidden_size
    gated = 3 if shape.gated_mlp else 2
    x = e * tokens * h / (tp if sp else 1)
    dense_drop = moe_drop = working = 0.0
    if "layernorm" in mods:
        dense_drop += 0.0 if fused_norms else 2 * x
        moe_drop += x if fused_norms else 2 * x
        working = max(working, x)
    if "mlp" in mods:
        mlp = e * tokens * gated * shape.ffn_hidden_size / tp + (x if fused_norms else 0.0)
        dense_drop += mlp
        working = max(working, mlp)
    moe = shape.moe
    if moe is not None:
        work = expert_work(shape, tp, cp, ep, etp, mb)
        shared = e * tokens * gated * moe.shared_ffn / tp
        experts = e * work.routed_rows * (h + gated * moe.expert_ffn / etp)
        if "moe" in mods:
            moe_drop += experts + shared
            working = max(working, experts + shared)
        else:
            if "moe_act" in mods:
                moe_drop += e * work.routed_rows * moe.expert_ffn / etp
                working = max(working, e * work.routed_rows * moe.expert_ffn / etp)
            if "shared_experts" in mods:
                moe_drop += shared
                working = max(working, shared)
    share = shape.num_moe_layers / shape.num_layers if moe is not None else 0.0
    return ModuleSavings((1 - share) * dense_drop + share * moe_drop, working)
