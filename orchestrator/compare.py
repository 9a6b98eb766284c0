"""orch compare: runs side by side, measured against each other and against their predictions.

``compare(sources, warmup=None) -> Comparison``: per run the statistics over the measured steps, plan.json's
predictions and their errors, and the time breakdown; across runs the semantic diff and the winner. The
statistics, the breakdown and the warm-up rule: docs/cost-model.md, "compare.py".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .runs import MeasuredRun, load_runs
from .spec import spec_to_data

WARMUP_STEPS = 3
TIE_FLOOR = 0.01       # runs within 1% tie whatever their noise (a shared machine's drift between runs)
P90 = 90.0
MEDIAN_KEYS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "allreduce_time_s",
               "allreduce_overhead", "comm_exposed_s")
# MoE and context parallelism (issue 10): medians where every measured step has them, else None (older runs
# and dense models).
OPTIONAL_MEDIAN_KEYS = ("alltoall_time_s", "expert_load_imbalance", "tokens_dropped_fraction", "moe_aux_loss")
PREDICTED_KEYS = MEDIAN_KEYS + ("mem_peak_bytes",) + OPTIONAL_MEDIAN_KEYS
LAYOUT_FIELDS = ("tp", "pp", "vpp", "dp", "zero_stage", "micro_batch_size", "num_microbatches",
                 "sequence_parallel", "recompute", "offload")
SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers")   # in a layout record only when set (uneven split)
COMPONENTS = ("compute_s", "bubble_s", "exposed_comm_s", "other_s")
WARMUP_RULE = (f"the first {WARMUP_STEPS} steps of each run are warm-up (first collectives, buffers, "
               "optimizer states, allocator growth) and left out; a run keeps at least half of its steps")


# --- statistics ----------------------------------------------------------------------------------------

def warmup_steps(num_steps: int, requested: int | None = None) -> int:
    """How many leading steps to leave out (docs/cost-model.md)."""
    if requested is None:
        return max(0, min(WARMUP_STEPS, (num_steps - 1) // 2))
    return max(0, min(requested, num_steps - 1))


def percentile(values, q: float) -> float:
    """The q-th percentile by linear interpolation between order statistics (NumPy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values) -> float:
    return percentile(values, 50.0)


def measured_stats(records, warmup: int) -> dict:
    """Medians (and the step time's p90) over records[warmup:]; the peak memory over all records."""
    kept = records[warmup:]
    stats = {key: median(r[key] for r in kept) for key in MEDIAN_KEYS}
    for key in OPTIONAL_MEDIAN_KEYS:
        values = [r.get(key) for r in kept]
        stats[key] = median(values) if all(isinstance(v, (int, float)) for v in values) else None
    stats["step_time_p90_s"] = percentile((r["step_time_s"] for r in kept), P90)
    stats["mem_peak_bytes"] = max(r["mem_peak_bytes"] for r in records)
    return stats


def step_breakdown(record: dict) -> dict:
    """One step's wall time split into compute, bubble, exposed communication and other (seconds)."""
    total = record["step_time_s"]
    compute = min(float(record.get("compute_time_s") or 0.0), total)
    bubble = min(record["bubble_fraction"] * total, total - compute)
    # the trainer's all-to-alls (MoE dispatch/combine, Ulysses) are synchronous: wholly exposed
    exposed = min(record["comm_exposed_s"] + (record.get("alltoall_time_s") or 0.0), total - compute - bubble)
    return {"compute_s": compute, "bubble_s": bubble, "exposed_comm_s": exposed,
            "other_s": total - compute - bubble - exposed}


def measured_breakdown(records, warmup: int) -> dict:
    """Means of :func:`step_breakdown` over records[warmup:] (they add up to the mean step time)."""
    sums, n = dict.fromkeys(COMPONENTS, 0.0), 0
    for record in records[warmup:]:          # summed as they come: a long run holds no list of dicts
        n += 1
        for key, value in step_breakdown(record).items():
            sums[key] += value
    return {key: total / n for key, total in sums.items()}


def predicted_breakdown(chosen: dict) -> dict:
    """plan.json's breakdown in the same four components (empty when the plan has no estimates)."""
    b = chosen.get("breakdown")
    if not isinstance(b, dict) or not isinstance(chosen.get("step_time_s"), (int, float)):
        return {}
    compute = b.get("compute_s", 0.0) + b.get("optimizer_s", 0.0) + b.get("offload_s", 0.0)
    exposed = sum(b.get(f"{kind}_exposed_s", 0.0) for kind in ("dp", "tp", "pp", "ep", "cp"))
    bubble = b.get("bubble_s", 0.0)
    other = chosen["step_time_s"] - compute - bubble - exposed
    return {"compute_s": compute, "bubble_s": bubble, "exposed_comm_s": exposed,
            "other_s": other if other > 1e-9 * chosen["step_time_s"] else 0.0}


def predicted_metrics(chosen: dict) -> dict:
    """The chosen record's predictions under the measured metrics' names (the trainer's W&B mapping)."""
    from .telemetry.wandb_sink import predicted_values  # noqa: PLC0415  (pure, light)

    values = {k.removeprefix("predicted/"): v for k, v in predicted_values(chosen).items()}
    return {k: values[k] for k in PREDICTED_KEYS if k in values}


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """100 * (predicted - measured) / measured; 0 when both are 0; None when either is missing or only the
    measured value is 0."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return 100.0 * (predicted - measured) / measured


# --- one run -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunComparison:
    """One run's statistics, predictions, errors and breakdowns."""

    run: MeasuredRun
    label: str
    warmup: int
    measured: dict
    predicted: dict
    breakdown_measured: dict
    breakdown_predicted: dict

    @property
    def records(self):
        return self.run.records

    @property
    def errors(self) -> dict:
        return {k: error_pct(self.predicted.get(k), self.measured.get(k)) for k in PREDICTED_KEYS}

    def layout_record(self) -> dict:
        lay = self.run.layout
        m = self.run.spec.training.global_batch_size // (lay.micro_batch_size * lay.dp)
        record = {f: m if f == "num_microbatches" else getattr(lay, f) for f in LAYOUT_FIELDS}
        return record | {f: getattr(lay, f) for f in SPLIT_FIELDS if getattr(lay, f) is not None}

    def to_dict(self) -> dict:
        spec, records = self.run.spec, self.records
        return {
            "label": self.label, "source": self.run.source, "kind": self.run.kind, "spec_name": spec.name,
            "tag": self.run.tag, "layout": self.layout_record(),
            "cluster": {"gpu": spec.cluster.gpu, "num_nodes": spec.cluster.num_nodes,
                        "gpus_per_node": spec.cluster.gpus_per_node, "world_size": spec.world_size,
                        "precision": spec.training.precision},
            "steps": {"recorded": len(records), "first": records[0]["step"], "last": records[-1]["step"],
                      "warmup": self.warmup, "measured": len(records) - self.warmup},
            "measured": dict(self.measured), "predicted": dict(self.predicted), "error_pct": self.errors,
            "breakdown": {"measured": dict(self.breakdown_measured), "predicted": dict(self.breakdown_predicted)},
            "series": {key: [r[key] for r in records] for key in ("step", "step_time_s", "tokens_per_s")},
        }


def compare_run(run: MeasuredRun, label: str, warmup: int | None = None) -> RunComparison:
    skip = warmup_steps(len(run.records), warmup)
    return RunComparison(run=run, label=label, warmup=skip, measured=measured_stats(run.records, skip),
                         predicted=predicted_metrics(run.chosen),
                         breakdown_measured=measured_breakdown(run.records, skip),
                         breakdown_predicted=predicted_breakdown(run.chosen))


def run_labels(runs: list[MeasuredRun]) -> list[str]:
    """Each run's layout tag; runs sharing a tag get their spec name in front when that tells them apart,
    their position (#n) behind otherwise."""
    tags = [r.tag for r in runs]
    labels = list(tags)
    for tag in {t for t in tags if tags.count(t) > 1}:
        group = [i for i, t in enumerate(tags) if t == tag]
        names = [runs[i].spec.name for i in group]
        for i in group:
            labels[i] = f"{runs[i].spec.name}:{tag}" if len(set(names)) == len(group) else f"{tag}#{i + 1}"
    return labels


# --- across runs ---------------------------------------------------------------------------------------

def diff_runs(runs: list[RunComparison]) -> dict:
    """The layout fields and resolved-spec fields (dotted paths) whose values differ between the runs."""
    layouts = [r.layout_record() for r in runs]
    layout = [{"field": f, "values": [lay.get(f) for lay in layouts]} for f in LAYOUT_FIELDS + SPLIT_FIELDS
              if len({repr(lay.get(f)) for lay in layouts}) > 1]
    flat = [flatten(spec_to_data(r.run.spec)) for r in runs]
    paths = sorted(set().union(*flat)) if flat else []
    spec = [{"path": p, "values": [f.get(p) for f in flat]} for p in paths
            if not p.startswith("parallelism.") and len({repr(f.get(p)) for f in flat}) > 1]
    return {"layout": layout, "spec": spec}


def flatten(data, prefix: str = "") -> dict:
    """Nested mappings as {dotted.path: leaf value} (lists are leaves)."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def model_differences(runs: list[RunComparison]) -> list[dict]:
    """The model fields (dotted paths) whose values differ between the runs ([] when they train one model)."""
    return [row for row in diff_runs(runs)["spec"] if row["path"].startswith("model.")]


def winner_criterion(runs: list[RunComparison]) -> str | None:
    """tokens_per_s; tokens_per_s_per_gpu when world sizes differ; None when the models differ (their
    throughputs measure different work, so no run wins)."""
    if model_differences(runs):
        return None
    return "tokens_per_s" if len({r.run.spec.world_size for r in runs}) == 1 else "tokens_per_s_per_gpu"


def rate(run: RunComparison, criterion: str) -> float:
    if criterion == "tokens_per_s_per_gpu":
        return run.measured["tokens_per_s"] / run.run.spec.world_size
    return run.measured[criterion]


def pick_winner(runs: list[RunComparison]) -> dict:
    """The fastest run by :func:`winner_criterion` and the main reason it beat the runner-up."""
    criterion = winner_criterion(runs)
    if criterion is None:
        return no_winner(runs)
    ranked = sorted(runs, key=lambda r: rate(r, criterion), reverse=True)
    best = ranked[0]
    result = {"label": best.label, "index": runs.index(best), "criterion": criterion,
              "value": rate(best, criterion), "runner_up": None, "speedup": None, "reason": None,
              "explanation": "only one run" if len(runs) == 1 else ""}
    if len(runs) == 1:
        return result
    second = ranked[1]
    noise = tie_margin(best, second)
    speedup = _ratio(rate(best, criterion), rate(second, criterion))
    if speedup is not None and speedup - 1 <= noise:
        return tie(best, second, criterion, speedup, noise)
    reason = main_reason(best, second, criterion)
    result.update(runner_up=second.label, speedup=_ratio(rate(best, criterion), rate(second, criterion)),
                  reason=reason)
    result["explanation"] = explain(best, second, criterion, reason, result["speedup"])
    return result


def rate_noise(run: RunComparison) -> float:
    """The relative standard error of the run's median tokens/s over its measured steps: 1.2533 sigma /
    sqrt(n) / median, sigma estimated robustly from the interquartile range (IQR / 1.349)."""
    values = run.records[run.warmup:].column("tokens_per_s")
    mid = median(values)
    if len(values) < 2 or mid <= 0:
        return 0.0
    sigma = (percentile(values, 75.0) - percentile(values, 25.0)) / 1.349
    return 1.2533 * sigma / math.sqrt(len(values)) / mid


def tie_margin(a: RunComparison, b: RunComparison) -> float:
    """How much faster one run must be to win: twice the combined noise of the two medians (about 95%
    confidence), and at least :data:`TIE_FLOOR`."""
    return max(TIE_FLOOR, 2.0 * math.hypot(rate_noise(a), rate_noise(b)))


def tie(best: RunComparison, second: RunComparison, criterion: str, speedup: float, noise: float) -> dict:
    """The winner record when the two fastest runs are within the measured noise: none."""
    return {"label": None, "index": None, "criterion": criterion, "value": None, "runner_up": None,
            "speedup": speedup, "reason": None, "tie": [best.label, second.label], "tie_margin": noise,
            "explanation": f"no winner: {best.label} and {second.label} tie ({speedup:.3f}x the "
                           f"{RATE_NAMES[criterion]}, within the measured noise of +-{100 * noise:.1f}%)"}


def no_winner(runs: list[RunComparison]) -> dict:
    """The winner record when the runs train different models: none, and why."""
    fields = [row["path"] for row in model_differences(runs)]
    shown = ", ".join(fields[:4]) + (f" and {len(fields) - 4} more" if len(fields) > 4 else "")
    return {"label": None, "index": None, "criterion": None, "value": None, "runner_up": None, "speedup": None,
            "reason": None, "models_differ": fields,
            "explanation": f"no winner: the runs train different models ({shown} differ), so their tokens/s and "
                           "TFLOP/s measure different work; compare layouts of one model"}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def main_reason(best: RunComparison, second: RunComparison, criterion: str) -> str:
    """The component of the step (per unit of the rate) by which ``second`` lost the most time to ``best``."""
    def per_unit(run):
        total = sum(run.breakdown_measured.values())
        r = rate(run, criterion)
        return {k: (v / total / r if total > 0 and r > 0 else 0.0) for k, v in run.breakdown_measured.items()}

    a, b = per_unit(best), per_unit(second)
    return max(COMPONENTS, key=lambda k: b[k] - a[k])


RATE_NAMES = {"tokens_per_s": "tokens/s", "tokens_per_s_per_gpu": "tokens/s per GPU",
              "tflops_per_gpu": "model TFLOP/s per GPU"}


def explain(best: RunComparison, second: RunComparison, criterion: str, reason: str, speedup) -> str:
    """One sentence: who won, by how much, and the main reason, with the numbers behind it."""
    head = (f"{best.label} wins: {speedup:.2f}x the {RATE_NAMES[criterion]} of {second.label} "
            f"({_fmt(rate(best, criterion))} vs {_fmt(rate(second, criterion))})" if speedup else
            f"{best.label} wins over {second.label}")
    mb, ms = best.measured, second.measured
    ba, bb = best.breakdown_measured, second.breakdown_measured
    ms_ = lambda s: f"{1e3 * s:.1f} ms"  # noqa: E731
    why = {
        "compute_s": f"faster compute: MFU {mb['mfu']:.1%} vs {ms['mfu']:.1%} (compute {ms_(ba['compute_s'])} vs "
                     f"{ms_(bb['compute_s'])} per step)",
        "bubble_s": f"less pipeline bubble: {mb['bubble_fraction']:.1%} vs {ms['bubble_fraction']:.1%} of the step",
        "exposed_comm_s": f"less exposed communication: {ms_(ba['exposed_comm_s'])} vs {ms_(bb['exposed_comm_s'])} "
                          f"per step (all-reduce overhead {mb['allreduce_overhead']:.1%} vs "
                          f"{ms['allreduce_overhead']:.1%})",
        "other_s": f"less time outside compute and exposed reductions (parameter all-gathers, data, framework): "
                   f"{ms_(ba['other_s'])} vs {ms_(bb['other_s'])} per step",
    }[reason]
    return f"{head}; mainly {why}"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


# --- the whole comparison ------------------------------------------------------------------------------

RESIZE_FIGURES = ("step_time_s", "tokens_per_s", "mfu")


def resize_links(runs: list[RunComparison]) -> list[dict]:
    """Each compared run dir that continues another (its resume.json): the source (its label when it is compared
    too), the step, both layouts and, per layout, the plan's predicted figures (the source's plan.json) and the
    measured ones (when that run is compared)."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from .resize import read_resume  # noqa: PLC0415
    from .telemetry.wandb_sink import layout_tag_of  # noqa: PLC0415

    by_dir = {str(Path(r.run.source).resolve()): r for r in runs if r.run.kind == "run_dir"}
    links = []
    for run in runs:
        try:
            resume = read_resume(run.run.source) if run.run.kind == "run_dir" else None
            if resume is None:
                continue
            src_dir = str(resume["source_run_dir"])
            source = by_dir.get(str(Path(src_dir).resolve()))
            if source is not None:
                old_predicted, old_measured = source.predicted, source.measured
            else:
                chosen = json.loads((Path(src_dir) / "plan.json").read_text()).get("chosen") or {}
                old_predicted, old_measured = predicted_metrics(chosen), {}
            old, new = layout_tag_of(resume["old_layout"]), layout_tag_of(resume["new_layout"])
            method = resume["conversion"]["method"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue      # an unreadable resume.json or source plan: the runs still compare, without the link
        pick = lambda values: {k: values.get(k) for k in RESIZE_FIGURES}  # noqa: E731
        links.append({"run": run.label, "source": source.label if source is not None else None,
                      "source_run_dir": src_dir, "source_step": resume.get("source_step"), "conversion": method,
                      "layouts": {"old": old, "new": new},
                      "predicted": {"old": pick(old_predicted), "new": pick(run.predicted)},
                      "measured": {"old": pick(old_measured) if old_measured else None, "new": pick(run.measured)}})
    return links


@dataclass(frozen=True)
class Comparison:
    runs: list
    diff: dict
    winner: dict
    warmup_requested: int | None = None
    resizes: list = field(default_factory=list)

    @property
    def warmup_rule(self) -> str:
        if self.warmup_requested is None:
            return WARMUP_RULE
        return (f"the first {self.warmup_requested} steps of each run are left out; a run keeps at least one step"
                " (--warmup N leaves out at most all but the last step)")

    def to_dict(self) -> dict:
        return {"warmup": {"rule": self.warmup_rule, "steps": [r.warmup for r in self.runs]},
                "runs": [r.to_dict() for r in self.runs], "diff": self.diff, "winner": self.winner,
                "resizes": self.resizes}


def compare_runs(runs: list[MeasuredRun], warmup: int | None = None) -> Comparison:
    labels = run_labels(runs)
    compared = [compare_run(run, label, warmup) for run, label in zip(runs, labels)]
    return Comparison(runs=compared, diff=diff_runs(compared), winner=pick_winner(compared),
                      warmup_requested=warmup, resizes=resize_links(compared))


def compare(sources: list[str], warmup: int | None = None) -> Comparison:
    """Load every source (all bad ones reported at once, exit 2) and compare the runs."""
    return compare_runs(load_runs(sources), warmup)
