"""Rules for per-module recompute, the full-recompute method and dropout (docs/recompute-dropout.md).

Same contract as :mod:`orchestrator.layout`; joined in orchestrator/rules.py (operands in the message, a fix in the hint, open fields pass).
They follow what Megatron-LM core_v0.16.1 refuses or ignores (transformer_config.py, transformer_layer.py);
orch's reference trainer (engine deepspeed) has neither dropout nor per-module recompute.
"""
from __future__ import annotations

from typing import Callable

from .errors import Problem
from .layout import Layout, _known, engine_of
from .spec import Spec

P = "parallelism"


def rule_modules_need_selective(spec: Spec, lay: Layout) -> Problem | None:
    mods = spec.parallelism.recompute_modules
    if mods is not None and lay.recompute is not None and lay.recompute != "selective":
        return Problem(f"{P}.recompute_modules", f"recompute_modules({', '.join(mods)}) needs recompute: "
                       f"selective, got recompute({lay.recompute})",
                       f"set {P}.recompute: selective, or remove {P}.recompute_modules")
    return None


def rule_method_needs_full(spec: Spec, lay: Layout) -> Problem | None:
    p = spec.parallelism
    for name, value in (("recompute_method", p.recompute_method), ("recompute_num_layers", p.recompute_num_layers)):
        if value is not None and lay.recompute is not None and lay.recompute != "full":
            return Problem(f"{P}.{name}", f"{name}({value}) needs recompute: full, got recompute({lay.recompute})",
                           f"set {P}.recompute: full, or remove {P}.{name}")
    return None


def rule_recompute_engine(spec: Spec, lay: Layout) -> Problem | None:
    p = spec.parallelism
    if engine_of(spec) == "megatron":
        return None
    for name, value in (("recompute_modules", p.recompute_modules), ("recompute_method", p.recompute_method),
                        ("recompute_num_layers", p.recompute_num_layers)):
        if value is not None:
            return Problem(f"{P}.{name}", f"{name} is a Megatron option; engine({engine_of(spec)}) recomputes "
                           "whole layers (DeepSpeed activation checkpointing) or the attention core",
                           f"remove {P}.{name}, or set training.engine: megatron")
    return None    # dropout with engine deepspeed: orch plan predicts it, orch generate refuses it (generate_rules.py)


def module_refusal(spec: Spec, module: str) -> str | None:
    """Why Megatron-Core refuses ``module`` for this spec (core_v0.16.1 transformer_config.py __post_init__
    raises), or None."""
    m, gpu = spec.model, spec.cluster.gpu
    if module == "mla_up_proj":
        return "needs multi-latent attention, which orch's models do not have"
    if module == "moe_act" and (m.moe is None or gpu == "cpu"):
        return ("needs --moe-grouped-gemm, which orch writes for MoE models on GPUs only"
                if m.moe is not None else "needs a MoE model (model.moe) and its grouped GEMM")
    if module in ("moe_act", "layernorm") and spec.training.precision == "fp8" and \
            (spec.training.fp8_recipe or "delayed") == "delayed":
        return ("is refused with FP8's delayed scaling (Megatron-Core; --fp8-recipe delayed, training.fp8_recipe's "
                "default): set training.fp8_recipe: tensorwise")
    return None


def module_noop(spec: Spec, module: str) -> str | None:
    """Why ``module`` recomputes nothing in this spec's model although Megatron-Core accepts it, or None."""
    m, gpu = spec.model, spec.cluster.gpu
    if module in ("moe", "shared_experts") and m.moe is None:
        return "recomputes MoE layers, and this model has none (model.moe)"
    if module == "shared_experts" and not m.moe.shared_expert_ffn_hidden_size:
        return "recomputes shared experts, and this model has none (model.moe.shared_expert_ffn_hidden_size)"
    if module == "mlp" and m.moe is not None and m.moe.first_dense_layers == 0:
        return "recomputes dense MLPs only, and every layer of this model is a MoE layer (moe recomputes those)"
    if module == "layernorm" and m.moe is None and gpu != "cpu":
        return ("recomputes nothing in a dense Transformer Engine layer (both norms are fused into the "
                "following linear)")
    return None


def module_problem(spec: Spec, module: str) -> str | None:
    """Why ``module`` is no use for this spec: Megatron-Core refuses it or it recomputes nothing (the planner
    searches neither), or None."""
    return module_refusal(spec, module) or module_noop(spec, module)


def recompute_module_notes(spec: Spec) -> list[str]:
    """Warnings for the spec's recompute modules that Megatron-Core accepts but that recompute nothing here:
    planned and generated as given (Megatron is the authority), said once in the plan."""
    mods = spec.parallelism.recompute_modules or ()
    if engine_of(spec) != "megatron":
        return []
    return [f"{P}.recompute_modules[{i}]: {module} {why}; Megatron-Core accepts it and recomputes nothing for it "
            f"(remove {module} to say what runs)" for i, module in enumerate(mods)
            if not module_refusal(spec, module) and (why := module_noop(spec, module))]


def rule_recompute_modules(spec: Spec, lay: Layout) -> Problem | None:
    mods = spec.parallelism.recompute_modules
    if not mods or engine_of(spec) != "megatron":
        return None
    repeated = sorted({x for x in mods if mods.count(x) > 1})
    if repeated:
        return Problem(f"{P}.recompute_modules", f"lists {', '.join(repeated)} more than once",
                       "name each module once")
    for i, module in enumerate(mods):
        why = module_refusal(spec, module)
        if why:
            return Problem(f"{P}.recompute_modules[{i}]", f"{module} {why}", f"remove {module}")
    return None     # modules that recompute nothing here are planned as given, with a warning (recompute_module_notes)


def chunk_layer_counts(num_layers: int, lay: Layout) -> set[int] | None:
    """The transformer-layer counts of the model chunks (one pipeline stage's share of one virtual stage),
    as Megatron-Core builds them (transformer_block.py get_num_layers_to_build); None while the split is open
    or not one the split rules accept (they report it)."""
    if not _known(lay.pp, lay.vpp) or lay.pp < 1 or lay.vpp < 1:
        return None
    if lay.account_split:     # the embedding and the loss each take one layer's place in the first / last chunk
        per_stage = (num_layers + 2) // lay.pp
        if (num_layers + 2) % lay.pp or per_stage % lay.vpp:
            return None
        per = per_stage // lay.vpp
        return {per - 1} if lay.pp == 2 and lay.vpp == 1 else {per, per - 1}
    first, last = lay.first_stage_layers, lay.last_stage_layers
    given = [c for c in (first, last) if c is not None] if lay.pp > 1 else []
    rest, stages = num_layers - sum(given), lay.pp - len(given)
    if rest < 0 or (stages and rest % stages):
        return None
    stage_counts = set(given) | ({rest // stages} if stages else set())
    if any(c % lay.vpp for c in stage_counts):
        return None
    return {c // lay.vpp for c in stage_counts}


def rule_recompute_num_layers(spec: Spec, lay: Layout) -> Problem | None:
    """--recompute-method uniform checkpoints groups of recompute_num_layers layers of each model chunk:
    Megatron-Core (transformer_block.py _checkpointed_forward) steps layer_idx by that group size up to the
    chunk's layer count and indexes self.layers[layer_idx:layer_idx + n], so a count the group does not divide
    reaches past the chunk (IndexError). block recomputes the first recompute_num_layers layers of each chunk:
    any count is accepted (more than the chunk's layers recomputes them all)."""
    p = spec.parallelism
    n = p.recompute_num_layers
    if n is None or (p.recompute_method or "uniform") != "uniform":
        return None
    counts = chunk_layer_counts(spec.model.num_layers, lay)
    bad = sorted(c for c in counts or () if c > 0 and c % n)
    if bad:
        return Problem(f"{P}.recompute_num_layers", f"recompute_method uniform recomputes groups of "
                       f"recompute_num_layers({n}) layers, which do not divide the {bad[0]} layers of a model chunk "
                       f"(num_layers({spec.model.num_layers}), pp({lay.pp}), vpp({lay.vpp}); Megatron-Core's "
                       "uniform groups would reach past the chunk)",
                       f"use a recompute_num_layers that divides {', '.join(map(str, sorted(counts)))}, "
                       "or recompute_method: block")
    return None


def rule_distribute_needs_full(spec: Spec, lay: Layout) -> Problem | None:
    """Megatron-Core keeps a split checkpoint only of a full recompute, and not with sequence parallelism
    (transformer_config.py __post_init__)."""
    if not spec.parallelism.distribute_saved_activations:
        return None
    if lay.recompute is not None and lay.recompute != "full":
        return Problem(f"{P}.distribute_saved_activations", f"needs recompute: full, got recompute({lay.recompute})",
                       f"set {P}.recompute: full, or remove {P}.distribute_saved_activations")
    if lay.sequence_parallel:
        return Problem(f"{P}.distribute_saved_activations", "Megatron-Core refuses it with sequence_parallel "
                       "(the checkpointed input is already split over the tp ranks)",
                       f"set {P}.sequence_parallel: false, or remove {P}.distribute_saved_activations")
    return None


SPEC_RULES: list[Callable[[Spec, Layout], Problem | None]] = [rule_recompute_engine, rule_recompute_modules]
LAYOUT_RULES: list[Callable[[Spec, Layout], Problem | None]] = [
    rule_modules_need_selective, rule_method_needs_full, rule_recompute_num_layers, rule_distribute_needs_full]
