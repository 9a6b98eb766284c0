"""MoE, context-parallel and FP8 spec fields: presets, defaults, the layout they fix, plan.json fields."""
from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.layout import layout_from_spec
from orchestrator.spec import spec_sha256, spec_to_data
from orchestrator.spec_loader import parse_spec
from tests.conftest import spec_data

MOE = {"model.preset": "tiny-moe"}
GPU = {"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8, "training.global_batch_size": 16,
       "training.precision": "bf16"}


def test_mixtral_preset_resolves_moe_defaults():
    spec = parse_spec(spec_data(**{"model.preset": "mixtral-8x7b", "cluster.gpu": "h100-sxm",
                                   "cluster.gpus_per_node": 8, "training.precision": "bf16", "training.global_batch_size": 16}))
    moe = spec.model.moe
    assert (moe.num_experts, moe.router_topk, moe.ffn_hidden_size, moe.capacity_factor) == (8, 2, 14336, None)


def test_moe_override_keeps_the_rest_of_the_preset():
    spec = parse_spec(spec_data(**MOE, **{"model.moe": {"router_topk": 1}}))
    assert (spec.model.moe.num_experts, spec.model.moe.router_topk) == (4, 1)


def test_qwen3_kv_channels_and_expert_ffn_default():
    spec = parse_spec(spec_data(**{"model.preset": "qwen3-30b-a3b", "model.moe": {"ffn_hidden_size": None},
                                   "cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8,
                                   "training.global_batch_size": 16}))
    assert spec.model.kv_channels == 128 and spec.model.moe.ffn_hidden_size == spec.model.ffn_hidden_size


def test_new_fields_do_not_change_a_dense_spec_hash():
    """Added fields are left out of the resolved spec while unset: existing run dirs keep their hash."""
    data = spec_data()
    assert "context" not in spec_to_data(parse_spec(data))["parallelism"]
    explicit = spec_data(**{"parallelism.context": 1})
    assert spec_sha256(parse_spec(data)) != spec_sha256(parse_spec(explicit))  # written: recorded


def test_layout_carries_ep_etp_cp():
    spec = parse_spec(spec_data(**MOE, **{"parallelism.expert": 2, "parallelism.expert_tensor": 1}))
    lay = layout_from_spec(spec)
    assert (lay.cp, lay.ep, lay.etp, lay.dp) == (1, 2, 1, 2) and "ep2" in lay.tag()


def test_context_open_unless_tensor_and_pipeline_fixed():
    open_cp = parse_spec(spec_data(**{"parallelism.tensor": None}))
    assert layout_from_spec(open_cp).cp is None
    assert layout_from_spec(parse_spec(spec_data())).cp == 1


@pytest.mark.parametrize("overrides,path,words", [
    ({"parallelism.expert": 2}, "parallelism.expert", "dense"),
    ({**MOE, "parallelism.expert": 3, "cluster.gpus_per_node": 3, "training.global_batch_size": 6},
     "parallelism.expert", "num_experts(4) % ep(3)"),
    ({"parallelism.context": 2, "parallelism.data": 2}, "parallelism.data", "cp(2)"),
    ({**MOE, "model.moe": {"router_topk": 5}}, "model.moe.router_topk", "router_topk(5) > num_experts(4)"),
    ({**MOE, "model.moe": {"first_dense_layers": 4}}, "model.moe.first_dense_layers", "no layer would be MoE"),
    # DeepSpeed engine (the CPU default): DeepSpeed-MoE's top-2 gate before 0.15.0, ep | dp, Ulysses heads and sequence
    ({**MOE, "model.moe": {"router_topk": 3}, "training.engine_version": "0.14.4"}, "model.moe.router_topk",
     "before 0.15.0 supports top-1 and top-2"),
    ({**MOE, "parallelism.tensor": 2, "parallelism.expert": 4, "cluster.gpus_per_node": 4}, "parallelism.expert",
     "dp(2) % ep(4)"),
    ({"parallelism.context": 2, "parallelism.data": 1, "model.num_attention_heads": 2, "model.hidden_size": 128,
      "model.num_query_groups": 1}, "parallelism.context", "num_query_groups(1)"),
    ({"parallelism.context": 2, "parallelism.data": 1, "model.seq_length": 127}, "parallelism.context",
     "seq_length(127) % 2"),
    # Megatron engine on GPUs: folding, SP with MoE and tp, 2*cp chunks, fused attention, topology, FP8
    ({**GPU, "model.preset": "mixtral-8x7b", "parallelism.tensor": 2, "parallelism.expert": 8,
      "parallelism.expert_tensor": 2, "parallelism.sequence_parallel": True}, "parallelism.expert",
     "etp(2) * ep(8) = 16 does not divide"),
    ({**GPU, "model.preset": "mixtral-8x7b", "parallelism.tensor": 2, "parallelism.expert": 4},
     "parallelism.sequence_parallel", "MoE with tp(2)"),
    ({**GPU, "parallelism.context": 4, "parallelism.tensor": 2, "model.seq_length": 12}, "parallelism.context",
     "seq_length(12) % 8"),
    ({**GPU, "parallelism.context": 2, "model.flash_attention": False}, "parallelism.context", "fused attention"),
    ({**GPU, "model.preset": "qwen3-30b-a3b", "cluster.num_nodes": 2, "parallelism.expert": 4,
      "parallelism.expert_tensor": 1, "parallelism.tensor": 1, "parallelism.pipeline": 1, "cluster.gpus_per_node": 6,
      "training.global_batch_size": 24}, "parallelism.expert", "straddle"),
    ({**GPU, "model.preset": "tiny-moe", "parallelism.tensor": 2, "parallelism.expert": 2,
      "parallelism.expert_tensor": 2, "parallelism.sequence_parallel": True}, "parallelism.expert_tensor",
     "linear biases"),
    ({"training.precision": "fp8", "cluster.gpu": "cpu"}, "training.precision", "Transformer Engine"),
    ({**GPU, "training.precision": "fp8", "cluster.gpu": "a100-80gb"}, "training.precision", "Ada, Hopper or newer"),
    ({**GPU, "training.precision": "fp8", "model.hidden_size": 120, "model.num_attention_heads": 4},
     "training.precision", "multiple of 16"),
])
def test_moe_and_context_rules(overrides, path, words):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**overrides))
    assert any(p.path == path and words in p.message for p in info.value.problems), info.value.problems


def test_deepspeed_moe_takes_any_topk_since_0_15():
    """DeepSpeed 0.15.0 (PR #5881) added topkgating: TopKGate takes k > 2, so top-8 (Qwen3, OLMoE) plans with
    engine deepspeed at the release orch writes for (the layout sweep found it refused)."""
    data = spec_data(**MOE, **{"model.moe": {"router_topk": 3}, "parallelism.expert": 2})
    assert parse_spec(data).model.moe.router_topk == 3
    assert parse_spec(spec_data(**MOE, **{"model.moe": {"router_topk": 3}, "training.engine_version": "0.15.0"}))


def test_fp8_is_a_precision():
    spec = parse_spec(spec_data(**{**GPU, "training.precision": "fp8"}))
    assert spec.training.precision == "fp8"
