"""The calibratable terms of the cost model, in one small record.

Everything the estimators assume that a measurement could correct lives here: how close kernels get to
the hardware's peaks, how well collectives use the links, how much communication hides behind compute,
and the framework's fixed memory overheads. Hardware *facts* (peaks, HBM size, link speeds, measured
matmul ceilings) stay in :mod:`orchestrator.catalog.gpus`; this record only scales or overrides them.

``CostModel()`` is the documented default. A later ``orch calibrate`` fits some fields from measured runs
and writes them as JSON; :meth:`CostModel.from_dict` reads that back (unknown keys are an error).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import Problem, SpecError
from ..typed import did_you_mean

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class CostModel:
    """Efficiency and overhead terms, each with the reason for its default."""

    # --- compute ----------------------------------------------------------------------------------
    # Fraction of dense peak the best-shaped GEMM sustains in training. None: the catalog's measured MAMF
    # ceiling times its sustained-clock fraction (GpuSpec.matmul_efficiency * sustained_clock_fraction).
    # Smaller or oddly shaped GEMMs get less (see estimate/compute.py).
    matmul_efficiency: Optional[float] = None
    # Fraction of dense peak a fused (flash) attention kernel reaches, forward + backward. None: the
    # catalog's figure for the GPU (GpuSpec.attention_efficiency, from the FlashAttention-2/-3 papers)
    # times its sustained-clock fraction. It is the rate of the "catalog" kernel (what orch's runs plan with);
    # a kernel with measured rates (estimate/attention.py, published runs only) keeps those.
    attention_efficiency: Optional[float] = None
    # Element-wise rate of a compute-bound GeLU (elements/s). None: the catalog's (GpuSpec.gelu_elems_per_s,
    # the CPU target's; GPUs run it at its bytes). ``--measured`` scales it with the CPU core (doctor/measured.py).
    gelu_elems_per_s: Optional[float] = None
    # Fraction of datasheet HBM bandwidth that memory-bound kernels (norms, activations, dropout,
    # softmax, the optimizer step) sustain. Copy/elementwise kernels on A100/H100 reach ~80-90%
    # (e.g. STREAM-like triad ~1.7 TB/s of 2.04 TB/s on A100 80GB).
    hbm_efficiency: float = 0.80
    # Gap between dependent kernels on one stream (launch + tail), per kernel. A few microseconds on
    # current drivers without CUDA graphs.
    kernel_gap_s: float = 3e-6
    # Weight gradients accumulate across micro-batches in an fp32 buffer. Unfused (DeepSpeed's hooks,
    # Megatron-LM before --gradient-accumulation-fusion), each micro-batch pays a memory-bound pass
    # reading the 16-bit gradient and reading + writing the fp32 accumulator; fused, the weight-gradient
    # GEMM accumulates in its epilogue.
    fused_grad_accumulation: bool = False
    # Spread (standard deviation) of sustained speed between GPUs of the same model: silicon lottery,
    # cooling position, power delivery. "5% and higher differences on an 8-gpu node" (S. Bekman, ML
    # Engineering, compute/accelerator, "Not all accelerators are created equal"): a 5% range over 8 GPUs
    # is ~1.75% sigma. Synchronous training runs at the pace of the slowest of its N GPUs.
    gpu_speed_spread: float = 0.0175
    # --- network ----------------------------------------------------------------------------------
    # Scale on the catalog's intra-node figure, which already is a measured nccl-tests busbw.
    intra_node_efficiency: float = 1.0
    # Scale on the catalog's per-GPU inter-node figure (mostly NIC line rates): IB/RoCE collectives
    # reach ~90% of line rate in nccl-tests. Spec-given (measured) bandwidths are used as they are.
    inter_node_efficiency: float = 0.9
    # Fixed cost of one collective or p2p call (NCCL launch + protocol latency, small-message regime).
    collective_latency_s: float = 20e-6
    # Measured bus bandwidths (GB/s) that replace the catalog's figure (and its efficiency) when set:
    # `orch plan/generate --measured doctor.json` puts what `orch doctor` measured on the cluster here.
    intra_node_bandwidth_GBps: Optional[float] = None
    inter_node_bandwidth_GBps: Optional[float] = None
    # --- overlap ----------------------------------------------------------------------------------
    # Fraction of the backward (or forward, ZeRO-3 prefetch) compute window that data-parallel
    # communication can hide behind. Bucketed, asynchronous reduction (DeepSpeed overlap_comm,
    # Megatron-Core overlap_grad_reduce) hides most of it; contention for SMs and HBM costs the rest.
    dp_overlap: float = 0.7
    # Tensor-parallel collectives sit on the critical path of every layer (Megatron-LM); none hidden.
    tp_overlap: float = 0.0
    # ... unless sequence parallelism runs with --tp-comm-overlap on an NVLink GPU (catalog
    # ``tp_comm_overlap``; orch emits the flag then): Transformer Engine splits each TP GEMM into chunks
    # and moves one chunk's all-gather / reduce-scatter while the previous chunk computes. Dense layers are
    # counted GEMM by GEMM (estimate/tp_overlap.py); for MoE layers a quarter stays exposed (our estimate,
    # not measured here).
    tp_comm_overlap: float = 0.75
    # Pipeline p2p in 1F1B: send/recv pairs are waited on before the next micro-batch; none hidden.
    pp_overlap: float = 0.0
    # Hidden communication is not free: NCCL runs each channel as one CUDA block on one SM ("reducing the
    # number of channels also reduces the number of CUDA blocks used for communication", NCCL docs,
    # NCCL_MAX_NCHANNELS), so while a collective overlaps compute, channels / SMs of the GPU is taken from
    # the GEMMs. 16 channels: the rings NCCL builds on 8-GPU NVLink/NVSwitch nodes (our estimate; NCCL_DEBUG
    # shows the count). On the CPU target (one core, "1 SM") gloo's threads take the core itself.
    # What the taken SMs cost a GEMM depends on its tile schedule: estimate/overlap.py.
    comm_channels: int = 16
    # --- engine host overheads (DeepSpeed) ------------------------------------------------------------
    # Host time of one ZeRO-3 module fetch (DeepSpeed's pre-forward/pre-backward hooks: status checks, the
    # all-gather call and its wait, the release after use), on the critical path: the hook blocks the thread
    # that launches the next kernels. Measured with benchmarks/ds_host_overhead.py on the CPU target.
    zero3_fetch_host_s: float = 0.64e-3
    # Host time per rank of the Python loop DeepSpeed before 0.5.5 runs for every ZeRO-3 all-gather (and, up
    # to 0.6.0, reduce-scatter): a narrow() view, a dist.get_rank(group) comparison and a list append per rank
    # of the group (partition_parameters.py _allgather_param / _reduce_scatter_gradient). The loop never
    # touches the device: benchmarks/ds_list_host.py times it as written on this CPU target (torch 2.13):
    # 1536-rank loop, 3 runs of 15, minimum 1.94-2.00 us, medians 2.03-2.81 us per rank (2026-12-01, shared
    # machine, load ~1.3). The copy back into each view is a kernel launch (kernel_gap_s) on top. Under torch 1.8.1
    # (the PyTorch of the 2021 runs; Python 3.8) the same loop takes 1.4-1.7 us, against 2.5-2.6 us under torch
    # 2.13 in the same minute (2026-12-02, load ~5): no underestimate for those releases.
    ds_list_rank_host_s: float = 2.0e-6
    # Host time per rank and resident parameter of the copy loop in DeepSpeed < 0.5.5's synchronous gather of
    # the resident (persistent) parameters after each optimizer step (partition_parameters._allgather_params:
    # narrow, view, narrow, copy_ per rank and tensor). benchmarks/ds_list_host.py on this CPU target (CPU
    # tensors; on a GPU each copy_ launches a kernel, kernel_gap_s): 3 runs of 15, minimum 4.29-4.37 us,
    # medians 4.33-4.76 us per rank (2026-12-01, load ~1); torch 1.8.1: 3.0-3.3 us against 5.7-5.8 us under torch
    # 2.13 in the same minute (2026-12-02, load ~5).
    ds_persistent_copy_host_s: float = 4.3e-6
    # Host time of one ZeRO-3 hook pass over a module whose parameters stay resident (under
    # stage3_param_persistence_threshold: the norms), or that holds none of its own (a container: on CPU
    # every called module of orch's trainer is hooked, ds_runtime.trainer_modules): the hook gathers nothing,
    # so on a GPU it runs ahead of the kernel queue and hides; where the host is the device (the CPU target)
    # it is in series with the math.
    # benchmarks/ds_host_overhead.py z3p vs z0 (minimum of 30 steps, 2026-12-01 02:35 UTC, load ~1.3):
    # z3p K=2 4.11, K=32 25.68; z0 K=2 1.63, K=32 4.34 ms -> (21.34 - 2.48) / 60 = 0.31 ms.
    zero3_resident_hook_host_s: float = 0.31e-3
    # Host time of one micro-batch in DeepSpeed's pipeline engine (its instruction interpreter runs
    # LoadMicroBatch, Forward/BackwardPass and the blocking Send/Recv instructions one by one).
    # Measured with benchmarks/ds_host_overhead.py on the CPU target.
    pipeline_microbatch_host_s: float = 1.08e-3
    # Fixed host time of one DeepSpeed training step where the host is the device (the CPU target): the
    # engine's step bookkeeping (gradient-norm and clipping, scheduler, zeroing, the loss all_reduce's launch)
    # runs on the rank's only core, in series with the math; on a GPU it runs ahead of the asynchronous
    # kernel queue and hides. Measured with benchmarks/ds_host_overhead.py z0 K=2 gas=1 (a whole step of two
    # Linear(8, 8): next to no arithmetic), minimum of 30 steps: 1.9 ms and 2.2 ms on two days.
    ds_step_host_s: float = 2.0e-3
    # --- offload ----------------------------------------------------------------------------------
    # DeepSpeed CPU-Adam throughput per GPU process (parameters updated per second). ZeRO-Offload
    # (Ren et al. 2021, arXiv 2101.06840) reports ~1B-parameter steps in a few tenths of a second on a
    # full server; one of 8 processes per node gets its share of the cores.
    cpu_adam_params_per_s: float = 1.5e9
    # The unfused (single-tensor) Adam step's rate on a CPU rank, parameters per second, where `orch doctor`
    # timed it (doctor.json measured.model_optimizer_s over model_optimizer_params; --measured sets it): the
    # tiny models of the CPU target step tensors that live in the core's caches, which the DRAM bandwidth
    # ADAM_UNFUSED_BYTES_PER_PARAM is charged at (compute.py optimizer_step_s) does not describe. None: that.
    optimizer_params_per_s: Optional[float] = None
    # Host time per parameter tensor and step of DeepSpeed's optimizer-offload path: with offload_optimizer
    # ZeRO copies each gradient into its host fp32 partition and computes its norm tensor by tensor in
    # Python (stage3.py / stage_1_and_2.py: the per-parameter loops of partition_grads and
    # complete_grad_norm_calculation_for_cpu_offload), and copies the updated partition back, on the critical
    # path. Measured with benchmarks/ds_host_overhead.py (z3off vs z3, minimum of 30 steps) on the CPU target,
    # 2026-12-01 02:30 UTC, load average ~3: z3 K=2 5.73 ms, K=32 42.64 ms; z3off K=2 5.16 ms, K=32 45.91 ms
    # -> (3.27 + 0.57) / 60 = 0.064 ms per tensor. Small: offload on the CPU target costs little time, and
    # frees nothing (the host is the device), so the planner never picks it there (planner._offload_options).
    offload_tensor_host_s: float = 0.064e-3
    # --- memory overheads (bytes, per GPU) --------------------------------------------------------
    # CUDA context, cuBLAS/cuDNN workspaces and loaded kernels: ~0.5-1 GiB on A100/H100 with PyTorch.
    cuda_context_bytes: int = 1 * GiB
    # NCCL's own buffers per communicator a rank belongs to (NCCL_BUFFSIZE 4 MiB x channels x
    # send/recv on NVLink systems).
    nccl_bytes_per_group: int = 128 * MiB
    # Data-parallel gradient bucket (two in flight: one filling, one reducing). The renderers should
    # emit bucket sizes no larger than this (DeepSpeed reduce_bucket_size / allgather_bucket_size).
    dp_bucket_bytes: int = 256 * MiB
    # Caching-allocator fragmentation, as a fraction of activation memory: memory PyTorch's allocator holds
    # in split blocks no request of the next size can use (activations are the many differently sized,
    # short-lived tensors; model states are few, long-lived and allocated once). Our estimate, between what
    # is reported: an OOM report on an 80 GB part with 75.31 GiB allocated showed 1.83 GiB "reserved but
    # unallocated" (2.4%; vllm-project/compressed-tensors PR #587), while torchtune measured 16.39 ->
    # 10.83 GiB peak with expandable_segments (a third of the peak was fragmentation; meta-pytorch/torchtune
    # issue #1185), and ZeRO (Rajbhandari et al. 2020, section 6.3) saw OOM with 30% of memory free in
    # extreme cases of interleaved short- and long-lived activations. Uncertain, so left out of the floor that
    # decides what fits (MemoryEstimate.floor_bytes; a layout past the capacity only with it is "tight").
    fragmentation: float = 0.10
    # Planner policy, not a physical limit: the planner prefers layouts whose total_bytes <= (1 - hbm_headroom)
    # * HBM (MemoryEstimate.within_headroom) and falls back, with a warning, to those within the device's
    # capacity (MemoryEstimate.fits). Of the 5% (4 GiB on an 80 GiB part) ~0.8 GiB is not there at all:
    # PyTorch reports "a total capacity of 79.18 GiB" on an 80 GB GPU (the OOM report above;
    # catalog.gpus.DRIVER_RESERVED_FRACTION); the rest is margin for what the terms here do not count.
    hbm_headroom: float = 0.05
    # Host memory for offload is the spec's cluster.host_memory_GiB (per node), not a cost-model term.

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModel":
        """A CostModel from calibration data; unknown keys raise SpecError with a suggestion."""
        names = [f.name for f in dataclasses.fields(cls)]
        problems = [Problem(f"calibration.{key}", "unknown cost-model term", did_you_mean(key, names))
                    for key in data if key not in names]
        for key, value in data.items():
            if key in names and not _in_range(key, value):
                problems.append(Problem(f"calibration.{key}", f"{value!r} is out of range", _RANGE_HINT))
        if problems:
            raise SpecError(problems)
        return cls(**data)


_FRACTIONS = ("_efficiency", "_overlap", "fragmentation", "hbm_headroom", "gpu_speed_spread")
# Bounds far outside any real cluster that keep the cost model's sums finite (1e-300 efficiency or 1e308 s
# per kernel would make every step time infinite): (name ending, lowest, highest), the first match counts.
_BOUNDS = (("_efficiency", 1e-4, 1.0), ("_per_s", 1.0, 1e18), ("_s", 0.0, 60.0), ("_GBps", 1e-6, 1e5),
           ("_bytes", 0, 2**50), ("_bytes_per_group", 0, 2**50), ("comm_channels", 1, 1024))
_RANGE_HINT = ("efficiencies are in [1e-4, 1]; overlaps, spreads and fractions in [0, 1]; times per operation in "
               "[0, 60] s; bandwidths in [1e-6, 1e5] GB/s; rates in [1, 1e18] per s; byte counts in [0, 2**50]; "
               "comm_channels in [1, 1024]")


def _in_range(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return key == "fused_grad_accumulation"
    if value is None:
        return key in ("matmul_efficiency", "attention_efficiency", "gelu_elems_per_s", "intra_node_bandwidth_GBps",
                       "inter_node_bandwidth_GBps", "optimizer_params_per_s")
    if not isinstance(value, (int, float)) or isinstance(value, float) and not math.isfinite(value) or value < 0:
        return False
    for ending, lo, hi in _BOUNDS:
        if key.endswith(ending):
            return lo <= value <= hi
    return value <= 1 if key.endswith(_FRACTIONS) else value <= 1e6
