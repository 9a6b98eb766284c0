"""Read a spec and check it whole: ``load_spec(path)`` / ``parse_spec(data)`` run the typed parse of
orchestrator.spec (unknown keys, types, bounds, preset, defaults), then every cross-field rule
(orchestrator.rules), and report every problem at once in one :class:`SpecError`."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from .catalog.models import MODELS, preset_fields
from .errors import Problem, SpecError, raise_if
from .programs.rules import program_file_problems, program_problems, resolve_program
from .rules import check_spec
from .spec import REQUIRED_MODEL_FIELDS, Spec, _apply_defaults, _merge_preset, check_world_bound, read_spec_data
from .typed import parse


def load_spec(path: str | Path) -> Spec:
    """Read, check and resolve a spec file (YAML or JSON). Raises SpecError listing every problem."""
    data = read_spec_data(path)
    try:
        spec = parse_spec(data, base_dir=Path(path).resolve().parent)
        raise_if(program_file_problems(spec.program))
    except SpecError as e:
        raise SpecError([dataclasses.replace(p, path=f"{path}:{p.path}") for p in e.problems]) from None
    return spec


def parse_spec(data: Any, base_dir: Path | None = None) -> Spec:
    """Check and resolve spec data: types, unknown keys, preset, defaults, then every cross-field rule.
    ``base_dir``: what relative program paths are relative to (the spec file's folder; default the working
    directory)."""
    problems: list[Problem] = []
    if not isinstance(data, dict):
        raise SpecError(Problem("spec", "the top level must be a mapping of keys (name, model, cluster, ...)",
                                "start from `orch init`"))
    data = dict(data)
    data["model"] = _merge_preset(data.get("model"), problems)
    spec = parse(Spec, data, "", problems)
    if spec is None and problems:
        problems.extend(_problems_of_what_parsed(data, problems))
    if spec is not None:
        spec = _apply_defaults(spec, problems)
    if spec is not None:
        spec = dataclasses.replace(spec, program=resolve_program(spec.program, base_dir, problems))
        problems.extend(check_world_bound(spec) or check_spec(spec))
        problems.extend(program_problems(spec))
    if problems:
        raise SpecError(problems)
    return spec


def _problems_of_what_parsed(data: dict, problems: list[Problem]) -> list[Problem]:
    """With a wrongly typed or unknown key the Spec cannot be built, which would hide every rule problem until
    the types are fixed. So: drop the keys those problems name (their defaults stand in), build the spec again
    and return its missing-field and rule problems that name none of the dropped keys."""
    dropped = {re.sub(r"\[\d+\]$", "", p.path) for p in problems}
    trimmed = _without(data, dropped)
    model = trimmed.get("model")
    if isinstance(model, dict):   # a required model field stands in as the preset's value (or 1): rules that
        preset = preset_fields(model["preset"]) if model.get("preset") in MODELS else {}   # name it are dropped
        for name in REQUIRED_MODEL_FIELDS:
            if f"model.{name}" in dropped:
                model[name] = preset.get(name, 1)
    retry: list[Problem] = []
    spec = parse(Spec, trimmed, "", retry)
    if spec is None:
        return []
    more: list[Problem] = []
    spec = _apply_defaults(spec, more)
    more += (check_world_bound(spec) or check_spec(spec)) if spec is not None else []
    leaves = {path.rsplit(".", 1)[-1] for path in dropped}
    return [p for p in more if p not in problems and p.path not in dropped
            and not any(re.search(rf"\b{re.escape(leaf)}\b", p.message) for leaf in leaves)]


def _without(data: dict, dotted: set[str], prefix: str = "") -> dict:
    """A copy of nested mappings without the keys at the given dotted paths."""
    out = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path in dotted:
            continue
        out[key] = _without(value, dotted, path) if isinstance(value, dict) else value
    return out
