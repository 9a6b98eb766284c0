"""Every published layout is judged to fit, and layouts that truly do not fit are still refused.

Published runs: the throughput rows of the reference file (Narayanan et al. 2021 Tables 1 and 2), the extra
published runs (BLOOM-176B, MT-NLG 530B on 280/350/420 nodes, the 530B ZeRO-3 rows of Table 2, GPT-NeoX-20B,
OPT-175B, Megatron-LM's GPT-3 175B example, GLM-130B, torchtitan's FSDP2 Llama rows, llm-foundry's 64-GPU MPT
rows) and the MoE / context-parallel / FP8 H100 runs. Each ran, so each must fit the device's capacity in the
planner's memory model (MemoryEstimate.fits); the planner's headroom is a policy for choosing, which a published run
may cross (llm-foundry's MPT-1b without checkpointing does; search warns then).
"""
from __future__ import annotations

import pytest

from orchestrator.plan import build_plan
from orchestrator.planner import NoFitError
from tests.published import EXTRA_CASES, load_cases, published_estimate, zero3_530b_case
from tests.published_layouts import layout_case_spec, load_layout_cases, predicted_layout
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
PUBLISHED = [*load_cases(DATA / "published-cases.json", "throughput"), *EXTRA_CASES]


@pytest.mark.parametrize("case", PUBLISHED, ids=lambda c: c["id"])
def test_published_layout_fits(case):
    """No false out-of-memory, on every pipeline stage kind (the floor of each: MemoryEstimate.fits)."""
    est = published_estimate(case)          # NoFitError when no plausible micro-batch fits
    assert est.fits and est.memory.floor_peak_bytes <= est.memory.capacity_bytes


@pytest.mark.parametrize("case", load_layout_cases(DATA / "published-moe-cp-fp8.json"), ids=lambda c: c["id"])
def test_published_moe_cp_fp8_layout_fits(case):
    """As the case ran (its dropout, EP overlap and FP8 recipe: predicted_layout), and as orch would plan it."""
    assert predicted_layout(case)["memory"]["fits"] is True
    assert build_plan(layout_case_spec(case), top_k=1).chosen["memory"]["fits"] is True


@pytest.mark.parametrize("gpus, batch, micro_batch", [
    (640, 5120, 8),     # Table 2's 640-GPU 530B ZeRO-3 row at twice its micro-batch: ~100 GiB of activations
    (320, 1280, 4),     # the same micro-batch on half the GPUs: twice the model states per GPU
])
def test_truly_non_fitting_530b_zero3_layouts_are_refused(gpus, batch, micro_batch):
    """Beyond the capacity as the rows ran (DeepSpeed 0.3's ZeRO-3 buffers, published_estimate): refused."""
    case = zero3_530b_case(gpus, batch, micro_batch, 0.0)
    with pytest.raises(NoFitError, match="capacity per GPU"):
        published_estimate(case)
