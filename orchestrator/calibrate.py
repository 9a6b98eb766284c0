"""orch calibrate: fit the cost model's efficiency terms to measured runs of one cluster.

``calibrate(sources, warmup=None) -> Calibration``; ``write_calibration(cal, path)`` writes calib.json;
``load_calibration(path) -> CalibrationFile`` reads it back, validated, and ``.cost_for(spec)`` gives the
:class:`~orchestrator.estimate.cost.CostModel` that ``orch plan/generate --calibration`` plan with.
What is measured, what is fitted, how, and when a term is left out: docs/cost-model.md, "calibrate.py".
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import __version__
from .compare import median, run_labels, warmup_steps
from .errors import Problem, SpecError, raise_if
from .estimate.cost import CostModel
from .layout import Layout
from .runs import MeasuredRun, load_runs
from .spec import Spec, spec_to_data

CALIBRATION_VERSION = 1
QUANTITIES = ("compute_s", "dp_reduction_s", "step_time_s")
GRID_POINTS = 33
GOLDEN_ITERATIONS = 40
MAX_SWEEPS = 3
TOLERANCE = 1e-6
NM_STEP = 0.05
NM_ITERATIONS = 600
NM_TOLERANCE = 1e-10
EDGE = 0.01          # a log-scaled term within 1% of either end of its range was not determined by the runs
TOP_KEYS = ("calibration_version", "orch_version", "cluster", "cost_model", "fit")
CLUSTER_KEYS = ("gpu", "gpus_per_node", "precision", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps")


# --- observations --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Observation:
    """What one run measured, as the fit uses it (None: not observed)."""

    source: str
    label: str
    spec: Spec
    layout: Layout
    measured: dict          # QUANTITIES -> seconds or None


def observe(run: MeasuredRun, label: str, warmup: int | None = None) -> Observation:
    kept = run.records[warmup_steps(len(run.records), warmup):]
    lay = run.layout
    dp_time = median(r["allreduce_time_s"] for r in kept) if lay.dp > 1 else None
    compute = median(float(r.get("compute_time_s") or 0.0) for r in kept)
    return Observation(source=run.source, label=label, spec=run.spec, layout=lay, measured={
        "compute_s": compute if compute > 0 else None,
        "dp_reduction_s": dp_time if dp_time else None,
        "step_time_s": median(r["step_time_s"] for r in kept)})


def predict(obs: Observation, cost: CostModel) -> dict:
    """The cost model's values of QUANTITIES for the run's layout under ``cost``."""
    from .estimate import estimate_layout  # noqa: PLC0415

    est = estimate_layout(obs.spec, obs.layout, cost)
    b = est.breakdown
    return {"compute_s": b.compute_s + b.optimizer_s + b.offload_s,
            "dp_reduction_s": reduction_time_s(obs.spec, obs.layout, cost), "step_time_s": est.step_time_s}


def reduction_time_s(spec: Spec, lay: Layout, cost: CostModel) -> float:
    """Time of one step's data-parallel gradient reductions alone (no parameter all-gathers)."""
    from .estimate import estimate_layout  # noqa: PLC0415

    return estimate_layout(spec, lay, cost).comm.dp_reduce_s


def log_errors(observations: list[Observation], cost: CostModel) -> list[float]:
    """log(predicted / measured) of every observed quantity of every run."""
    out = []
    for obs in observations:
        pred = predict(obs, cost)
        for key in QUANTITIES:
            meas = obs.measured[key]
            if meas and pred[key] > 0:
                out.append(math.log(pred[key] / meas))
    return out


def rms_error_pct(observations: list[Observation], cost: CostModel) -> float:
    """The typical error of the predictions, as the fit measures it: exp(rms of log(predicted/measured)) - 1,
    in % (a 2x over- or under-estimate both count 100%; the fit never makes it larger)."""
    errors = log_errors(observations, cost)
    return 100.0 * math.expm1(math.sqrt(sum(e * e for e in errors) / len(errors))) if errors else 0.0


# --- the terms and the fit -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One fitted degree of freedom: its range and how it sets CostModel fields."""

    name: str
    lo: float
    hi: float
    log: bool
    apply: Callable[[CostModel, float], CostModel]
    start: float


def fit_terms(observations: list[Observation], base: CostModel) -> list[Term]:
    """The terms these runs can tell apart (docs/cost-model.md)."""
    from .catalog.gpus import GPUS  # noqa: PLC0415
    from .estimate.comm import group_placement  # noqa: PLC0415

    spec = observations[0].spec
    gpu = GPUS[spec.cluster.gpu]
    mm0 = base.matmul_efficiency or gpu.matmul_efficiency * gpu.sustained_clock_fraction
    att0 = base.attention_efficiency or gpu.attention_efficiency * gpu.sustained_clock_fraction
    terms = [Term("compute_efficiency_factor", 0.02, min(1 / mm0, 1 / att0), True,
                  lambda c, s: dataclasses.replace(c, matmul_efficiency=s * mm0, attention_efficiency=s * att0),
                  min(1.0, 1 / mm0, 1 / att0))]
    if len({o.layout.micro_batch_size for o in observations}) > 1:
        terms.append(Term("kernel_gap_s", 1e-7, 1e-3, True, lambda c, v: dataclasses.replace(c, kernel_gap_s=v),
                          base.kernel_gap_s))
    dp_runs = [o for o in observations if o.measured["dp_reduction_s"]]
    places = [group_placement(o.layout.dp, o.layout.tp, o.spec.cluster.gpus_per_node) for o in dp_runs]
    if any(p.per_node > 1 for p in places) and not spec.cluster.intra_node_bandwidth_GBps:
        terms.append(Term("intra_node_efficiency", 1e-3, 1.0, True,
                          lambda c, v: dataclasses.replace(c, intra_node_efficiency=v), base.intra_node_efficiency))
    if any(p.num_nodes > 1 for p in places) and not spec.cluster.inter_node_bandwidth_GBps:
        terms.append(Term("inter_node_efficiency", 1e-3, 1.0, True,
                          lambda c, v: dataclasses.replace(c, inter_node_efficiency=v), base.inter_node_efficiency))
    if dp_runs:
        terms.append(Term("dp_overlap", 0.0, 1.0, False, lambda c, v: dataclasses.replace(c, dp_overlap=v),
                          base.dp_overlap))
    return terms


def apply_terms(base: CostModel, terms: list[Term], values: list[float]) -> CostModel:
    cost = base
    for term, value in zip(terms, values):
        cost = term.apply(cost, value)
    return cost


def minimize(objective: Callable[[list[float]], float], terms: list[Term]) -> tuple[list[float], float]:
    """Coordinate descent (per term a grid scan, then golden-section refinement) for a start near the global
    minimum, then Nelder-Mead over all terms at once, which follows the valleys coordinate steps zigzag in
    (compute efficiency against per-kernel cost, bandwidth against overlap)."""
    x = [t.start for t in terms]
    best = objective(x)
    for _ in range(MAX_SWEEPS):
        before = best
        for i, term in enumerate(terms):
            x[i], best = line_search(lambda v, i=i: objective(x[:i] + [v] + x[i + 1:]), term, x[i], best)
        if before - best <= TOLERANCE * max(before, 1e-12):
            break
    return nelder_mead(objective, terms, x, best)


def _to_unit(term: Term, value: float) -> float:
    to = math.log if term.log else (lambda v: v)
    return (to(value) - to(term.lo)) / (to(term.hi) - to(term.lo))


def _from_unit(term: Term, u: float) -> float:
    u = min(1.0, max(0.0, u))
    if term.log:
        return math.exp(math.log(term.lo) + u * (math.log(term.hi) - math.log(term.lo)))
    return term.lo + u * (term.hi - term.lo)


def nelder_mead(objective, terms: list[Term], x0: list[float], f0: float) -> tuple[list[float], float]:
    """Nelder-Mead in the unit cube of the terms' (log) ranges (points outside are clipped onto it)."""
    def f(u):
        return objective([_from_unit(t, v) for t, v in zip(terms, u)])

    start = [_to_unit(t, v) for t, v in zip(terms, x0)]
    simplex = [start] + [[v + (NM_STEP if j == i else 0.0) * (1 if v < 0.5 else -1) for j, v in enumerate(start)]
                         for i in range(len(start))]
    values = [f0] + [f(p) for p in simplex[1:]]
    for _ in range(NM_ITERATIONS):
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= NM_TOLERANCE * max(values[0], 1e-300):
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / (len(simplex) - 1) for j in range(len(start))]
        along = lambda t: [c + t * (w - c) for c, w in zip(centroid, simplex[-1])]  # noqa: E731
        reflected = along(-1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = along(-2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = along(0.5)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [[b + 0.5 * (p - b) for b, p in zip(simplex[0], q)] for q in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    i = min(range(len(simplex)), key=values.__getitem__)
    if values[i] >= f0:
        return list(x0), f0
    return [_from_unit(t, v) for t, v in zip(terms, simplex[i])], values[i]


def line_search(f: Callable[[float], float], term: Term, current: float, f_current: float) -> tuple[float, float]:
    """The best value of ``term`` for ``f``, never worse than ``current``."""
    to = (lambda v: math.log(v)) if term.log else (lambda v: v)
    back = (lambda u: math.exp(u)) if term.log else (lambda u: u)
    lo, hi = to(term.lo), to(term.hi)
    grid = [lo + (hi - lo) * k / (GRID_POINTS - 1) for k in range(GRID_POINTS)]
    values = [f(back(u)) for u in grid]
    k = min(range(GRID_POINTS), key=values.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, GRID_POINTS - 1)]
    best_u, best_f = grid[k], values[k]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(GOLDEN_ITERATIONS):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(back(d))
    for u, fu in ((c, fc), (d, fd)):
        if fu < best_f:
            best_u, best_f = u, fu
    if f_current <= best_f:
        return current, f_current
    return back(best_u), best_f


# --- the result ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    fitted: dict            # CostModel field -> fitted value (what calib.json's cost_model holds)
    cluster: dict
    runs: list              # per run: source, label, measured, predicted before and after
    error_before_pct: float   # rms_error_pct with the default cost model
    error_after_pct: float    # ... and with the fitted one
    warnings: list = dataclasses.field(default_factory=list)   # terms left at their defaults, and why

    def to_dict(self) -> dict:
        return {"calibration_version": CALIBRATION_VERSION, "orch_version": __version__, "cluster": self.cluster,
                "cost_model": self.fitted,
                "fit": {"method": "least squares of log(predicted/measured) over compute_s, dp_reduction_s and "
                                  "step_time_s; coordinate descent", "runs": self.runs,
                        "rms_error_pct": {"before": self.error_before_pct, "after": self.error_after_pct},
                        "warnings": list(self.warnings)}}


def cluster_of(spec: Spec) -> dict:
    c = spec.cluster
    return {"gpu": c.gpu, "gpus_per_node": c.gpus_per_node, "precision": spec.training.precision,
            "intra_node_bandwidth_GBps": c.intra_node_bandwidth_GBps,
            "inter_node_bandwidth_GBps": c.inter_node_bandwidth_GBps}


def check_one_cluster(runs: list[MeasuredRun]) -> None:
    """SpecError listing every run when they come from more than one cluster or precision."""
    clusters = [cluster_of(r.spec) for r in runs]
    if len({json.dumps(c, sort_keys=True) for c in clusters}) <= 1:
        return
    raise SpecError([Problem(r.source, "cluster " + ", ".join(f"{k}={v}" for k, v in c.items() if v is not None))
                     for r, c in zip(runs, clusters)] + [
        Problem("RUN...", "the runs come from different clusters or precisions",
                "calibrate each cluster (GPU type, GPUs per node, interconnect) and precision separately")])


def fit_calibration(runs: list[MeasuredRun], warmup: int | None = None, base: CostModel | None = None) -> Calibration:
    """Fit the cost model to ``runs`` (one cluster)."""
    check_one_cluster(runs)
    base = base or CostModel()
    observations = [observe(run, label, warmup) for run, label in zip(runs, run_labels(runs))]
    terms, values, warnings = identified_fit(observations, base)
    cost = apply_terms(base, terms, values)
    fields = _fitted_fields(terms)
    fitted = {name: getattr(cost, name) for name in fields}
    per_run = [{"source": o.source, "label": o.label, "measured": o.measured,
                "predicted_before": predict(o, base), "predicted_after": predict(o, cost)} for o in observations]
    return Calibration(cost=cost, fitted=fitted, cluster=cluster_of(runs[0].spec), runs=per_run,
                       error_before_pct=rms_error_pct(observations, base),
                       error_after_pct=rms_error_pct(observations, cost), warnings=warnings)


def identified_fit(observations: list[Observation], base: CostModel) -> tuple[list[Term], list[float], list[str]]:
    """Fit the terms the runs determine: fewer terms than measured values (one left over checks the fit),
    dropping the last terms of :func:`fit_terms` first; then drop any rate or efficiency that ran to the edge
    of its range (the runs did not determine it) and fit again. Returns terms, values and warnings."""
    terms = fit_terms(observations, base)
    measured = distinct_measured(observations)
    warnings = [f"{t.name} not fitted (kept the default): {measured} measured value(s) leave no check on "
                f"{len(terms)} terms; add runs of other layouts" for t in terms[max(1, measured - 1):]]
    terms = terms[:max(1, measured - 1)]
    while True:
        values = minimize(lambda v: sum(e * e for e in log_errors(observations, apply_terms(base, terms, v))),
                          terms)[0] if terms else []
        edge = [i for i, (t, v) in enumerate(zip(terms, values)) if t.log and not EDGE < _to_unit(t, v) < 1 - EDGE]
        if not edge:
            return terms, values, warnings
        warnings += [f"{terms[i].name} not fitted (kept the default): the fit ran to the edge of its range "
                     f"({values[i]:.3g}), so these runs do not determine it" for i in edge]
        terms = [t for i, t in enumerate(terms) if i not in edge]


def distinct_measured(observations: list[Observation]) -> int:
    """How many measured values the runs give the fit: per distinct experiment (what the cost model sees:
    the spec but its name, tracking and launch, and the layout), the most any of its runs measured. The same
    run given twice, or one layout trained again, repeats a measurement: it determines no further term."""
    most: dict[str, int] = {}
    for o in observations:
        data = {k: v for k, v in spec_to_data(o.spec).items() if k not in ("name", "tracking", "launch")}
        key = json.dumps([data, repr(o.layout)], sort_keys=True, default=str)
        most[key] = max(most.get(key, 0), sum(1 for q in QUANTITIES if o.measured[q]))
    return sum(most.values())


def _fitted_fields(terms: list[Term]) -> list[str]:
    names = []
    for term in terms:
        names += ["matmul_efficiency", "attention_efficiency"] if term.name == "compute_efficiency_factor" else [
            term.name]
    return names


def calibrate(sources: list[str], warmup: int | None = None) -> Calibration:
    """Load the runs (every bad one reported at once) and fit the cost model to them."""
    return fit_calibration(load_runs(sources), warmup)


def write_calibration(cal: Calibration, path: str | Path, *, force: bool = False) -> Path:
    """calib.json, written atomically (sorted keys, indent 2); an existing file only with ``force``,
    never anything but a regular file (see orchestrator.outfiles)."""
    from .outfiles import write_output_file  # noqa: PLC0415

    out = Path(path)
    if not out.parent.is_dir():
        raise SpecError(Problem(str(out), f"directory {out.parent} does not exist", "create it first"))
    return write_output_file(out, json.dumps(cal.to_dict(), sort_keys=True, indent=2, allow_nan=False) + "\n", force=force,
                             option="--output")


# --- reading calib.json back ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibrationFile:
    path: str
    cost: CostModel
    cluster: dict

    def cost_for(self, spec: Spec) -> CostModel:
        """The calibrated CostModel, or SpecError when the spec is for another GPU or precision."""
        raise_if(spec_mismatches(self.cluster, spec, f"{self.path}: cluster", "fitted on {!r} runs",
                                 "calibrate on runs of this cluster and precision, or drop --calibration"))
        return self.cost


def spec_mismatches(recorded: dict, spec: Spec, where: str, what: str, fix: str) -> list[Problem]:
    """A Problem for the GPU, the GPUs per node (intra-node bandwidth and placement depend on it) and the
    precision when ``recorded`` (what a file was made on) names another than the spec's; ``what`` is a format
    with one ``{!r}`` for the recorded value ("fitted on {!r} runs")."""
    problems = []
    for key, field, have in (("gpu", "cluster.gpu", spec.cluster.gpu),
                             ("gpus_per_node", "cluster.gpus_per_node", spec.cluster.gpus_per_node),
                             ("precision", "training.precision", spec.training.precision)):
        want = recorded.get(key)
        if want is not None and want != have:
            made = f"made with {want!r} GPUs per node" if key == "gpus_per_node" else what.format(want)
            problems.append(Problem(f"{where}.{key}", f"{made}, but the spec's {field} is {have!r}", fix))
    return problems


def read_json(path: str | Path, write_hint: str):
    """A JSON file of measured numbers, or SpecError naming the file (and line:col or field) and what is
    wrong: missing (``write_hint`` says how to write it), not a regular file, over 16 MiB, not JSON, or
    holding NaN, Infinity or numbers no float can hold (:func:`orchestrator.userfiles.read_number_json`)."""
    from .userfiles import read_number_json  # noqa: PLC0415

    return read_number_json(path, write_hint)


def load_calibration(path: str | Path) -> CalibrationFile:
    """Read and validate calib.json: unknown keys, wrong types and out-of-range values are SpecErrors."""
    where = str(path)
    data = read_json(path, "write one with `orch calibrate RUN... -o FILE`")
    problems = calibration_problems(data, where)
    terms = data.get("cost_model") if isinstance(data, dict) else None
    cost = None
    if isinstance(terms, dict):
        bad_types = {p.path.rsplit(".", 1)[-1] for p in cost_model_type_problems(terms, where)}
        try:
            cost = CostModel.from_dict({k: v for k, v in terms.items() if k not in bad_types})
        except SpecError as e:
            problems += [Problem(f"{where}: {p.path.replace('calibration.', 'cost_model.', 1)}", p.message, p.hint)
                         for p in e.problems]
    if problems:
        raise SpecError(problems)
    return CalibrationFile(path=where, cost=cost, cluster=dict(data.get("cluster") or {}))


def calibration_problems(data, where: str) -> list[Problem]:
    """Every structural and type problem of calib.json data (ranges are CostModel.from_dict's)."""
    from .typed import did_you_mean  # noqa: PLC0415

    if not isinstance(data, dict):
        return [Problem(where, "calib.json must be a JSON object", "write it with `orch calibrate`")]
    problems = [Problem(f"{where}: {k}", "unknown key", did_you_mean(k, list(TOP_KEYS)))
                for k in data if k not in TOP_KEYS]
    version = data.get("calibration_version", CALIBRATION_VERSION)
    if version != CALIBRATION_VERSION or isinstance(version, bool):
        problems.append(Problem(f"{where}: calibration_version", f"{version!r} is not {CALIBRATION_VERSION}",
                                "written by another orch version: calibrate again"))
    if "cost_model" not in data:
        problems.append(Problem(f"{where}: cost_model", "required key is missing", "the fitted CostModel terms"))
    elif not isinstance(data["cost_model"], dict):
        problems.append(Problem(f"{where}: cost_model", "must be an object of CostModel terms"))
    else:
        problems += cost_model_type_problems(data["cost_model"], where)
    cluster = data.get("cluster", {})
    if not isinstance(cluster, dict):
        problems.append(Problem(f"{where}: cluster", "must be an object"))
    else:
        problems += [Problem(f"{where}: cluster.{k}", "unknown key", did_you_mean(k, list(CLUSTER_KEYS)))
                     for k in cluster if k not in CLUSTER_KEYS]
        problems += [Problem(f"{where}: cluster.{k}", f"must be a string, got {cluster[k]!r}")
                     for k in ("gpu", "precision") if k in cluster and not isinstance(cluster[k], str)]
        per_node = cluster.get("gpus_per_node")
        if per_node is not None and (isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1):
            problems.append(Problem(f"{where}: cluster.gpus_per_node", f"must be an integer >= 1, got {per_node!r}"))
    if not isinstance(data.get("fit", {}), dict):
        problems.append(Problem(f"{where}: fit", "must be an object"))
    return problems


def cost_model_type_problems(terms: dict, where: str) -> list[Problem]:
    """Wrong JSON types of known CostModel terms (unknown keys are left to CostModel.from_dict)."""
    types = {f.name: str(f.type) for f in dataclasses.fields(CostModel)}
    problems = []
    for key, value in terms.items():
        kind = types.get(key)
        if kind is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = {"bool": isinstance(value, bool), "int": number and float(value).is_integer(),
              "float": number, "Optional[float]": value is None or number}.get(kind, True)
        if not ok:
            expected = {"bool": "true or false", "int": "an integer", "float": "a number",
                        "Optional[float]": "a number or null"}[kind]
            problems.append(Problem(f"{where}: cost_model.{key}", f"must be {expected}, got {value!r}"))
    return problems
