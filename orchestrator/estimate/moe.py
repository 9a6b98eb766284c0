"""Mixture-of-Experts: the MoE block of one layer on one rank (router, permutation, the experts' grouped GEMMs,
shared expert, host launch floor, load imbalance) and its expert-parallel all-to-all.

What is counted and its sources (Megatron-Core's MoE docs, Switch Transformer, DeepSpeed-MoE):
docs/cost-model.md, "estimate/moe.py".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from math import comb, sqrt

from .comm import NCCL_BASE_US, NCCL_HOP_US, US, Placement, all_gather_s, group_placement
from .compute import (KERNELS_BWD, KERNELS_FWD, LayerTimeEstimate, MlpTimes, activation_times_s, linear_times_s,
                      linears_time_s, matmul_time_s, mlp_linear_shapes, straggler_factor)
from .eager_ops import EXPERT_BIAS_KERNELS, expert_bias_work, glu_clamp_work, norm_forward_work
from .hardware import Hardware
from .params import ModelShape
from .precision import FP8_RECIPE

# Max over mean of the tokens the busiest expert rank receives with dropless routing and an auxiliary
# load-balancing loss, after the early phase of training. Our estimate (not a fitted value): Switch-style
# balancing losses keep per-expert loads within ~10-20% of the mean (Fedus et al. 2021, section 2.2 and
# figure 7; Megatron-Core MoE docs recommend the aux loss for this); a rank holds E/ep experts, which
# averages part of the per-expert spread out. Runs that force balance (NVIDIA's MoE benchmarks) are left only
# sampling noise: random_routing_imbalance.
DROPLESS_IMBALANCE = 1.1
ROUTER_KERNELS = 6
# With --overlap-moe-expert-parallel-comm (Megatron-Core MoE docs, "EP A2A overlap"; orch emits it when
# Megatron allows it: ep > 1, no full recompute, interleaving when pp > 1) the dispatch / combine of one
# micro-batch runs while another micro-batch's layer computes (Megatron-Core core_v0.16.1
# models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run: comm stream combine_bwd |
# dispatch_fwd -> dispatch_bwd | combine_fwd against comp stream attn_fwd | mlp_bwd -> mlp_fwd | attn_bwd). As
# with the TP overlap, the SMs the communication kernels take and the first transfer stay exposed: we take a
# quarter (our estimate). The ideal two-stream makespan of that order would hide more: on Megatron-Bridge's
# measured A/B (Qwen3-30B-A3B, ep 16 over two nodes, BF16) it hides ~3/4 of the all-to-all where the run hid
# under half (docs/cost-model.md, "EP all-to-all overlap"), so the estimate stays. Passes the schedule cannot
# pair (warm-up forwards, cool-down backwards) expose all of theirs: unpaired_share.
EP_A2A_OVERLAP = 0.75
ROUTER_KERNELS = 6
# With --overlap-moe-expert-parallel-comm (Megatron-Core MoE docs, "EP A2A overlap"; orch emits it when
# Megatron allows it: ep > 1, no full recompute, interleaving when pp > 1) the dispatch / combine of one
# micro-batch runs while another micro-batch's layer computes, in the order Megatron-Core's
# TransformerLayerSchedulePlan.run issues them (core_v0.16.1 models/common/model_chunk_schedule_plan.py):
#     comm stream: combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
#     comp stream: attn_fwd    | mlp_bwd (-> mlp_bwd_dw) -> mlp_fwd | attn_bwd
# (combined_1f1b_layer_s). The SMs the hidden all-to-all takes are charged as for every hidden collective
# (step.py's contention term).
ROUTER_KERNELS = 6           # router GEMM, softmax, top-k, aux-loss, permute, unpermute (forward)
# Host time to launch one operator from eager PyTorch (Python, the ATen dispatcher, autograd bookkeeping,
# cudaLaunchKernel): we take the one figure measured on a training node, 13.5 us: torch.nn.Linear's forward
# (one cuBLAS GEMM) costs the host 13.5 us on a DGX H100 (Xeon 8480C; TransformerEngine issue #2053, BF16,
# h 2048, 8192 tokens). (Until stop 24 orch took a round 10 us from the range below; the change was made after
# the token dispatchers' traffic was modelled and knowing its effect on the MoE reference runs, so those runs
# no longer check this constant independently: docs/accuracy.md.) The range: a TE linear module ~2.7x a torch
# one on the same host (ibid., GB200 99.7 vs 37.1 us, GH200 90.5 vs 33.2 us); TE pull request #1016 (a
# maintainer, L40): a small PyTorch op's launch ~20 us, ~10 us with a dedicated kernel; Meta's
# HolisticTraceAnalysis docs (features/cuda_kernel_launch_stats): "the launch
# time on the CPU side is between 5-20 microseconds" (the cudaLaunchKernel runtime event alone). Megatron-
# Core's MoE docs name the "CPU overhead bottleneck" of fine-grained MoE ("many small operations"; remedies:
# CUDA graphs, router and permute fusion, fewer launches). A dropless MoE layer cannot be captured in a CUDA
# graph (dynamic shapes: Megatron-Core MoE docs, "CUDA Graph") and its alltoall dispatcher and grouped GEMM
# take the per-expert token splits as host tensors, a device-to-host sync every layer (Megatron-LM PR #3496,
# "Inference Optimized MoEs"; TransformerEngine issue #2452), so the host cannot run ahead of the GPU.
HOST_OP_S = 13.5e-6
# Host operators of the token dispatch of one layer, forward: token counts and splits (with their D2H copy),
# permute, sort by local expert, dispatch all-to-all, unsort, combine all-to-all, unpermute (our count of
# Megatron-Core's MoEAlltoAllTokenDispatcher); backward runs as many.
DISPATCH_HOST_OPS = 12
# Per local expert, per GroupedLinear (the experts' fc1 and fc2 are one each): the host operations Transformer
# Engine 2.9 (the release Megatron-Bridge 25.11 pins) runs for that expert, counted from its source
# (transformer_engine/pytorch/module/grouped_linear.py _GroupedLinear.forward / backward; csrc/quantizer.cpp
# Float8CurrentScalingQuantizer::create_tensor / quantize_impl; csrc/extensions/cast.cpp split_quantize). One
# operation is one call through the PyTorch dispatcher or the CUDA runtime (a kernel launch, a tensor
# allocation, a tensor object built for Python, a saved-tensor or usage update), at HOST_OP_S each; plain Python
# bookkeeping is not counted. Forward, BF16: the expert's GEMM (general_grouped_gemm: one cuBLASLt call per
# expert), its input view (torch.split), saving it for the backward (prepare_for_saving): 3. Forward, FP8: the
# GEMM; the quantized input split_quantize builds (three at::empty: data, transpose, scale_inv, and the Python
# Float8Tensor: 4) and its cast kernel (1; current scaling adds the amax and scale kernels:
# CURRENT_SCALING_EXTRA_HOST_OPS); the cached FP8 weight (get_weight_workspace); the usage updates of the saved
# input and weight (update_usage, 2); saving: 10. Backward, BF16: the data- and weight-gradient GEMMs, the
# gradient's view, the placeholder weight gradient Megatron's fused accumulation returns
# (handle_custom_ddp_from_mcore: torch.empty), freeing the saved input (clear_tensor_data), restoring the saved
# tensors: 6. Backward, FP8: the two GEMMs, the quantized gradient (4 and its cast kernel), the weight's usage
# update, the placeholder, the free, the restore: 11. The gradient hooks of the expert's parameters come on top
# (EXPERT_GRAD_HOOKS). (Delayed scaling's cast is one fused kernel per linear, not per expert:
# DELAYED_CAST_PER_LINEAR; its per-expert tensors are still built one by one.)
GROUPED_LINEAR_HOST_OPS = {False: (3, 6), True: (10, 11)}   # fp8 -> (forward, backward), per expert and linear
EXPERT_LINEARS = 2
EXPERT_HOST_OPS = {fp8: (EXPERT_LINEARS * f, EXPERT_LINEARS * b) for fp8, (f, b) in GROUPED_LINEAR_HOST_OPS.items()}
# Each local expert's weights are parameters of their own (TE GroupedLinear weight0 .. weight{E/ep - 1}, fc1 and
# fc2; with biases bias0 ..), and Megatron-Core's DistributedDataParallel hooks every parameter's gradient
# accumulator (core_v0.16.1 distributed/distributed_data_parallel.py: grad_acc.register_hook(
# _make_backward_post_hook(param))); the hook runs in Python on every micro-batch's backward (main_grad add or
# skip, param.grad = None, and with overlap_grad_reduce register_grad_ready): one host operator per expert
# parameter, backward.
EXPERT_GRAD_HOOKS = 2        # fc1 and fc2 weights; biases add as many (moe_block_host_s)
# Per-tensor current scaling (Megatron --fp8-recipe tensorwise, the "FP8-CS" of NVIDIA's tables) adds two host
# launches to each per-expert cast: Transformer Engine 2.9 (the release Megatron-Bridge 25.11 pins: uv.lock
# transformer-engine 2.9.0+70f53666) casts a GroupedLinear's inputs with tex.split_quantize, fused over all experts
# (nvte_multi_cast_transpose) for delayed scaling only, one tensor at a time otherwise (pytorch/csrc/extensions/
# cast.cpp multi_tensor_quantize_impl); a current-scaling cast runs an amax kernel and a scale-from-amax kernel
# before the cast itself (pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl). Two casts per
# expert forward (the fc1 and fc2 inputs) and two backward (their output gradients): 2 x 2 each way. (For delayed
# scaling EXPERT_HOST_OPS keeps one op per expert cast although TE 2.9 fuses the kernel over the experts:
# multi_tensor_quantize still creates each expert's output tensors one by one; left as it was.)
CURRENT_SCALING_EXTRA_HOST_OPS = (4, 4)
# Delayed scaling casts a GroupedLinear's inputs (forward) and output gradients (backward) with one fused kernel
# over its experts (TE 2.9 cast.cpp multi_tensor_quantize_impl: with_fused_kernel for Float8Quantizer outputs,
# nvte_multi_cast_transpose): one launch per linear and direction, where GROUPED_LINEAR_HOST_OPS counts one
# cast per expert (found by benchmarks/layout_neighbours.py's review; no published run trains delayed scaling).
DELAYED_CAST_PER_LINEAR = 1
# Transformer Engine runs a GroupedLinear's per-expert GEMMs as separate cuBLAS(Lt) calls on its own compute
# streams ("multi-stream cuBLAS": TE pull request #853; TE issue #1386, a maintainer: batched GEMM cannot take
# different sizes and cuBLAS's grouped API and CUTLASS grouped kernels were slower or lacked FP8, so TE keeps
# the multi-stream loop), and the pool has 4 streams (transformer_engine/common/util/multi_stream.h,
# num_compute_streams = 4). TE pull request #3134 (2026-06) still describes the Hopper/FP8 path this way.
GROUPED_GEMM_STREAMS = 4
# With the EP all-to-all overlap Megatron-Core runs each layer pass as schedule nodes (core_v0.16.1
# models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan: attn, moe_dispatch, mlp, moe_combine;
# a dense layer's dispatch and combine are no-ops), each called through pipeline_parallel/utils.py
# ScheduleNode._forward / _backward: forward, the event wait and record around it (stream_acquire_context) and
# the detached, viewless copy of its input (make_viewless(...).detach(), requires_grad): 4 host operations;
# backward, the wait and record, its own autograd engine call (Variable._execution_engine.run_backward) and the
# record_stream of its gradient: 5. Counted as the host operations above (HOST_OP_S each).
COMBINED_1F1B_NODE_HOST_OPS = (4, 5)
MOE_LAYER_NODES, DENSE_LAYER_NODES = 4, 2


@dataclass(frozen=True)
class ExpertWork:
    """How the MoE block of one layer lies on one rank for one micro-batch."""

    tokens: int          # tokens this rank routes (after sequence parallelism and cp)
    routed_rows: float   # routed (token, expert) rows this rank's experts process, with imbalance
    local_experts: int
    imbalance: float


def load_imbalance(shape: ModelShape, tokens: int, ep: int, etp: int) -> float:
    """Max over mean of the routed rows an expert rank processes: the capacity factor bounds it where tokens
    beyond capacity are dropped (padded to capacity: exactly it, at most 1.1); forced balance leaves sampling
    noise; otherwise :data:`DROPLESS_IMBALANCE`."""
    cf = shape.moe.capacity_factor
    if cf is not None:
        return min(DROPLESS_IMBALANCE, max(1.0, cf))
    if shape.router_force_balance:
        return random_routing_imbalance(shape.moe.num_experts, shape.moe.router_topk, ep, tokens * ep * etp)
    return DROPLESS_IMBALANCE


def random_routing_imbalance(experts: int, topk: int, ep: int, group_tokens: int) -> float:
    """Expected max over mean of the (token, expert) rows the ``ep`` ranks of an expert group receive when
    each of ``group_tokens`` tokens picks ``topk`` distinct experts of ``experts`` uniformly at random, as
    Megatron-Core's forced load balancing does: its router replaces the logits by i.i.d. normal draws
    (moe_utils.py RandomSTE, router.py ``moe_router_force_load_balancing``, core_v0.16.1) before the top-k.
    A rank holds ``experts / ep`` of them, so the count one token sends it is hypergeometric, with mean k/ep
    and variance k (1/ep)(1 - 1/ep)(E - k)/(E - 1); summed over the tokens the rank loads are near normal, and
    the busiest of ep is the mean plus E[max of ep standard normals] standard deviations
    (:func:`~orchestrator.estimate.compute.straggler_factor`, the same extreme-value expression)."""
    if ep <= 1 or experts <= topk or group_tokens <= 0:
        return 1.0
    share = 1.0 / ep
    var_per_token = topk * share * (1 - share) * (experts - topk) / (experts - 1)
    mean = group_tokens * topk * share
    return straggler_factor(ep, sqrt(group_tokens * var_per_token) / mean)


def expert_work(shape: ModelShape, tp: int, cp: int, ep: int, etp: int, mb: int) -> ExpertWork:
    moe = shape.moe
    tokens = shape.seq_length * mb // (cp * tp)
    imbalance = load_imbalance(shape, tokens, ep, etp)
    rows = tokens * moe.router_topk * etp * imbalance
    return ExpertWork(tokens=tokens, routed_rows=rows, local_experts=moe.num_experts // ep, imbalance=imbalance)


@lru_cache(maxsize=16384)
def moe_mlp_times(shape: ModelShape, hw: Hardware, tp: int, cp: int, ep: int, etp: int, mb: int,
                  gemm_hw: Hardware | None = None) -> MlpTimes:
    """The MoE block of one layer (router, permutation, grouped expert GEMMs, shared expert) on one rank,
    all-to-all excluded. ``shape`` is the full-sequence shape; cp divides the tokens."""
    moe, h, e = shape.moe, shape.hidden_size, hw.dtype_bytes
    work = expert_work(shape, tp, cp, ep, etp, mb)
    gemm = gemm_hw or hw
    router_f, router_b = linear_times_s(work.tokens, moe.num_experts, h, hw)
    route_bytes = 4 * work.tokens * moe.num_experts * 4          # fp32 scores: softmax and top-k, r/w
    permute_bytes = 2 * 2 * e * work.tokens * moe.router_topk * h  # permute + unpermute, read + write
    expert_f, expert_b = _grouped_expert_times(shape, gemm, work, etp)
    act_f, act_b = _expert_activation_times_s(shape, hw, work, etp)
    eager_f, eager_b = _expert_bias(shape, hw, work)
    fwd = router_f + expert_f + (route_bytes + permute_bytes) / hw.hbm_Bps + act_f + eager_f
    bwd = router_b + expert_b + (route_bytes + permute_bytes) / hw.hbm_Bps + act_b + eager_b
    fwd += (ROUTER_KERNELS + work.local_experts) * hw.kernel_gap_s
    bwd += (ROUTER_KERNELS + 2 * work.local_experts) * hw.kernel_gap_s
    mm = router_f + expert_f
    shared_f = 0.0
    if moe.shared_ffn:
        sf, sb, smm = linears_time_s(work.tokens * tp, mlp_linear_shapes(shape, moe.shared_ffn, tp), gemm)
        sa_f, sa_b = activation_times_s(shape, hw, work.tokens * tp, moe.shared_ffn / tp)
        shared_f = sf + sa_f
        fwd, bwd, mm = fwd + shared_f, bwd + sb + sa_b, mm + smm
    return MlpTimes(fwd, bwd, mm, recompute_s=_block_recompute_s(shape, hw, work, act_f, fwd, shared_f))


def _expert_activation_times_s(shape: ModelShape, hw: Hardware, work: ExpertWork, etp: int) -> tuple[float, float]:
    """The experts' activation over the routed rows, with its eager clamp when the shape has one."""
    width = shape.moe.expert_ffn / etp
    act_f, act_b = activation_times_s(shape, hw, work.routed_rows, width)
    if shape.glu_clamp is None:
        return act_f, act_b
    fc1_elements = work.routed_rows * width * (2 if shape.gated_mlp else 1)
    clamp_f, clamp_b = glu_clamp_work(fc1_elements, hw.dtype_bytes).times_s(hw.hbm_Bps, hw.kernel_gap_s)
    return act_f + clamp_f, act_b + clamp_b


def _expert_bias(shape: ModelShape, hw: Hardware, work: ExpertWork) -> tuple[float, float]:
    """TEGroupedMLP's per-expert fc2 bias of a biased model (estimate/eager_ops.py); nothing without biases."""
    if not shape.bias:
        return 0.0, 0.0
    return expert_bias_work(work.routed_rows * shape.hidden_size, work.local_experts,
                            hw.dtype_bytes).times_s(hw.hbm_Bps, hw.kernel_gap_s)


def _block_recompute_s(shape: ModelShape, hw: Hardware, work: ExpertWork, activation_forward_s: float,
                       block_forward_s: float = 0.0, shared_forward_s: float = 0.0) -> float:
    """What Megatron's recompute modules redo in the MoE block during the backward: the whole block's forward
    (``moe``, its all-to-all in layer.py), else the experts' activation (``moe_act``) and the shared experts'
    forward (``shared_experts``); and the pre-MLP norm over the rank's tokens (``layernorm``;
    estimate/eager_ops.py)."""
    mods = shape.recompute_modules
    if "moe" in mods:
        redo = block_forward_s
    else:
        redo = (activation_forward_s if "moe_act" in mods else 0.0) + \
            (shared_forward_s if "shared_experts" in mods else 0.0)
    if "layernorm" in shape.recompute_modules:
        norm = norm_forward_work(work.tokens * shape.hidden_size, hw.dtype_bytes)
        redo += norm.times_s(hw.hbm_Bps, hw.kernel_gap_s)[0]
    return redo


def _grouped_expert_times(shape: ModelShape, hw: Hardware, work: ExpertWork, etp: int) -> tuple[float, float]:
    """Forward and backward of the rank's local experts: per linear, one GEMM per expert (forward), a data- and
    a weight-gradient GEMM per expert (backward), run in rounds of :data:`GROUPED_GEMM_STREAMS` concurrent
    GEMMs (see :func:`stream_rounds`)."""
    moe = shape.moe
    rows = max(1, round(work.routed_rows / work.local_experts))
    fwd = bwd = 0.0
    for n_out, k_in in mlp_linear_shapes(shape, moe.expert_ffn, etp):
        fwd += stream_rounds(rows, n_out, k_in, hw, work.local_experts)
        bwd += stream_rounds(rows, k_in, n_out, hw, work.local_experts) + \
            stream_rounds(k_in, n_out, rows, hw, work.local_experts)
    return fwd, bwd


def stream_rounds(m: int, n: int, k: int, hw: Hardware, gemms: int, streams: int = GROUPED_GEMM_STREAMS) -> float:
    """``gemms`` equal (m x k) @ (k x n) GEMMs issued over ``streams`` streams: full rounds of ``streams``
    concurrent GEMMs (their tiles share the SMs, one wave quantisation per round), then the remainder."""
    full, rest = divmod(gemms, streams)
    time = full * matmul_time_s(m, n, k, hw, batch=streams) if full else 0.0
    return time + (matmul_time_s(m, n, k, hw, batch=rest) if rest else 0.0)


def expert_host_ops(fp8: bool, recipe: str = FP8_RECIPE) -> tuple[int, int]:
    """Host launches per local expert, (forward, backward): its GEMMs and, in FP8, its casts by scaling recipe."""
    per_f, per_b = EXPERT_HOST_OPS[fp8]
    if fp8 and recipe == "tensorwise":
        extra_f, extra_b = CURRENT_SCALING_EXTRA_HOST_OPS
        per_f, per_b = per_f + extra_f, per_b + extra_b
    elif fp8:          # delayed scaling: the fused cast is per linear (module_cast_ops), not per expert
        per_f, per_b = per_f - EXPERT_LINEARS, per_b - EXPERT_LINEARS
    return per_f, per_b


def module_cast_ops(fp8: bool, recipe: str = FP8_RECIPE) -> int:
    """Cast launches per MoE layer and direction that do not grow with the local experts: delayed scaling's one
    fused multi-tensor cast per GroupedLinear; none in BF16 or with current scaling (whose casts are per expert)."""
    return EXPERT_LINEARS * DELAYED_CAST_PER_LINEAR if fp8 and recipe != "tensorwise" else 0


def expert_cast_kernels(local_experts: int, fp8: bool, recipe: str = FP8_RECIPE) -> int:
    """GPU kernels of the experts' FP8 casts in one direction (forward: the fc1 and fc2 inputs; backward: their
    output gradients), on the main stream before each grouped GEMM: current scaling runs an amax, a scale and a
    cast kernel per expert (TE 2.9 csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl, called per
    expert by split_quantize), delayed scaling one fused kernel over the experts (cast.cpp
    multi_tensor_quantize_impl); none in BF16. Each costs the GPU its launch and tail (kernel_gap_s)."""
    if not fp8:
        return 0
    per_linear = 3 * local_experts if recipe == "tensorwise" else 1
    return EXPERT_LINEARS * per_linear


def combined_1f1b_host_s(nodes: int) -> tuple[float, float]:
    """Host time the EP overlap's schedule nodes add to a layer of ``nodes`` nodes, forward and backward."""
    per_f, per_b = COMBINED_1F1B_NODE_HOST_OPS
    return nodes * per_f * HOST_OP_S, nodes * per_b * HOST_OP_S


def dense_host_s() -> tuple[float, float]:
    """Host launch time of one dense layer, forward and backward: KERNELS_FWD / KERNELS_BWD host operators.
    Cross-checked against Megatron-Core core_v0.16.1's TE-spec layer (transformer_layer.py, attention.py, mlp.py;
    the layer norms are fused into the linears): four TE linear modules (LayerNorm+QKV, projection, LayerNorm+fc1,
    fc2) and TE's DotProductAttention at ~36 us each (2.7x torch's 13.5 us Linear, TE issue #2053), two RoPE
    applications, two fused bias-dropout-adds and the fused activation at ~13.5 us, the q/k/v split views: ~270 us
    forward; autograd runs about twice that backward (a data- and a weight-gradient GEMM per linear). KERNELS_FWD /
    KERNELS_BWD (20 / 40 ops, 200 / 400 us) are about 3/4 of that count; we keep them (the MoE layer's floor uses
    them too). Eager only: a CUDA-graphed layer (which orch never emits) launches from one graph replay."""
    return KERNELS_FWD * HOST_OP_S, KERNELS_BWD * HOST_OP_S


def moe_host_s(shape: ModelShape, ep: int, fp8: bool, recipe: str = FP8_RECIPE) -> tuple[float, float]:
    """Host launch time of one MoE layer (attention, router, dispatch, local experts), forward and backward."""
    block_f, block_b = moe_block_host_s(shape, ep, fp8, recipe)
    dense_f, dense_b = dense_host_s()
    return block_f + dense_f, block_b + dense_b


def moe_block_host_s(shape: ModelShape, ep: int, fp8: bool, recipe: str = FP8_RECIPE) -> tuple[float, float]:
    """Host launch time of the MoE block alone (router, dispatch, local experts), forward and backward."""
    local = shape.moe.num_experts // ep
    per_f, per_b = expert_host_ops(fp8, recipe)
    per_b += EXPERT_GRAD_HOOKS * (2 if shape.bias else 1)
    if shape.bias:     # TEGroupedMLP's per-expert bias loop: one host operator per kernel (eager_ops.py)
        per_f, per_b = per_f + EXPERT_BIAS_KERNELS[0], per_b + EXPERT_BIAS_KERNELS[1]
    casts = module_cast_ops(fp8, recipe)
    fwd = ROUTER_KERNELS + DISPATCH_HOST_OPS + casts + per_f * local
    bwd = 2 * (ROUTER_KERNELS + DISPATCH_HOST_OPS) + casts + per_b * local
    return fwd * HOST_OP_S, bwd * HOST_OP_S


def moe_block_s(shape: ModelShape, hw: Hardware, tp: int, cp: int, ep: int, etp: int, mb: int,
                gemm_hw: Hardware | None = None) -> tuple[float, float]:
    """(forward, backward) of the MoE block of one layer on one rank, as a benchmark of the block alone
    measures it: router, permutation, dispatch and combine all-to-alls (two each way), experts, at least
    the block's host launch time; no overlap with other work (Megatron-LM's moe_perf test:
    tests/data/megatron-moe-perf-h100.json). ``gemm_hw``: the FP8 GEMM rates of an FP8 block (None: 16-bit);
    it also selects FP8's host launch counts (EXPERT_HOST_OPS)."""
    mlp = moe_mlp_times(shape, hw, tp, cp, ep, etp, mb, gemm_hw)
    a2a = expert_layer_comm(shape, hw, tp, cp, ep, etp, mb).seconds / 2
    host_f, host_b = moe_block_host_s(shape, ep, gemm_hw is not None)
    return max(mlp.forward_s + a2a, host_f), max(mlp.backward_s + a2a, host_b)


def after_sync_host_s(shape: ModelShape, ep: int, fp8: bool, recipe: str = FP8_RECIPE) -> float:
    """Host time of what a dropless layer's forward launches after its dispatcher's sync: the dispatch
    (permutation, all-to-alls, sorting) and the local experts; the router ran before it."""
    return moe_block_host_s(shape, ep, fp8, recipe)[0] - ROUTER_KERNELS * HOST_OP_S


def with_dispatch_sync(layer: LayerTimeEstimate, moe_forward_s: float, host_after_sync_s: float) -> LayerTimeEstimate:
    """A dropless MoE layer's forward with its host sync. The alltoall dispatcher needs the token counts on
    the host (the all-to-all splits and the grouped GEMM's per-expert sizes) and waits for their device-to-
    host copy every layer (Megatron-Core moe/token_dispatcher.py: cuda_sync_point "before_ep_alltoall" with
    ep or tp > 1, "before_finish" otherwise); the GPU has then run everything launched before, so the host
    cannot run ahead across it. From one sync to the next, the host launches the dispatch and the experts
    (``host_after_sync_s``) and, after them, the next layer's attention, whose GPU time (the layer's forward
    outside the MoE block) can only follow: a two-stage flow shop (host, then GPU; Johnson 1954), whose
    length is at least the host time of the first part plus the GPU time of the second."""
    bound = host_after_sync_s + (layer.forward_s - moe_forward_s)
    return with_host_floor(layer, bound, layer.backward_s)


def with_host_floor(layer: LayerTimeEstimate, host_f: float, host_b: float) -> LayerTimeEstimate:
    """A layer that cannot run faster than the host launches it (a recomputed forward as its forward)."""
    fwd, bwd = max(layer.forward_s, host_f), max(layer.backward_s, host_b)
    if fwd == layer.forward_s and bwd == layer.backward_s:
        return layer
    recompute = layer.recompute_s * fwd / layer.forward_s if layer.forward_s > 0 else layer.recompute_s
    return dataclasses.replace(layer, forward_s=fwd, backward_s=bwd, recompute_s=recompute)


def host_idle_s(floored: LayerTimeEstimate, gpu_only: LayerTimeEstimate) -> float:
    """GPU time of a host-bound MoE layer spent waiting for its launches: the host floors' excess over the GPU
    work, forward and backward each (a direction the floor left alone gives exactly 0; the difference of the two
    sums left rounding there). The expert all-to-all runs on the GPU (NCCL kernels on its own stream) and is
    launched before what follows it, so it runs in that wait (:func:`exposed_all_to_all_s`)."""
    return (max(0.0, floored.forward_s - gpu_only.forward_s)
            + max(0.0, floored.backward_s - gpu_only.backward_s))


# --- the expert-parallel all-to-all ----------------------------------------------------------------

def uses_ep_a2a_overlap(is_moe: bool, engine: str, gpu: str, ep: int, pp: int, vpp: int, recompute: str,
                        dispatcher: str | None = None) -> bool:
    """Megatron-Core's EP all-to-all overlap applies (TransformerConfig's conditions: not with the allgather
    dispatcher), on a GPU."""
    return (is_moe and engine == "megatron" and gpu != "cpu" and ep > 1 and recompute != "full"
            and (pp == 1 or vpp > 1) and dispatcher != "allgather")


def exposed_all_to_all_s(ep_s: float, layer_compute_s: float, overlapped: bool, unpaired: float = 0.0) -> float:
    """What the all-to-all of a layer adds to it per micro-batch: all of it, or with the overlap what the other
    micro-batch's compute cannot cover (at least 1 - EP_A2A_OVERLAP of it) for the passes the combined 1F1B
    schedule pairs, and all of it for the ``unpaired`` share it runs alone (:func:`unpaired_share`)."""
    if not overlapped:
        return ep_s
    paired = max(ep_s - EP_A2A_OVERLAP * layer_compute_s, (1 - EP_A2A_OVERLAP) * ep_s)
    return unpaired * ep_s + (1 - unpaired) * paired


def unpaired_share(pp: int, vpp: int, num_microbatches: int) -> float:
    """Share of a rank's layer passes the EP overlap cannot pair (its busiest rank, pipeline rank 0). pp = 1:
    the first micro-batch's forward and the last one's backward run alone (combined_1f1b.py
    combined_1f1b_schedule_for_no_pipelining), 1 of m; interleaved: the warm-up forwards, (pp - 1) x 2 +
    (vpp - 1) x pp + 1 model-chunk passes (schedules.py get_pp_rank_microbatches, the group size
    microbatch_group_size_per_vp_stage defaulting to pp, one extra with the overlap), and as many cool-down
    backwards, of m x vpp."""
    if num_microbatches <= 0:
        return 1.0
    if pp <= 1:
        return 1.0 / num_microbatches
    warmup = (pp - 1) * 2 + (vpp - 1) * pp + 1
    return min(1.0, warmup / (num_microbatches * vpp))


def expert_group_placement(ep: int, etp: int, gpus_per_node: int) -> Placement:
    """The ep group: expert ranks are ordered etp -> ep -> edp, so its members are etp ranks apart."""
    return group_placement(ep, etp, gpus_per_node)


def all_to_all_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """One all-to-all where each rank sends ``nbytes`` in total, spread evenly over the group: the share
    bound for other nodes crosses at the per-GPU network bandwidth, the rest at the node's bus bandwidth;
    NCCL runs it as concurrent send/recv pairs (one p2p latency, Simple protocol)."""
    if pl.size <= 1:
        return 0.0
    remote = (pl.size - pl.per_node) / (pl.size - 1)
    return split_all_to_all_s(nbytes * (1 - remote), nbytes * remote, pl, hw)


def groups_reached(experts: int, topk: int, groups: int) -> float:
    """Expected number of ``groups`` (each holding experts / groups of the experts) a token's ``topk`` distinct
    experts fall in, routed uniformly (forced balance; a trained router balanced by its aux loss, to first order)."""
    per_group = experts // max(1, groups)
    if groups <= 1 or per_group < 1:
        return 1.0
    return groups * (1 - comb(experts - per_group, topk) / comb(experts, topk))


def flex_dispatch_bytes(token_bytes: float, experts: int, topk: int, pl: Placement) -> tuple[float, float]:
    """(NVLink, network) bytes one rank sends in one dispatch (or combine) of the flex dispatcher, DeepEP or
    HybridEP (docs/cost-model.md, "Token dispatchers"): each token crosses to each remote node that holds one of
    its experts once and is forwarded inside that node over NVLink to each rank that holds one; the alltoall
    dispatcher sends one copy per (token, expert). NVLink: one copy per distinct other rank reached (the local
    ones directly, the remote ones by the forward); network: one per distinct remote node reached. Sources:
    DeepEP's README (NVLink-to-RDMA forwarding) and csrc/kernels/internode.cu SourceMeta (one RDMA token per
    node with its target ranks' bitmask); Megatron-Core fused_a2a.py runs HybridEP from the same library."""
    ranks = groups_reached(experts, topk, pl.size)
    nodes = groups_reached(experts, topk, pl.num_nodes)
    return (token_bytes * ranks * (pl.size - 1) / pl.size,
            token_bytes * nodes * (pl.num_nodes - 1) / pl.num_nodes)


def split_all_to_all_s(intra_bytes: float, inter_bytes: float, pl: Placement, hw: Hardware) -> float:
    """One exchange that sends ``intra_bytes`` inside the node (NVLink) and ``inter_bytes`` over the network
    concurrently, as NCCL's send/recv pairs: one p2p latency (Simple protocol; gloo's on CPU), then the slower
    of the two links."""
    if pl.size <= 1:
        return 0.0
    link = "net" if pl.num_nodes > 1 else hw.link
    lat = (NCCL_BASE_US[("ring", "Simple")] + NCCL_HOP_US.get(link, NCCL_HOP_US["net"])[("ring", "Simple")]) * US \
        if hw.link != "loopback" else 2 * hw.latency_s
    return lat + max(intra_bytes / hw.intra_Bps, inter_bytes / hw.inter_Bps if inter_bytes else 0.0)


@dataclass(frozen=True)
class ExpertComm:
    """All-to-all (and expert-tensor-parallel) traffic of one MoE layer, one micro-batch, one rank."""

    bytes: float
    seconds: float


@lru_cache(maxsize=16384)
def expert_layer_comm(shape: ModelShape, hw: Hardware, tp: int, cp: int, ep: int, etp: int, mb: int) -> ExpertComm:
    """Dispatch + combine, forward and backward (4 exchanges: all-to-alls of the routed copies for the alltoall
    dispatcher, of one copy per remote node and rank for flex, all-gathers / reduce-scatters of every token for
    allgather); with etp > 1 the etp all-gather of the routed tokens and the reduce-scatter of their outputs,
    forward and backward."""
    moe = shape.moe
    work = expert_work(shape, tp, cp, ep, etp, mb)
    token_bytes = work.tokens * shape.hidden_size * hw.dtype_bytes
    routed_bytes = token_bytes * moe.router_topk
    placement = expert_group_placement(ep, etp, hw.gpus_per_node)
    if moe.dispatcher == "allgather":      # every rank gathers the group's tokens, reduce-scatters the outputs
        gathered = token_bytes * ep
        seconds = 4 * all_gather_s(gathered, placement, hw)
        sent = gathered * (ep - 1) / ep
    elif moe.dispatcher.startswith("flex") and placement.num_nodes > 1:
        intra, inter = flex_dispatch_bytes(token_bytes, moe.num_experts, moe.router_topk, placement)
        seconds = 4 * work.imbalance * split_all_to_all_s(intra, inter, placement, hw)
        sent = intra + inter
    else:
        sent = routed_bytes * (ep - 1) / ep
        seconds = 4 * work.imbalance * all_to_all_s(sent, placement, hw)
    nbytes = 4 * sent
    if etp > 1:
        etp_pl = group_placement(etp, 1, hw.gpus_per_node)
        gathered = routed_bytes * etp
        seconds += 4 * work.imbalance * all_gather_s(gathered, etp_pl, hw)
        nbytes += 4 * gathered * (etp - 1) / etp
    return ExpertComm(bytes=nbytes, seconds=seconds)
