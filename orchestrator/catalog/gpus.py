"""Accelerator facts, each with its source. Data only: the cost model reads it, nothing here computes.

Peaks are DENSE figures (NVIDIA datasheets print bf16/fp16 "with sparsity", twice the dense value).
``intra_node_bandwidth_GBps`` is the NCCL bus bandwidth (nccl-tests ``busbw``) of an all-reduce among the
GPUs of one node; ``inter_node_bandwidth_GBps`` is the bandwidth ONE GPU gets across nodes (its share of
the node's NICs, e.g. 8x 200 Gb/s HDR for 8 GPUs = 25 GB/s). The spec's ``cluster.*_bandwidth_GBps``
override both with what the user measured. HBM is what ``nvidia-smi`` / ``rocm-smi`` reports as total.
"""
from __future__ import annotations

from dataclasses import dataclass

TFLOPS = 1e12
GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: dict            # dtype ("fp32", "tf32", "bf16", "fp16", "fp8") -> dense FLOP/s
    hbm_bytes: int
    hbm_bandwidth_GBps: float
    intra_node_bandwidth_GBps: float
    inter_node_bandwidth_GBps: float
    host_link_GBps: float       # GPU <-> host memory (PCIe), what offload pays
    source: str

    def peak_for(self, precision: str) -> float:
        """Dense peak FLOP/s for a training precision (fp32 training runs on TF32 tensor cores)."""
        if precision == "fp32":
            return self.peak_flops.get("tf32", self.peak_flops["fp32"])
        return self.peak_flops[precision]


_A100 = {"fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS, "bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS}
_A100_SRC = ("NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TF bf16/fp16 dense, 156 TF tf32; "
             "NVLink3 600 GB/s bidirectional, nccl-tests DGX A100 all_reduce busbw ~230 GB/s; "
             "DGX A100: 8x 200 Gb/s HDR InfiniBand per 8 GPUs -> 25 GB/s per GPU; PCIe Gen4 x16")
_H100 = {"fp32": 66.9 * TFLOPS, "tf32": 494.7 * TFLOPS, "bf16": 989.4 * TFLOPS, "fp16": 989.4 * TFLOPS,
         "fp8": 1978.9 * TFLOPS}
_H100_SRC = ("NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989.4 TF bf16 dense (1979 sparse), 494.7 TF tf32; "
             "NVLink4 900 GB/s bidirectional, nccl-tests all_reduce busbw ~370 GB/s on 8x H100 SXM; "
             "DGX H100: 8x 400 Gb/s NDR per 8 GPUs -> 50 GB/s per GPU (~45 GB/s measured); PCIe Gen5 x16")

GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("a100-40gb", _A100, 40960 * MiB, 1555, 230, 25, 25, _A100_SRC + "; 40 GB HBM2, 1555 GB/s"),
    GpuSpec("a100-80gb", _A100, 81920 * MiB, 2039, 230, 25, 25, _A100_SRC + "; 80 GB HBM2e, 2039 GB/s"),
    GpuSpec("h100-sxm", _H100, 81559 * MiB, 3350, 370, 45, 50, _H100_SRC + "; 80 GB HBM3, 3.35 TB/s"),
    GpuSpec("h100-pcie", {"fp32": 51.2 * TFLOPS, "tf32": 378 * TFLOPS, "bf16": 756 * TFLOPS,
                          "fp16": 756 * TFLOPS, "fp8": 1513 * TFLOPS},
            81559 * MiB, 2000, 50, 12.5, 50,
            "NVIDIA H100 PCIe datasheet: 756 TF bf16 dense, 80 GB HBM2e 2 TB/s; no NVSwitch: peers over "
            "PCIe Gen5 (~50 GB/s busbw); typical 1x 200 Gb/s NIC per 2 GPUs -> 12.5 GB/s per GPU"),
    GpuSpec("h200", _H100, 143771 * MiB, 4800, 370, 45, 50,
            "NVIDIA H200 datasheet: same Hopper tensor cores as H100 SXM (989.4 TF bf16 dense), 141 GB HBM3e "
            "4.8 TB/s; NVLink4 900 GB/s (busbw ~370 GB/s); 8x 400 Gb/s NDR per node -> 50 GB/s per GPU"),
    GpuSpec("b200", {"fp32": 80 * TFLOPS, "tf32": 1100 * TFLOPS, "bf16": 2250 * TFLOPS,
                     "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS},
            183359 * MiB, 8000, 720, 45, 50,
            "NVIDIA DGX B200 / HGX B200 datasheet: 2.25 PF bf16 dense per GPU (4.5 PF sparse), 180 GB HBM3e "
            "8 TB/s; NVLink5 1.8 TB/s bidirectional (busbw ~720 GB/s); 8x 400 Gb/s ConnectX-7 per 8 GPUs"),
    GpuSpec("mi300x", {"fp32": 163.4 * TFLOPS, "tf32": 653.7 * TFLOPS, "bf16": 1307.4 * TFLOPS,
                       "fp16": 1307.4 * TFLOPS, "fp8": 2614.9 * TFLOPS},
            196592 * MiB, 5300, 310, 45, 50,
            "AMD Instinct MI300X datasheet: 1307.4 TF bf16 dense, 192 GB HBM3 5.3 TB/s; 7x Infinity Fabric "
            "links 896 GB/s aggregate (RCCL all_reduce busbw ~310 GB/s on 8 GPUs); 400 Gb/s NIC per GPU"),
    GpuSpec("l40s", {"fp32": 91.6 * TFLOPS, "tf32": 183 * TFLOPS, "bf16": 362.05 * TFLOPS,
                     "fp16": 362.05 * TFLOPS, "fp8": 733 * TFLOPS},
            46068 * MiB, 864, 20, 12.5, 25,
            "NVIDIA L40S datasheet: 362 TF bf16 dense (733 sparse), 48 GB GDDR6 864 GB/s; no NVLink: "
            "peers over PCIe Gen4 (~20 GB/s busbw); typical 200 Gb/s NIC per 2 GPUs"),
    GpuSpec("cpu", {"fp32": 1e11, "tf32": 1e11, "bf16": 1e11, "fp16": 1e11},
            8 * GiB, 20, 1.0, 1.0, 20,
            "One CPU training process (orch's CPU test target). Peak 100 GFLOP/s: one x86-64 core with two "
            "AVX2 FMA units, 8 fp32 lanes each, at ~3 GHz (2*2*8*3e9 = 96e9), rounded. 'HBM' is the share "
            "of host memory a process may use; bandwidths are gloo over loopback (~1 GB/s measured, "
            "10M fp32 all_reduce in ~40 ms on 2 processes)"),
]}
