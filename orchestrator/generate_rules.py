"""What ``orch plan`` predicts but ``orch generate`` / ``orch validate`` refuse: software orch does not write.

A spec may describe a run on other software (another DeepSpeed release, torchtitan's eager layer, flash-attn's
kernels, dropout in orch's reference trainer), so that the planner predicts it; orch cannot write its files.
Each problem names the field, what orch writes instead, and the fix (docs/published-specs.md).
"""
from __future__ import annotations

from .errors import Problem
from .layout import engine_of
from .spec import Spec

MEGATRON_RELEASE = "0.16.1"    # Megatron-LM core_v0.16.1 (render/megatron.py MEGATRON_LM_TAG)
_ENGINE_LOSS = {"megatron": "vocab_parallel", "deepspeed": "torch"}


def orch_release(engine: str) -> str:
    """The release of ``engine`` orch writes configs for."""
    if engine == "megatron":
        return MEGATRON_RELEASE
    from .validate._deepspeed_keys_data import DEEPSPEED_VERSION  # noqa: PLC0415

    return DEEPSPEED_VERSION


def _same_release(asked: str, ours: str) -> bool:
    """``asked`` names ``ours`` (0.16 names 0.16.1; 0.5 does not name 0.19.8)."""
    return ours.split(".")[:len(asked.split("."))] == asked.split(".")


def generate_problems(spec: Spec) -> list[Problem]:
    """Every spec field orch plan reads but orch generate cannot write for (empty: generate can)."""
    t = spec.training
    engine = engine_of(spec)
    problems = []
    if t.engine_version is not None and not _same_release(t.engine_version, orch_release(engine)):
        problems.append(Problem("training.engine_version", f"orch writes configs for {engine} "
                                f"{orch_release(engine)}, not {t.engine_version} (orch plan predicts that release)",
                                "remove training.engine_version to generate"))
    if t.attention_impl is not None:
        problems.append(Problem("training.attention_impl", f"{t.attention_impl} is not the attention orch's "
                                f"{engine} runs use (orch plan predicts it)", "remove training.attention_impl"))
    if t.cross_entropy_impl not in (None, _ENGINE_LOSS[engine], *_written_losses(spec, engine)):
        problems.append(Problem("training.cross_entropy_impl", f"{t.cross_entropy_impl}: orch's {engine} runs use "
                                f"{_ENGINE_LOSS[engine]} (orch plan predicts {t.cross_entropy_impl})",
                                "remove training.cross_entropy_impl"))
    if t.layer_impl not in (None, "megatron_core"):
        problems.append(Problem("training.layer_impl", f"orch trains its own layer, not {t.layer_impl} "
                                "(orch plan predicts it)", "remove training.layer_impl"))
    if t.eager_norm:
        problems.append(Problem("training.eager_norm", "orch's layers run fused norms (orch plan predicts eager "
                                "ones)", "remove training.eager_norm"))
    if engine == "deepspeed" and (spec.program is None or spec.program.kind == "orch"):
        problems += _reference_trainer_problems(spec)
    return problems + _dispatcher_problems(spec)


def _dispatcher_problems(spec: Spec) -> list[Problem]:
    """model.moe.token_dispatcher combinations Megatron-Core core_v0.16.1 refuses (TransformerConfig
    __post_init__, token_dispatcher.py) or that need a GPU."""
    moe, path = spec.model.moe, "model.moe.token_dispatcher"
    kind = moe and moe.token_dispatcher
    problems = []
    if kind == "flex_deepep" and moe.capacity_factor is not None:
        problems.append(Problem(path, "flex_deepep with model.moe.capacity_factor: orch pads each expert's input to "
                                "its capacity (--moe-pad-expert-input-to-capacity), which Megatron-Core's DeepEP "
                                "backend refuses", "use flex_hybridep or alltoall, or remove "
                                "model.moe.capacity_factor (dropless)"))
    if kind in ("flex_deepep", "flex_hybridep") and spec.cluster.gpu == "cpu":
        problems.append(Problem(path, f"{kind} runs DeepEP / HybridEP CUDA kernels, not on cluster.gpu cpu",
                                "use alltoall or allgather"))
    if kind == "allgather" and spec.parallelism.overlap_moe_expert_parallel_comm:
        problems.append(Problem(path, "allgather with parallelism.overlap_moe_expert_parallel_comm: Megatron-Core "
                                "overlaps only the alltoall and flex dispatchers",
                                "use alltoall, or remove parallelism.overlap_moe_expert_parallel_comm"))
    return problems


def _written_losses(spec: Spec, engine: str) -> tuple[str, ...]:
    """Loss implementations besides the engine's own that orch writes: Megatron-LM's --cross-entropy-loss-fusion
    (render/megatron.py), for a Megatron-LM program (orch's reference trainer runs Megatron-Core's unfused loss)."""
    reference = spec.program is None or spec.program.kind == "orch"
    return ("vocab_parallel_fused",) if engine == "megatron" and not reference else ()


def _reference_trainer_problems(spec: Spec) -> list[Problem]:
    """Megatron options orch's reference trainer (engine deepspeed) does not have."""
    m, p = spec.model, spec.parallelism
    moe = m.moe
    asked = [("model.hidden_dropout", m.hidden_dropout), ("model.attention_dropout", m.attention_dropout),
             ("model.rope_fusion", m.rope_fusion is False and "false"),
             ("model.activation_func_clamp_value", m.activation_func_clamp_value),
             ("model.moe.router_force_load_balancing", moe is not None and moe.router_force_load_balancing),
             ("model.moe.token_dispatcher", moe is not None and moe.token_dispatcher not in (None, "alltoall")
              and moe.token_dispatcher),
             ("parallelism.distribute_saved_activations", p.distribute_saved_activations)]
    return [Problem(path, f"{path.split('.')[-1]}({value}), but engine deepspeed trains orch's reference model, "
                    "which has no such option (orch plan predicts it)", f"remove {path}, or set training.engine: "
                    "megatron") for path, value in asked if value]
