"""``spec_with(spec, **{"training.engine_version": "0.5"})``: a parsed spec with some fields changed (for tests)."""
from __future__ import annotations

import dataclasses

from orchestrator.spec import Spec


def spec_with(spec: Spec, **fields) -> Spec:
    """``spec`` with each dotted field (``training.engine_version``, ``model.moe.capacity_factor``) set."""
    for dotted, value in fields.items():
        spec = _replace(spec, dotted.split("."), value)
    return spec


def _replace(node, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(node, **{path[0]: value})
    return dataclasses.replace(node, **{path[0]: _replace(getattr(node, path[0]), path[1:], value)})
