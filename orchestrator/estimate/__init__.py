"""The cost model: pure estimators of parameters, memory, FLOPs, compute, communication and the pipeline.

No I/O, no printing. ``estimate_layout(spec, layout, cost=None)`` is the entry point for one complete
layout; the planner (``orchestrator.planner``) shares the same functions through :class:`EstimateContext`.
The calibratable terms are :class:`CostModel`'s fields.
"""
from .cost import CostModel
from .step import EstimateContext, LayoutEstimate, estimate_layout

__all__ = ["CostModel", "EstimateContext", "LayoutEstimate", "estimate_layout"]
