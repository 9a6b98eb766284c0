"""The planner: enumerate parallel layouts, keep those that follow the rules and fit, rank by step time.

``search(spec, top_k=5, cost=None) -> SearchResult``. Fields the spec fixes are not searched; shared terms
(parameter counts, layer times, activation memory) are cached, so a layout's step time is arithmetic. The
search space, what fits and the headroom policy: docs/cost-model.md, "planner.py".
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterator

from .catalog.gpus import GPUS
from .errors import Problem, SpecError
from .generate_rules import generate_problems
from .estimate.comm import group_placement, shard_placements
from .estimate.cost import CostModel
from .estimate.moe import HOST_OP_S
from .estimate.plausibility import mfu_warnings
from .estimate.step import EstimateContext, LayoutEstimate, estimate, estimate_memory, step_timing
from .estimate.to_train import short_amount, to_train
from .estimate.uncertainty import plus_minus
from .layout import FIELD_PATHS, Layout, engine_of, layout_from_spec
from .parallel_rules import rule_fp8_dims, rule_fp8_engine_gpu
from .rules import check_layout
from .spec import ParallelismSpec, Spec
from .stages import accounted_split, balanced_split, split_issues, stage_split
from .estimate.step import for_layout  # noqa: I001  (own line: keeps the merge with main's imports simple)
from .recompute_rules import module_problem, recompute_module_notes

GiB = 2**30
RECOMPUTE = ("none", "selective", "full")
MAX_NODE_FACTOR = 64


class NoFitError(SpecError):
    """No layout fits the GPU's memory capacity (exit code 2); the problems say what is closest and what would help."""


@dataclass(frozen=True)
class SearchResult:
    """The planner's answer: the chosen layout, the ranked candidates and why."""

    chosen: LayoutEstimate
    candidates: list[LayoutEstimate]          # best first; candidates[0] is chosen
    num_considered: int                       # complete layouts estimated
    num_fitting: int                          # within the headroom; when none is, within the capacity
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # also in reasons (orch plan --json: on stderr)

    def to_dict(self) -> dict:
        return {"chosen": self.chosen.to_dict(), "candidates": [c.to_dict() for c in self.candidates]}


@dataclass(frozen=True)
class _Scored:
    step_time_s: float
    total_bytes: float
    fits: bool               # within the device's capacity (MemoryEstimate.fits)
    within_headroom: bool    # within the planner's headroom policy (MemoryEstimate.within_headroom)
    layout: Layout
    overflow: float          # worst of GPU bytes / capacity and host bytes / host capacity (fits: <= 1)


def search(spec: Spec, *, top_k: int = 5, cost: CostModel | None = None) -> SearchResult:
    """Rank the layouts of ``spec`` within the headroom, else (with a warning) those within the capacity;
    NoFitError when none fits the capacity. Everything the estimate reads comes from the spec
    (EstimateContext.of)."""
    ctx = EstimateContext.of(spec, cost)
    rejected: list[Problem] = []
    prune = layout_from_spec(spec).recompute_modules is None   # module sets the spec fixed are never pruned
    scored = list(_scored_layouts(ctx, enumerate_layouts(spec, rejected), prune_modules=prune))
    if not scored:
        example = f"; e.g. {rejected[0]}" if rejected else ""
        raise SpecError(Problem("parallelism", "no layout satisfies the rules with the fixed fields "
                                f"({_fixed_fields(spec)}) on {spec.world_size} GPUs{example}",
                                "leave more parallelism fields open, or change the cluster size"))
    fitting = _fastest_first(s for s in scored if s.within_headroom) or _fastest_first(s for s in scored if s.fits)
    if not fitting:
        raise _no_fit(spec, ctx, scored)
    ranked = [with_to_train(spec, estimate(ctx, s.layout)) for s in fitting[:max(1, top_k)]]
    best_overall = min(scored, key=lambda s: (s.step_time_s, s.total_bytes))
    warnings = headroom_warning(spec, ctx, ranked[0]) + plausibility(ctx, ranked[0]) + recompute_module_notes(spec)
    reasons = (explain(ctx, ranked, best_overall, len(scored), len(fitting)) + fp8_hint(spec, cost, ranked[0])
               + warnings + _generate_note(spec))
    return SearchResult(chosen=ranked[0], candidates=ranked, num_considered=len(scored),
                        num_fitting=len(fitting), reasons=reasons, warnings=warnings)


def _generate_note(spec: Spec) -> list[str]:
    """One line naming the fields orch generate refuses (software orch does not write), if any."""
    paths = [p.path for p in generate_problems(spec)]
    return [f"software: predicted as specified, but orch generate refuses {', '.join(paths)} (software orch does "
            "not write; orch validate says why)"] if paths else []


def with_to_train(spec: Spec, est: LayoutEstimate) -> LayoutEstimate:
    """The estimate with its days and cost to train training.total_tokens (unchanged when the spec has none)."""
    tokens = spec.training.total_tokens
    if tokens is None:
        return est
    price = spec.cluster.gpu_hour_cost
    return dataclasses.replace(est, to_train=to_train(
        tokens, est.tokens_per_s, spec.world_size, est.uncertainty["relative_error"],
        (price.amount, price.currency) if price is not None else None))


def _fastest_first(scored) -> list[_Scored]:
    return sorted(scored, key=lambda s: (s.step_time_s, s.total_bytes))


def headroom_warning(spec: Spec, ctx: EstimateContext, chosen: LayoutEstimate) -> list[str]:
    """A warning when the chosen layout is inside the headroom (no layout stays out of it): how close it runs
    to the device's capacity and what would give the margin back."""
    mem = chosen.memory
    if mem.within_headroom:
        return []
    if mem.tight:
        return [f"memory: tight: {_gib(mem.total_bytes)} estimated on the {mem.stage} pipeline stage against "
                f"{_gib(mem.capacity_bytes)} the GPU can hold; it fits only if the allocator fragments less than the "
                f"{ctx.cost.fragmentation:.0%} estimated ({_gib(mem.floor_bytes)} counted without it); expect "
                f"allocator pressure / OOM risk (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps); "
                f"{_margin_hints(spec, ctx, chosen.layout)}."]
    return [f"memory: inside the {ctx.cost.hbm_headroom:.0%} headroom: {_gib(mem.total_bytes)} of "
            f"{_gib(mem.capacity_bytes)} the GPU can hold ({_gib(mem.usable_bytes)} within the headroom) on the "
            f"{mem.stage} pipeline stage, and no layout stays within it; expect allocator pressure / OOM risk; "
            f"{_margin_hints(spec, ctx, chosen.layout)}."]


def _margin_hints(spec: Spec, ctx: EstimateContext, lay: Layout) -> str:
    hints = [f"{FIELD_PATHS['recompute']}: full"] if lay.recompute != "full" else []
    if lay.micro_batch_size > 1:
        hints.append(f"a smaller {FIELD_PATHS['micro_batch_size']} (now {lay.micro_batch_size})")
    nodes = _nodes_to_fit(spec, ctx, within_headroom=True)
    hints.append(f"more GPUs: {nodes} nodes x {spec.cluster.gpus_per_node} stay within the headroom" if nodes
                 else "more GPUs")
    return "try: " + "; ".join(hints)


def plausibility(ctx: EstimateContext, chosen: LayoutEstimate) -> list[str]:
    """A warning when the chosen layout's MFU beats what published runs reached on this GPU (plausibility.py)."""
    if ctx.gpu not in GPUS:
        return []
    return mfu_warnings(GPUS[ctx.gpu], ctx.precision, chosen.mfu)


def fp8_hint(spec: Spec, cost: CostModel | None, chosen: LayoutEstimate) -> list[str]:
    """FP8 where the rules allow it (Megatron engine, Ada, Hopper or newer, 16-aligned widths): the chosen layout
    estimated in FP8, as one line of advice; precision is never changed behind the user's back."""
    if spec.training.precision != "bf16":
        return []
    fp8 = dataclasses.replace(spec, training=dataclasses.replace(spec.training, precision="fp8"))
    if rule_fp8_engine_gpu(fp8, chosen.layout) or rule_fp8_dims(fp8, chosen.layout):
        return []
    est = estimate(EstimateContext.of(fp8, cost), chosen.layout)
    if not est.memory.within_headroom or est.step_time_s >= chosen.step_time_s:
        return []
    return [f"fp8: training.precision: fp8 would run this layout {chosen.step_time_s / est.step_time_s - 1:.0%} "
            f"faster ({est.step_time_s:.3g} s/step, Transformer Engine FP8 GEMMs) and still fit "
            f"({_gib(est.memory.total_bytes)})."]


def _score(ctx: EstimateContext, lay: Layout, mem=None) -> _Scored:
    ctx = for_layout(ctx, lay)
    mem = mem or estimate_memory(ctx, lay)
    overflow = max(mem.total_bytes / mem.capacity_bytes, mem.host_bytes / mem.host_capacity_bytes)
    return _Scored(step_timing(ctx, lay).step_time_s, mem.total_bytes, mem.fits, mem.within_headroom, lay, overflow)


def _scored_layouts(ctx: EstimateContext, layouts: Iterator[Layout],
                    prune_modules: bool = True) -> Iterator[_Scored]:
    """Each layout scored, but a module-recompute candidate that cannot pay off: its layout already fits
    within the headroom with less recompute (none, or a lighter module set: enumerated before it,
    :data:`MOE_MODULE_SETS`), its model states alone exceed the GPU without recompute, or it does not fit.
    Only candidates the planner made are pruned (``prune_modules``): a module set the spec fixed is scored, so a
    layout that does not fit is refused for its memory (NoFitError), not as if no layout met the rules."""
    fit_lighter: set[Layout] = set()
    hopeless: set[Layout] = set()
    for lay in layouts:
        modules = prune_modules and lay.recompute_modules is not None
        if not modules and lay.recompute != "none":
            yield _score(ctx, lay)
            continue
        base = dataclasses.replace(lay, recompute=None, recompute_modules=None)
        if modules and (base in fit_lighter or base in hopeless):
            continue
        mem = estimate_memory(for_layout(ctx, lay), lay)
        if modules and not mem.fits:
            continue
        scored = _score(ctx, lay, mem)
        if scored.within_headroom:
            fit_lighter.add(base)
        elif mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes > mem.capacity_bytes:
            hopeless.add(base)
        yield scored


# --- enumeration ----------------------------------------------------------------------------------

def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_layouts(spec: Spec, rejected: list[Problem] | None = None) -> Iterator[Layout]:
    """Every complete layout that honours the spec's fixed fields and passes ``check_layout``.

    Open fields only range over values that satisfy the rules by construction; ``check_layout`` still
    runs on each layout (it catches combinations with fixed fields and any rule added later). The
    problems of rejected layouts are appended to ``rejected`` when given.
    """
    for lay in _candidates(spec):
        problems = check_layout(spec, lay)
        if not problems:
            yield lay
        elif rejected is not None and len(rejected) < 1:
            rejected.extend(problems[:1])


def _candidates(spec: Spec) -> Iterator[Layout]:
    fixed = layout_from_spec(spec)
    world, m = spec.world_size, spec.model
    batch = spec.training.global_batch_size
    megatron = engine_of(spec) == "megatron"
    for tp in _tp_options(spec, fixed):
        for cp in _opt(fixed.cp, context_options(spec, world // tp if world % tp == 0 else 1)):
            for pp in _opt(fixed.pp, _pp_options(m.num_layers, world, tp * cp, fixed, megatron)):
                if world % (tp * cp * pp):
                    continue
                dp = world // (tp * cp * pp)
                if (fixed.dp is not None and fixed.dp != dp) or batch % dp:
                    continue
                for ep, etp in expert_options(spec, fixed, tp, world // pp, dp):
                    for mb in _opt(fixed.micro_batch_size, divisors(batch // dp)):
                        if batch % (mb * dp):
                            continue
                        degrees = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "etp": etp}
                        yield from _inner(spec, fixed, degrees, mb, batch // (mb * dp))


def _split_variants(spec: Spec, fixed: Layout, pp: int, num_mb: int) -> Iterator[tuple[int, tuple, bool | None]]:
    """(vpp, (first_stage_layers, last_stage_layers), account_split) for a pipeline degree: the even or
    uneven split with its interleavings, and (engine megatron) the embedding/loss-accounted split with the
    virtual sizes that divide its (num_layers + 2) / pp, each chunk keeping >= 2 slots."""
    n, megatron = spec.model.num_layers, engine_of(spec) == "megatron"
    regular = 0
    if fixed.account_split is not True:
        for vpp in _opt(fixed.vpp, _vpp_options(n, pp, num_mb, fixed) if megatron else [1]):
            split = _split_for(n, pp, vpp, fixed)
            if split is not None:
                regular += 1
                yield vpp, split, fixed.account_split      # None or False: not accounted
    # Undecided with pp and vpp fixed: the accounted split only where no other split exists (a spec that
    # fixes every classic field keeps its one candidate).
    fallback_only = fixed.account_split is None and fixed.vpp is not None and fixed.pp is not None
    if (megatron and fixed.account_split is not False and not fixed.is_uneven and accounted_split(n, pp)
            and not (fallback_only and regular)):
        c = (n + 2) // pp
        vpps = [v for v in divisors(c) if c // v >= 2 and (v == 1 or num_mb % pp == 0)]
        for vpp in _opt(fixed.vpp, vpps):
            yield vpp, (None, None), True


# Smallest sequence chunk a context-parallel rank is searched with: Megatron-Core's context-parallel guide
# recommends CP for long sequences (8K tokens and more); below 4K tokens per rank the attention blocks are
# short, the ring's launches and partial-softmax corrections weigh more, and the planner would mostly add
# losing candidates (a spec may still fix any cp the rules allow).
MIN_CONTEXT_CHUNK = 4096


def context_options(spec: Spec, ranks: int) -> list[int]:
    """cp degrees to search: 1, and the divisors of ``ranks`` that split the sequence into 2*cp equal
    chunks (causal load balancing) of at least MIN_CONTEXT_CHUNK tokens, with fused attention."""
    s = spec.model.seq_length
    if not spec.model.flash_attention:
        return [1]
    return [c for c in divisors(ranks) if c == 1 or (s % (2 * c) == 0 and s // c >= MIN_CONTEXT_CHUNK)]


def expert_options(spec: Spec, fixed: Layout, tp: int, ranks_per_stage: int, dp: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs to search for a MoE model (dense: (1, 1)): ep a divisor of the expert count, etp 1
    or tp (Megatron's default is etp = tp; published MoE runs mostly use 1), ep * etp dividing the ranks of
    one pipeline stage (MoE parallel folding)."""
    moe = spec.model.moe
    if moe is None:
        return [(fixed.ep or 1, fixed.etp or 1)]
    eps = _opt(fixed.ep, divisors(moe.num_experts))
    etps = _opt(fixed.etp, sorted({1, tp}))
    return [(e, t) for e in eps for t in etps if ranks_per_stage % (e * t) == 0]


def _inner(spec: Spec, fixed: Layout, d: dict, mb: int, num_mb: int) -> Iterator[Layout]:
    tp, pp, dp = d["tp"], d["pp"], d["dp"]
    for vpp, split, account in _split_variants(spec, fixed, pp, num_mb):
        for sp in _opt(fixed.sequence_parallel, _sp_options(spec, tp)):
            for rec, modules in _recompute_options(spec, fixed):
                for zero in _opt(fixed.zero_stage, _zero_options(pp, dp)):
                    for off in _opt(fixed.offload, _offload_options(pp, zero, spec.cluster.gpu)):
                        yield Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, zero_stage=zero, micro_batch_size=mb,
                                     sequence_parallel=sp, recompute=rec, offload=off,
                                     first_stage_layers=split[0], last_stage_layers=split[1],
                                     cp=d["cp"], ep=d["ep"], etp=d["etp"], account_split=account,
                                     recompute_modules=modules, shard_degree=fixed.shard_degree)


# Megatron recompute-module sets the planner tries for a MoE model when recompute is open (what long-context
# MoE runs use: the experts' activation or the whole MoE block, with the pre-MLP norm), lighter first; of each
# the first that Megatron accepts for the spec (recompute_rules.module_problem), FP8 falling back to the MoE
# block alone.
MOE_MODULE_SETS = ((("layernorm", "moe_act"),), (("layernorm", "moe"), ("moe",)))


def _recompute_options(spec: Spec, fixed: Layout) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """(recompute, modules) pairs: the spec's when fixed; none / selective / full (selective skipped with flash
    attention: it equals none there), and with engine megatron on a MoE model the module sets of
    :data:`MOE_MODULE_SETS` as selective recomputes."""
    p = spec.parallelism
    if fixed.recompute is not None:
        return ((fixed.recompute, fixed.recompute_modules),)
    if fixed.recompute_modules is not None:
        return (("selective", fixed.recompute_modules),)
    if p.recompute_method is not None or p.recompute_num_layers is not None:
        return (("full", None),)
    options = [(r, None) for r in RECOMPUTE if not (r == "selective" and spec.model.flash_attention)]
    if spec.model.moe is not None and engine_of(spec) == "megatron":
        for choices in MOE_MODULE_SETS:
            usable = [c for c in choices if not any(module_problem(spec, m) for m in c)]
            options += [("selective", usable[0])] if usable else []
    return tuple(options)


def _sp_options(spec: Spec, tp: int) -> list[bool]:
    """Sequence parallelism off and on with tp > 1; only on for MoE on Megatron (its MoE layer needs it)."""
    if tp == 1 or spec.model.seq_length % tp:
        return [False]
    return [True] if spec.model.moe is not None and engine_of(spec) == "megatron" else [False, True]


def _opt(fixed, options: list) -> list:
    return [fixed] if fixed is not None else options


def _tp_options(spec: Spec, fixed: Layout) -> list[int]:
    if fixed.tp is not None:
        return [fixed.tp]
    m = spec.model
    return [t for t in divisors(spec.cluster.gpus_per_node)
            if m.num_attention_heads % t == 0 and m.num_query_groups % t == 0 and spec.world_size % t == 0]


def _pp_options(num_layers: int, world: int, tp: int, fixed: Layout, megatron: bool = False) -> list[int]:
    """Pipeline degrees that fit the world: even splits, uneven ones the spec gives or that balance, and
    (Megatron) those the embedding/loss-accounted split divides."""
    return [p for p in divisors(world) if world % (tp * p) == 0 and p <= num_layers
            and (num_layers % p == 0 or fixed.is_uneven or balanced_split(num_layers, p) is not None
                 or (megatron and accounted_split(num_layers, p) is not None))]


def _split_for(num_layers: int, pp: int, vpp: int, fixed: Layout) -> tuple | None:
    """(first_stage_layers, last_stage_layers) for a candidate: the spec's, (None, None) for the even
    split, or the balanced uneven one for this vpp; None when there is none."""
    if fixed.is_uneven:
        return fixed.first_stage_layers, fixed.last_stage_layers
    if num_layers % pp == 0:
        return None, None
    return balanced_split(num_layers, pp, vpp)


def _vpp_options(num_layers: int, pp: int, num_mb: int, fixed: Layout | None = None) -> list[int]:
    if pp < 2 or num_mb % pp:
        return [1]
    if fixed is not None and fixed.is_uneven:
        first, last = fixed.first_stage_layers, fixed.last_stage_layers
        if split_issues(num_layers, pp, 1, first, last):
            return [1]     # the rules reject this pp whatever the vpp
        split = stage_split(num_layers, pp, first, last)
        return divisors(math.gcd(split.first, split.middle, split.last))
    if num_layers % pp == 0:
        return divisors(num_layers // pp)
    return [v for v in divisors(num_layers) if balanced_split(num_layers, pp, v) is not None]


def _zero_options(pp: int, dp: int) -> list[int]:
    if dp == 1:
        return [0]
    return [0, 1] if pp > 1 else [0, 1, 2, 3]


def _offload_options(pp: int, zero: int, gpu: str) -> list[str]:
    """Offload moves states from the device to host memory: never on the CPU target (the host is the
    device, offload cannot pay off), never with the pipeline engine or without ZeRO."""
    if pp > 1 or zero == 0 or gpu == "cpu":
        return ["none"]
    return ["none", "optimizer", "optimizer+params"] if zero == 3 else ["none", "optimizer"]


def _fixed_fields(spec: Spec) -> str:
    lay = layout_from_spec(spec)
    fixed = [f"{FIELD_PATHS[f.name].split('.')[-1]}={shown(getattr(lay, f.name))}" for f in dataclasses.fields(lay)
             if getattr(lay, f.name) is not None]
    return ", ".join(fixed) or "none fixed"


# --- explanations ---------------------------------------------------------------------------------

def shown(value) -> str:
    """A layout value as the spec (YAML) spells it: true/false, not Python's True/False."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def describe(est: LayoutEstimate) -> str:
    lay = est.layout
    split = [f"{end} stage {count} layers" for end, count in (("first", lay.first_stage_layers),
                                                              ("last", lay.last_stage_layers)) if count is not None]
    extras = [f"v{lay.vpp}" if lay.vpp > 1 else "", *split, "embedding+loss in split" if lay.account_split else "",
              "sp" if lay.sequence_parallel else "",
              f"recompute={lay.recompute}" + (f" [{' '.join(lay.recompute_modules)}]" if lay.recompute_modules else ""),
              f"offload={lay.offload}" if lay.offload != "none" else ""]
    return f"{lay.tag()} ({', '.join(e for e in extras if e)})"


def memory_breakdown(mem) -> str:
    text = (f"params {_gib(mem.params_bytes)}, grads {_gib(mem.grads_bytes)}, optimizer {_gib(mem.optimizer_bytes)}, "
            f"activations {_gib(mem.activations_bytes)}, other {_gib(mem.other_bytes)}")
    if mem.host_bytes:
        text += f"; host {_gib(mem.host_bytes)} of {_gib(mem.host_capacity_bytes)}"
    return text


def explain(ctx: EstimateContext, ranked: list[LayoutEstimate], best_overall: _Scored, considered: int,
            fitting: int) -> list[str]:
    """A few lines for people: why the winner won and what limits it (memory, bubble, network)."""
    top = ranked[0]
    pm = plus_minus(top.uncertainty)
    lines = [f"chose {describe(top)}: {top.step_time_s:.3g} s/step, {top.tokens_per_s:,.0f} tokens/s {pm}, "
             f"{top.tflops_per_gpu:.3g} TFLOP/s {pm} per GPU, MFU {top.mfu:.1%}; {fitting} of {considered} layouts fit.",
             f"uncertainty {pm} ({top.uncertainty['regime']}): {top.uncertainty['basis']}."]
    if top.to_train is not None:
        lines.append(to_train_line(top))
    if len(ranked) > 1:
        gap = ranked[1].step_time_s / top.step_time_s - 1
        diff = ", ".join(f"{f.name} {shown(getattr(ranked[1].layout, f.name))}" for f in dataclasses.fields(Layout)
                         if getattr(ranked[1].layout, f.name) != getattr(top.layout, f.name))
        lines.append(f"runner-up {describe(ranked[1])} ({diff}) is {gap:.1%} slower"
                     + (f" and needs {_gib(ranked[1].memory.total_bytes)}." if gap < 0.001 else "."))
    mem = top.memory
    host = f"; {_gib(mem.host_bytes)} offloaded to host memory" if mem.host_bytes else ""
    room = (f"{_gib(mem.usable_bytes)} usable" if mem.within_headroom
            else f"{_gib(mem.capacity_bytes)} capacity ({_gib(mem.usable_bytes)} within the headroom"
            + (f"; tight: {_gib(mem.floor_bytes)} without the fragmentation estimate)" if mem.tight else ")"))
    lines.append(f"memory: {_gib(mem.total_bytes)} of {room} on the {mem.stage} "
                 f"pipeline stage ({memory_breakdown(mem)}){host}.")
    if best_overall.step_time_s < top.step_time_s * 0.999 and not best_overall.within_headroom:
        lines.append(f"limited by memory: {best_overall.layout.tag()} (recompute={best_overall.layout.recompute}) "
                     f"would be {top.step_time_s / best_overall.step_time_s - 1:.1%} faster but needs "
                     f"{_gib(best_overall.total_bytes)}.")
    lines.append(_time_line(top))
    lines += _host_line(ctx, top)
    lines.append(_network_line(ctx, top))
    return lines


HOST_WAIT_SHOWN = 0.05       # the host line appears when the GPU waits for launches this share of the step


def _host_line(ctx: EstimateContext, est: LayoutEstimate) -> list[str]:
    """Where the GPU waits for the host to launch its kernels (est.host_wait_s, part of the compute share): what
    launches so much, what shortens it, and that the host's price is the least certain part of the figure."""
    share = est.host_wait_s / est.step_time_s if est.step_time_s > 0 else 0.0
    if share < HOST_WAIT_SHOWN:
        return []
    moe, lay = ctx.shape.moe, est.layout
    if moe is not None and moe.num_experts // lay.ep > 1:
        local = moe.num_experts // lay.ep
        work = "GEMMs and FP8 casts" if ctx.precision == "fp8" else "GEMMs"
        scaling = (" (current scaling adds an amax and a scale kernel to each cast)"
                   if ctx.precision == "fp8" and ctx.fp8_recipe == "tensorwise" else "")
        what = (f"each MoE layer launches the {work} of its {local} local experts one by one{scaling}, and its "
                f"dispatcher waits for the token counts every layer; a larger parallelism.expert (fewer local "
                f"experts) shortens it")
    else:
        what = (f"layers this small launch more kernels than their GPU time covers; a larger "
                f"parallelism.micro_batch_size (now {lay.micro_batch_size}) gives each launch more work")
    return [f"host: the GPU waits {share:.0%} of the step for its kernel launches (eager PyTorch, one host "
            f"launch per operator at ~{HOST_OP_S * 1e6:.3g} us: estimate/moe.py HOST_OP_S); {what}. Every launch is "
            f"priced at that one average, so this part of the prediction is the least certain."]


def to_train_line(est: LayoutEstimate) -> str:
    """'to train 1T tokens: 12.3 days ±12% (10.8-13.8), 18,900 GPU-hours, 47.2k USD ±12% (41.6k-52.9k) at
    2.5 USD per GPU-hour.'"""
    t, pm = est.to_train, plus_minus(est.uncertainty)
    line = (f"to train {short_amount(t['total_tokens'])} tokens: {t['days']:.3g} days {pm} ({t['days_low']:.3g}-"
            f"{t['days_high']:.3g}) on {t['num_gpus']} GPUs, {t['gpu_hours']:,.0f} GPU-hours")
    if "cost" in t:
        c = t["cost"]
        line += (f", {short_amount(c['amount'])} {c['currency']} {pm} ({short_amount(c['low'])}-"
                 f"{short_amount(c['high'])}) at {c['per_gpu_hour']:g} {c['currency']} per GPU-hour")
    return line + "."


def _network_line(ctx: EstimateContext, est: LayoutEstimate) -> str:
    lay, comm, hw = est.layout, est.comm, ctx.hw
    dp_nodes = group_placement(lay.dp, lay.tp, hw.gpus_per_node).num_nodes
    where = "inside one node" if dp_nodes == 1 else f"across {dp_nodes} nodes at {_rate(hw.inter_Bps)} per GPU"
    parts = [f"TP {comm.tp_exposed_s:.3g} s inside the node at {_rate(hw.intra_Bps)} busbw"] if lay.tp > 1 else []
    parts += [f"PP {comm.pp_exposed_s:.3g} s"] if lay.pp > 1 else []
    if lay.dp > 1:
        parts.append(f"DP {comm.dp_exposed_s:.3g} s of {comm.dp_s:.3g} s; the DP group of {lay.dp} lies {where}")
        if lay.replicas > 1:
            shard = shard_placements(lay, hw.gpus_per_node)[0].num_nodes
            parts[-1] += (f", sharded in groups of {lay.shard_degree} ("
                          f"{'inside one node' if shard == 1 else f'over {shard} nodes'}) and replicated "
                          f"{lay.replicas} times")
    return (f"network: {comm.exposed_s / est.step_time_s:.1%} of the step is exposed communication"
            + (f" ({', '.join(parts)})." if parts else " (tp, pp and dp are 1: none)."))


def _rate(bytes_per_s: float) -> str:
    """A bandwidth with three significant digits, so a small one never reads as 0 GB/s."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def _time_line(est: LayoutEstimate) -> str:
    b, step = est.breakdown, est.step_time_s
    parts = {"compute": b.compute_s, "pipeline bubble": b.bubble_s, "TP comm": b.tp_exposed_s,
             "PP p2p": b.pp_exposed_s, "DP comm (exposed)": b.dp_exposed_s, "optimizer": b.optimizer_s,
             "offload": b.offload_s, "engine host work": b.engine_s, "comm contention": b.contention_s,
             "EP all-to-all": b.ep_exposed_s, "CP K/V ring (exposed)": b.cp_exposed_s}
    shares = ", ".join(f"{k} {v / step:.0%}" for k, v in parts.items() if v / step >= 0.005)
    worst = max((k for k in parts if k != "compute"), key=lambda k: parts[k])
    limit = f"largest overhead: {worst} ({parts[worst] / step:.1%} of the step)"
    if worst == "pipeline bubble":
        lay = est.layout
        limit += f", bubble fraction (p-1)/(v*m+p-1) = {est.bubble_fraction:.1%} with m={est.num_microbatches}"
    elif worst == "DP comm (exposed)":
        limit += f"; DP sends {est.comm.dp_bytes / 1e9:.2f} GB per GPU per step in {est.comm.dp_s:.3g} s"
    elif worst == "EP all-to-all":
        limit += (f"; dispatch and combine send {est.comm.ep_bytes / 1e9:.2f} GB per GPU per step in "
                  f"{est.comm.ep_s:.3g} s over ep({est.layout.ep})")
    return f"time: {shares}; {limit}."


# --- when nothing fits ----------------------------------------------------------------------------

def _no_fit(spec: Spec, ctx: EstimateContext, scored: list[_Scored]) -> NoFitError:
    closest = min(scored, key=lambda s: (s.overflow, s.step_time_s))
    est = estimate(ctx, closest.layout)
    mem = est.memory
    limit = (f"the {_gib(mem.capacity_bytes)} capacity per GPU ({spec.cluster.gpu}: {_gib(mem.hbm_bytes)} HBM less "
             f"what the driver keeps; the planner's {ctx.cost.hbm_headroom:.0%} headroom would leave "
             f"{_gib(mem.usable_bytes)}; {_gib(mem.host_capacity_bytes)} host memory per GPU for offload)")
    needs = (f"needs {_gib(mem.total_bytes)} on the {mem.stage} pipeline stage ({_gib(mem.floor_bytes)} even "
             f"without the fragmentation estimate): {memory_breakdown(mem)}")
    if layout_from_spec(spec).is_complete:
        message = f"the layout fixed in the spec, {describe(est)}, does not fit in {limit}: it {needs}"
    else:
        message = f"none of {len(scored)} layouts fits in {limit}; closest: {describe(est)} {needs}"
    return NoFitError([Problem("parallelism", message, _fit_hints(spec, ctx, closest.layout))])


def _fit_hints(spec: Spec, ctx: EstimateContext, closest: Layout) -> str:
    hints = []
    fixed = layout_from_spec(spec)
    if fixed != Layout() and _fits_with(spec, ctx, open_all=True):
        hints.append(f"leave the parallelism fields open ({_fixed_fields(spec)} are fixed)")
    for name, value in (("recompute", "full"), ("micro_batch_size", 1)):
        if getattr(closest, name) != value:
            hints.append(f"{FIELD_PATHS[name]}: {value}")
    if closest.pp == 1 and closest.offload != "optimizer+params":
        hints.append("zero_stage 3 with offload: optimizer+params")
    nodes = _nodes_to_fit(spec, ctx)
    if nodes:
        hints.append(f"more GPUs: {nodes} nodes x {spec.cluster.gpus_per_node} would fit")
    else:
        hints.append(f"more GPUs (even {spec.cluster.num_nodes * MAX_NODE_FACTOR} nodes would not fit), a GPU with "
                     "more memory, or a smaller model / shorter sequence")
    return "try: " + "; ".join(hints)


def _open_spec(spec: Spec, num_nodes: int | None = None) -> Spec:
    cluster = spec.cluster if num_nodes is None else dataclasses.replace(spec.cluster, num_nodes=num_nodes)
    return dataclasses.replace(spec, parallelism=ParallelismSpec(), cluster=cluster)


def _fits_with(spec: Spec, ctx: EstimateContext, *, open_all: bool, within_headroom: bool = False) -> bool:
    probe = _open_spec(spec) if open_all else spec
    rule = "within_headroom" if within_headroom else "fits"
    return any(getattr(estimate_memory(ctx, lay), rule) for lay in enumerate_layouts(probe))


def _nodes_to_fit(spec: Spec, ctx: EstimateContext, *, within_headroom: bool = False) -> int | None:
    """Smallest node count (doubling, global batch kept) at which some layout fits in memory (``within_headroom``:
    stays within the planner's headroom)."""
    factor = 2
    while factor <= MAX_NODE_FACTOR:
        nodes = spec.cluster.num_nodes * factor
        if _fits_with(_open_spec(spec, nodes), ctx, open_all=False, within_headroom=within_headroom):
            return nodes
        factor *= 2
    return None
