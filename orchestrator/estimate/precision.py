"""FP8 training (Transformer Engine with Megatron-Core): GEMM rates, casting overheads, weight copies.

Transformer Engine docs ("Using FP8 with Transformer Engine", "Performance considerations"):

* the linear layers run FP8 GEMMs (E4M3 forward, E5M2 gradients with the hybrid format) at the GPU's FP8
  tensor-core rate (H100 SXM: 1979 TFLOP/s dense, twice bf16); attention, norms, softmax and the rest stay
  in bf16. We assume FP8 GEMMs reach the same fraction of their peak as bf16 GEMMs do of theirs (the
  catalog's MAMF fraction); no FP8 MAMF table is published for these parts.
* every FP8 GEMM input is cast: activations in the forward (read bf16, write fp8 and, for the weight
  gradient, its transpose) and output gradients in the backward (the same); delayed scaling records the
  amax in the same pass. Weights are cast once per step (Megatron passes ``is_first_microbatch``) into an
  fp8 copy and its transpose.
* memory: the cached fp8 weight copy (1 byte per local parameter) beside the bf16 weights; its transpose
  for the backward is made and freed layer by layer (our reading of TE's weight caching; published FP8
  runs such as Llama 3 8B with cp 2 on 8 H100s fit only without a persistent transpose as well);
  the inputs a linear layer keeps for its weight gradient are kept as their fp8 cast (1 byte instead of 2):
  of Korthikanti et al.'s per-layer activations, the QKV and fc1 inputs (replicated part) and the
  projection and fc2 inputs (tensor-parallel part).
"""
from __future__ import annotations

import dataclasses

from ..catalog.gpus import GPUS
from .hardware import Hardware

FP8_BYTES = 1
FP8_WEIGHT_COPY_BYTES = 1   # the cached fp8 weight, per parameter (its transpose is transient, per layer)
# The FP8 scaling recipe orch writes (Megatron's --fp8-recipe; render/megatron_moe.py emits this one). Published
# runs may have used another: "tensorwise" is Megatron's name for per-tensor current scaling (Megatron-Bridge's
# bf16_with_fp8_current_scaling_mixed, the "FP8-CS" of NVIDIA's performance tables). Only the MoE experts' host
# launches depend on it in this model (estimate/moe.py expert_host_ops).
FP8_RECIPE = "delayed"


def fp8_gemm_hardware(hw: Hardware, gpu: str) -> Hardware:
    """The rates FP8 GEMMs run at on ``gpu``: its FP8 peak, 1-byte operands."""
    return dataclasses.replace(hw, peak_flops=GPUS[gpu].peak_flops["fp8"], dtype_bytes=FP8_BYTES)


def cast_bytes_per_row(shapes: list[tuple[int, int]], e: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token row of casting the inputs of these linear layers to FP8:
    forward reads the bf16 input and writes fp8 and its transpose; backward does the same for the output
    gradient."""
    fwd = sum((e + 2 * FP8_BYTES) * k_in for _, k_in in shapes)
    bwd = sum((e + 2 * FP8_BYTES) * n_out for n_out, _ in shapes)
    return fwd, bwd


def weight_cast_s(local_params: float, hw: Hardware) -> float:
    """Casting the rank's weights to fp8 once per step (read bf16, write fp8)."""
    return local_params * (hw.dtype_bytes + FP8_WEIGHT_COPY_BYTES) / hw.hbm_Bps


def fp8_saved_activation_bytes(shape, tp: int, sp: bool, mb: int, recompute: str, dtype_bytes: int) -> float:
    """Activation bytes one layer saves for one micro-batch by keeping FP8 GEMM inputs in fp8."""
    if recompute == "full":
        return 0.0
    rows = shape.seq_length * mb
    per = dtype_bytes - FP8_BYTES
    replicated = 2 * per * rows * shape.hidden_size / (tp if sp else 1)
    parallel = per * rows * (shape.q_size + shape.ffn_hidden_size) / tp
    return replicated + parallel


def fp8_saved_moe_mlp_bytes(moe_rows: float, h: int, expert_ffn: float, dense_rows: int, ffn: int, tp: int,
                            sp: bool, dtype_bytes: int) -> float:
    """What a MoE layer's MLP saves in FP8 beyond what :func:`fp8_saved_activation_bytes` counts for the
    dense MLP it replaces: the grouped expert linears keep their inputs (the ``moe_rows`` routed token
    copies, h wide, and the expert activations, expert_ffn wide) in fp8 (Transformer Engine GroupedLinear;
    Megatron-Core MoE docs, "FP8 Training": linear layer inputs stored in FP8), not the dense fc1 and fc2
    inputs of ``dense_rows`` tokens."""
    per = dtype_bytes - FP8_BYTES
    dense = per * dense_rows * (h / (tp if sp else 1) + ffn / tp)
    return per * moe_rows * (h + expert_ffn) - dense


def fp8_weight_bytes(local_params: float) -> float:
    return FP8_WEIGHT_COPY_BYTES * local_params
