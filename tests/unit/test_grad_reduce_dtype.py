"""training.grad_reduce_dtype: the engine defaults it resolves to, what orch generate writes for it, what validate
refuses, and what the cost model charges for it (wire bytes and Megatron's gradient buffer)."""
from __future__ import annotations


import pytest

from orchestrator.errors import SpecError
from orchestrator.estimate import estimate_layout
from orchestrator.estimate.engines import default_grad_reduce_dtype, grad_reduce_bytes
from orchestrator.layout import require_complete
from orchestrator.render.deepspeed import render_ds_config
from orchestrator.render.megatron import render_megatron_args
from orchestrator.spec_loader import parse_spec
from orchestrator.validate.deepspeed import check_ds_config
from orchestrator.validate.megatron import check_megatron_args
from tests.conftest import fixed_plan, spec_data

GPU = {"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8, "training.precision": "bf16",
       "parallelism.zero_stage": 1, "training.global_batch_size": 64}


def data(**overrides) -> dict:
    """TINY_SPEC on one 8-GPU H100 node, bf16, ZeRO-1, with dotted overrides (later ones win)."""
    return spec_data(**{**GPU, **overrides})


@pytest.mark.parametrize("engine,precision,cp,expected", [
    ("megatron", "bf16", 1, "fp32"), ("megatron", "fp8", 1, "fp32"), ("megatron", "fp16", 1, "fp16"),
    ("megatron", "fp32", 1, "fp32"), ("deepspeed", "bf16", 1, "bf16"), ("deepspeed", "fp16", 1, "fp16"),
    ("deepspeed", "fp32", 1, "fp32"), ("deepspeed", "bf16", 2, "fp32"), ("deepspeed", "fp16", 2, "fp32")])
def test_defaults_follow_the_engine(engine, precision, cp, expected):
    assert default_grad_reduce_dtype(engine, precision, cp) == expected


def test_deepspeed_ulysses_fp32_default_is_0_19_8s_rule():
    assert default_grad_reduce_dtype("deepspeed", "bf16", 2, "0.14.4") == "bf16"
    assert grad_reduce_bytes("megatron", "fp8") == 4 and grad_reduce_bytes("megatron", "fp8", "bf16") == 2


def _megatron(**extra):
    return render_megatron_args(fixed_plan(data(**{"training.engine": "megatron", **extra})))


def test_megatron_args_write_the_non_default_reduction_only():
    assert "--grad-reduce-in-bf16" not in _megatron()
    assert "--grad-reduce-in-bf16" not in _megatron(**{"training.grad_reduce_dtype": "fp32"})
    assert "--grad-reduce-in-bf16" in _megatron(**{"training.grad_reduce_dtype": "bf16"})
    fp16 = _megatron(**{"training.precision": "fp16", "training.grad_reduce_dtype": "fp32"})
    assert "--accumulate-allreduce-grads-in-fp32" in fp16 and "--grad-reduce-in-bf16" not in fp16
    assert "--accumulate-allreduce-grads-in-fp32" not in _megatron(**{"training.precision": "fp16"})


def test_ds_config_names_the_key_deepspeed_reads():
    base = {"training.engine": "deepspeed"}
    assert "communication_data_type" not in render_ds_config(fixed_plan(data(**base)))
    config = render_ds_config(fixed_plan(data(**base, **{"training.grad_reduce_dtype": "fp32"})))
    assert config["communication_data_type"] == "fp32" and "seq_parallel_communication_data_type" not in config
    ulysses = data(**base, **{"training.grad_reduce_dtype": "bf16", "parallelism.context": 2})
    config = render_ds_config(fixed_plan(ulysses))
    assert config["seq_parallel_communication_data_type"] == "bf16" and "communication_data_type" not in config


@pytest.mark.parametrize("precision,asked", [("bf16", "fp16"), ("fp8", "fp16"), ("fp16", "bf16"), ("fp32", "bf16"),
                                             ("fp32", "fp16")])
def test_megatron_refuses_what_it_cannot_reduce_in(precision, asked):
    with pytest.raises(SpecError) as err:
        parse_spec(data(**{"training.engine": "megatron", "training.precision": precision,
                           "training.grad_reduce_dtype": asked}))
    [problem] = [p for p in err.value.problems if p.path == "training.grad_reduce_dtype"]
    assert f"grad_reduce_dtype({asked})" in problem.message and "set training.grad_reduce_dtype" in problem.hint


def test_deepspeed_takes_any_of_the_three():
    for asked in ("fp32", "bf16", "fp16"):
        parse_spec(data(**{"training.engine": "deepspeed", "training.grad_reduce_dtype": asked}))


def test_static_checks_catch_what_the_engines_reject_or_ignore():
    problems = check_ds_config({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
                                "gradient_accumulation_steps": 1, "communication_data_type": "fp8"}, world_size=2)
    assert any(p.path.endswith("communication_data_type") and "get_communication_data_type" in p.message
               for p in problems)
    ignored = check_megatron_args(["--fp16", "--grad-reduce-in-bf16"], deep=False)
    assert any("ignored without --bf16" in p.message for p in ignored)


def _grads_and_wire(engine: str, **extra):
    """A ZeRO-0 data-parallel layout's gradient memory and data-parallel bytes (all-reduce of the gradients
    only: no parameter all-gather)."""
    spec = parse_spec(data(**{"training.engine": engine, "parallelism.zero_stage": 0, **extra}))
    est = estimate_layout(spec, require_complete(spec))
    return est.memory.grads_bytes, est.comm.dp_bytes


def test_megatron_charges_the_reduce_dtype_on_the_wire_and_in_the_gradient_buffer():
    fp32_grads, fp32_wire = _grads_and_wire("megatron")
    bf16_grads, bf16_wire = _grads_and_wire("megatron", **{"training.grad_reduce_dtype": "bf16"})
    assert fp32_grads == pytest.approx(2 * bf16_grads)
    assert fp32_wire == pytest.approx(2 * bf16_wire)
    assert _grads_and_wire("megatron", **{"training.grad_reduce_dtype": "fp32"}) == (fp32_grads, fp32_wire)
    fp8 = _grads_and_wire("megatron", **{"training.precision": "fp8"})   # --bf16 too: fp32 by default
    assert fp8 == (fp32_grads, fp32_wire)


def test_deepspeed_keeps_its_gradients_in_the_training_dtype_and_casts_for_the_wire():
    fp16 = _grads_and_wire("deepspeed", **{"training.precision": "fp16"})
    fp32 = _grads_and_wire("deepspeed", **{"training.precision": "fp16", "training.grad_reduce_dtype": "fp32"})
    assert fp16[0] == fp32[0] and fp32[1] == pytest.approx(2 * fp16[1])
