"""Cost model for MoE, context parallelism and FP8: closed forms, published parameter counts, the planner's
search over ep/etp/cp, and the published H100 runs (tests/data/published-moe-cp-fp8.json)."""
from __future__ import annotations

import statistics

import pytest

from orchestrator.estimate.context import attention_scale, context_layer_comm
from orchestrator.estimate.layer import LayerKey, rank_layer
from orchestrator.estimate.moe import all_to_all_s, expert_work, moe_host_s
from orchestrator.estimate.params import active_layer_matrix_params, estimate_params, model_shape
from orchestrator.estimate.step import EstimateContext, estimate_layout
from orchestrator.layout import layout_from_spec
from orchestrator.plan import build_plan
from orchestrator.planner import search
from tests.published_layouts import layout_case_spec, load_layout_cases, predicted_layout
from orchestrator.spec_loader import parse_spec
from tests.conftest import ROOT

CASES = load_layout_cases(ROOT / "tests" / "data" / "published-moe-cp-fp8.json")


def spec(preset: str, nodes: int = 8, **parallelism):
    return parse_spec({"name": "t", "model": {"preset": preset},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": nodes, "gpus_per_node": 8},
                       "training": {"global_batch_size": 256}, "parallelism": parallelism})


@pytest.mark.parametrize("preset,total_b,active_b", [
    ("mixtral-8x7b", 46.7, 12.9),      # Jiang et al. 2024: 47B total, 13B active
    ("mixtral-8x22b", 140.6, 39.2),    # Mistral: 141B total, 39B active
    ("qwen3-30b-a3b", 30.5, 3.3),      # Qwen3 report: 30.5B total, 3.3B active
    ("qwen3-235b-a22b", 235.1, 22.2),  # 235B total, 22B active
])
def test_total_and_active_parameters_match_the_published_counts(preset, total_b, active_b):
    shape = model_shape(spec(preset))
    p = estimate_params(shape)
    active = shape.num_layers * active_layer_matrix_params(shape) + p.embedding + p.output_layer
    assert p.total / 1e9 == pytest.approx(total_b, rel=0.01)
    assert active / 1e9 == pytest.approx(active_b, rel=0.02)


def test_experts_shard_over_ep_and_their_states_over_edp():
    s = spec("mixtral-8x7b", tensor=1, pipeline=1, expert=8, expert_tensor=1, zero_stage=1, micro_batch_size=1,
             sequence_parallel=False,
             recompute="full", virtual_pipeline=1, offload="none", context=1)
    lay = layout_from_spec(s)
    shape = model_shape(s)
    one = estimate_params(shape, 1, 1, None, 1, 1).per_gpu
    eight = estimate_params(shape, 1, 1, None, 8, 1).per_gpu
    experts = 32 * 8 * 3 * 4096 * 14336
    assert one - eight == pytest.approx(experts * 7 / 8, rel=1e-6)
    assert lay.edp == 8 and estimate_layout(s, lay).fits


def test_expert_work_and_all_to_all_placement():
    shape = model_shape(spec("mixtral-8x7b"))
    w = expert_work(shape, tp=2, cp=1, ep=8, etp=1, mb=1)
    assert w.tokens == 4096 // 2 and w.local_experts == 1 and w.routed_rows == pytest.approx(2048 * 2 * 1.1)
    ctx = EstimateContext.of(spec("mixtral-8x7b"))
    from orchestrator.estimate.moe import expert_group_placement
    inside, across = expert_group_placement(8, 1, 8), expert_group_placement(8, 2, 8)
    assert inside.num_nodes == 1 and across.num_nodes == 2
    assert all_to_all_s(1e8, across, ctx.hw) > 2 * all_to_all_s(1e8, inside, ctx.hw)


def test_context_parallel_attention_and_ring():
    shape = model_shape(spec("llama3-8b-128k"))
    assert attention_scale(shape, 1) == 1 and attention_scale(shape, 4) == pytest.approx(4, rel=0.01)
    ctx = EstimateContext.of(spec("llama3-8b-128k"))
    long = context_layer_comm(shape, ctx.hw, 1, 4, 1, attention_forward_s=1.0)
    short = context_layer_comm(shape, ctx.hw, 1, 4, 1, attention_forward_s=1e-6)
    assert long.exposed_s == 0 < short.exposed_s <= short.seconds and long.bytes == short.bytes > 0


def test_context_parallelism_divides_activation_memory():
    base = dict(tensor=4, pipeline=1, zero_stage=1, micro_batch_size=1, recompute="full", virtual_pipeline=1,
                offload="none", sequence_parallel=True)
    one = estimate_layout(s1 := spec("llama3-8b-128k", nodes=1, **base, context=1), layout_from_spec(s1))
    two = estimate_layout(s2 := spec("llama3-8b-128k", nodes=2, **base, context=2), layout_from_spec(s2))
    assert two.memory.activations_bytes == pytest.approx(one.memory.activations_bytes / 2, rel=0.05)
    assert two.comm.cp_bytes > 0 and one.comm.cp_bytes == 0


def test_fp8_is_faster_than_bf16_and_costs_a_weight_copy():
    fixed = dict(tensor=1, pipeline=1, zero_stage=1, micro_batch_size=1, recompute="full", virtual_pipeline=1,
                 sequence_parallel=False,
                 offload="none", context=1)
    s = spec("llama3-8b", nodes=1, **fixed)
    f = parse_spec({**_data(s), "training": {"global_batch_size": 256, "precision": "fp8"}})
    bf16, fp8 = estimate_layout(s, layout_from_spec(s)), estimate_layout(f, layout_from_spec(f))
    assert 1.2 < fp8.tokens_per_s / bf16.tokens_per_s < 2.0
    # One fp8 byte per weight of the 32 layers (6.98e9); the embedding and the output layer (2 x 128256 x 4096)
    # run no fp8 GEMM and keep no fp8 copy.
    assert fp8.memory.params_bytes - bf16.memory.params_bytes == pytest.approx(6.98e9, rel=0.01)


def test_fine_grained_moe_layer_takes_at_least_its_host_launch_time():
    """128 experts on few expert ranks: a layer launches per local expert GEMMs (and FP8 casts) from the
    host; it cannot run faster than that, and spreading the experts over more ranks shortens it."""
    s = spec("qwen3-30b-a3b", nodes=1)
    ctx = EstimateContext.of(s)
    key = LayerKey(tp=1, cp=1, ep=1, etp=1, mb=1, sp=False, recompute="none")
    host_f, host_b = moe_host_s(ctx.shape, 1, True)
    assert host_f > 1e-3 and moe_host_s(ctx.shape, 8, True)[0] < host_f / 4
    layer = rank_layer(ctx.shape, ctx.hw, "h100-sxm", "fp8", key).time
    assert layer.forward_s >= host_f * 0.99 and layer.backward_s >= host_b * 0.99


def test_fp8_keeps_routed_expert_inputs_in_fp8_so_nvidias_layout_fits_without_recompute():
    """Megatron-Bridge's 25.09 Qwen3-30B-A3B H100 FP8 harness runs pp 2, vp 24, ep 8, mb 2 with recompute off
    (scripts/performance/configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml, commit fa0315ae2): the grouped expert
    linears keep their inputs (the routed token copies) in fp8."""
    case = next(c for c in CASES if c["id"] == "mbridge2509_qwen3_30b_a3b_tokendrop")
    assert case["mbs"] == 2
    data = _data(layout_case_spec(case))
    data["parallelism"].update(recompute="none", expert_tensor=1)
    fp8 = parse_spec(data)
    bf16 = parse_spec({**data, "training": {**data["training"], "precision": "bf16", "fp8_recipe": None}})
    mem8, mem16 = (estimate_layout(x, layout_from_spec(x)).memory for x in (fp8, bf16))
    assert mem8.fits and mem16.activations_bytes - mem8.activations_bytes > 8 * 2**30


def _data(s):
    from orchestrator.spec import spec_to_data
    return spec_to_data(s)


def test_planner_searches_ep_etp_cp_and_plan_json_carries_them():
    result = search(spec("mixtral-8x7b"), top_k=50)
    tried = {(c.layout.ep, c.layout.etp, c.layout.cp) for c in result.candidates}
    assert len({ep for ep, _, _ in tried}) > 1
    chosen = result.chosen.to_dict()
    assert {"ep", "etp", "cp"} <= set(chosen) and {"ep_bytes", "ep_s", "cp_bytes", "cp_s"} <= set(chosen["comm"])
    assert chosen["ep"] > 1 and chosen["comm"]["ep_bytes"] > 0


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_published_run_plans_without_refusal_and_fits(case):
    plan = build_plan(layout_case_spec(case), top_k=1)
    assert plan.chosen["memory"]["fits"]
    assert (plan.layout.tp, plan.layout.pp, plan.layout.cp, plan.layout.micro_batch_size) == \
        (case["tp"], case["pp"], case["cp"], case["mbs"] or plan.layout.micro_batch_size)   # null: unpublished
    assert plan.layout.vpp == case["vp"] or case["vp"] is None or case["pp"] == 1
    assert plan.layout.ep == (case["ep"] or 1)


def _errors(group: str) -> list[float]:
    out = []
    for case in (c for c in CASES if c["group"] == group):
        s = layout_case_spec(case)
        predicted = predicted_layout(case)["tokens_per_s"] / s.world_size
        out.append(abs(predicted / case["tokens_per_s_per_gpu"] - 1))
    return out


@pytest.mark.parametrize("group", ["fp8-dense", "context"])
def test_dense_fp8_and_context_parallel_runs_within_the_issue_tolerance(group):
    """Mean |error| <= 20% and every case <= 30% (issue 10). The MoE group does not meet it yet: see
    benchmarks/moe_cp_fp8_accuracy.py (NVIDIA's dropless Qwen3-30B-A3B FP8 runs at pp 2 / ep 8 are 2.4x
    slower than the physics here predicts; the other ten MoE runs within 23%)."""
    errors = _errors(group)
    assert statistics.mean(errors) <= 0.20 and max(errors) <= 0.30, errors


def test_ulysses_degree_reaches_ds_config_and_its_batch_check():
    from orchestrator.render.deepspeed import render_ds_config
    from orchestrator.validate.deepspeed import check_ds_config
    from tests.conftest import fixed_plan, spec_data

    plan = fixed_plan(spec_data(**{"parallelism.context": 2, "cluster.gpus_per_node": 4}))   # deepspeed on cpu
    config = render_ds_config(plan)
    assert config["sequence_parallel_size"] == 2 and plan.layout.dp == 2
    assert check_ds_config(config, world_size=4, model_parallel_size=1) == []
    assert check_ds_config({**config, "sequence_parallel_size": 1}, world_size=4, model_parallel_size=1)


def test_planner_advises_fp8_only_where_the_rules_allow_it():
    hopper = search(spec("llama3-8b", nodes=1))
    assert any(r.startswith("fp8: training.precision: fp8 would run this layout") for r in hopper.reasons)
    ampere = parse_spec({"name": "t", "model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 256},
                         "cluster": {"gpu": "a100-80gb", "num_nodes": 1, "gpus_per_node": 8}})
    assert not any(r.startswith("fp8") for r in search(ampere).reasons)


def test_a_case_without_preset_names_its_shape_and_leaves_unpublished_fields_open():
    """Megatron-LM's README runs (group bf16-dense) publish the shape, tp, pp and dp, not the micro-batch or
    the interleaving: the spec carries the shape and leaves those two to the planner."""
    case = next(c for c in CASES if c["id"] == "mlm0715_gpt_70b_bf16")
    spec = layout_case_spec(case)
    assert (spec.model.num_layers, spec.model.hidden_size, spec.model.tie_embeddings) == (84, 8192, False)
    assert spec.parallelism.micro_batch_size is None and spec.parallelism.virtual_pipeline is None
    assert spec.training.precision == "bf16" and spec.world_size == case["gpus"]


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES if "gpt_oss" in c["id"]])
def test_gpt_oss_runs_carry_the_model_cards_shape_and_the_recipes_layout(case_id):
    """gpt-oss-120b has no preset (orch cannot express its sliding-window layers): its case names the shape, whose
    parameter counts are the model card's (OpenAI 2025, arXiv 2508.10925, Table 1: 116.83B total, 5.13B active,
    which leaves out the input embedding), and the layout of Megatron-Bridge's H100 BF16 recipe: tp 1, pp 4 without
    virtual stages, ep 8, micro-batch 1, BF16, the EP all-to-all not overlapped."""
    case = next(c for c in CASES if c["id"] == case_id)
    shape = model_shape(layout_case_spec(case))
    p = estimate_params(shape)
    active = shape.num_layers * active_layer_matrix_params(shape) + p.output_layer
    assert p.total / 1e9 == pytest.approx(116.83, rel=0.005)
    assert active / 1e9 == pytest.approx(5.13, rel=0.01)
    assert shape.q_size == 4096 != shape.hidden_size and shape.bias
    chosen = predicted_layout(case)
    assert chosen["tag"].startswith("tp1-pp4-ep8-") and chosen["tag"].endswith("-mb1")
    assert case["precision"] == "bf16" and case["ep_a2a_overlap"] is False
