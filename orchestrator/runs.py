"""Measured runs from any source: a run dir, a W&B offline run directory, or a W&B run path.

``load_runs(sources) -> list[MeasuredRun]`` reads every source and reports every bad one at once
(SpecError, exit 2). A :class:`MeasuredRun` carries what ``orch compare`` and ``orch calibrate`` need,
whatever the source: the resolved spec, plan.json's chosen record (the predictions) and the per-step
metrics records (SPEC.md's names), sorted by step.

What each source gives:

- a run dir (``orch generate``): ``spec.resolved.yaml``, ``plan.json`` and ``metrics.jsonl``;
- a W&B offline run directory (``RUN_DIR/wandb/offline-run-*``, or its ``run-<id>.wandb`` file): read with
  wandb's own reader (``wandb leet inspect --json``, no server); the trainer puts the resolved spec and the
  chosen record in the run config (``spec``, ``plan``) and logs one history row per step. A resumed job
  writes one offline-run-* directory per start, all with the same run id: ``RUN_DIR/wandb`` reads them
  together;
- ``entity/project/run_id`` (or a ``https://wandb.ai/entity/project/runs/run_id`` URL): the same through
  wandb's public API, which needs W&B online and a login.

A run must come from this orch's spec format (``spec_version``); a run dir from another version is refused
with the version it was written for.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import OrchError, Problem, SpecError, raise_if
from .layout import Layout, require_complete
from .records import KEPT_KEYS, Records, RecordsBuilder
from .spec import SPEC_VERSION, Spec
from .spec_loader import parse_spec
from .telemetry.sinks import METRICS_FILE, parse_record

RUN_DIR_FILES = ("spec.resolved.yaml", "plan.json")
WANDB_PATH = re.compile(r"^(?:wandb://)?([\w.-]+)/([\w.-]+)/(?:runs/)?([\w.-]+)$")
WANDB_URL = re.compile(r"^https?://[^/]+/([\w.-]+)/([\w.-]+)/runs/([\w.-]+)/?(?:\?.*)?$")
# The record fields orch compare and orch calibrate read; a record without one of them is refused.
REQUIRED_NUMBERS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "allreduce_time_s",
                    "allreduce_overhead", "comm_exposed_s", "mem_peak_bytes")
MAX_PROBLEMS_PER_FILE = 5
MAX_LINE_BYTES = 1 << 20       # one metrics record is under 1 KiB
MAX_STEP = 10**12
INSPECT_TIMEOUT_S = 120


@dataclass(frozen=True)
class MeasuredRun:
    """One training run: what was asked (spec), predicted (chosen) and measured (records)."""

    source: str              # the argument the user gave
    kind: str                # "run_dir" | "wandb_offline" | "wandb_online"
    spec: Spec
    chosen: dict             # plan.json's chosen LAYOUT record, with the cost model's estimates
    records: Records         # metrics records (read-only mappings), one per step, sorted by step

    @property
    def layout(self) -> Layout:
        return require_complete(self.spec)

    @property
    def tag(self) -> str:
        return self.layout.tag()


def load_runs(sources: list[str]) -> list[MeasuredRun]:
    """Every source as a MeasuredRun; one SpecError listing the problems of all bad sources."""
    runs, problems = [], []
    for source in sources:
        try:
            runs.append(load_run(source))
        except SpecError as e:
            problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    return runs


def load_run(source: str) -> MeasuredRun:
    """One source (see the module doc); SpecError naming the source when it cannot be used."""
    path = Path(source)
    if path.is_file() and path.suffix == ".wandb":
        return _from_wandb_offline(source, [path])
    if path.is_dir():
        if any((path / name).exists() for name in RUN_DIR_FILES):
            return _from_run_dir(source, path)
        wandb_files = _wandb_files_in(source, path)
        if wandb_files:
            return _from_wandb_offline(source, wandb_files)
        raise SpecError(Problem(source, "not a run dir (no spec.resolved.yaml or plan.json) nor a W&B offline "
                                        "run directory (no run-*.wandb)",
                                "pass a directory written by `orch generate`, or RUN_DIR/wandb/offline-run-*"))
    if path.exists():
        raise SpecError(Problem(source, "a file, not a run dir or W&B run",
                                "pass the run dir itself, a W&B offline-run-* directory or its .wandb file"))
    wandb_path = parse_wandb_path(source)
    if wandb_path is not None:
        return _from_wandb_online(source, wandb_path)
    raise SpecError(Problem(source, "no such run dir", "check the path; a W&B run is given as entity/project/run_id"))


def parse_wandb_path(text: str) -> str | None:
    """``entity/project/run_id`` from a W&B run path or URL, else None."""
    for pattern in (WANDB_URL, WANDB_PATH):
        match = pattern.match(text)
        if match:
            return "/".join(match.groups())
    return None


# --- run dirs ------------------------------------------------------------------------------------------

def _from_run_dir(source: str, root: Path) -> MeasuredRun:
    from .rundir import read_run_dir  # noqa: PLC0415

    check_spec_version(_spec_version_of(source, root), source, "spec.resolved.yaml")
    try:
        run_dir = read_run_dir(root)
    except SpecError as e:
        raise SpecError([p if p.path.startswith(str(root)) else
                         Problem(f"{source}: spec.resolved.yaml: {p.path}", p.message, p.hint)
                         for p in e.problems]) from None
    except OrchError as e:      # a run dir file that is not valid JSON/YAML: bad input, not a failure
        raise SpecError(Problem(source, str(e))) from None
    raise_if(chosen_problems(run_dir.chosen, f"{source}: plan.json: chosen"))
    records = read_records(source, root / METRICS_FILE)
    return MeasuredRun(source=source, kind="run_dir", spec=run_dir.spec, chosen=run_dir.chosen,
                       records=records)


def _spec_version_of(source: str, root: Path):
    from .userfiles import parse_yaml, read_user_text  # noqa: PLC0415

    path = root / "spec.resolved.yaml"
    try:       # the bounded reader read_run_dir uses: a run dir given to compare is user input
        data = parse_yaml(read_user_text(path), str(path))
    except SpecError:
        return SPEC_VERSION   # read_run_dir reports what is wrong with the file
    return data.get("spec_version", SPEC_VERSION) if isinstance(data, dict) else SPEC_VERSION


def check_spec_version(version, source: str, where: str) -> None:
    if version != SPEC_VERSION:
        raise SpecError(Problem(f"{source}: {where}: spec_version",
                                f"the run was written for spec version {version!r}; this orch reads version "
                                f"{SPEC_VERSION}",
                                "compare it with the orch that wrote it, or regenerate the run dir with this "
                                "one (`orch generate SPEC -o DIR`) and train it again"))


def read_records(source: str, path: Path) -> Records:
    """metrics.jsonl as records sorted by step, read as a stream (a torn last line from a killed job is
    skipped; a step written twice keeps its last record). SpecError when the file is missing, not a regular
    file, empty or malformed."""
    from .userfiles import open_regular  # noqa: PLC0415

    if not path.is_file():
        raise SpecError(Problem(f"{source}: {METRICS_FILE}", "no metrics: the run has not been trained",
                                f"train it first: orch launch {source} --wait"))
    builder, problems, torn = RecordsBuilder(), [], None
    with open_regular(path) as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if torn is not None:       # a bad line that turned out not to be the last one
                problems.append(torn)
                torn = None
            if len(line) > MAX_LINE_BYTES:
                problems.append(Problem(f"{path}:{number}", f"a line longer than {MAX_LINE_BYTES} bytes"))
                while line and not line.endswith(b"\n"):
                    line = f.readline(MAX_LINE_BYTES + 1)
                continue
            if not line.strip():
                continue
            record = parse_record(line)
            if record is None:
                torn = Problem(f"{path}:{number}", "not a JSON record (one JSON object per line)")
                continue
            issues = record_problems(record)
            problems.extend(Problem(f"{path}:{number}", message) for message in issues)
            if not issues and not problems:
                builder.add(record)
    if problems:
        more = len(problems) - MAX_PROBLEMS_PER_FILE
        shown = problems[:MAX_PROBLEMS_PER_FILE]
        if more > 0:
            shown.append(Problem(str(path), f"... and {more} more problem(s)"))
        raise SpecError(shown)
    return finish_records(source, str(path), builder)


# key -> (lowest, highest) a metrics record's value may take; the first rule whose name ending matches
# counts. Far outside any real run, tight enough that medians, ratios and logs of them stay finite.
RECORD_BOUNDS = (("step_time_s", 1e-9, 1e6), ("_per_s", 0.0, 1e15), ("_s", 0.0, 1e6), ("_bytes", 0, 2**60),
                 ("", 0.0, 1e15))


def record_problems(record) -> list[str]:
    """What makes a metrics record unusable (empty when it is fine): the step, every number compare and
    calibrate read (required or optional) and its bounds."""
    if not isinstance(record, dict):
        return ["a record must be a JSON object"]
    step = record.get("step")
    out = [] if isinstance(step, int) and not isinstance(step, bool) and 1 <= step <= MAX_STEP else [
        f"step must be an integer in [1, {MAX_STEP}], got {_shown(step)}"]
    for key in KEPT_KEYS[1:]:
        value = record.get(key)
        if key not in REQUIRED_NUMBERS and value is None:
            continue
        lo, hi = next((lo, hi) for ending, lo, hi in RECORD_BOUNDS if key.endswith(ending))
        if not _is_number(value):
            out.append(f"{key} must be a number, got {_shown(value)}" if key in record else f"{key} is missing")
        elif not lo <= value <= hi:
            out.append(f"{key} must be in [{lo:g}, {hi:g}], got {value!r}")
    return out


MAX_ESTIMATE = 1e30                   # no estimate is that large (a 175B run's FLOPs per step are ~1e18)
NUMBER_ENDINGS = ("_s", "_bytes", "_fraction", "_flops", "mfu", "tflops_per_gpu", "_overhead")
BLOCKS = ("breakdown", "memory", "comm")


def chosen_problems(chosen: dict, where: str) -> list[Problem]:
    """plan.json's chosen record as compare and calibrate read it: its breakdown, memory and comm blocks
    objects, every number finite and below MAX_ESTIMATE, and a number (not true/false, not text) wherever
    a key names a time, a size, a rate or a fraction. Empty when it is fine."""
    hint = "plan.json was edited or damaged: re-generate the run dir with `orch generate`"
    problems = [Problem(f"{where}.{key}", f"must be an object, got {_shown(chosen[key])}", hint)
                for key in BLOCKS if chosen.get(key) is not None and not isinstance(chosen[key], dict)]
    stack = [(value, f"{where}.{key}", str(key)) for key, value in chosen.items()]
    while stack and len(problems) < MAX_PROBLEMS_PER_FILE:
        value, at, key = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}", str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]", key) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value) or _is_number(value) and abs(value) > MAX_ESTIMATE:
            problems.append(Problem(at, f"{_shown(value)} is not a finite number below {MAX_ESTIMATE:g}", hint))
        elif key.endswith(NUMBER_ENDINGS) and value is not None and not _is_number(value):
            problems.append(Problem(at, f"must be a number, got {_shown(value)}", hint))
    return problems


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value) -> bool:
    """A finite int or float, not a bool (an int of any size: math.isfinite would overflow converting it)."""
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)


def finish_records(source: str, where: str, builder: RecordsBuilder) -> Records:
    """Sorted by step, each step once (the last record wins); SpecError when there is none."""
    if not len(builder):
        raise SpecError(Problem(f"{source}: {where}", "no metrics records (empty)",
                                "the job wrote no step yet, or ran with --no-telemetry; train it first"))
    return builder.finish()


# --- W&B -----------------------------------------------------------------------------------------------

def _wandb_files_in(source: str, directory: Path) -> list[Path]:
    """The .wandb file of an offline-run-* directory; or, for a wandb/ directory, the files of its offline
    runs when they are ONE run (a resumed job starts a new offline-run-* of the same run id each time),
    oldest first. Empty when there is none."""
    files = sorted(directory.glob("run-*.wandb"))
    odd = [f for f in [*files, *directory.glob("offline-run-*/run-*.wandb")] if not f.is_file()]
    if odd:      # wandb's reader would block on a FIFO, or read a device forever
        raise SpecError(Problem(str(odd[0]), "not a regular file", "pass a .wandb file that W&B wrote"))
    if len(files) > 1:
        raise SpecError(Problem(source, f"{len(files)} run-*.wandb files in one directory",
                                "pass one of them: " + ", ".join(str(f) for f in files)))
    if files:
        return files
    runs = sorted(directory.glob("offline-run-*/run-*.wandb"), key=lambda f: f.parent.name)
    if len({f.name for f in runs}) > 1:
        raise SpecError(Problem(source, f"a W&B directory with {len({f.name for f in runs})} different runs",
                                "pass one offline-run-* directory: " + ", ".join(str(f.parent) for f in runs)))
    return runs


@dataclass(frozen=True)
class WandbRun:
    """A W&B run read back: config, history rows (one dict per log call) and summary."""

    config: dict
    history: list
    summary: dict


def _from_wandb_offline(source: str, wandb_files: list[Path]) -> MeasuredRun:
    """One run from its offline log(s): configs and summaries merged in order, histories concatenated
    (a step logged again after a resume keeps its last record)."""
    parts = [read_wandb_offline(source, f) for f in wandb_files]
    merged = WandbRun(config={}, history=[], summary={})
    for part in parts:
        merged.config.update(part.config)
        merged.history.extend(part.history)
        merged.summary.update(part.summary)
    return run_from_wandb(source, "wandb_offline", merged)


def read_wandb_offline(source: str, wandb_file: Path) -> WandbRun:
    """Read a .wandb transaction log with wandb's own reader (``wandb leet inspect --json``)."""
    argv = [*_wandb_cli(), "leet", "inspect", "--json", str(wandb_file)]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OrchError(f"{source}: could not run wandb's reader ({' '.join(argv[:3])} ...): {e}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SpecError(Problem(source, f"wandb could not read {wandb_file.name}: {' '.join(tail)}",
                                "is it a complete .wandb file?"))
    return parse_transaction_log(proc.stdout)


def _wandb_cli() -> list[str]:
    beside = Path(sys.executable).with_name("wandb")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("wandb")
    if found:
        return [found]
    raise OrchError("reading a W&B run needs wandb (pip install 'orch[train]'): no `wandb` command found")


def parse_transaction_log(text: str) -> WandbRun:
    """Config, history and summary from the JSON lines of ``wandb leet inspect --json`` (lines of other
    shapes are skipped: a damaged log gives fewer rows, and the run's checks then say what is missing)."""
    config, history, summary = {}, [], {}
    for line in text.splitlines():
        record = _json_object(line)
        kind = record.get("type")
        body = record.get(kind) if isinstance(kind, str) else None
        if not isinstance(body, dict):
            continue
        if kind == "run":
            config.update(_update_of(body.get("config")))
        elif kind == "config":
            config.update(_update_of(body))
        elif kind == "history" and isinstance(body.get("item"), dict):
            history.append(body["item"])
        elif kind == "summary":
            summary.update(_update_of(body))
    return WandbRun(config=config, history=history, summary=summary)


def _json_object(line: str) -> dict:
    try:
        value = json.loads(line) if line.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _update_of(block) -> dict:
    update = block.get("update") if isinstance(block, dict) else None
    return update if isinstance(update, dict) else {}


def _from_wandb_online(source: str, path: str) -> MeasuredRun:
    from .telemetry.wandb_sink import has_wandb_credentials  # noqa: PLC0415

    mode = os.environ.get("WANDB_MODE", "")
    hint = ("pass the run's offline directory instead (RUN_DIR/wandb/offline-run-*), or go online: "
            "unset WANDB_MODE and `wandb login`")
    if mode in ("offline", "dryrun", "disabled"):
        raise SpecError(Problem(source, f"no such run dir, and reading W&B run {path} needs W&B online, but "
                                        f"WANDB_MODE={mode}", hint))
    if not has_wandb_credentials():
        raise SpecError(Problem(source, f"no such run dir, and reading W&B run {path} needs a W&B login (no "
                                        "WANDB_API_KEY, no netrc entry)", hint))
    return run_from_wandb(source, "wandb_online", read_wandb_online(source, path))


def read_wandb_online(source: str, path: str) -> WandbRun:
    try:
        import wandb  # noqa: PLC0415
    except ImportError:
        raise OrchError("reading a W&B run needs wandb (pip install 'orch[train]')") from None
    try:
        run = wandb.Api(timeout=30).run(path)
        return WandbRun(config=dict(run.config), history=list(run.scan_history()), summary=dict(run.summary))
    except Exception as e:  # noqa: BLE001  (network, auth, not found: all reported the same way)
        raise SpecError(Problem(source, f"could not read W&B run {path}: {e.__class__.__name__}: {e}",
                                "check the entity/project/run_id and that you are logged in")) from None


def run_from_wandb(source: str, kind: str, run: WandbRun) -> MeasuredRun:
    """A MeasuredRun from a W&B run logged by orch's trainer (config: spec, plan; one row per step)."""
    spec_data, chosen = run.config.get("spec"), run.config.get("plan")
    if not isinstance(spec_data, dict) or not isinstance(chosen, dict):
        raise SpecError(Problem(source, "not a W&B run logged by orch's trainer (its config has no 'spec' and "
                                        "'plan')", "pass a run written by `orch launch` / orchestrator.train"))
    check_spec_version(spec_data.get("spec_version", SPEC_VERSION), source, "config.spec")
    try:
        spec = parse_spec(spec_data)
    except SpecError as e:
        raise SpecError([Problem(f"{source}: config.spec.{p.path}", p.message, p.hint) for p in e.problems]) from None
    raise_if(chosen_problems(chosen, f"{source}: config.plan"))
    records = history_records(source, run.history)
    return MeasuredRun(source=source, kind=kind, spec=spec, chosen=chosen, records=records)


def history_records(source: str, history: list) -> Records:
    """Metrics records from W&B history rows: wandb's own keys (``_step``, ``_runtime``...) dropped."""
    builder, problems = RecordsBuilder(), []
    for row in history:
        if not isinstance(row, dict):
            continue
        record = {k: v for k, v in row.items() if not str(k).startswith("_")}
        if "step" not in record:
            continue
        issues = record_problems(record)
        if issues:
            problems.extend(Problem(f"{source}: history step {_shown(record.get('step'))}", m) for m in issues)
        else:
            builder.add(record)
    if problems:
        raise SpecError(problems[:MAX_PROBLEMS_PER_FILE])
    return finish_records(source, "W&B history", builder)
