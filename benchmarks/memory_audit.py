"""The memory model per term against its references, for every published layout and every measured peak.

Issue 18, "No false OOM". For each case it prints orch's terms (params, grads, optimizer, activations, other)
next to a reference and the ratio orch / reference (> 1: orch over-estimates that term):

* Megatron-LM's own estimate (megatron/training/theoretical_memory_usage.py, re-derived here term by term:
  2-byte weights, 4-byte fp32 main gradients, 12 bytes of optimizer states, sharded over dp with the
  distributed optimizer; activations from Korthikanti et al. Table 2, with dropout, without GQA) for dense
  models, whatever the engine (the physics is the same);
* DeepSpeed's model-state estimators (estimate_zero2/zero3_model_states_mem_needs) for DeepSpeed ZeRO cases;
* measured peaks of real CPU runs here (tests/data/memory-fit/cpu-peaks.json: the trainer's mem_peak_bytes,
  peak RSS per rank), as differences between runs so the Python runtime cancels out.

Then whether each published layout fits (on its floor) and whether it is tight.

    python benchmarks/memory_audit.py [--published]     # --published: also every published case (~1 min)
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.estimate.estimate_context import EstimateContext  # noqa: E402
from orchestrator.estimate.params import padded_vocab_size  # noqa: E402
from orchestrator.estimate.step import estimate, params_of  # noqa: E402
from orchestrator.planner import enumerate_layouts  # noqa: E402
from orchestrator.spec_loader import load_spec  # noqa: E402

GiB = 2**30
DATA = ROOT / "tests" / "data"
TERMS = ("params", "grads", "optimizer", "activations")


def megatron_reference(spec, lay, num_microbatches: int) -> dict:
    """Megatron-LM's theoretical_memory_usage.py for a dense model, split into its terms (bytes per GPU)."""
    m = spec.model
    h, L, s, b, tp, pp = m.hidden_size, m.num_layers, m.seq_length, lay.micro_batch_size, lay.tp, lay.pp
    a = m.num_attention_heads
    g = m.num_query_groups or a
    ffn = m.ffn_hidden_size or 4 * h
    kv = m.kv_channels or h // a
    v = padded_vocab_size(m.vocab_size, tp)
    norm = 1 if m.normalization == "rmsnorm" else 2
    attn = 2 * h * h * ((1 + g / a) * kv * a / h)
    layer = 2 * h * (ffn * (1.5 if m.gated_mlp else 1) + norm) + attn
    block = layer * L + norm * h
    shard = (block / pp + h * v) / tp + (h * v / tp if not m.tie_embeddings and pp == 1 else 0)
    dist = lay.zero_stage >= 1
    optimizer = 12 * shard / (lay.dp * lay.cp) if dist else 12 * shard
    sbh = s * b * h
    sp = lay.sequence_parallel and lay.recompute == "selective"     # their compute_activation_memory; else
    per_layer = sbh * (18 + 4 * ffn / h) / tp if sp else sbh * (10 + 24 / tp)   # ..._without_sp (SP: / tp)
    act = per_layer * L + (8 * s * b * pp + sbh * pp) / (tp if sp else 1)   # + input ids, embedding dropout
    if lay.vpp > 1:
        act *= 1 + (pp - 1) / (pp * lay.vpp)
    elif pp > 1:
        act *= min(1, num_microbatches / pp)
    if pp == 1:
        act += sbh * 4 * (1 + v / h) / tp if sp else 2 * (s * b * v / tp + sbh)
    if not sp:
        act *= 1.05
    return {"params": 2 * shard, "grads": 4 * shard, "optimizer": optimizer, "activations": act}


def deepspeed_reference(total_params: float, largest_layer: float, zero_stage: int, gpus: int, per_node: int) -> dict:
    """DeepSpeed's own model-state estimators (no offload), as orch's terms: its 16-bit params and grads, the
    rest optimizer (its fp32 partition: master weights, momentum, variance, fp32 gradients)."""
    import os  # noqa: PLC0415
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs  # noqa: PLC0415
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: PLC0415
    nodes = max(1, gpus // per_node)
    if zero_stage <= 2:
        _, gpu = estimate_zero2_model_states_mem_needs(total_params, per_node, nodes, cpu_offload=False,
                                                       additional_buffer_factor=1.0)
        return {"params": 2 * total_params, "grads": 2 * total_params, "optimizer": gpu - 4 * total_params}
    _, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer, per_node, nodes, cpu_offload=False,
                                                      cpu_offload_params=False, zero_init=True,
                                                      additional_buffer_factor=1.0)
    live = 4 * largest_layer
    return {"params": 2 * total_params / gpus, "grads": 0.0, "optimizer": gpu - live - 2 * total_params / gpus,
            "other": live}


def _states(mem) -> float:
    return mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes


def orch_terms(mem) -> dict:
    return {"params": mem.params_bytes, "grads": mem.grads_bytes, "optimizer": mem.optimizer_bytes,
            "activations": mem.activations_bytes, "other": mem.other_bytes}


def _row(name: str, ours: dict, ref: dict | None, label: str) -> list[str]:
    lines = [f"  {name}: reference {label}"]
    for term in (*TERMS, "other"):
        if term not in ours:
            continue
        r = (ref or {}).get(term)
        ratio = f"{ours[term] / r:5.2f}x" if r else "   - "
        ref_s = f"{r / GiB:7.2f}" if r is not None else "      -"
        lines.append(f"    {term:<12} orch {ours[term] / GiB:7.2f} GiB   ref {ref_s} GiB   orch/ref {ratio}")
    return lines


def fit_line(mem) -> str:
    state = "fits" if mem.fits else "REFUSED"
    if mem.tight:
        state = "fits (tight)"
    return (f"total {mem.total_bytes / GiB:.1f} GiB, floor {mem.floor_bytes / GiB:.1f} GiB, capacity "
            f"{mem.capacity_bytes / GiB:.1f} GiB ({mem.stage} stage): {state}")


def audit_spec(path: Path, label: str | None = None, **model) -> list[str]:
    spec = load_spec(path)
    if model:
        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, **model))
    lay = next(iter(enumerate_layouts(spec)))
    ctx = EstimateContext.of(spec)
    est = estimate(ctx, lay)
    out = [f"{label or path.stem}: {lay.tag()} ({spec.training.engine}, {spec.training.precision}); {fit_line(est.memory)}"]
    if spec.model.moe is None:
        out += _row("busiest stage", orch_terms(est.memory), megatron_reference(spec, lay, est.num_microbatches),
                    "Megatron-LM theoretical_memory_usage.py (16-bit, Korthikanti et al. Table 2)")
    if spec.training.engine == "deepspeed" and lay.zero_stage >= 1:
        psi = params_of(ctx, lay)
        ref = deepspeed_reference(psi.per_gpu, psi.largest_layer_per_gpu, lay.zero_stage, lay.dp, spec.cluster.gpus_per_node)
        out += _row("model states", orch_terms(est.memory), ref, "DeepSpeed estimate_zero*_model_states_mem_needs")
    return out


def cpu_peaks() -> list[str]:
    """Measured peaks (tests/data/memory-fit/cpu-peaks.json) against orch's, as differences between runs."""
    path = DATA / "memory-fit" / "cpu-peaks.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    from orchestrator.spec_loader import parse_spec  # noqa: PLC0415
    predicted = {}
    out = [f"CPU runs here ({data['source']}):"]
    for run in data["runs"]:
        spec = parse_spec(run["spec"])
        lay = next(iter(enumerate_layouts(spec)))
        mem = estimate(EstimateContext.of(spec), lay).memory
        predicted[run["id"]] = mem
        if lay.zero_stage >= 1:
            psi = params_of(EstimateContext.of(spec), lay)
            ds = deepspeed_reference(psi.per_gpu, psi.largest_layer_per_gpu, lay.zero_stage, lay.dp,
                                     spec.cluster.gpus_per_node)
            out.append(f"  {run['id']}: model states orch {_states(mem) / 2**20:.0f} MiB ({spec.training.precision}), "
                       f"DeepSpeed's estimator {sum(ds.values()) / 2**20:.0f} MiB (it assumes 16-bit mixed precision)")
        out.append(f"  {run['id']}: measured peak {run['mem_peak_bytes'] / 2**20:7.0f} MiB, orch total "
                   f"{mem.total_bytes / 2**20:7.0f} MiB (floor {mem.floor_bytes / 2**20:.0f}; activations "
                   f"{mem.activations_bytes / 2**20:.0f}, states "
                   f"{_states(mem) / 2**20:.0f})")
    for a, b, what in data.get("differences", []):
        meas = next(r for r in data["runs"] if r["id"] == a)["mem_peak_bytes"] - \
            next(r for r in data["runs"] if r["id"] == b)["mem_peak_bytes"]
        pred = predicted[a].total_bytes - predicted[b].total_bytes
        ratio = f"{pred / meas:.2f}x" if meas > 0 else "-"
        out.append(f"  {a} - {b} ({what}): measured {meas / 2**20:+.0f} MiB, orch {pred / 2**20:+.0f} MiB "
                   f"(orch/measured {ratio})")
    return out


def published() -> list[str]:
    """Every published layout: does it fit, is it tight (tests/unit/test_published_fit.py asserts the first)."""
    from tests.published import EXTRA_CASES, load_cases, published_estimate  # noqa: PLC0415
    from tests.published_layouts import load_layout_cases, predicted_layout  # noqa: PLC0415
    out, refused = ["Published layouts (tests/data/published-cases.json, tests/published.py, "
                    "published-moe-cp-fp8.json):"], 0
    for case in [*load_cases(DATA / "published-cases.json", "throughput"), *EXTRA_CASES]:
        try:
            mem = published_estimate(case).memory
            out.append(f"  {case['id'][:44]:<44} {fit_line(mem)}")
        except Exception as e:   # noqa: BLE001  (NoFitError: a false OOM, reported)
            refused += 1
            out.append(f"  {case['id'][:44]:<44} REFUSED: {str(e)[:120]}")
    for case in load_layout_cases(DATA / "published-moe-cp-fp8.json"):
        mem = predicted_layout(case)["memory"]
        state = ("fits (tight)" if mem["tight"] else "fits") if mem["fits"] else "REFUSED"
        refused += not mem["fits"]
        out.append(f"  {case['id'][:44]:<44} total {mem['total_bytes'] / GiB:.1f} GiB, floor "
                   f"{mem['floor_bytes'] / GiB:.1f} GiB, capacity {mem['capacity_bytes'] / GiB:.1f} GiB: {state}")
    out.append(f"  refused: {refused}")
    return out


def main(argv: list[str]) -> int:
    lines = ["Published layouts once refused (tests/data/memory-fit/*.yaml):"]
    for path in sorted((DATA / "memory-fit").glob("*.yaml")):
        lines += audit_spec(path)
    for prec in ("bf16", "fp8"):
        lines += audit_spec(DATA / "memory-fit" / f"nemotron4-340b-128xh100-{prec}.yaml",
                            f"nemotron4-340b {prec} with vocab 256000 (not the published run's)", vocab_size=256000)
    lines += cpu_peaks()
    if "--published" in argv:
        lines += published()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
