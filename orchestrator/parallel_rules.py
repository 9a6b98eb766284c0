"""Rules for Mixture-of-Experts, context parallelism and FP8, one small pure function per constraint.

Each rule follows :mod:`orchestrator.layout`'s contract (``rule(spec, layout) -> Problem | None``, operands
shown, a fix in the hint, open fields pass) and follows the spec's engine:

* Megatron (Megatron-Core MoE docs, "MoE parallel folding"): attention runs over tp x cp x dp x pp, the
  experts over etp x ep x edp x pp on the same ranks, so etp * ep must divide the tp * cp * dp ranks of a
  pipeline stage; ep divides the expert count; MoE with tp > 1 needs sequence parallelism (MoELayer raises
  otherwise); context parallelism splits the sequence into 2 * cp chunks (causal load balancing:
  validate_args asserts seq_length % (2 * cp) == 0) and needs fused attention (Transformer Engine's
  DotProductAttention implements the ring exchange).
* DeepSpeed (DeepSpeed-MoE, Rajbhandari et al. 2022; ``deepspeed.moe.layer.MoE``): expert-parallel groups
  are carved out of the data-parallel ranks (ep divides dp), the gate supports top-1 and top-2 only before
  0.15.0 (any top-k since), and expert tensor parallelism reuses the model's tp group; ``context`` is the DeepSpeed-Ulysses degree
  (Jacobs et al. 2023, arXiv 2309.14509): its all-to-all trades the sequence split for a head split, so the
  heads and the sequence must divide by it.
* FP8 (Transformer Engine "Using FP8 with Transformer Engine"; its support matrix: per-tensor FP8 from compute
  capability 8.9, Ada): Megatron engine only, on Ada, Hopper or newer (catalog ``fp8_training``), and every
  FP8 GEMM dimension a multiple of 16.
"""
from __future__ import annotations

from typing import Callable

from .catalog.gpus import GPUS
from .errors import Problem
from .layout import FIELD_PATHS, Layout, _known, engine_of
from .releases import ds_version
from .spec import Spec

# DeepSpeed's TopKGate takes any k >= 1 (``topkgating``) since v0.15.0 (PR #5881, 2024-08-15); top-1 and top-2
# only before (``raise ValueError('Only top-1 and top-2 gatings are supported.')``).
DS_TOPK_GATE_SINCE = (0, 15, 0)


FP8_ALIGNMENT = 16   # TE FP8 GEMMs: both GEMM dimensions of a weight a multiple of 16 (TE docs)


# --- the model ----------------------------------------------------------------------------------

def rule_topk(spec: Spec, lay: Layout) -> Problem | None:
    moe = spec.model.moe
    if moe is not None and moe.router_topk > moe.num_experts:
        return Problem("model.moe.router_topk", f"router_topk({moe.router_topk}) > num_experts({moe.num_experts})",
                       "route each token to at most num_experts experts")
    return None


def rule_first_dense_layers(spec: Spec, lay: Layout) -> Problem | None:
    moe, n = spec.model.moe, spec.model.num_layers
    if moe is not None and moe.first_dense_layers >= n:
        return Problem("model.moe.first_dense_layers", f"first_dense_layers({moe.first_dense_layers}) >= "
                       f"num_layers({n}): no layer would be MoE", "use fewer leading dense layers, or drop model.moe")
    return None


# --- MoE parallel folding -----------------------------------------------------------------------

def rule_expert_needs_moe(spec: Spec, lay: Layout) -> Problem | None:
    if spec.model.moe is not None or (lay.ep == 1 and lay.etp == 1):
        return None
    for name in ("ep", "etp"):
        value = getattr(lay, name)
        if _known(value) and value > 1:
            return Problem(FIELD_PATHS[name], f"{name}({value}) > 1 but the model is dense (no model.moe)",
                           f"remove {FIELD_PATHS[name]}, or describe the experts under model.moe")
    return None


def rule_ep_divides_experts(spec: Spec, lay: Layout) -> Problem | None:
    moe = spec.model.moe
    if moe is not None and _known(lay.ep) and moe.num_experts % lay.ep:
        return Problem(FIELD_PATHS["ep"], f"num_experts({moe.num_experts}) % ep({lay.ep}) = "
                       f"{moe.num_experts % lay.ep}, must be 0 (each rank holds num_experts/ep experts)",
                       "use an expert-parallel degree that divides model.moe.num_experts")
    return None


def rule_expert_folding(spec: Spec, lay: Layout) -> Problem | None:
    """etp * ep divides the ranks of one pipeline stage (tp * cp * dp): edp = those / (etp * ep)."""
    if spec.model.moe is None or not _known(lay.tp, lay.cp, lay.dp, lay.ep, lay.etp):
        return None
    stage, experts = lay.tp * lay.cp * lay.dp, lay.etp * lay.ep
    if stage % experts:
        return Problem(FIELD_PATHS["ep"], f"etp({lay.etp}) * ep({lay.ep}) = {experts} does not divide the ranks of "
                       f"a pipeline stage tp({lay.tp}) * cp({lay.cp}) * dp({lay.dp}) = {stage} (MoE parallel "
                       "folding: experts over etp x ep x edp x pp on the same ranks)",
                       f"use ep * etp dividing {stage}")
    return None


def rule_moe_bias_etp(spec: Spec, lay: Layout) -> Problem | None:
    """Megatron-Core: biases in MoE layers only with etp = 1 (TransformerConfig asserts it)."""
    m = spec.model
    if m.moe is None or not m.add_bias_linear or engine_of(spec) != "megatron" or not _known(lay.etp):
        return None
    if lay.etp > 1:
        return Problem(FIELD_PATHS["etp"], f"MoE with linear biases (model.add_bias_linear) needs etp(1), got "
                       f"etp({lay.etp}) (Megatron-Core: 'Bias in Moe is only supported when ETP==1')",
                       "set expert_tensor: 1, or model.add_bias_linear: false")
    return None


def rule_moe_sequence_parallel(spec: Spec, lay: Layout) -> Problem | None:
    if spec.model.moe is None or engine_of(spec) != "megatron" or not _known(lay.tp, lay.sequence_parallel):
        return None
    if lay.tp > 1 and not lay.sequence_parallel:
        return Problem(FIELD_PATHS["sequence_parallel"], f"MoE with tp({lay.tp}) > 1 needs sequence parallelism "
                       "(Megatron-Core's MoELayer refuses to train without it)",
                       "set sequence_parallel: true, or tensor: 1")
    return None


def rule_expert_group_topology(spec: Spec, lay: Layout) -> Problem | None:
    """An expert group (etp * ep consecutive ranks) that straddles a node boundary without having to."""
    gpn = spec.cluster.gpus_per_node
    if spec.model.moe is None or spec.cluster.num_nodes == 1 or not _known(lay.ep, lay.etp):
        return None
    size = lay.ep * lay.etp
    if size > 1 and gpn % size and size % gpn:
        return Problem(FIELD_PATHS["ep"], f"the expert group etp({lay.etp}) * ep({lay.ep}) = {size} neither divides "
                       f"nor fills whole nodes of gpus_per_node({gpn}): some groups straddle two nodes and their "
                       "all-to-all runs at the inter-node bandwidth without need",
                       f"use ep * etp dividing {gpn} (inside a node) or a multiple of it (whole nodes)")
    return None


def rule_deepspeed_moe(spec: Spec, lay: Layout) -> Problem | None:
    """DeepSpeed-MoE: ep divides dp; top-1 or top-2 gating before 0.15.0; expert tensor parallelism only over the tp group."""
    moe = spec.model.moe
    if moe is None or engine_of(spec) != "deepspeed":
        return None
    if _known(lay.ep, lay.dp) and lay.dp % lay.ep:
        return Problem(FIELD_PATHS["ep"], f"DeepSpeed-MoE carves expert groups out of the data-parallel ranks: "
                       f"dp({lay.dp}) % ep({lay.ep}) = {lay.dp % lay.ep}, must be 0",
                       "use an expert-parallel degree that divides dp, or training.engine: megatron")
    version = spec.training.engine_version
    if moe.router_topk > 2 and ds_version(version) < DS_TOPK_GATE_SINCE:
        return Problem("model.moe.router_topk", f"DeepSpeed-MoE's gate before 0.15.0 supports top-1 and top-2, got "
                       f"router_topk({moe.router_topk}) with engine_version({version})",
                       "use router_topk 1 or 2, engine_version 0.15.0 or later, or training.engine: megatron")
    if _known(lay.etp, lay.tp) and lay.etp not in (1, lay.tp):
        return Problem(FIELD_PATHS["etp"], f"DeepSpeed-MoE shards experts over the model's tp group or not at "
                       f"all: etp({lay.etp}) must be 1 or tp({lay.tp})", "set expert_tensor: 1, or the tensor degree")
    return None


# --- context parallelism ------------------------------------------------------------------------

def rule_context_sequence(spec: Spec, lay: Layout) -> Problem | None:
    if lay.cp == 1 or lay.cp is None:
        return None
    s, cp = spec.model.seq_length, lay.cp
    chunks, why = (2 * cp, "2 * cp chunks, causal load balancing") if engine_of(spec) == "megatron" else \
        (cp, "Ulysses splits the sequence over cp ranks")
    if s % chunks:
        return Problem(FIELD_PATHS["cp"], f"seq_length({s}) % {chunks} = {s % chunks}, must be 0 ({why})",
                       f"use a sequence length divisible by {chunks}, or a smaller context degree")
    return None


def rule_context_fused_attention(spec: Spec, lay: Layout) -> Problem | None:
    if lay.cp != 1 and lay.cp is not None and not spec.model.flash_attention and engine_of(spec) == "megatron":
        return Problem(FIELD_PATHS["cp"], f"context parallelism (cp({lay.cp})) needs fused attention: Transformer "
                       "Engine's attention runs the K/V ring exchange", "set model.flash_attention: true, or context: 1")
    return None


def rule_ulysses_heads(spec: Spec, lay: Layout) -> Problem | None:
    """DeepSpeed-Ulysses: the all-to-all regroups heads, so heads (and KV heads) per tp rank divide by cp."""
    if lay.cp == 1 or engine_of(spec) != "deepspeed" or not _known(lay.cp, lay.tp):
        return None
    m = spec.model
    for name, heads in (("num_attention_heads", m.num_attention_heads), ("num_query_groups", m.num_query_groups)):
        per_rank = heads // lay.tp
        if per_rank % lay.cp:
            return Problem(FIELD_PATHS["cp"], f"Ulysses degree cp({lay.cp}) must divide {name}({heads}) / "
                           f"tp({lay.tp}) = {per_rank}", f"use a context degree that divides {per_rank}, or a smaller "
                           f"tensor degree (tp * cp dividing {heads})" if per_rank > 1 else
                           f"set context: 1, or a smaller tensor degree (tp * cp dividing {heads})")
    return None


# --- FP8 ----------------------------------------------------------------------------------------

def rule_fp8_engine_gpu(spec: Spec, lay: Layout) -> Problem | None:
    if spec.training.precision != "fp8":
        return None
    if engine_of(spec) != "megatron":
        return Problem("training.precision", "fp8 trains through Transformer Engine with the Megatron engine, "
                       f"not {engine_of(spec)}", "set training.engine: megatron, or precision: bf16")
    gpu = GPUS[spec.cluster.gpu]
    if not gpu.fp8_training:
        return Problem("training.precision", f"fp8 needs FP8 tensor cores (Ada, Hopper or newer, with Transformer "
                       f"Engine); cluster.gpu is {spec.cluster.gpu}",
                       "use bf16 on this GPU, or an l40s/h100/h200/b200")
    return None


def fp8_gemm_dims(spec: Spec, lay: Layout) -> dict[str, int]:
    """The per-rank GEMM dimensions FP8 casts: hidden, dense and expert FFN widths over their tp degrees."""
    m = spec.model
    dims = {"model.hidden_size": m.hidden_size, "model.ffn_hidden_size / tp": m.ffn_hidden_size // lay.tp}
    if m.moe is not None:
        dims["model.moe.ffn_hidden_size / expert_tensor"] = m.moe.ffn_hidden_size // lay.etp
        if m.moe.shared_expert_ffn_hidden_size:
            dims["model.moe.shared_expert_ffn_hidden_size / tp"] = m.moe.shared_expert_ffn_hidden_size // lay.tp
    return dims


def rule_fp8_dims(spec: Spec, lay: Layout) -> Problem | None:
    if spec.training.precision != "fp8" or not _known(lay.tp, lay.etp):
        return None
    for name, dim in fp8_gemm_dims(spec, lay).items():
        if dim % FP8_ALIGNMENT:
            return Problem("training.precision", f"{name} = {dim} is not a multiple of {FP8_ALIGNMENT}: "
                           "Transformer Engine's FP8 GEMMs need both dimensions divisible by 16",
                           "use bf16, or sizes (and tensor degrees) that keep these widths multiples of 16")
    return None


def rule_fp8_recipe(spec: Spec, lay: Layout) -> Problem | None:
    if spec.training.fp8_recipe is not None and spec.training.precision != "fp8":
        return Problem("training.fp8_recipe", f"fp8_recipe({spec.training.fp8_recipe}) needs precision: fp8, got "
                       f"precision({spec.training.precision})", "set training.precision: fp8, or remove "
                       "training.fp8_recipe")
    return None


# What Megatron-LM core_v0.16.1 can reduce each precision's gradients in (megatron/training/arguments.py):
# --bf16 (orch's bf16 and fp8 runs) fp32, or bf16 with --grad-reduce-in-bf16; --fp16 fp16, or fp32 with
# --accumulate-allreduce-grads-in-fp32; fp32 training keeps fp32 gradients (both flags only act under
# --bf16 / --fp16). DeepSpeed casts to any of the three (communication_data_type).
MEGATRON_GRAD_REDUCE_DTYPES = {"bf16": ("fp32", "bf16"), "fp8": ("fp32", "bf16"), "fp16": ("fp16", "fp32"),
                               "fp32": ("fp32",)}


def rule_grad_reduce_dtype(spec: Spec, lay: Layout) -> Problem | None:
    asked, precision = spec.training.grad_reduce_dtype, spec.training.precision
    if asked is None or engine_of(spec) != "megatron" or asked in MEGATRON_GRAD_REDUCE_DTYPES[precision]:
        return None
    allowed = MEGATRON_GRAD_REDUCE_DTYPES[precision]
    return Problem("training.grad_reduce_dtype", f"grad_reduce_dtype({asked}) with precision({precision}): "
                   f"Megatron-LM reduces {precision} gradients in {' or '.join(allowed)} only",
                   f"set training.grad_reduce_dtype to {' or '.join(allowed)}, or remove it (default "
                   f"{allowed[0]})")


MODEL_RULES: list[Callable[[Spec, Layout], Problem | None]] = [rule_topk, rule_first_dense_layers]
SPEC_RULES: list[Callable[[Spec, Layout], Problem | None]] = [rule_fp8_engine_gpu, rule_fp8_recipe,
                                                              rule_grad_reduce_dtype]
LAYOUT_RULES: list[Callable[[Spec, Layout], Problem | None]] = [
    rule_expert_needs_moe, rule_ep_divides_experts, rule_expert_folding, rule_moe_bias_etp, rule_moe_sequence_parallel,
    rule_expert_group_topology, rule_deepspeed_moe,
    rule_context_sequence, rule_context_fused_attention, rule_ulysses_heads, rule_fp8_dims,
]
