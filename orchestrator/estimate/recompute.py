"""What Megatron's per-module recompute (``ModelShape.recompute_modules``) no longer stores, per layer.

Korthikanti et al. 2022's accounting (activations.py) applied to what Megatron-Core core_v0.16.1 checkpoints
for each module (transformer_layer.py, mlp.py, moe/): layernorm the norm outputs of norms that are modules of
their own, moe_act the experts' activation output, shared_experts / mlp / moe those blocks' activations; the
largest recomputed module is the transient. Table and derivation: docs/recompute-dropout.md.
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
        if not fused_norms or shape.moe is not None:   # a fused dense norm recomputes nothing: no transient
            working = max(working, x)
    if "mlp" in mods:
        mlp = e * tokens * gated * shape.ffn_hidden_size / tp + (x if fused_norms else 0.0)
        dense_drop += mlp
        if shape.moe is None or shape.num_moe_layers < shape.num_layers:   # dense MLPs only: none, nothing to redo
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
