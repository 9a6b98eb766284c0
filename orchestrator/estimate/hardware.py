"""What one GPU and its links deliver for this spec: catalog facts scaled by the cost model.

:class:`Hardware` is a small hashable record so the estimators can cache on it. Bandwidths are bytes per
second. Bandwidths measured by ``orch doctor`` (the cost model's ``*_bandwidth_GBps``, from ``--measured``)
come first, then the spec's ``cluster.*_bandwidth_GBps`` (measurements too), used as they are; catalog
figures are scaled by the cost model's link efficiencies.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..catalog.gpus import GPUS
from ..spec import Spec
from .cost import CostModel

GB = 1e9

# fp8 training (Transformer Engine) keeps bf16 weights, gradients and activations between layers; only
# the GEMM inputs are cast to fp8 (TE docs, "Using FP8 with Transformer Engine").
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
# The peak MFU is measured against: for fp8 the bf16 dense peak, as NVIDIA's and Megatron-Core's
# published MFU figures for FP8 runs do (the fp8 GEMM rate enters the compute time, estimate/precision.py).
MFU_PEAK_PRECISION = {"fp8": "bf16"}


@dataclass(frozen=True)
class Hardware:
    """Achievable rates of one GPU of the cluster, for the spec's training precision."""

    name: str
    peak_flops: float          # dense datasheet peak for the precision (FLOP/s)
    matmul_efficiency: float   # best-shape GEMM fraction of peak, sustained (MAMF / peak x clock fraction)
    attention_efficiency: float
    num_sms: int
    sustained_clock_fraction: float  # sustained / datasheet clock (catalog): scales measured kernel rates
    hbm_bytes: int
    capacity_bytes: int        # hbm_bytes less what the driver keeps (catalog driver_reserved_fraction)
    hbm_Bps: float             # sustained memory bandwidth of memory-bound kernels
    intra_Bps: float           # all-reduce bus bandwidth inside a node
    inter_Bps: float           # bandwidth one GPU gets across nodes
    host_Bps: float            # GPU <-> host link (offload)
    gpus_per_node: int
    num_nodes: int
    dtype_bytes: int           # activation / low-precision parameter element size
    kernel_gap_s: float
    latency_s: float           # per-hop latency of CPU (gloo) collectives; GPUs use NCCL's tables (comm.py)
    link: str = "nvlink"       # intra-node link class for NCCL's latencies: nvlink | pci | loopback (CPU, gloo)
    fused_grad_accumulation: bool = False
    tp_comm_overlap: bool = False   # the GPU can overlap TP comm with GEMMs (catalog)
    runtime_bytes: int | None = None   # framework runtime per process (catalog); None: CostModel's CUDA context
    gelu_elems_per_s: float | None = None   # compute-bound GELU rate (catalog, CPU); None: memory-bound
    persistent_gemm: bool = False   # GEMMs run persistent CTAs on a static tile schedule (catalog; estimate/overlap.py)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def host_is_device(self) -> bool:
        """Ranks are CPU processes on gloo (the catalog's cpu entry): their memory is host memory, where a
        buffer's pages are resident only once written, and no NCCL runs."""
        return self.link == "loopback"


def hardware_for(spec: Spec, cost: CostModel) -> Hardware:
    """The Hardware record of ``spec.cluster`` under ``cost``."""
    gpu = GPUS[spec.cluster.gpu]
    c = spec.cluster
    intra = (cost.intra_node_bandwidth_GBps or c.intra_node_bandwidth_GBps
             or gpu.intra_node_bandwidth_GBps * cost.intra_node_efficiency)
    inter = (cost.inter_node_bandwidth_GBps or c.inter_node_bandwidth_GBps
             or gpu.inter_node_bandwidth_GBps * cost.inter_node_efficiency)
    return Hardware(
        name=gpu.name, peak_flops=gpu.peak_for(MFU_PEAK_PRECISION.get(spec.training.precision,
                                                                      spec.training.precision)),
        matmul_efficiency=_override(cost.matmul_efficiency, gpu.matmul_efficiency * gpu.sustained_clock_fraction),
        attention_efficiency=_override(cost.attention_efficiency,
                                       gpu.attention_efficiency * gpu.sustained_clock_fraction),
        num_sms=gpu.num_sms, sustained_clock_fraction=gpu.sustained_clock_fraction, hbm_bytes=gpu.hbm_bytes,
        capacity_bytes=int(gpu.hbm_bytes * (1 - gpu.driver_reserved_fraction)),
        hbm_Bps=gpu.hbm_bandwidth_GBps * GB * cost.hbm_efficiency, intra_Bps=intra * GB, inter_Bps=inter * GB,
        host_Bps=gpu.host_link_GBps * GB, gpus_per_node=c.gpus_per_node, num_nodes=c.num_nodes,
        dtype_bytes=DTYPE_BYTES[spec.training.precision], kernel_gap_s=cost.kernel_gap_s,
        latency_s=cost.collective_latency_s, fused_grad_accumulation=cost.fused_grad_accumulation,
        tp_comm_overlap=gpu.tp_comm_overlap, runtime_bytes=gpu.runtime_bytes, link=intra_link(gpu),
        gelu_elems_per_s=cost.gelu_elems_per_s or gpu.gelu_elems_per_s, persistent_gemm=gpu.persistent_gemm)


def intra_link(gpu) -> str:
    """NVLink/NVSwitch-class parts (>= 100 GB/s busbw inside a node), PCIe peers, or CPU processes."""
    if gpu.name == "cpu":
        return "loopback"
    return "nvlink" if gpu.intra_node_bandwidth_GBps >= 100 else "pci"


def _override(calibrated: float | None, catalog: float) -> float:
    return catalog if calibrated is None else calibrated
