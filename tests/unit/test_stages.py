"""Layers per pipeline stage: the even split, Megatron-LM's uneven first/last split and its rules, and the
balanced uneven split the planner and the hints propose."""
from __future__ import annotations

import pytest

from orchestrator.stages import SPEC_NAMES, StageSplit, balanced_split, even_split_issue, split_issues, stage_split


@pytest.mark.parametrize("n,pp,vpp,split", [
    (126, 16, 1, (7, 7)),     # Llama 3 405B: 7 + 14 x 8 + 7 (Llama 3 paper, section 3.3.2)
    (70, 12, 1, (5, 5)),      # BLOOM-176B: 5 + 10 x 6 + 5
    (5, 2, 1, (2, 3)),        # no middle stage: two halves, the first one lighter
    (36, 8, 1, (3, 3)),       # 3 + 6 x 5 + 3
    (126, 16, 2, (6, 8)),     # every count a multiple of vpp: 6 + 14 x 8 + 8
    (128, 24, 1, None),       # no split with ends no heavier than the middle stages
    (33, 16, 1, None),
    (7, 3, 2, None),          # vpp must divide num_layers
    (1, 2, 1, None),          # fewer layers than stages
])
def test_balanced_split(n, pp, vpp, split):
    assert balanced_split(n, pp, vpp) == split
    if split is not None:
        assert split_issues(n, pp, vpp, *split) == []
        s = stage_split(n, pp, *split)
        assert s.num_layers == n and max(s.first, s.last) <= s.middle or pp == 2


def test_balanced_split_minimises_the_largest_stage_load():
    """Load = layers + 1 on the first (embedding) and last (output layer + loss) stage, layers elsewhere."""
    n, pp = 126, 16
    first, last = balanced_split(n, pp)
    best = max(first + 1, last + 1, (n - first - last) // (pp - 2))
    for f in range(1, n):
        for la in range(1, n - f):
            if not split_issues(n, pp, 1, f, la) and max(f, la) <= (n - f - la) // (pp - 2):
                assert max(f + 1, la + 1, (n - f - la) // (pp - 2)) >= best


@pytest.mark.parametrize("n,pp,first,last,counts", [
    (32, 4, None, None, (8, 8, 8, 8)),
    (126, 16, 7, 7, (7,) + (8,) * 14 + (7,)),
    (126, 16, 6, None, (6,) + (8,) * 15),           # only one given: the other stages share the rest
    (126, 16, None, 6, (8,) * 15 + (6,)),
    (5, 2, 2, 3, (2, 3)),
    (5, 2, 2, None, (2, 3)),
    (4, 1, None, None, (4,)),
])
def test_stage_split_counts(n, pp, first, last, counts):
    split = stage_split(n, pp, first, last)
    assert split.counts == counts and split.num_layers == n
    assert split.is_even == (len(set(counts)) == 1)


def test_describe():
    assert StageSplit(16, 7, 8, 7).describe() == "7 + 14x8 + 7"
    assert StageSplit(2, 2, 3, 3).describe() == "2 + 3"
    assert StageSplit(4, 8, 8, 8).describe() == "4x8"


# (n, pp, vpp, first, last) -> (field, text): the rules Megatron-LM's TransformerConfig applies (and orch's two
# stricter ones: pp >= 2, every middle stage at least one layer).
ISSUES = [
    ((126, 16, 1, 0, 7), "first", "first_stage_layers(0) must be >= 1"),
    ((126, 16, 1, 7, -1), "last", "last_stage_layers(-1) must be >= 1"),
    ((4, 1, 1, 4, None), "first", "needs pp >= 2, got pp(1)"),
    ((5, 2, 1, 2, 2), "first", "first_stage_layers(2) + last_stage_layers(2) = 4 != num_layers(5) with pp(2)"),
    ((126, 16, 1, 6, 7), "first", "= 113 middle layers % 14 middle stages (pp(16) - 2) = 1, must be 0"),
    ((126, 16, 1, 7, None), "first", "= 119 middle layers % 15 middle stages (pp(16) - 1) = 14"),
    ((126, 16, 1, None, 7), "last", "num_layers(126) - last_stage_layers(7) = 119 middle layers"),
    ((126, 16, 1, 60, 60), "first", "6 middle layers for 14 middle stage(s)"),
    ((4, 3, 1, 3, 3), "first", "-2 middle layers for 1 middle stage(s)"),     # Megatron: -2 % 1 == 0 passes
    ((5, 2, 1, 5, None), "first", "0 middle layers for 1 middle stage(s)"),
    ((126, 16, 2, 7, 7), "first", "first_stage_layers(7) % virtual_pipeline(2) = 1"),
    ((21, 3, 2, 4, 5), "last", "last_stage_layers(5) % virtual_pipeline(2) = 1"),
    ((126, 16, 4, 12, 16), "vpp", "= 7 layers each, % virtual_pipeline(4) = 3"),
]


@pytest.mark.parametrize("args,field,text", ISSUES, ids=[i[2][:40] for i in ISSUES])
def test_split_issue(args, field, text):
    issues = split_issues(*args)
    assert issues and issues[0].field == field and text in issues[0].message, issues
    assert issues[0].hint


def test_valid_splits_have_no_issues():
    assert split_issues(126, 16, 1, 7, 7) == []
    assert split_issues(126, 16, 2, 6, 8) == []
    assert split_issues(5, 2, 1, 2, 3) == []
    assert split_issues(32, 4, 2, None, None) == []    # the even rule is separate


def test_even_rule_hint_names_the_balanced_split():
    issue = even_split_issue(126, 16)
    assert issue.field == "pp" and "num_layers(126) % pp(16) = 14, must be 0" in issue.message
    assert ("set parallelism.first_stage_layers: 7 and parallelism.last_stage_layers: 7 (14 middle stages of 8)"
            in issue.hint)
    assert "(no middle stage)" in even_split_issue(5, 2).hint
    assert "split unevenly" not in even_split_issue(33, 16).hint
    assert even_split_issue(128, 16) is None


def test_hint_for_a_broken_split_proposes_a_valid_one():
    [issue] = split_issues(126, 16, 1, 6, 7, SPEC_NAMES)
    assert "parallelism.first_stage_layers: 7 and parallelism.last_stage_layers: 7" in issue.hint
