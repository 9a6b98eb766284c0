"""The Plan: a resolved spec plus its complete layout and every derived number the renderers need.

``build_plan(spec)`` estimates a fully fixed layout, or asks the planner to search the open fields.
Renderers are pure functions of a Plan; nothing downstream reaches back into the spec's raw data.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .layout import Layout, grad_accum_steps, layout_split, padded_vocab_size
from .spec import ParallelismSpec, Spec, spec_sha256
from .stages import StageSplit


@dataclass(frozen=True)
class Plan:
    spec: Spec
    layout: Layout
    chosen: dict                              # the LAYOUT record of SPEC.md (layout + estimates)
    candidates: list = field(default_factory=list)  # LAYOUT records of the top candidates
    cost_model: dict | None = None            # the calibrated cost-model terms, when not the defaults
    measured: dict | None = None              # which figures `orch doctor` measured (--measured), with values

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def num_nodes(self) -> int:
        return self.spec.cluster.num_nodes

    @property
    def procs_per_node(self) -> int:
        return self.spec.cluster.gpus_per_node

    @property
    def grad_accum_steps(self) -> int:
        return grad_accum_steps(self.spec, self.layout)

    @property
    def stage_split(self) -> StageSplit:
        """Transformer layers on each pipeline stage (even, or the uneven first/last split)."""
        return layout_split(self.spec.model.num_layers, self.layout)

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.spec.model.vocab_size, self.layout.tp)

    @property
    def spec_sha256(self) -> str:
        return spec_sha256(self.spec)

    def plan_record(self, notes: list[str] | None = None) -> dict:
        """plan.json: the chosen LAYOUT and the top candidates (the shape of `orch plan --json`), plus
        notes on what a generated file cannot express."""
        record = {"chosen": self.chosen, "candidates": self.candidates}
        if self.cost_model:
            record["cost_model"] = self.cost_model
        if self.measured:
            record["measured"] = self.measured
        if notes:
            record["notes"] = notes
        return record


def build_plan(spec: Spec, *, top_k: int = 5, cost=None, measured: dict | None = None) -> Plan:
    """Plan a spec: estimate its layout when fully fixed, otherwise search the open fields."""
    from .planner import search  # noqa: PLC0415  (keeps `orch --help` light)

    result = search(spec, top_k=top_k, cost=cost)
    layout = result.chosen.layout
    return Plan(spec=with_layout(spec, layout), layout=layout, chosen=result.chosen.to_dict(),
                candidates=[c.to_dict() for c in result.candidates],
                cost_model=cost.to_dict() if cost is not None else None, measured=measured)


def with_layout(spec: Spec, layout: Layout) -> Spec:
    """The spec with every parallelism field fixed to ``layout`` (what spec.resolved.yaml records).
    cp = 1 is left out: with tensor and pipeline fixed, a missing context means 1 (layout.fixed_context)."""
    return dataclasses.replace(spec, parallelism=ParallelismSpec(
        tensor=layout.tp, pipeline=layout.pp, virtual_pipeline=layout.vpp, data=layout.dp,
        zero_stage=layout.zero_stage, micro_batch_size=layout.micro_batch_size,
        sequence_parallel=layout.sequence_parallel, recompute=layout.recompute, offload=layout.offload,
        first_stage_layers=layout.first_stage_layers, last_stage_layers=layout.last_stage_layers,
        context=layout.cp if layout.cp != 1 else None, **_expert_fields(spec, layout),
        account_for_embedding_loss=True if layout.account_split else None, shard_degree=layout.shard_degree,
        **_recompute_fields(spec, layout), **_software_fields(spec.parallelism)))


def _software_fields(p: ParallelismSpec) -> dict:
    """The parallelism fields that say how the run's software runs the layout (kept as the spec states them)."""
    return {"overlap_moe_expert_parallel_comm": p.overlap_moe_expert_parallel_comm,
            "distribute_saved_activations": p.distribute_saved_activations, "overlap_p2p_comm": p.overlap_p2p_comm}


def _recompute_fields(spec: Spec, layout: Layout) -> dict:
    """recompute_modules of a selective layout; the spec's method / layer count of a full one."""
    p = spec.parallelism
    if layout.recompute == "selective" and layout.recompute_modules:
        return {"recompute_modules": list(layout.recompute_modules)}
    if layout.recompute == "full":
        return {"recompute_method": p.recompute_method, "recompute_num_layers": p.recompute_num_layers}
    return {}


def _expert_fields(spec: Spec, layout: Layout) -> dict:
    """expert / expert_tensor for a MoE model; a dense model leaves them out (they are 1)."""
    if spec.model.moe is None:
        return {}
    return {"expert": layout.ep, "expert_tensor": layout.etp}

