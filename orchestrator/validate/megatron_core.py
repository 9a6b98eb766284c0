"""Megatron-Core's own config classes as the final check of megatron_config.json (and of parsed args).

``TransformerConfig(**kwargs)`` is built in a subprocess (``import megatron.core`` takes ~4 s and pulls in
torch), and whatever it raises comes back as a Problem quoting its message. The field names of
``TransformerConfig`` (and its base ``ModelParallelConfig``) are read from the installed package's source
with :mod:`ast`, without importing it, so unknown keys are caught on the light path too.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from ..errors import Problem
from ..render.megatron import OBJECT_FIELDS

_CLASSES = {"transformer/transformer_config.py": "TransformerConfig",
            "model_parallel_config.py": "ModelParallelConfig"}


@lru_cache(maxsize=1)
def megatron_core_dir() -> Path | None:
    """The installed megatron/core directory, found without importing it (None when not installed)."""
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def megatron_core_available() -> bool:
    return megatron_core_dir() is not None


@lru_cache(maxsize=1)
def transformer_config_fields() -> frozenset[str] | None:
    """Dataclass field names of the installed TransformerConfig + ModelParallelConfig (None if absent)."""
    core = megatron_core_dir()
    if core is None:
        return None
    names: set[str] = set()
    for relative, class_name in _CLASSES.items():
        names |= _annotated_names((core / relative).read_text(), class_name)
    return frozenset(names)


def _annotated_names(source: str, class_name: str) -> set[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {stmt.target.id for stmt in node.body
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and not _is_classvar(stmt.annotation)}
    return set()


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def check_transformer_config(config: dict, *, path: str = "megatron_config.json") -> list[Problem]:
    """Problems TransformerConfig(**config) raises (dotted OBJECT_FIELDS resolved first)."""
    return check_transformer_configs([config], paths=[path])[0]


def check_transformer_configs(configs: list[dict], *, paths: list[str] | None = None) -> list[list[Problem]]:
    """:func:`check_transformer_config` for several configs in one subprocess (one megatron import)."""
    from .megatron_lm import run_child  # noqa: PLC0415

    paths = paths or ["megatron_config.json"] * len(configs)
    verdicts = {} if _VERDICTS is None else _VERDICTS
    new = {_key(c): c for c in configs if _key(c) not in verdicts}
    if new:
        requests = [{"mode": "core-config", "config": c, "object_fields": list(OBJECT_FIELDS)} for c in new.values()]
        verdicts.update(zip(new, run_child({"mode": "batch", "requests": requests})["results"]))
    results = [verdicts[_key(c)] for c in configs]
    return [[] if r["ok"] else [_problem(r["error"], path)] for r, path in zip(results, paths)]


# TransformerConfig's verdicts by config while a validate.prefetch.shared_answers() block runs (None: no
# reuse): a run dir's megatron_args.txt and megatron_config.json describe one config, asked about once.
_VERDICTS: dict[str, dict] | None = None


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def _problem(err: dict, path: str) -> Problem:
    said = err["message"].strip() or err["source"].split(": ", 1)[-1]
    return Problem(path, f"Megatron-Core's TransformerConfig rejects it: {err['type']}: {said}",
                   err["source"] or "see megatron-core's TransformerConfig")


def resolve_config(config: dict) -> dict:
    """megatron_config.json -> real TransformerConfig kwargs (imports torch / megatron.core: trainer side)."""
    from .megatron_child import resolve_objects  # noqa: PLC0415

    return resolve_objects(config, list(OBJECT_FIELDS))
