"""MoE routing metrics of one step, from the routing counts every rank contributes.

Each rank's trainer keeps, per step, a flat vector (``orchestrator.train.moe.MoEStats.take``): the
token-slots (token, chosen expert) routed to each expert of each MoE layer, ``num_layers * num_experts``
numbers, then four sums: slots dropped at capacity, slots routed, the aux loss over forward passes (summed
over the layers of each pass) and the number of forward passes. Summed over ranks (one all_reduce, in
step.py) they give:

- ``expert_load_imbalance``: per MoE layer, the most-loaded expert's slots over the mean slots per expert
  (1.0 = perfectly balanced; E = all slots on one expert); the step's value is the worst layer's;
- ``tokens_dropped_fraction``: dropped slots / routed slots (0 when dropless);
- ``moe_aux_loss``: the load-balancing loss added to the objective (coefficient included, summed over
  the MoE layers), averaged over the micro-batches of all ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

EXTRAS = 4   # dropped, routed, aux-loss sum, forward passes


@dataclass(frozen=True)
class MoEShape:
    """How the routing vector is laid out: MoE layers x routed experts (+ EXTRAS)."""

    num_layers: int
    num_experts: int

    @property
    def size(self) -> int:
        return self.num_layers * self.num_experts + EXTRAS


def load_imbalance(counts: list[float]) -> float:
    """max / mean of one layer's per-expert counts (1.0 for a layer that routed nothing)."""
    mean = sum(counts) / len(counts)
    return max(counts) / mean if mean > 0 else 1.0


def moe_metrics(shape: MoEShape, summed: list[float]) -> dict:
    """The step's MoE fields of the metrics record from the vector summed over ranks."""
    e = shape.num_experts
    layers = [summed[i * e:(i + 1) * e] for i in range(shape.num_layers)]
    dropped, routed, aux_sum, passes = summed[shape.num_layers * e:]
    return {"expert_load_imbalance": max(load_imbalance(c) for c in layers),
            "tokens_dropped_fraction": dropped / routed if routed > 0 else 0.0,
            "moe_aux_loss": aux_sum / passes if passes > 0 else 0.0}
