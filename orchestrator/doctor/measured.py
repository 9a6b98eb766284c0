"""``--measured doctor.json``: what ``orch doctor`` measured replaces the catalog's figures in the cost model.

It goes through the same :class:`~orchestrator.estimate.cost.CostModel` that ``--calibration`` fills (on top
of it, when both are given): the measured intra- and inter-node all-reduce bus bandwidths become
``intra/inter_node_bandwidth_GBps`` (used as they are, ahead of the spec's and the catalog's), the 8-byte
all-reduce latency ``collective_latency_s`` (per ring hop; CPU runs only: on GPUs the cost model takes NCCL's
per-link latencies from its table, which a small all-reduce does not resolve), and the slowest rank's GEMM
rate over the precision's dense peak ``matmul_efficiency`` (at most 1). On CPU one core fraction scales every
rate and host time of the rank (:func:`cpu_core_terms`): solved from the doctor's run of the trainer's own
micro-batch where it has one (:func:`kernel_mix_terms`), else the GEMM rate the ranks sustain together over
the catalog's. plan.json's ``measured`` block lists each figure that was replaced, its value and
where it came from.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from ..calibrate import read_json, spec_mismatches
from ..errors import Problem, SpecError, raise_if
from ..estimate.cost import CostModel
from ..spec import Spec
from .report import DOCTOR_VERSION

# doctor.json measured.<name> -> the CostModel field it sets
FIGURES = {"intra_node_bandwidth_GBps": "intra_node_bandwidth_GBps",
           "inter_node_bandwidth_GBps": "inter_node_bandwidth_GBps"}
# measured.<name> -> (lowest, highest) a measurement can be: far outside any real cluster (NVLink 5 is
# 900 GB/s, a GEMM on one GPU under 10 PFLOP/s) yet tight enough that the cost model's sums stay finite.
BOUNDS = {"intra_node_bandwidth_GBps": (1e-6, 1e5), "inter_node_bandwidth_GBps": (1e-6, 1e5),
          "allreduce_latency_s": (1e-9, 60.0), "gemm_flops": (1e3, 1e18), "gemm_sync_flops": (1e3, 1e18),
          "gemm_fp32_flops": (1e3, 1e18), "gemm_fp32_sync_flops": (1e3, 1e18),
          "model_step_s": (1e-7, 3600.0), "model_fwd_bwd_s": (1e-7, 3600.0), "model_optimizer_s": (1e-7, 3600.0)}
MAX_RANKS = 10**7


def load_doctor(path: str | Path) -> dict:
    """doctor.json's content, or SpecError naming the file and what is wrong with it."""
    where = str(path)
    data = read_json(path, "write one with `orch doctor RUN_DIR`")
    if not isinstance(data, dict) or data.get("doctor_version") != DOCTOR_VERSION or \
            not isinstance(data.get("measured"), dict):
        raise SpecError(Problem(where, f"not a doctor.json of version {DOCTOR_VERSION} (no measured figures)",
                                "re-run `orch doctor RUN_DIR` with this orch"))
    raise_if(figure_problems(data["measured"], where) + spec_block_problems(data.get("spec"), where))
    return data


def figure_problems(measured: dict, where: str) -> list[Problem]:
    """A Problem per measured figure that is not a number in its :data:`BOUNDS` (null: not measured)."""
    problems = []
    for name, (lo, hi) in BOUNDS.items():
        value = measured.get(name)
        if value is None:
            continue
        if not _number(value) or not lo <= value <= hi:
            problems.append(Problem(f"{where}: measured.{name}", f"{value!r} is not a number in [{lo:g}, {hi:g}]",
                                    "re-measure with `orch doctor RUN_DIR`; the file was edited or is damaged"))
    mb = measured.get("model_step_micro_batch")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb < 1):
        problems.append(Problem(f"{where}: measured.model_step_micro_batch", f"{mb!r} is not an integer >= 1",
                                "re-measure with `orch doctor`"))
    params = measured.get("model_optimizer_params")
    if params is not None and (not isinstance(params, int) or isinstance(params, bool) or params < 1):
        problems.append(Problem(f"{where}: measured.model_optimizer_params", f"{params!r} is not an integer >= 1",
                                "re-measure with `orch doctor`"))
    ranks = measured.get("allreduce_latency_ranks")
    if ranks is not None and (not _number(ranks) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS):
        problems.append(Problem(f"{where}: measured.allreduce_latency_ranks",
                                f"{ranks!r} is not an integer in [1, {MAX_RANKS}]", "re-measure with `orch doctor`"))
    return problems


def spec_block_problems(block, where: str) -> list[Problem]:
    """doctor.json's ``spec`` (what it measured) must be an object with a string gpu and an integer
    gpus_per_node when present."""
    if block is None:
        return []
    if not isinstance(block, dict):
        return [Problem(f"{where}: spec", f"must be an object, got {type(block).__name__}")]
    problems = [Problem(f"{where}: spec.{k}", f"must be a string, got {block[k]!r}")
                for k in ("gpu", "precision") if block.get(k) is not None and not isinstance(block[k], str)]
    per_node = block.get("gpus_per_node")
    if per_node is not None and (not _number(per_node) or not isinstance(per_node, int) or per_node < 1):
        problems.append(Problem(f"{where}: spec.gpus_per_node", f"must be an integer >= 1, got {per_node!r}"))
    return problems


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def per_hop_latency_s(measured: dict) -> float | None:
    """The cost model's gloo latency per ring hop from an 8-byte all-reduce over n ranks: the model charges
    1 + 2(n-1) hops for it (estimate/comm.py), so the measured time is split over as many."""
    lat, n = measured.get("allreduce_latency_s"), measured.get("allreduce_latency_ranks")
    if not _number(lat) or not _number(n) or not isinstance(n, int) or lat <= 0 or n < 2:
        return None
    return float(lat) / (1 + 2 * (n - 1))


def measured_cost(path: str | Path, spec: Spec, base: CostModel | None = None) -> tuple[CostModel, dict]:
    """(the cost model with the measured figures, plan.json's ``measured`` record)."""
    from ..catalog.gpus import GPUS  # noqa: PLC0415

    data = load_doctor(path)
    raise_if(spec_mismatches(data.get("spec") or {}, spec, f"{path}: spec", "measured on {!r}",
                             "measure this cluster with `orch doctor` on a run dir of this spec"))
    measured, terms, figures = data["measured"], {}, {}
    for name, field in FIGURES.items():
        value = measured.get(name)
        if _number(value) and value > 0:
            terms[field] = float(value)
            figures[field] = {"value": float(value), "from": f"measured.{name}"}
    hop = per_hop_latency_s(measured)
    if hop is not None and spec.cluster.gpu == "cpu":
        terms["collective_latency_s"] = hop
        figures["collective_latency_s"] = {"value": hop, "from": "measured.allreduce_latency_s",
                                           "allreduce_latency_s": measured["allreduce_latency_s"],
                                           "ranks": measured["allreduce_latency_ranks"]}
    on_cpu = spec.cluster.gpu == "cpu"
    source = "gemm_sync_flops" if on_cpu and _number(measured.get("gemm_sync_flops")) else "gemm_flops"
    gemm = measured.get(source)
    base = base or CostModel()
    if _number(gemm) and gemm > 0:
        gpu = GPUS[spec.cluster.gpu]
        peak = gpu.peak_for(spec.training.precision)
        terms["matmul_efficiency"] = min(1.0, gemm / peak)
        figures["matmul_efficiency"] = {"value": terms["matmul_efficiency"], "from": f"measured.{source}",
                                        "gemm_flops": float(gemm), "peak_flops": peak}
        if on_cpu:
            kernels = kernel_mix_terms(spec, measured, dataclasses.replace(base, **terms), gpu)
            if kernels is not None:      # the trainer's own kernels measured: they set the rank's speed
                fraction, core, source = kernels
                figures["matmul_efficiency"] = {"value": core["matmul_efficiency"], "from": f"measured.{source}"}
            else:
                fraction = core_fraction(measured, gpu)
                core = cpu_core_terms(dataclasses.replace(base, **terms), gpu, fraction)
            terms.update(core)
            for field, value in core.items():
                figures[field] = {**figures.get(field, {}), "value": value, "from": f"measured.{source}",
                                  "core_fraction": fraction}
            if "optimizer_params_per_s" in core:
                figures["optimizer_params_per_s"] = {"value": core["optimizer_params_per_s"],
                                                     "from": "measured.model_optimizer_s",
                                                     "params": measured["model_optimizer_params"]}
    cost = dataclasses.replace(base, **terms)
    return cost, {"source": str(path), "doctor_time_unix": data.get("time_unix"), "backend": data.get("backend"),
                  "figures": figures}


def core_fraction(measured: dict, gpu) -> float:
    """A CPU rank's core speed over the catalog's sustained one, from the doctor's fp32 GEMM rate (the catalog's
    CPU figures were measured in fp32; a 16-bit spec's GEMMs run other kernels, AMX/AVX-512 BF16): its own fp32
    probe, else the GEMM rate itself (an fp32 spec, or a doctor.json from before the fp32 probe); each as the
    ranks sustain it together (doctor/report.py synchronous_rate) where doctor.json has that."""
    rate = (measured.get("gemm_fp32_sync_flops") or measured.get("gemm_fp32_flops")
            or measured.get("gemm_sync_flops") or measured["gemm_flops"])
    return float(rate) / (gpu.peak_for("fp32") * gpu.matmul_efficiency * gpu.sustained_clock_fraction)


def catalog_micro_batch_s(spec: Spec, cost: CostModel, micro_batch: int, *, optimizer: bool = True) -> float:
    """What the cost model charges one CPU rank for the doctor's model probe (probe.measure_model_step): the
    whole model's forward and backward on one micro-batch (the step's compute over its micro-batches, at
    tp = pp = dp = 1) plus, with ``optimizer``, the optimizer step over every parameter."""
    from ..estimate.estimate_context import EstimateContext  # noqa: PLC0415
    from ..estimate.step import estimate  # noqa: PLC0415
    from ..layout import Layout  # noqa: PLC0415

    lay = Layout(tp=1, pp=1, vpp=1, dp=1, zero_stage=0, micro_batch_size=micro_batch, sequence_parallel=False,
                 recompute="none", offload="none")
    ctx = dataclasses.replace(EstimateContext.of(spec, cost), global_batch=micro_batch)   # one micro-batch
    b = estimate(ctx, lay).breakdown
    return b.compute_s + (b.optimizer_s if optimizer else 0.0)


class KernelMix(NamedTuple):
    """What :func:`kernel_mix_terms` solved: the core fraction, the cost-model terms it sets, and the doctor.json
    figure it was solved on (``model_fwd_bwd_s`` where the probe timed its two parts, else ``model_step_s``)."""

    fraction: float
    terms: dict
    source: str


def kernel_mix_terms(spec: Spec, measured: dict, cost: CostModel, gpu, rounds: int = 4) -> KernelMix | None:
    """The core fraction and cost-model terms that make the cost model charge the doctor's model probe what it
    measured (doctor.json ``model_step_s`` at ``model_step_micro_batch``), or None without that figure.

    The GEMM probe times one 256 x 256 GEMM; a tiny-gpt micro-batch is some 300 small GEMMs (512 x 128 x 128
    and alike), as many memory-bound passes and autograd's per-op dispatch, whose share of the step the GEMM
    rate does not tell, and which a loaded core (neighbours evicting its caches) slows more than a GEMM that
    lives in L2. So on CPU the fraction comes from the trainer's kernels themselves: every rate and host time
    of the rank (:func:`cpu_core_terms`, the GEMM ceiling too) scales by one fraction, solved so the model's
    micro-batch matches the measurement (a few fixed-point rounds: the shape terms are not exactly linear).

    Where the probe timed its two parts (``model_fwd_bwd_s``, ``model_optimizer_s`` over
    ``model_optimizer_params``), the fraction is solved on the forward and backward alone and the optimizer
    step's own rate is taken as measured (CostModel.optimizer_params_per_s). One fraction for the sum charged
    the whole-model Adam step at the DRAM rate (80 bytes a parameter, compute.py) although tiny-gpt's states
    live in the core's caches: measured alone on this CPU, mb 1, its step is 3.4 ms of 17.3 where the model
    charged 6.3 of 20, which left the fitted forward and backward ~15% fast, and a pp = 2 stage, which runs
    half the forward and backward per micro-batch but one step of half the parameters, faster still."""
    step_s, mb = measured.get("model_step_s"), measured.get("model_step_micro_batch")
    if not _number(step_s) or step_s <= 0 or not isinstance(mb, int) or mb < 1:
        return None
    split = _probe_parts(measured)
    base = dataclasses.replace(cost, matmul_efficiency=None)
    extra, source = {}, "model_step_s"
    if split is not None:
        step_s, extra, source = split[0], {"optimizer_params_per_s": split[1]}, "model_fwd_bwd_s"
    sustained = gpu.matmul_efficiency * gpu.sustained_clock_fraction
    fraction, terms = 1.0, {}
    for _ in range(rounds):
        terms = {**cpu_core_terms(base, gpu, fraction), "matmul_efficiency": min(1.0, sustained * fraction)}
        charged = catalog_micro_batch_s(spec, dataclasses.replace(base, **terms), mb, optimizer=split is None)
        fraction *= charged / step_s
    terms = {**cpu_core_terms(base, gpu, fraction), "matmul_efficiency": min(1.0, sustained * fraction), **extra}
    return KernelMix(fraction, terms, source)


def _probe_parts(measured: dict) -> tuple[float, float] | None:
    """(forward + backward seconds, optimizer parameters per second) of the model probe, or None where
    doctor.json has only the whole step (a doctor before the parts were timed)."""
    fb, opt, params = (measured.get(k) for k in ("model_fwd_bwd_s", "model_optimizer_s", "model_optimizer_params"))
    if not (_number(fb) and fb > 0 and _number(opt) and opt > 0 and isinstance(params, int) and params > 0):
        return None
    return float(fb), params / float(opt)


def cpu_core_terms(cost: CostModel, gpu, fraction: float) -> dict:
    """The cost-model terms of a CPU rank whose core runs at ``fraction`` of the catalog's sustained speed.

    On the CPU target the "device" is the rank's core: its GEMMs, its attention matmuls, its element-wise
    passes (norms, GeLU, softmax, the optimizer step: the tiny model's tensors live in the core's caches,
    whose bandwidth follows the core clock and, under a time-shared core, its share of the wall clock), and
    every host step (kernel launch, DeepSpeed's hooks and loops) run on it. The doctor's GEMM rate over the
    catalog's sustained GEMM rate is that fraction (a clocked-down VM or neighbours taking a share of the core
    slow all of it alike), so the rates scale by it and the host times by its inverse; the catalog's figures
    were measured at ``fraction`` 1. Only the GEMM rate scaled (before) left the non-GEMM half of a tiny-gpt
    step at catalog speed (docs/doctor.md, "CPU")."""
    f = fraction
    out = {"kernel_gap_s": cost.kernel_gap_s / f, "hbm_efficiency": cost.hbm_efficiency * f,
           "cpu_adam_params_per_s": cost.cpu_adam_params_per_s * f,
           "attention_efficiency": (cost.attention_efficiency
                                    or gpu.attention_efficiency * gpu.sustained_clock_fraction) * f}
    if gpu.gelu_elems_per_s:
        out["gelu_elems_per_s"] = (cost.gelu_elems_per_s or gpu.gelu_elems_per_s) * f
    for field in dataclasses.fields(CostModel):
        if field.name.endswith("_host_s"):
            out[field.name] = getattr(cost, field.name) / f
    return out
