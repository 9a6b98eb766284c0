"""What real runs set (issue 18): dropout and Megatron's per-module / partial full recompute, from the spec
through the rules, the rendered arguments, the static checker, the cost model and the planner."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.estimate.activations import layer_activation_bytes, partial_full_recompute_bytes
from orchestrator.estimate.moe import expert_work, moe_mlp_times
from orchestrator.estimate.params import ModelShape, MoEShape, model_shape
from orchestrator.estimate.recompute import module_savings
from orchestrator.estimate.step import EstimateContext, estimate, full_recompute_share, rank_layer_of
from orchestrator.layout import Layout, layout_from_spec
from orchestrator.plan import with_layout
from orchestrator.planner import _recompute_options, enumerate_layouts
from orchestrator.render.megatron import render_megatron_args, render_megatron_config
from orchestrator.spec_loader import parse_spec
from orchestrator.validate.megatron import check_megatron_args
from tests.conftest import EXAMPLES, fixed_plan, spec_data
from tests.megatron_layouts import MEGATRON_LAYOUTS

MIXTRAL = MEGATRON_LAYOUTS["mixtral-tp2-ep8-sp"]
GIB = 2 ** 30


def _problems(**overrides):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**overrides))
    return info.value.problems


def _one(problems, path, text):
    found = [p for p in problems if p.path == path and text in p.message]
    assert found, [str(p) for p in problems]
    assert found[0].hint
    return found[0]


# --- spec fields and rules ------------------------------------------------------------------------

def test_misspelt_module_gets_did_you_mean():
    problems = _problems(**MIXTRAL, **{"parallelism.recompute": "selective",
                                       "parallelism.recompute_modules": ["moe", "layernrom"]})
    assert "did you mean 'layernorm'" in _one(problems, "parallelism.recompute_modules[1]", "not allowed").hint


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_dropout_bounds(value):
    _one(_problems(**MIXTRAL, **{"model.hidden_dropout": value}), "model.hidden_dropout", str(value))


RULE_CASES = [
    ({**MIXTRAL, "parallelism.recompute": "full", "parallelism.recompute_modules": ["moe"]},
     "parallelism.recompute_modules", "recompute_modules(moe) needs recompute: selective, got recompute(full)"),
    ({**MIXTRAL, "parallelism.recompute": "selective", "parallelism.recompute_method": "block"},
     "parallelism.recompute_method", "recompute_method(block) needs recompute: full, got recompute(selective)"),
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": "full", "parallelism.recompute_num_layers": 7},
     "parallelism.recompute_num_layers", "recompute_num_layers(7) layers, which do not divide the 6 layers"),
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": "full", "parallelism.recompute_method": "uniform",
      "parallelism.recompute_num_layers": 4}, "parallelism.recompute_num_layers", "do not divide the 6 layers"),
    ({**MIXTRAL, "parallelism.recompute": "selective", "parallelism.recompute_modules": ["mla_up_proj"]},
     "parallelism.recompute_modules[0]", "multi-latent attention"),
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": "selective",
      "parallelism.recompute_modules": ["moe_act"]}, "parallelism.recompute_modules[0]", "needs a MoE model"),
    ({**MIXTRAL, "training.precision": "fp8", "parallelism.recompute": "selective",
      "parallelism.recompute_modules": ["moe", "layernorm"]}, "parallelism.recompute_modules[1]", "delayed scaling"),
    ({**MIXTRAL, "parallelism.recompute": "selective", "parallelism.recompute_modules": ["moe", "moe"]},
     "parallelism.recompute_modules", "lists moe more than once"),
    ({"training.fp8_recipe": "tensorwise"}, "training.fp8_recipe", "needs precision: fp8"),
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": "selective",
      "parallelism.distribute_saved_activations": True}, "parallelism.distribute_saved_activations",
     "needs recompute: full"),
    ({"parallelism.recompute": "selective", "parallelism.recompute_modules": ["core_attn"]},
     "parallelism.recompute_modules", "a Megatron option; engine(deepspeed)"),
]


@pytest.mark.parametrize("overrides,module,why", [
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute_modules": ["layernorm"]}, "layernorm",
     "recomputes nothing in a dense Transformer Engine layer"),
    ({**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute_modules": ["moe"]}, "moe", "this model has none"),
    ({**MIXTRAL, "cluster.num_nodes": 4, "parallelism.recompute_modules": ["mlp"]}, "mlp",   # 32 GPUs: it fits
     "every layer of this model is a MoE layer"),
])
def test_modules_megatron_accepts_but_that_recompute_nothing_plan_with_a_warning(overrides, module, why):
    """Megatron-Core accepts these (core_v0.16.1 transformer_config.py raises only for moe_act without the
    grouped GEMM, mla_up_proj without MLA and delayed-scaling FP8): the layout sweep found orch refusing them.
    They plan and generate as given, with one warning naming the module, and save no memory."""
    from orchestrator.plan import build_plan
    from orchestrator.planner import search

    spec = parse_spec(spec_data(**{**overrides, "parallelism.recompute": "selective"}))
    plan, warnings = build_plan(spec, top_k=1), search(spec, top_k=1).warnings
    notes = [w for w in warnings if w.startswith("parallelism.recompute_modules[0]")]
    assert len(notes) == 1 and module in notes[0] and why in notes[0], warnings
    args = render_megatron_args(plan)
    assert args[args.index("--recompute-modules") + 1] == module
    assert not check_megatron_args(args, world_size=spec.world_size)
    bare = parse_spec(spec_data(**{**overrides, "parallelism.recompute": "none", "parallelism.recompute_modules": None}))
    assert plan.chosen["memory"]["activations_bytes"] == build_plan(bare, top_k=1).chosen["memory"]["activations_bytes"]


@pytest.mark.parametrize("method,n,extra", [
    ("block", 7, {}),           # more than the chunk's 6 layers: Megatron-Core recomputes all six
    ("block", 2, {}),
    ("uniform", 3, {}),         # 3 divides the 6 layers of each chunk
    ("uniform", 2, {"parallelism.virtual_pipeline": 1, "parallelism.pipeline": 2}),
])
def test_recompute_num_layers_megatron_accepts(method, n, extra):
    """What Megatron-Core's _checkpointed_forward runs (the layout sweep found block with n > the chunk's
    layers refused): block takes any count, uniform a group size dividing each chunk's layers."""
    spec = parse_spec(spec_data(**{**MEGATRON_LAYOUTS["pp2-vpp2"], **extra, "parallelism.recompute": "full",
                                   "parallelism.recompute_method": method, "parallelism.recompute_num_layers": n}))
    assert spec.parallelism.recompute_num_layers == n


def test_recompute_num_layers_uniform_counts_uneven_and_accounted_chunks():
    """Uneven first / last stages and the embedding / loss accounted for make chunks of other sizes: uniform's
    group must divide each of them."""
    from orchestrator.recompute_rules import chunk_layer_counts

    assert chunk_layer_counts(24, Layout(pp=2, vpp=2)) == {6}
    assert chunk_layer_counts(30, Layout(pp=4, vpp=1, first_stage_layers=6, last_stage_layers=6)) == {6, 9}
    assert chunk_layer_counts(126, Layout(pp=8, vpp=4, account_split=True)) == {4, 3}
    assert chunk_layer_counts(30, Layout(pp=2, vpp=1, account_split=True)) == {15}
    assert chunk_layer_counts(30, Layout(pp=4, vpp=None)) is None


@pytest.mark.parametrize("overrides,path,text", RULE_CASES, ids=[c[2][:40] for c in RULE_CASES])
def test_rule_fires_with_operands(overrides, path, text):
    _one(_problems(**overrides), path, text)


# --- generate and validate -------------------------------------------------------------------------

def test_megatron_args_and_config_carry_modules_method_and_dropout():
    plan = fixed_plan(spec_data(**MEGATRON_LAYOUTS["mixtral-recompute-moe-layernorm"]))
    args = " ".join(render_megatron_args(plan))
    assert "--recompute-granularity selective --recompute-modules layernorm moe" in args \
        or "--recompute-granularity selective --recompute-modules moe layernorm" in args
    assert "--attention-dropout 0.0 --hidden-dropout 0.0" in args
    plan = fixed_plan(spec_data(**MEGATRON_LAYOUTS["pp2-full-block3-dropout"]))
    args = " ".join(render_megatron_args(plan))
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 3" in args
    assert "--attention-dropout 0.1 --hidden-dropout 0.1" in args
    config = render_megatron_config(plan)
    assert (config["recompute_method"], config["recompute_num_layers"], config["hidden_dropout"]) == ("block", 3, 0.1)
    assert check_megatron_args(render_megatron_args(plan), world_size=plan.world_size) == []


def _args_problems(extra: list[str]):
    plan = fixed_plan(spec_data(**MIXTRAL))
    return check_megatron_args(render_megatron_args(plan) + extra, world_size=plan.world_size)


def test_static_checker_knows_the_module_rules():
    [p] = _args_problems(["--recompute-granularity", "selective", "--recompute-modules", "moe", "layernrom"])
    assert "unknown recompute module 'layernrom'" in p.message and "layernorm" in p.hint
    [p] = _args_problems(["--recompute-modules", "moe"])
    assert "selective only" in p.message
    [p] = _args_problems(["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"])
    assert "--multi-latent-attention" in p.message
    [p] = _args_problems(["--recompute-granularity", "selective", "--recompute-num-layers", "2"])
    assert "must be unset" in p.message


def test_resolved_spec_keeps_the_planners_modules():
    spec = parse_spec(spec_data(**MIXTRAL))
    lay = dataclasses.replace(layout_from_spec(spec), recompute="selective", recompute_modules=("layernorm", "moe"))
    resolved = with_layout(spec, lay)
    assert resolved.parallelism.recompute_modules == ["layernorm", "moe"]
    assert layout_from_spec(resolved).recompute_modules == ("layernorm", "moe")


# --- the cost model ---------------------------------------------------------------------------------

def test_dropout_split_closed_form():
    """Hidden dropout: two 1-byte masks per layer; attention dropout: the unfused attention's mask and output."""
    base = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=256,
                      vocab_size=1000, seq_length=32, flash_attention=False)
    s, b, h, a, e = 32, 1, 64, 4, 2
    none = layer_activation_bytes(base, 1, False, "none", b, e)
    hidden = layer_activation_bytes(dataclasses.replace(base, dropout=0.1, attention_dropout=0.0), 1, False, "none", b, e)
    attention = layer_activation_bytes(dataclasses.replace(base, attention_dropout=0.1), 1, False, "none", b, e)
    both = layer_activation_bytes(dataclasses.replace(base, dropout=0.1), 1, False, "none", b, e)
    assert hidden - none == 2 * s * b * h
    assert attention - none == (e + 1) * a * s * s * b
    assert both - none == 2 * s * b * h + (e + 1) * a * s * s * b    # Korthikanti's 34 + 5 a s / h


def test_spec_dropout_reaches_the_shape():
    spec = parse_spec(spec_data(**MEGATRON_LAYOUTS["pp2-full-block3-dropout"]))
    shape = model_shape(spec)
    assert (shape.dropout, shape.attention_dropout_p, shape.recompute_method, shape.recompute_num_layers) == \
        (0.1, 0.1, "block", 3)


MOE = ModelShape(num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=4096,
                 vocab_size=32000, seq_length=2048, gated_mlp=True,
                 moe=MoEShape(num_experts=8, router_topk=2, expert_ffn=2048, shared_ffn=1024, first_dense_layers=1))


def test_module_savings_closed_forms():
    e, s, h, f, fs, fd = 2, 2048, 1024, 2048, 1024, 4096
    rows = expert_work(MOE, 1, 1, 1, 1, 1).routed_rows
    x = e * s * h
    share = 3 / 4   # one dense layer of four

    def saved(*mods, fused=True):
        return module_savings(dataclasses.replace(MOE, recompute_modules=mods), 1, 1, 1, 1, 1, False, e, fused)

    assert saved("layernorm").stored_bytes == share * x
    assert saved("layernorm", fused=False).stored_bytes == 2 * x
    assert saved("moe_act").stored_bytes == pytest.approx(share * e * rows * f)
    assert saved("shared_experts").stored_bytes == share * e * s * 3 * fs
    experts = e * rows * (h + 3 * f) + e * s * 3 * fs
    assert saved("moe").stored_bytes == pytest.approx(share * experts)
    assert saved("moe").working_bytes == pytest.approx(experts)
    assert saved("moe", "moe_act", "shared_experts").stored_bytes == saved("moe").stored_bytes   # subsumed
    assert saved("mlp").stored_bytes == (1 - share) * (e * s * 3 * fd + x)


def test_partial_full_recompute_closed_forms():
    inp, layer = 10, 100
    assert partial_full_recompute_bytes(inp, layer, 6, "uniform", 1) == (10, 100)
    assert partial_full_recompute_bytes(inp, layer, 6, "uniform", 4) == (2 * 10 / 6, 400)   # groups of 4 and 2
    assert partial_full_recompute_bytes(inp, layer, 6, "block", 2) == ((2 * 10 + 4 * 100) / 6, 100)
    assert partial_full_recompute_bytes(inp, layer, 6, "block", 9) == (10, 100)


def test_block_recompute_charges_its_share_of_the_layers():
    spec = parse_spec(spec_data(**MEGATRON_LAYOUTS["pp2-full-block3-dropout"]))
    lay = layout_from_spec(spec)
    ctx = EstimateContext.of(spec)
    assert full_recompute_share(ctx.shape, lay) == 3 / 6
    uniform = dataclasses.replace(ctx, shape=dataclasses.replace(ctx.shape, recompute_method="uniform"))
    assert rank_layer_of(ctx, lay).time.recompute_s == pytest.approx(rank_layer_of(uniform, lay).time.recompute_s / 2)
    assert estimate(ctx, lay).memory.activations_bytes > estimate(uniform, lay).memory.activations_bytes


def test_moe_recompute_redoes_the_block_forward():
    hw = EstimateContext.of(parse_spec(spec_data(**MIXTRAL))).hw
    plain = moe_mlp_times(MOE, hw, 1, 1, 1, 1, 1)
    redo = moe_mlp_times(dataclasses.replace(MOE, recompute_modules=("moe",)), hw, 1, 1, 1, 1, 1)
    assert plain.recompute_s == 0 and redo.recompute_s == pytest.approx(redo.forward_s)


def _mixtral_example(**parallelism):
    """examples/mixtral-8x7b-64xh100.yaml with its planned layout fixed, in bf16 (Megatron refuses layernorm
    recompute with the example's FP8 delayed scaling)."""
    data = yaml.safe_load((EXAMPLES / "mixtral-8x7b-64xh100.yaml").read_text())
    data["training"]["precision"] = "bf16"
    data["parallelism"] = {"tensor": 1, "pipeline": 2, "virtual_pipeline": 4, "expert": 8, "expert_tensor": 1,
                           "zero_stage": 1, "micro_batch_size": 1, "sequence_parallel": False, **parallelism}
    spec = parse_spec(data)
    return EstimateContext.of(spec), layout_from_spec(spec)


def test_moe_layernorm_recompute_lowers_the_mixtral_activations_by_the_expected_amount():
    ctx, lay = _mixtral_example(recompute="none")
    ctx_r, lay_r = _mixtral_example(recompute="selective", recompute_modules=["moe", "layernorm"])
    before, after = estimate(ctx, lay).memory, estimate(ctx_r, lay_r).memory
    e, s, h, f = 2, 4096, 4096, 14336
    rows = expert_work(ctx.shape, 1, 1, 8, 1, 1).routed_rows
    experts = e * rows * (h + 3 * f)        # permuted tokens + SwiGLU experts' activations, per MoE layer
    norm = e * s * h                        # the pre-MLP norm's output
    chunks = (2 - 0 - 1) * 2 + (4 - 1) * 2 + 1   # interleaved 1F1B, stage 0: (p - 1) * 2 + (v - 1) * p + 1
    layers_in_flight = chunks * 32 / 2 / 4
    expected = layers_in_flight * (experts + norm) - experts   # minus the one MoE block recomputed at a time
    assert before.activations_bytes - after.activations_bytes == pytest.approx(expected, rel=1e-6)
    assert (before.activations_bytes - after.activations_bytes) / GIB > 20


def test_planner_tries_moe_module_sets_where_megatron_accepts_them():
    spec = parse_spec(spec_data(**{**MIXTRAL, "parallelism.recompute": None}))
    options = _recompute_options(spec, layout_from_spec(spec))
    assert ("selective", ("layernorm", "moe")) in options and ("selective", ("layernorm", "moe_act")) in options
    fp8 = parse_spec(spec_data(**{**MIXTRAL, "parallelism.recompute": None, "training.precision": "fp8"}))
    assert [o for o in _recompute_options(fp8, layout_from_spec(fp8)) if o[1]] == [("selective", ("moe",))]
    dense = parse_spec(spec_data(**{**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": None}))
    assert all(m is None for _, m in _recompute_options(dense, layout_from_spec(dense)))
    assert any(lay.recompute_modules == ("layernorm", "moe") for lay in enumerate_layouts(spec))
    assert Layout().recompute_modules is None and "recompute_modules" not in Layout(tp=1).open_fields()


def test_hardware_flops_count_the_recomputed_modules():
    from orchestrator.estimate.flops import estimate_flops

    s, h, f, fs, E, k = 2048, 1024, 2048, 1024, 8, 2
    plain = estimate_flops(dataclasses.replace(MOE, recompute_core_attn=False), 4, "selective")
    moe = estimate_flops(dataclasses.replace(MOE, recompute_modules=("moe",), recompute_core_attn=False), 4, "selective")
    block = 2 * s * (h * E + k * 3 * h * f + 3 * h * fs)     # router, top-k SwiGLU experts, shared expert
    assert plain.hardware_flops == plain.model_flops
    assert moe.hardware_flops - moe.model_flops == pytest.approx(3 * block * 4)   # 3 MoE layers of 4, 4 sequences
    assert moe.model_flops == plain.model_flops
