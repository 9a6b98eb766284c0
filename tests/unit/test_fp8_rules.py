"""FP8 on the parts Transformer Engine trains it on: per-tensor FP8 from compute capability 8.9 (Ada, its support
matrix), so an L40S spec plans and generates FP8; an A100 (8.0) is refused, naming the parts that can."""
from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.plan import build_plan
from orchestrator.render.megatron import render_megatron_args
from orchestrator.spec_loader import parse_spec
from orchestrator.validate.megatron import check_megatron_args
from tests.conftest import spec_data

LLAMA = {"model.preset": "llama3-8b", "model.seq_length": 4096, "cluster.gpus_per_node": 8, "cluster.num_nodes": 2,
         "training.engine": "megatron", "training.global_batch_size": 64, "training.precision": "fp8",
         "parallelism.tensor": 2, "parallelism.sequence_parallel": True, "parallelism.zero_stage": 1,
         "parallelism.micro_batch_size": 1, "parallelism.recompute": "full"}


@pytest.mark.parametrize("recipe", [None, "tensorwise"])
def test_fp8_plans_on_the_l40s_and_runs_faster_than_bf16(recipe):
    data = spec_data(**{**LLAMA, "cluster.gpu": "l40s", "training.fp8_recipe": recipe})
    fp8 = build_plan(parse_spec(data), top_k=1)
    args = render_megatron_args(fp8)
    assert "--fp8-format" in args and not check_megatron_args(args, world_size=16)
    bf16 = build_plan(parse_spec(spec_data(**{**LLAMA, "cluster.gpu": "l40s", "training.precision": "bf16"})), top_k=1)
    assert fp8.chosen["tag"] == bf16.chosen["tag"]
    assert fp8.chosen["step_time_s"] < bf16.chosen["step_time_s"]


def test_fp8_on_an_a100_names_the_parts_that_train_it():
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**{**LLAMA, "cluster.gpu": "a100-80gb"}))
    problem = next(p for p in info.value.problems if p.path == "training.precision")
    assert "Ada, Hopper or newer" in problem.message and "l40s" in problem.hint
