"""Every rule a spec and its layout must satisfy: layout.py's structural rules, parallel_rules.py's
MoE, context-parallel and FP8 rules and recompute_rules.py's recompute and dropout rules, in one list. ``check_layout`` is the planner's hot path; ``check_spec``
runs every rule on the fields the user fixed (orchestrator.spec_loader.parse_spec calls it)."""
from __future__ import annotations

from typing import Callable

from . import layout as _layout, parallel_rules as _parallel, recompute_rules as _recompute
from .errors import Problem
from .layout import Layout, layout_from_spec
from .spec import Spec

Rule = Callable[[Spec, Layout], Problem | None]
MODEL_RULES: list[Rule] = _layout.MODEL_RULES + _parallel.MODEL_RULES
SPEC_RULES: list[Rule] = _layout.SPEC_RULES + _parallel.SPEC_RULES + _recompute.SPEC_RULES
LAYOUT_RULES: list[Rule] = _layout.LAYOUT_RULES + _parallel.LAYOUT_RULES + _recompute.LAYOUT_RULES


def check_layout(spec: Spec, layout: Layout) -> list[Problem]:
    """Every layout rule that fails for ``layout`` (open fields pass). The planner's hot path."""
    return [p for rule in LAYOUT_RULES if (p := rule(spec, layout)) is not None]


def check_spec(spec: Spec) -> list[Problem]:
    """Every rule that fails for the spec: model shape, the fixed layout fields, launch and data.

    The spec may hold out-of-range values already reported by the typed parser (a zero degree, say);
    a rule that cannot evaluate on them is skipped rather than reported twice.
    """
    layout = layout_from_spec(spec) if _positive_degrees(spec) else Layout()
    problems = []
    for rule in MODEL_RULES + SPEC_RULES + LAYOUT_RULES:
        try:
            problem = rule(spec, layout)
        except (ArithmeticError, TypeError):
            continue
        if problem is not None:
            problems.append(problem)
    return problems


def _positive_degrees(spec: Spec) -> bool:
    p = spec.parallelism
    degrees = (p.tensor, p.pipeline, p.virtual_pipeline, p.data, p.micro_batch_size, p.first_stage_layers,
               p.last_stage_layers, p.context, p.expert, p.expert_tensor, p.shard_degree)
    return all(d is None or d >= 1 for d in degrees) and spec.world_size >= 1
