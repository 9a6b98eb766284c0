"""Accelerator facts, each with its source. Data only: the cost model reads it, nothing here computes.

What each field means and where its values come from (dense peaks, bus bandwidths, MAMF, sustained clock,
tp_comm_overlap, attention_efficiency, fp8_training, published_mfu): docs/cost-model.md, "catalog/gpus.py".
"""
from __future__ import annotations

from dataclasses import dataclass

TFLOPS = 1e12
GiB = 2**30
MiB = 2**20
# Device memory the CUDA driver keeps from the processes: PyTorch's out-of-memory report gives the device total
# as cudaMemGetInfo returns it, "a total capacity of 79.18 GiB" on an 80 GB part (the report cited for
# CostModel.fragmentation, vllm-project/compressed-tensors PR #587): 1 - 79.18/80 = 1.03%. A100-40GB reports read
# "39.59 GiB total capacity", the same fraction. Charged against the catalog's HBM figure; where that is already
# nvidia-smi's smaller total (H100's 81559 MiB) it errs by ~0.35 GiB on the safe side.
DRIVER_RESERVED_FRACTION = 1 - 79.18 / 80


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
    matmul_efficiency: float = 0.75   # MAMF / dense peak (bf16); see _MAMF_SRC
    num_sms: int = 108                # SMs (CUs on AMD): one GEMM tile runs per SM per wave
    sustained_clock_fraction: float = 0.926   # sustained clock at the power limit / datasheet clock
    attention_efficiency: float = 0.45        # fused attention, forward + backward, fraction of peak
    tp_comm_overlap: bool = False             # Transformer Engine userbuffers can overlap TP comm with GEMMs
    runtime_bytes: int | None = None          # framework runtime per process; None: the cost model's CUDA context
    driver_reserved_fraction: float = DRIVER_RESERVED_FRACTION   # of hbm_bytes, never allocatable (above)
    fp8_training: bool = False                # FP8 training through Transformer Engine (Ada, Hopper or newer)
    # Elements per second of the tanh-GELU kernel (forward; backward alike) where it is bound by its
    # arithmetic, not by memory: on a CPU core the tanh costs more than the bytes. None: memory-bound (GPUs).
    gelu_elems_per_s: float | None = None
    persistent_gemm: bool = False             # cuBLAS's GEMMs: persistent CTAs, static tile schedule (Hopper)
    published_mfu: tuple = ()                 # ((model params, MFU), ...) published for 16-bit training (doc)
    published_mfu_source: str = ""

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

_A100_MFU = ((6.66e9, 0.6423), (12.85e9, 0.5957), (29.98e9, 0.5530), (64.86e9, 0.5333), (175e9, 0.514),
             (530e9, 0.560), (1000e9, 0.563))
_A100_MFU_SRC = ("MosaicML llm-foundry scripts/train/benchmarking/README.md, 'A100 80GB with 1600 Gbps node-node "
                 "interconnect' at seq 2048 (MPT 7B 64.23%, 13B 59.57%, 30B 55.3%, 70B 53.33%); Megatron-LM "
                 "README (commit 2e90a342f5, 2022-05-19, Selene A100-80GB, data-parallel size 1; Korthikanti et "
                 "al. 2022, arXiv 2205.05198): 175B 51.4%, 530B 56.0%, 1T 56.3%")
# In orch's own FLOP count (estimate/flops.py): each run's tokens/s per GPU times orch's model FLOPs per token over
# the 989.4 TF bf16 peak; tests/unit/test_plausibility.py recomputes them from tests/data/published-moe-cp-fp8.json.
_H100_MFU = ((1.7e9, 0.413), (6.66e9, 0.4644), (7.1e9, 0.471), (16e9, 0.494), (32e9, 0.465), (64.86e9, 0.4336),
             (70e9, 0.424), (119e9, 0.425), (177e9, 0.437), (314e9, 0.480), (462e9, 0.465))
_H100_MFU_SRC = ("Megatron-LM README model table (commit 937571cfd4, 2024-07-15: GPT 1.7B-462B on 48-6144 H100; best "
                 "16B, 489.1 TFLOP/s = 49.4% in orch's FLOP count); MosaicML llm-foundry "
                 "scripts/train/benchmarking/README.md, 'H100 80GB BF16' (MPT 7B 46.44%, 70B 43.36%)")

_MAMF_SRC = ("MAMF from S. Bekman, 'Machine Learning Engineering', compute/accelerator/README.md, "
             "'Maximum Achievable Matmul FLOPS comparison table' (bf16, mamf-finder.py): A100 SXM 271.2/312 "
             "(86.9%), H100 SXM 794.5/989 (80.3%, 'H200 is the same'), B200 SXM 1745/2250 (77.6%), "
             "MI300X 781.9/1300 (60.1%, ROCm 6.2); H100 PCIe 499.5/756 from the same finder "
             "(github.com/mag-/gpu_benchmark README). SM counts from the NVIDIA/AMD architecture whitepapers")

GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("a100-40gb", _A100, 40960 * MiB, 1555, 230, 25, 25, _A100_SRC + "; 40 GB HBM2, 1555 GB/s",
            matmul_efficiency=0.869, num_sms=108, attention_efficiency=0.55, published_mfu=_A100_MFU,
            published_mfu_source=_A100_MFU_SRC),
    GpuSpec("a100-80gb", _A100, 81920 * MiB, 2039, 230, 25, 25, _A100_SRC + "; 80 GB HBM2e, 2039 GB/s",
            matmul_efficiency=0.869, num_sms=108, attention_efficiency=0.55, published_mfu=_A100_MFU,
            published_mfu_source=_A100_MFU_SRC),
    GpuSpec("h100-sxm", _H100, 81559 * MiB, 3350, 370, 45, 50, _H100_SRC + "; 80 GB HBM3, 3.35 TB/s",
            matmul_efficiency=0.803, num_sms=132, tp_comm_overlap=True, fp8_training=True, persistent_gemm=True,
            published_mfu=_H100_MFU, published_mfu_source=_H100_MFU_SRC),
    GpuSpec("h100-pcie", {"fp32": 51.2 * TFLOPS, "tf32": 378 * TFLOPS, "bf16": 756 * TFLOPS,
                          "fp16": 756 * TFLOPS, "fp8": 1513 * TFLOPS},
            81559 * MiB, 2000, 50, 12.5, 50,
            "NVIDIA H100 PCIe datasheet: 756 TF bf16 dense, 80 GB HBM2e 2 TB/s; no NVSwitch: peers over "
            "PCIe Gen5 (~50 GB/s busbw); typical 1x 200 Gb/s NIC per 2 GPUs -> 12.5 GB/s per GPU",
            matmul_efficiency=0.661, num_sms=114, fp8_training=True, persistent_gemm=True),
    GpuSpec("h200", _H100, 143771 * MiB, 4800, 370, 45, 50,
            "NVIDIA H200 datasheet: same Hopper tensor cores as H100 SXM (989.4 TF bf16 dense), 141 GB HBM3e "
            "4.8 TB/s; NVLink4 900 GB/s (busbw ~370 GB/s); 8x 400 Gb/s NDR per node -> 50 GB/s per GPU",
            matmul_efficiency=0.803, num_sms=132, tp_comm_overlap=True, fp8_training=True, persistent_gemm=True),
    GpuSpec("b200", {"fp32": 80 * TFLOPS, "tf32": 1100 * TFLOPS, "bf16": 2250 * TFLOPS,
                     "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS},
            183359 * MiB, 8000, 720, 45, 50,
            "NVIDIA DGX B200 / HGX B200 datasheet: 2.25 PF bf16 dense per GPU (4.5 PF sparse), 180 GB HBM3e "
            "8 TB/s; NVLink5 1.8 TB/s bidirectional (busbw ~720 GB/s); 8x 400 Gb/s ConnectX-7 per 8 GPUs",
            matmul_efficiency=0.776, num_sms=148, tp_comm_overlap=True, fp8_training=True),
    GpuSpec("mi300x", {"fp32": 163.4 * TFLOPS, "tf32": 653.7 * TFLOPS, "bf16": 1307.4 * TFLOPS,
                       "fp16": 1307.4 * TFLOPS, "fp8": 2614.9 * TFLOPS},
            196592 * MiB, 5300, 310, 45, 50,
            "AMD Instinct MI300X datasheet: 1307.4 TF bf16 dense, 192 GB HBM3 5.3 TB/s; 7x Infinity Fabric "
            "links 896 GB/s aggregate (RCCL all_reduce busbw ~310 GB/s on 8 GPUs); 400 Gb/s NIC per GPU",
            matmul_efficiency=0.601, num_sms=304, attention_efficiency=0.35),
    GpuSpec("l40s", {"fp32": 91.6 * TFLOPS, "tf32": 183 * TFLOPS, "bf16": 362.05 * TFLOPS,
                     "fp16": 362.05 * TFLOPS, "fp8": 733 * TFLOPS},
            46068 * MiB, 864, 20, 12.5, 25,
            "NVIDIA L40S datasheet: 362 TF bf16 dense (733 sparse), 48 GB GDDR6 864 GB/s; no NVLink: "
            "peers over PCIe Gen4 (~20 GB/s busbw); typical 200 Gb/s NIC per 2 GPUs; matmul efficiency not "
            "measured in the MAMF table: 0.70 assumed (below the Hopper/Ampere SXM parts); FP8 (per tensor: delayed and "
            "current scaling) on compute capability 8.9 per Transformer Engine's support matrix",
            matmul_efficiency=0.70, num_sms=142, fp8_training=True),
    GpuSpec("cpu", {"fp32": 192e9, "tf32": 192e9, "bf16": 192e9, "fp16": 192e9},
            8 * GiB, 19.5, 1.0, 1.0, 20,
            "One CPU training process (orch's CPU test target). Peak 192 GFLOP/s fp32: one AVX-512 core with two "
            "FMA units, 16 fp32 lanes each, at ~3 GHz (2*2*16*3e9); measured on the target (Xeon with AVX-512, "
            "torch.matmul fp32, one thread, 2026-12-01): 190-202 GFLOP/s for (128..512) x (128..512) x (128..512) "
            "shapes, with no penalty for short K, so the matmul efficiency is 1.0. 'HBM bandwidth' 19.5 GB/s: what one rank's "
            "memory-bound kernels get while the other rank runs too (benchmarks/cpu_concurrency.py at load < 1, "
            "2026-12-01 02:36 UTC: 64 MiB copy 20.2 GB/s alone, 15.6 GB/s per process with 2 processes = 19.5 x "
            "the cost model's hbm_efficiency 0.8; the matmul keeps its rate with 2 processes, ratio 1.01; orch's "
            "tiny-gpt forward + backward at mb 4 runs 28.7 ms alone, 31.7 ms with 2 processes). 'HBM' is the share "
            "of host memory a process may use; bandwidths are gloo over loopback (~1 GB/s measured, "
            "10M fp32 all_reduce in ~40 ms on 2 processes); one 'SM' (no wave quantisation). Runtime memory: no "
            "CUDA context; python + torch + deepspeed hold ~0.24 GiB of RSS after import and ~0.5 GiB training "
            "the tiny model (measured): 0.4 GiB. Sustained speed 0.91 of that peak: the host VM's core runs "
            "145-202 GFLOP/s through the day; the one-core GEMM rate benchmarks/cpu_measure.sh printed before each "
            "of 8 runs (2026-12-01 06:16-06:20 UTC) was 166-187, median 176.5, and benchmarks/cpu_kernels.py gave "
            "174-175 for the tiny-gpt's training GEMM shapes (forward, data and weight gradient) at 06:24. "
            "GeLU (tanh) is bound by its arithmetic here, not by memory: 0.60/0.61 G elements/s forward and "
            "0.53/0.56 backward (benchmarks/cpu_kernels.py, 2 runs, 06:24 UTC; 0.57: their mean, 0.575, to two digits), ~4x its bytes at 19.5 GB/s; SiLU "
            "runs 2.5-2.6 G elements/s, at its bytes. No device driver keeps any of the 'HBM' share",
            matmul_efficiency=1.0, num_sms=1, sustained_clock_fraction=0.91, gelu_elems_per_s=0.57e9,
            attention_efficiency=0.25, runtime_bytes=400 * MiB, driver_reserved_fraction=0.0),
]}
