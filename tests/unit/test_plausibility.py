"""The MFU plausibility guard: a plan above what published runs reached on its GPU is flagged, not clamped."""
import dataclasses

from orchestrator.catalog.gpus import GPUS
from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.plausibility import mfu_bound, mfu_warnings
from orchestrator.planner import search
from orchestrator.spec_loader import parse_spec

A100 = GPUS["a100-80gb"]


def test_bound_is_the_best_published_mfu_of_a_model_at_least_as_large():
    assert mfu_bound(A100, 175e9) == (0.563, 1000e9)      # 175B: the 530B and 1T runs count, the 7B does not
    assert mfu_bound(A100, 1.7e9) == (0.6423, 6.66e9)     # small model: every run counts
    assert mfu_bound(A100, 2e12) == (0.563, 1000e9)       # beyond the largest run: its figure
    assert mfu_bound(GPUS["l40s"], 7e9) is None           # no published figure checked: no bound


def test_warning_only_above_the_bound_and_only_for_16_bit_training():
    assert mfu_warnings(A100, "bf16", 175e9, 0.55) == []
    [line] = mfu_warnings(A100, "bf16", 175e9, 0.60)
    assert "60.0%" in line and "56.3%" in line and "Megatron-LM README" in line
    assert mfu_warnings(A100, "fp8", 175e9, 0.60) == []   # the published figures are 16-bit


def _spec():
    return parse_spec({"name": "s", "model": {"preset": "gpt3-1.7b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 4, "gpus_per_node": 8},
                       "training": {"global_batch_size": 512, "precision": "bf16"}})


def test_planner_flags_the_chosen_layout_exactly_when_its_mfu_beats_the_bound():
    result = search(_spec(), top_k=1)
    bound = mfu_bound(A100, 1.7e9)[0]
    assert result.chosen.mfu > bound                       # the default cost model's all-open 1.7B pick
    assert len(result.warnings) == 1 and result.warnings[0] in result.reasons
    slow = search(_spec(), top_k=1, cost=dataclasses.replace(CostModel(), matmul_efficiency=0.5))
    assert slow.chosen.mfu < bound and slow.warnings == []
