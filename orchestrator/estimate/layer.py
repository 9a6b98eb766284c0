"""One rank's transformer layer for one micro-batch: the dense model's layer (estimate/compute.py) with the
MoE block (estimate/moe.py), context parallelism's share of the sequence (estimate/context.py) and FP8
GEMMs (estimate/precision.py) composed in. The step model (estimate/step.py) reads only this.

A MoE model mixes dense and MoE layers (``first_dense_layers``): times and traffic are the mean over the
layers, which is what a stage of ``c`` layers multiplies by c.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from .compute import LayerTimeEstimate, MlpTimes, attention_linear_shapes, estimate_layer_time, mlp_linear_shapes
from .context import context_layer_comm, rank_shape, with_full_attention
from .hardware import Hardware
from .moe import (DENSE_LAYER_NODES, MOE_LAYER_NODES, after_sync_host_s, combined_1f1b_host_s, dense_host_s,
                  expert_cast_kernels, expert_layer_comm, expert_work, host_idle_s, moe_host_s, moe_mlp_times, with_dispatch_sync,
                  with_host_floor)
from .params import ModelShape
from .precision import FP8_RECIPE, cast_bytes_per_row, fp8_gemm_hardware


MOE_RECOMPUTE_A2A = 1.5   # all-to-all traffic with the MoE block recomputed: forward twice, backward once


@dataclass(frozen=True)
class RankLayer:
    """Mean per-layer time and traffic of one rank for one micro-batch."""

    time: LayerTimeEstimate
    ep_bytes: float = 0.0      # expert all-to-all (and etp) traffic
    ep_s: float = 0.0          # its time (on the critical path: the alltoall dispatcher waits for it)
    cp_bytes: float = 0.0      # context-parallel K/V ring
    cp_s: float = 0.0
    cp_exposed_s: float = 0.0
    host_idle_s: float = 0.0   # GPU time a host-bound MoE layer waits for its launches (moe.py host_idle_s)
    host_wait_s: float = 0.0   # ... and any layer, dense ones too (what the plan reports: LAYOUT host_wait_s)

    @property
    def total_s(self) -> float:
        """Compute plus the exposed expert and context-parallel exchanges."""
        return self.time.total_s + self.ep_s + self.cp_exposed_s


@dataclass(frozen=True)
class LayerKey:
    """The layout fields a layer's time depends on (hashable: the planner caches on it)."""

    tp: int
    cp: int
    ep: int
    etp: int
    mb: int
    sp: bool
    recompute: str
    combined_1f1b: bool = False   # the EP all-to-all overlap runs the layer as schedule nodes (moe.py)


@lru_cache(maxsize=65536)
def rank_layer(shape: ModelShape, hw: Hardware, gpu: str, precision: str, key: LayerKey,
               fp8_recipe: str = FP8_RECIPE) -> RankLayer:
    """The mean transformer layer of one rank for the layout fields ``key`` (MoE, context parallelism and FP8
    composed in); ``fp8_recipe``: the FP8 scaling recipe (precision.py FP8_RECIPE), for the experts' host launches."""
    rs = rank_shape(shape, key.cp)
    gemm_hw = fp8_gemm_hardware(hw, gpu) if precision == "fp8" else None
    dense = _with_casts(estimate_layer_time(rs, hw, key.tp, key.mb, key.sp, key.recompute, gemm_hw),
                        _dense_cast_rows(rs, key), hw, gemm_hw)
    dense_gpu = dense
    if gpu != "cpu":     # eager PyTorch launches every kernel from the host (the CPU target counts it as compute)
        dense = with_host_floor(dense, *_plus(dense_host_s(), _nodes_host_s(key, DENSE_LAYER_NODES)))
    layer, ep_bytes, ep_s, idle = dense, 0.0, 0.0, 0.0
    wait = host_idle_s(dense, dense_gpu)
    if shape.moe is not None:
        fp8 = precision == "fp8"
        moe_layer, mlp = moe_gpu_layer(shape, hw, gpu, precision, key, fp8_recipe)
        gpu_only = moe_layer
        if gpu != "cpu":
            nodes_f, nodes_b = _nodes_host_s(key, MOE_LAYER_NODES)
            # The dispatcher's sync bounds the GPU-only layer (its attention after the host's launches); with the
            # EP overlap the host launches the other micro-batch's expert backward between this attention and the
            # sync (TransformerLayerSchedulePlan.run: attn_fwd, mlp_bwd, then moe_dispatch), so the GPU has work
            # and the host nothing to wait for there: the bound does not apply.
            if shape.moe.capacity_factor is None and not key.combined_1f1b:
                moe_layer = with_dispatch_sync(moe_layer, mlp.forward_s, after_sync_host_s(shape, key.ep, fp8, fp8_recipe))
            moe_layer = with_host_floor(moe_layer, *_plus(moe_host_s(shape, key.ep, fp8, fp8_recipe),
                                                          (nodes_f, nodes_b)))
        share = shape.num_moe_layers / shape.num_layers
        idle = share * host_idle_s(moe_layer, gpu_only)
        wait = idle + (1 - share) * wait
        layer = _mix(dense, moe_layer, share)
        comm = expert_layer_comm(shape, hw, key.tp, key.cp, key.ep, key.etp, key.mb)
        # The ``moe`` recompute module redoes the forward's dispatch and combine: 3 of the 2 + 2 exchanges.
        redo = MOE_RECOMPUTE_A2A if "moe" in shape.recompute_modules and key.recompute != "full" else 1.0
        ep_bytes, ep_s = share * comm.bytes * redo, share * comm.seconds * redo
    layer = with_full_attention(layer, shape, key.cp, hw.kernel_gap_s)
    cp = context_layer_comm(shape, hw, key.tp, key.cp, key.mb, layer.attention_forward_s)
    return RankLayer(time=layer, ep_bytes=ep_bytes, ep_s=ep_s, cp_bytes=cp.bytes, cp_s=cp.seconds,
                     cp_exposed_s=cp.exposed_s, host_idle_s=idle, host_wait_s=wait)


def moe_gpu_layer(shape: ModelShape, hw: Hardware, gpu: str, precision: str, key: LayerKey,
                  fp8_recipe: str = FP8_RECIPE) -> tuple[LayerTimeEstimate, MlpTimes]:
    """A MoE layer's GPU work (attention, MoE block, FP8 casts and their kernels; no host floor, no all-to-all),
    and its MoE block."""
    rs = rank_shape(shape, key.cp)
    gemm_hw = fp8_gemm_hardware(hw, gpu) if precision == "fp8" else None
    mlp = moe_mlp_times(shape, hw, key.tp, key.cp, key.ep, key.etp, key.mb, gemm_hw)
    layer = _with_casts(estimate_layer_time(rs, hw, key.tp, key.mb, key.sp, key.recompute, gemm_hw, mlp),
                        _moe_cast_rows(shape, rs, key), hw, gemm_hw)
    casts = expert_cast_kernels(shape.moe.num_experts // key.ep, precision == "fp8", fp8_recipe) * hw.kernel_gap_s
    return dataclasses.replace(layer, forward_s=layer.forward_s + casts, backward_s=layer.backward_s + casts), mlp


def _nodes_host_s(key: LayerKey, nodes: int) -> tuple[float, float]:
    """The EP overlap's schedule-node host time of a layer of ``nodes`` nodes (none without the overlap)."""
    return combined_1f1b_host_s(nodes) if key.combined_1f1b else (0.0, 0.0)


def _plus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def _mix(dense: LayerTimeEstimate, moe: LayerTimeEstimate, share: float) -> LayerTimeEstimate:
    """The mean of a dense and a MoE layer, ``share`` of the layers being MoE."""
    return LayerTimeEstimate(**{f.name: (1 - share) * getattr(dense, f.name) + share * getattr(moe, f.name)
                                for f in dataclasses.fields(LayerTimeEstimate)})


def _dense_cast_rows(rs: ModelShape, key: LayerKey) -> list[tuple[float, list[tuple[int, int]]]]:
    rows = rs.seq_length * key.mb
    return [(rows, attention_linear_shapes(rs, key.tp) + mlp_linear_shapes(rs, rs.ffn_hidden_size, key.tp))]


def _moe_cast_rows(shape: ModelShape, rs: ModelShape, key: LayerKey) -> list[tuple[float, list[tuple[int, int]]]]:
    work = expert_work(shape, key.tp, key.cp, key.ep, key.etp, key.mb)
    rows = [(rs.seq_length * key.mb, attention_linear_shapes(rs, key.tp)),
            (work.routed_rows, mlp_linear_shapes(shape, shape.moe.expert_ffn, key.etp))]
    if shape.moe.shared_ffn:
        rows.append((rs.seq_length * key.mb, mlp_linear_shapes(shape, shape.moe.shared_ffn, key.tp)))
    return rows


def _with_casts(layer: LayerTimeEstimate, rows: list, hw: Hardware, gemm_hw: Hardware | None) -> LayerTimeEstimate:
    """FP8: add the casts of every FP8 GEMM's inputs (forward) and output gradients (backward)."""
    if gemm_hw is None:
        return layer
    fwd = bwd = 0.0
    for n_rows, shapes in rows:
        f, b = cast_bytes_per_row(shapes, hw.dtype_bytes)
        fwd, bwd = fwd + n_rows * f, bwd + n_rows * b
    fwd_s, bwd_s = fwd / hw.hbm_Bps, bwd / hw.hbm_Bps
    recompute = layer.recompute_s + (fwd_s if layer.recompute_s >= layer.forward_s else 0.0)
    return dataclasses.replace(layer, forward_s=layer.forward_s + fwd_s, backward_s=layer.backward_s + bwd_s,
                               recompute_s=recompute, memory_bound_forward_s=layer.memory_bound_forward_s + fwd_s)


def moe_activation_scale(shape: ModelShape, key: LayerKey, per_layer_bytes: float, dtype_bytes: int) -> float:
    """Activation bytes of the mean layer over those of a dense one: a MoE layer stores its permuted tokens
    and its experts' activations (routed rows) instead of a dense MLP's (Korthikanti's MLP terms)."""
    if shape.moe is None or key.recompute == "full" or per_layer_bytes <= 0:
        return 1.0
    rs = rank_shape(shape, key.cp)
    tokens = rs.seq_length * key.mb
    e, moe = dtype_bytes, shape.moe
    gated = 3 if shape.gated_mlp else 2
    dense_mlp = e * tokens * gated * shape.ffn_hidden_size / key.tp
    work = expert_work(shape, key.tp, key.cp, key.ep, key.etp, key.mb)
    moe_mlp = e * work.routed_rows * (shape.hidden_size + gated * moe.expert_ffn / key.etp) + \
        e * tokens * gated * moe.shared_ffn / key.tp
    share = shape.num_moe_layers / shape.num_layers
    return max(0.1, 1 + share * (moe_mlp - dense_mlp) / per_layer_bytes)
