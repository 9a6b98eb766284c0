"""Layout-neighbour audit: is the cost model still sane one layout step away from each published run?

A model can match its reference rows and still be wrong one step away (a rule that refuses what Megatron or
DeepSpeed accept, a discontinuity, a term that explodes). For every published spec in
tests/data/published-specs/*.yaml this plans the spec as ``orch plan SPEC`` does (parse_spec, build_plan), then
moves its resolved layout one step at a time with the GPU count fixed (data parallelism follows):

    tp x2 / /2, pp x2 / /2 (interleaving and stage split then left to the planner), virtual_pipeline off / on /
    x2, micro_batch_size x2 / /2, expert x2 / /2 (MoE), context x2 / /2, zero_stage +-1, recompute none /
    selective / full, sequence_parallel on / off (tp > 1), precision bf16 <-> fp8 (GPUs with FP8 training).

Each neighbour is planned through the same path and printed with its predicted model TFLOP/s per GPU, the ratio
to the published layout's, its memory floor, and the same layout in the other precision; or the refusal.
Anomalies (leads to examine, not verdicts; the summary at the end):

    ratio      a neighbour predicted > 1.6x or < 0.5x as fast as the published layout;
    fp8<bf16   FP8 predicted slower than BF16 on the same layout (the published layout and every planned
               neighbour are planned in the other precision too; a recipe refusal of FP8's default delayed
               scaling is retried with tensorwise);
    refusal    a refused neighbour whose memory floor is within 5% of the published layout's (which fits);
    monotone   more recompute predicted faster on the same layout (none <= selective <= full in step time).

``--quiet`` prints only the anomalies; ``--only SUBSTRING`` restricts the specs. Progress goes to stderr.
Run it under the shared lock: ``flock /work/wt/cpu.lock python benchmarks/layout_neighbours.py``.
"""
from __future__ import annotations

import copy
import dataclasses
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.catalog.gpus import GPUS  # noqa: E402
from orchestrator.errors import SpecError  # noqa: E402
from orchestrator.estimate.step import EstimateContext, estimate  # noqa: E402
from orchestrator.layout import layout_from_spec  # noqa: E402
from orchestrator.plan import build_plan  # noqa: E402
from orchestrator.planner import enumerate_layouts  # noqa: E402
from orchestrator.spec import read_spec_data  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402

SPECS = ROOT / "tests" / "data" / "published-specs"
FAST, SLOW = 1.6, 0.5          # ratio bounds of the "ratio" anomaly
FLOOR_CLOSE = 0.05             # a refused neighbour within this of the published layout's memory floor
RECOMPUTE_ORDER = ("none", "selective", "full")
# What a pipeline change invalidates in the resolved layout: left open for the planner to choose.
SPLIT_FIELDS = ("virtual_pipeline", "first_stage_layers", "last_stage_layers", "account_for_embedding_loss")
RECOMPUTE_DETAIL = {"recompute_modules": None, "recompute_method": None, "recompute_num_layers": None,
                    "distribute_saved_activations": None}     # (full recompute's own option)
GiB = 2**30


@dataclasses.dataclass
class Outcome:
    """One planned (or refused) layout: model TFLOP/s per GPU, step time, memory floor, or the refusal text."""

    label: str
    precision: str
    tflops: float | None = None
    step_s: float | None = None
    floor_bytes: float | None = None
    tag: str = ""
    refusal: str = ""
    other: "Outcome | None" = None      # the same layout in the other precision

    @property
    def planned(self) -> bool:
        return self.tflops is not None


# --- planning ----------------------------------------------------------------------------------------

def plan_data(label: str, data: dict, base_dir: Path) -> Outcome:
    """Parse and plan spec data as `orch plan` does; a refusal keeps its first problem's text and, when the
    layout can still be estimated, its memory floor."""
    precision = data["training"].get("precision", "bf16")
    try:
        spec = parse_spec(data, base_dir=base_dir)
    except SpecError as e:
        return Outcome(label, precision, refusal=_first(e))
    try:
        plan = build_plan(spec, top_k=1)
    except SpecError as e:
        return Outcome(label, precision, refusal=_first(e), floor_bytes=_floor_of(spec))
    c = plan.chosen
    return Outcome(label, precision, tflops=c["tflops_per_gpu"], step_s=c["step_time_s"],
                   floor_bytes=c["memory"]["floor_bytes"], tag=f"{plan.layout.tag()} {plan.layout.recompute}")


def _first(e: SpecError) -> str:
    p = e.problems[0]
    return f"{p.path}: {p.message}"[:400]


def _floor_of(spec) -> float | None:
    """The memory floor of the spec's (first) layout that passes the rules, estimated directly."""
    fixed = layout_from_spec(spec)
    lay = fixed if fixed.is_complete else next(enumerate_layouts(spec), None)
    if lay is None:
        return None
    try:
        return estimate(EstimateContext.of(spec), lay).memory.floor_bytes
    except Exception:  # noqa: BLE001  (an audit: a layout the estimator cannot take is reported, not fatal)
        return None


def other_precision(prec: str) -> str:
    return "fp8" if prec == "bf16" else "bf16"


def flipped(data: dict, recipe: str | None = None) -> dict:
    """Spec data in the other precision: to FP8 with the spec's recipe (orch's default if none) or ``recipe``;
    to BF16 without an FP8 recipe."""
    d = copy.deepcopy(data)
    training = d["training"]
    if training.get("precision", "bf16") == "bf16":
        training["precision"] = "fp8"
        if recipe:
            training["fp8_recipe"] = recipe
    else:
        training["precision"] = "bf16"
        training.pop("fp8_recipe", None)
    return d


def plan_flipped(label: str, data: dict, base_dir: Path) -> Outcome:
    """The layout in the other precision; FP8 refused for its default delayed scaling is retried tensorwise."""
    out = plan_data(label, flipped(data), base_dir)
    if not out.planned and "delayed scaling" in out.refusal:
        retry = plan_data(label + " (tensorwise)", flipped(data, "tensorwise"), base_dir)
        return retry if retry.planned else out
    return out


# --- neighbours --------------------------------------------------------------------------------------

def resolved_parallelism(spec) -> dict:
    """The resolved spec's parallelism section as spec data (None fields left out)."""
    p = dataclasses.asdict(spec.parallelism)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items() if v is not None}


def with_changes(par: dict, world: int, changes: dict, open_split: bool = False) -> dict | None:
    """The parallelism ``par`` with ``changes`` (None removes a field), data following the GPU count; None when
    the degrees do not divide it."""
    new = {k: v for k, v in par.items() if not (open_split and k in SPLIT_FIELDS)}
    new.update(changes)
    new = {k: v for k, v in new.items() if v is not None}
    model_ranks = new.get("tensor", 1) * new.get("pipeline", 1) * new.get("context", 1)
    if world % model_ranks:
        return None
    new["data"] = world // model_ranks
    if new.get("tensor", 1) == 1:
        new.pop("sequence_parallel", None)
    return new


def halve_double(name: str, field: str, value: int, halve: bool = True) -> Iterator[tuple[str, dict]]:
    yield f"{name} {value}->{value * 2}", {field: value * 2}
    if halve and value > 1:
        yield f"{name} {value}->{value // 2}", {field: value // 2}


def degree_steps(par: dict, num_layers: int, moe: bool) -> Iterator[tuple[str, dict, bool]]:
    """(label, changes, open the pipeline split) of the degree steps: tp, pp, vpp, micro-batch, ep, cp."""
    tp, pp = par.get("tensor", 1), par.get("pipeline", 1)
    for label, ch in halve_double("tp", "tensor", tp):
        yield label, {**ch, "sequence_parallel": par.get("sequence_parallel") if tp > 1 else None}, False
    for label, ch in halve_double("pp", "pipeline", pp):
        yield label, ch, True
    yield from vpp_steps(par, num_layers)
    for label, ch in halve_double("mb", "micro_batch_size", par.get("micro_batch_size", 1)):
        yield label, ch, False
    if moe:
        for label, ch in halve_double("ep", "expert", par.get("expert", 1)):
            yield label, ch, False
    for label, ch in halve_double("cp", "context", par.get("context", 1)):
        yield label, ch, False


def vpp_steps(par: dict, num_layers: int) -> Iterator[tuple[str, dict, bool]]:
    """Interleaving off (vpp > 1), on at the smallest size the stage's layers allow (vpp 1), or doubled."""
    pp, vpp = par.get("pipeline", 1), par.get("virtual_pipeline", 1)
    if pp <= 1:
        return
    uneven = {"first_stage_layers": None, "last_stage_layers": None}
    if vpp > 1:
        yield f"vpp {vpp}->off", {"virtual_pipeline": 1, **uneven}, False
        yield f"vpp {vpp}->{vpp * 2}", {"virtual_pipeline": vpp * 2, "account_for_embedding_loss": None}, False
        return
    per_stage = num_layers // pp
    on = next((v for v in range(2, per_stage + 1) if per_stage % v == 0), None)
    if on:
        yield f"vpp off->{on}", {"virtual_pipeline": on, "account_for_embedding_loss": None, **uneven}, False


def setting_steps(par: dict) -> Iterator[tuple[str, dict, bool]]:
    """ZeRO stage +-1, the other recompute settings, sequence parallelism toggled (tp > 1)."""
    z = par.get("zero_stage", 0)
    for nz in (z - 1, z + 1):
        if 0 <= nz <= 3:
            yield f"zero {z}->{nz}", {"zero_stage": nz}, False
    rc = par.get("recompute", "none")
    for other in RECOMPUTE_ORDER:
        if other != rc:
            yield f"recompute {rc}->{other}", {"recompute": other, **RECOMPUTE_DETAIL}, False
    if par.get("tensor", 1) > 1:
        sp = bool(par.get("sequence_parallel"))
        yield f"sp {sp}->{not sp}", {"sequence_parallel": not sp}, False


def neighbours(par: dict, data: dict, world: int, num_layers: int, moe: bool) -> Iterator[tuple[str, dict]]:
    """(label, spec data) of every one-step layout neighbour of the resolved parallelism ``par``."""
    for label, changes, open_split in [*degree_steps(par, num_layers, moe), *setting_steps(par)]:
        new = with_changes(par, world, changes, open_split)
        if new is not None:
            yield label, {**data, "parallelism": new}


# --- one spec ----------------------------------------------------------------------------------------

def audit_spec(path: Path) -> tuple[list[str], list[str]]:
    """(table lines, anomaly lines) of one published spec."""
    data = read_spec_data(path)
    base = plan_data("published", data, path.parent)
    if not base.planned:
        return [f"\n{path.stem}: published layout refused: {base.refusal}"], [f"{path.stem}: published refused"]
    spec = parse_spec(data, base_dir=path.parent)
    par = resolved_parallelism(build_plan(spec, top_k=1).spec)
    resolved = {**data, "parallelism": par}
    gpu = GPUS.get(spec.cluster.gpu)
    flips = bool(gpu and gpu.fp8_training) and base.precision in ("bf16", "fp8")
    if flips:
        base.other = plan_flipped("published", resolved, path.parent)
    outcomes = []
    for label, d in neighbours(par, resolved, spec.world_size, spec.model.num_layers, spec.model.moe is not None):
        o = plan_data(label, d, path.parent)
        if o.planned and flips:
            o.other = plan_flipped(label, d, path.parent)
        outcomes.append(o)
    if flips:
        outcomes.append(plan_flipped(f"precision {base.precision}->{other_precision(base.precision)}", resolved,
                                     path.parent))
    lines = [f"\n{path.stem}: {base.tag}  {base.tflops:.1f} TFLOP/s/GPU ({base.precision}), floor "
             f"{base.floor_bytes / GiB:.1f} GiB{_other_text(base)}"] + [_row(o, base) for o in outcomes]
    return lines, anomalies(path.stem, base, outcomes, par.get("recompute", "none"))


def _other_text(o: Outcome) -> str:
    x = o.other
    if x is None:
        return ""
    if not x.planned:
        return f"; {x.precision}: refused{_floor_text(x)}: {x.refusal[:160]}"
    return f"; {x.precision}{' tensorwise' if 'tensorwise' in x.label else ''} same layout {x.tflops:.1f}"


def _floor_text(o: Outcome) -> str:
    return f" (floor {o.floor_bytes / GiB:.1f} GiB)" if o.floor_bytes else ""


def _row(o: Outcome, base: Outcome) -> str:
    if not o.planned:
        return f"    {o.label:<26} refused{_floor_text(o)}: {o.refusal}"
    return (f"    {o.label:<26} {o.tflops:7.1f} {o.tflops / base.tflops:6.2f}x  {o.tag} "
            f"({o.floor_bytes / GiB:.1f} GiB){_other_text(o)}")


# --- anomalies ---------------------------------------------------------------------------------------

def anomalies(name: str, base: Outcome, outcomes: list[Outcome], recompute: str) -> list[str]:
    """Every flag of one spec's audit, prefixed with its name."""
    found = fp8_slower([base, *outcomes]) + ratio_flags(base, outcomes) + close_refusals(base, outcomes)
    found += monotone_recompute(base, outcomes, recompute)
    return [f"{name}: {a}" for a in found]


def fp8_slower(outcomes: list[Outcome]) -> list[str]:
    """FP8 predicted slower than BF16 on the same layout."""
    found = []
    for o in outcomes:
        if o.planned and o.other is not None and o.other.planned:
            fp8, bf16 = (o, o.other) if o.precision == "fp8" else (o.other, o)
            if fp8.tflops < bf16.tflops:
                found.append(f"fp8<bf16 at {o.label} ({o.tag}): fp8 {fp8.tflops:.1f} < bf16 {bf16.tflops:.1f}")
    return found


def ratio_flags(base: Outcome, outcomes: list[Outcome]) -> list[str]:
    """Neighbours predicted more than FAST times or less than SLOW times as fast as the published layout."""
    ratios = [(o, o.tflops / base.tflops) for o in outcomes if o.planned]
    return [f"ratio {r:.2f}x at {o.label} ({o.tag})" for o, r in ratios if r > FAST or r < SLOW]


def close_refusals(base: Outcome, outcomes: list[Outcome]) -> list[str]:
    """Refused layouts (a neighbour or the other precision of one) whose memory floor is within FLOOR_CLOSE of
    the published layout's, which fits."""
    found = []
    for o in [base, *outcomes]:
        for x in (o, o.other):
            if x is not None and not x.planned and x.floor_bytes and \
                    x.floor_bytes <= base.floor_bytes * (1 + FLOOR_CLOSE):
                found.append(f"refusal at {x.label} ({x.precision}) with floor {x.floor_bytes / GiB:.1f} GiB, "
                             f"published {base.floor_bytes / GiB:.1f} GiB: {x.refusal[:240]}")
    return found


def monotone_recompute(base: Outcome, outcomes: list[Outcome], recompute: str) -> list[str]:
    """More recompute is never faster on the same layout: none <= selective <= full in step time."""
    times = {recompute: base.step_s}
    for o in outcomes:
        if o.label.startswith("recompute") and o.planned:
            times[o.label.split("->")[1]] = o.step_s
    order = [r for r in RECOMPUTE_ORDER if r in times]
    return [f"monotone: recompute {a} {times[a]:.3f} s > {b} {times[b]:.3f} s"
            for a, b in zip(order, order[1:]) if times[a] > times[b] * 1.0005]


def main(argv: list[str]) -> int:
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    paths = [p for p in sorted(SPECS.glob("*.yaml")) if only in p.stem]
    start, found = time.process_time(), []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem} ({time.process_time() - start:.0f} s CPU)", file=sys.stderr)
        lines, flagged = audit_spec(path)
        found += flagged
        if "--quiet" not in argv:
            print("\n".join(lines))
    print(f"\nanomalies ({len(found)}):")
    print("\n".join(f"  {a}" for a in found) or "  none")
    print(f"{len(paths)} specs in {time.process_time() - start:.0f} s CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
