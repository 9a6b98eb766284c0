"""Transformer layers per pipeline stage: the even split, or Megatron-LM's uneven first/last split.

Pure arithmetic, no spec: the spec rules (:mod:`orchestrator.layout`), the cost model, the planner and the
Megatron argument checks share it. The rules Megatron checks and where orch is stricter: docs/cost-model.md,
"stages.py".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional


@dataclass(frozen=True)
class StageSplit:
    """Layers on the first stage, on each middle stage and on the last stage of a pp-stage pipeline.

    pp = 1: one stage holds everything (first = middle = last = num_layers). pp = 2: there is no middle
    stage (``middle`` repeats the last count).
    """

    pp: int
    first: int
    middle: int
    last: int

    @property
    def counts(self) -> tuple[int, ...]:
        if self.pp == 1:
            return (self.first,)
        return (self.first,) + (self.middle,) * (self.pp - 2) + (self.last,)

    @property
    def num_layers(self) -> int:
        return sum(self.counts)

    @property
    def is_even(self) -> bool:
        return len(set(self.counts)) == 1

    def describe(self) -> str:
        """'7 + 14x8 + 7' (even: '4x8')."""
        if self.is_even:
            return f"{self.pp}x{self.first}"
        if self.pp == 2:
            return f"{self.first} + {self.last}"
        return f"{self.first} + {self.pp - 2}x{self.middle} + {self.last}"


def accounted_split(num_layers: int, pp: int) -> StageSplit | None:
    """Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding and the loss count as one
    layer each, (num_layers + 2) / pp per stage; None when that does not divide or leaves a stage empty."""
    if pp < 2 or (num_layers + 2) % pp or (num_layers + 2) // pp < 2:
        return None
    c = (num_layers + 2) // pp
    return StageSplit(pp, c - 1, c if pp > 2 else c - 1, c - 1)


def stage_split(num_layers: int, pp: int, first: Optional[int] = None, last: Optional[int] = None) -> StageSplit:
    """The split of a layout that passed :func:`split_issues` (an invalid one is a programmer bug)."""
    if pp == 1:
        return StageSplit(1, num_layers, num_layers, num_layers)
    layers, stages = _middle(num_layers, pp, first, last)
    assert stages == 0 or layers % stages == 0, "split rules must pass first"
    share = layers // stages if stages else last      # pp = 2 with both given: no middle stage
    return StageSplit(pp, share if first is None else first, share, share if last is None else last)


def _middle(num_layers: int, pp: int, first: Optional[int], last: Optional[int]) -> tuple[int, int]:
    """(layers, stages) left for the stages whose count is not given."""
    given = [c for c in (first, last) if c is not None]
    return num_layers - sum(given), pp - len(given)


# --- the rules -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitNames:
    """How the operands are named: in messages (``first``, ``last``, ``vpp``) and in hints (``first_key``,
    ``last_key`` joined to a value by ``assign``; ``vpp_off`` turns interleaving off). Spec fields here;
    :mod:`orchestrator.validate.megatron` names Megatron-LM flags and TransformerConfig fields."""

    first: str
    last: str
    vpp: str
    first_key: str
    last_key: str
    vpp_off: str
    assign: str = ": "

    def setting(self, first: int, last: int) -> str:
        return f"{self.first_key}{self.assign}{first} and {self.last_key}{self.assign}{last}"


SPEC_NAMES = SplitNames("first_stage_layers", "last_stage_layers", "virtual_pipeline",
                        "parallelism.first_stage_layers", "parallelism.last_stage_layers", "virtual_pipeline: 1")


@dataclass(frozen=True)
class SplitIssue:
    """One broken split rule: which operand to point at ("first", "last", "pp" or "vpp"), what, how to fix."""

    field: str
    message: str
    hint: str


def _suggestion(num_layers: int, pp: int, vpp: int, names: SplitNames) -> str:
    split = balanced_split(num_layers, pp, vpp)
    if split is None:
        return "use a pipeline degree that divides the layer count"
    return f"e.g. {names.setting(*split)} ({_shape_of(num_layers, pp, *split)})"


def _shape_of(num_layers: int, pp: int, first: int, last: int) -> str:
    if pp == 2:
        return "no middle stage"
    middle = (num_layers - first - last) // (pp - 2)
    return f"{pp - 2} middle stage{'s' if pp > 3 else ''} of {middle}"


def issue_count_positive(n: int, pp: int, vpp: int, first, last, names: SplitNames) -> SplitIssue | None:
    for key, count in (("first", first), ("last", last)):
        if count is not None and count < 1:
            label = getattr(names, key)
            return SplitIssue(key, f"{label}({count}) must be >= 1",
                              f"give that stage at least one layer, or remove {label} for an even split")
    return None


def issue_needs_pipeline(n: int, pp: int, vpp: int, first, last, names: SplitNames) -> SplitIssue | None:
    if pp == 1 and (first is not None or last is not None):
        key = "first" if first is not None else "last"
        label = getattr(names, key)
        return SplitIssue(key, f"{label}({first if key == 'first' else last}) needs pp >= 2, got pp(1) "
                          "(a single stage holds every layer)", f"remove {label}, or use pipeline >= 2")
    return None


def issue_no_middle(n: int, pp: int, vpp: int, first, last, names: SplitNames) -> SplitIssue | None:
    if pp == 2 and first is not None and last is not None and first + last != n:
        return SplitIssue("first", f"{names.first}({first}) + {names.last}({last}) = {first + last} != "
                          f"num_layers({n}) with pp(2): there is no middle stage to take the rest",
                          f"e.g. {names.setting(first, n - first) if 0 < first < n else names.setting(*_half(n))}, "
                          f"or give only one of them")
    return None


def _half(n: int) -> tuple[int, int]:
    return n // 2, n - n // 2


def _middle_text(n: int, pp: int, first, last, names: SplitNames) -> tuple[str, int, int]:
    layers, stages = _middle(n, pp, first, last)
    given = "".join(f" - {getattr(names, k)}({v})" for k, v in (("first", first), ("last", last)) if v is not None)
    return f"num_layers({n}){given} = {layers} middle layers", layers, stages


def issue_middle_layers(n: int, pp: int, vpp: int, first, last, names: SplitNames) -> SplitIssue | None:
    if pp < 2 or (first is None and last is None):
        return None
    text, layers, stages = _middle_text(n, pp, first, last, names)
    if stages == 0:
        return None
    key = "first" if first is not None else "last"
    of_pp = f"pp({pp}) - {pp - stages}"
    if layers < stages:
        return SplitIssue(key, f"{text} for {stages} middle stage(s) ({of_pp}): every middle stage needs at "
                          "least one layer", _suggestion(n, pp, vpp, names))
    if layers % stages:
        return SplitIssue(key, f"{text} % {stages} middle stages ({of_pp}) = {layers % stages}, must be 0",
                          _suggestion(n, pp, vpp, names))
    return None


def issue_virtual_chunks(n: int, pp: int, vpp: int, first, last, names: SplitNames) -> SplitIssue | None:
    if vpp <= 1 or pp < 2 or (first is None and last is None):
        return None
    for key, count in (("first", first), ("last", last)):
        if count is not None and count % vpp:
            return SplitIssue(key, f"{getattr(names, key)}({count}) % {names.vpp}({vpp}) = {count % vpp}, must be 0 "
                              f"(the stage's layers form {vpp} equal interleaved chunks)",
                              _suggestion(n, pp, vpp, names) + f", or {names.vpp_off}")
    text, layers, stages = _middle_text(n, pp, first, last, names)
    if stages and layers >= stages and layers % stages == 0 and (layers // stages) % vpp:
        share = layers // stages
        return SplitIssue("vpp", f"{text} / {stages} middle stages = {share} layers each, % {names.vpp}({vpp}) = "
                          f"{share % vpp}, must be 0", f"use a {names.vpp} that divides {share}, or {names.vpp_off}")
    return None


SPLIT_CHECKS = (issue_count_positive, issue_needs_pipeline, issue_no_middle, issue_middle_layers,
                issue_virtual_chunks)


def split_issues(num_layers: int, pp: int, vpp: int, first: Optional[int], last: Optional[int],
                 names: SplitNames = SPEC_NAMES) -> list[SplitIssue]:
    """Every broken rule of an uneven split (none when neither count is given: the even rule is separate)."""
    if first is None and last is None:
        return []
    found = []
    for check in SPLIT_CHECKS:
        issue = check(num_layers, pp, vpp, first, last, names)
        if issue is not None:
            found.append(issue)
            if check in (issue_count_positive, issue_needs_pipeline):
                break   # the arithmetic below is meaningless then
    return found


def even_split_issue(num_layers: int, pp: int, names: SplitNames = SPEC_NAMES) -> SplitIssue | None:
    """Neither count given: num_layers % pp must be 0; the hint names the balanced uneven split."""
    if num_layers % pp == 0:
        return None
    split = balanced_split(num_layers, pp, 1)
    hint = "use a pipeline degree that divides the layer count"
    if split is not None:
        hint += f", or split unevenly: set {names.setting(*split)} ({_shape_of(num_layers, pp, *split)})"
    return SplitIssue("pp", f"num_layers({num_layers}) % pp({pp}) = {num_layers % pp}, must be 0 "
                      f"(or give {names.first_key} / {names.last_key})", hint)


# --- the balanced uneven split -------------------------------------------------------------------

@lru_cache(maxsize=4096)
def balanced_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int] | None:
    """(first, last) of the balanced uneven split, or None when there is none.

    Counting the embedding as one layer's worth of work on the first stage and the output layer + loss as
    one on the last (Megatron's account-for-embedding/loss convention; BLOOM's partition did the same),
    it minimises the largest stage load max(first + 1, middle, last + 1), with first and last no heavier
    than a middle stage (pp > 2) and every count a multiple of vpp. Ties: the lighter first stage (it holds
    the most in-flight micro-batches under 1F1B). It reproduces Llama 3 405B (126 on 16: 7, 7) and
    BLOOM-176B (70 on 12: 5, 5). pp = 2: the two halves, the first one lighter.
    """
    if pp < 2 or num_layers % vpp or num_layers < pp * vpp:
        return None
    units = num_layers // vpp
    best = None
    for middle in range(1, units + 1) if pp > 2 else (0,):
        rest = units - (pp - 2) * middle
        if rest < 2:
            break
        first, last = rest // 2, rest - rest // 2
        if pp > 2 and last > middle:
            continue
        load = max(vpp * first + 1, vpp * last + 1, vpp * middle)
        if best is None or load < best[0]:
            best = (load, vpp * first, vpp * last)
    return None if best is None else best[1:]
