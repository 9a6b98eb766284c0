"""Published runs as orch specs (tests/data/published-specs/*.yaml, issue 18): current with their generator, each
loaded by orch's loader and planned by `orch plan`'s path; the spec fields that describe a run's software reach the
cost model, orch generate writes the ones it can and refuses the rest, and orch validate says so."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.estimate.step import EstimateContext, estimate
from orchestrator.generate_rules import generate_problems
from orchestrator.layout import layout_from_spec
from orchestrator.plan import build_plan
from orchestrator.spec_loader import load_spec, parse_spec
from tests.conftest import ROOT, run_cli, spec_data
from tests.megatron_layouts import MEGATRON_LAYOUTS
from tests.spec_variants import spec_with

DATA = ROOT / "tests" / "data"
RUNS = yaml.safe_load((DATA / "published-runs.yaml").read_text())


def test_specs_are_current_with_their_generator():
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "published_specs.py"), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_scored_run_is_a_spec_file_and_every_spec_file_is_scored():
    files = {p.name for p in (DATA / "published-specs").glob("*.yaml")}
    assert files == {run["spec"].removeprefix("published-specs/") for run in RUNS}
    assert len(RUNS) == len({run["id"] for run in RUNS}) == 82
    assert all(run["reference_tokens_per_s"] > 0 and run["source"] for run in RUNS)


def test_each_spec_loads_and_orch_plan_accepts_it(capsys):
    """Every published layout plans (a refusal would be a false OOM or a rule that is too strict: the list says
    which). Planned through the CLI for a few, through build_plan (what `orch plan` calls) for all."""
    refused = []
    for run in RUNS:
        try:
            build_plan(load_spec(DATA / run["spec"]), top_k=1)
        except SpecError as e:
            refused.append(f"{run['id']}: {e}")
    assert refused == []
    for run in (RUNS[0], next(r for r in RUNS if r["group"] == "h100_layouts")):
        code, out, err = run_cli(["plan", str(DATA / run["spec"]), "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["chosen"]["tokens_per_s"] > 0


def _published(case_id: str):
    return load_spec(DATA / "published-specs" / f"{case_id}.yaml")


def test_the_software_fields_reach_the_cost_model():
    glm = EstimateContext.of(_published("glm_130b"))
    assert (glm.engine_version, glm.distribute_saved_activations, glm.shape.loss) == ("0.6", True, "vocab_parallel")
    assert glm.shape.dropout == 0.1
    titan = EstimateContext.of(_published("torchtitan_llama3_70b_fsdp_64gpu")).shape
    assert (titan.attention, titan.layer_impl, titan.eager_norm, titan.loss) == ("fa2", "torchtitan_llama", True,
                                                                                 "vocab_parallel")
    oss = _published("mbridge2602_gpt_oss_120b_bf16")
    shape = EstimateContext.of(oss).shape
    assert (shape.fused_rope, shape.glu_clamp, shape.router_force_balance) == (False, 7.0, True)
    assert shape.recompute_modules == ("layernorm", "moe_act") and not shape.recompute_core_attn
    assert EstimateContext.of(_published("mbridge2602_qwen3_30b_a3b_fp8")).fp8_recipe == "tensorwise"
    assert not EstimateContext.of(_published("mbridge260518_qwen3_30b_a3b_bf16_no_a2a_overlap")).ep_a2a_overlap
    # and they change the prediction: the same layout on the DeepSpeed orch writes for is another step time
    mtnlg = _published("mtnlg_530b_280nodes")
    lay = build_plan(mtnlg, top_k=1).layout
    as_orch = spec_with(mtnlg, **{"training.engine_version": None})
    assert estimate(EstimateContext.of(mtnlg), lay).step_time_s != estimate(EstimateContext.of(as_orch), lay).step_time_s


def test_generate_refuses_what_orch_cannot_write_and_names_each_field():
    paths = {p.path for p in generate_problems(_published("torchtitan_llama3_70b_fsdp_64gpu"))}
    assert paths == {"training.attention_impl", "training.layer_impl", "training.eager_norm"}
    paths = {p.path for p in generate_problems(_published("glm_130b"))}
    assert paths == {"training.engine_version", "training.cross_entropy_impl", "model.hidden_dropout",
                     "model.attention_dropout", "parallelism.distribute_saved_activations"}
    assert all(p.hint for p in generate_problems(_published("glm_130b")))
    # what orch writes passes: its own release (0.16 names core_v0.16.1), its own loss, Megatron options on Megatron
    # ... and a Megatron-Bridge recipe's fused loss is refused by name for orch's reference trainer (a Megatron-LM
    # program gets --cross-entropy-loss-fusion written: the next test)
    assert [p.path for p in generate_problems(_published("mbridge2602_gpt_oss_120b_bf16"))] == \
        ["training.cross_entropy_impl"]
    assert generate_problems(_published("opt_175b")) == []
    megatron = parse_spec(spec_data(**MEGATRON_LAYOUTS["gqa-swiglu-tp4-pp2-full"], **{
        "training.engine_version": "0.16", "training.cross_entropy_impl": "vocab_parallel"}))
    assert generate_problems(megatron) == []


def test_a_megatron_lm_program_gets_the_fused_loss_written(tmp_path):
    """training.cross_entropy_impl: vocab_parallel_fused is Megatron-LM's --cross-entropy-loss-fusion: written for a
    Megatron-LM program (argv and TransformerConfig), refused for orch's reference trainer, which runs the unfused
    vocab-parallel loss."""
    from orchestrator.render.megatron import render_megatron_args, render_megatron_config
    from tests.conftest import fixed_plan

    (tmp_path / "pretrain_gpt.py").write_text("# Megatron-LM's entry\n")
    fused = {**MEGATRON_LAYOUTS["gqa-swiglu-tp4-pp2-full"], "training.cross_entropy_impl": "vocab_parallel_fused"}
    program = parse_spec(spec_data(**fused, program={"kind": "megatron-lm", "megatron_lm": str(tmp_path)}))
    assert generate_problems(program) == []
    plan = fixed_plan(spec_data(**fused, program={"kind": "megatron-lm", "megatron_lm": str(tmp_path)}))
    assert "--cross-entropy-loss-fusion" in render_megatron_args(plan)
    assert render_megatron_config(plan)["cross_entropy_loss_fusion"] is True
    assert "--cross-entropy-loss-fusion" not in render_megatron_args(fixed_plan(spec_data(
        **MEGATRON_LAYOUTS["gqa-swiglu-tp4-pp2-full"], program={"kind": "megatron-lm", "megatron_lm": str(tmp_path)})))
    assert [p.path for p in generate_problems(parse_spec(spec_data(**fused)))] == ["training.cross_entropy_impl"]


def test_validate_reports_the_generate_refusals(tmp_path, capsys):
    path = tmp_path / "glm.yaml"
    path.write_text((DATA / "published-specs" / "glm_130b.yaml").read_text())
    code, out, err = run_cli(["validate", str(path)], capsys)
    assert code == 2 and "training.engine_version" in out + err and "orch writes configs for deepspeed" in out + err


@pytest.mark.parametrize("field,value", [("training.fp8_recipe", "mxfp8"), ("training.attention_impl", "sdpa"),
                                         ("training.engine_version", "v0.5"), ("training.layer_impl", "hf")])
def test_bad_values_are_refused_with_the_field(field, value):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**{field: value}))
    assert any(p.path == field for p in info.value.problems)


def test_fp8_tensorwise_allows_the_recompute_modules_delayed_scaling_refuses():
    base = {**MEGATRON_LAYOUTS["mixtral-tp2-ep8-sp"], "training.precision": "fp8", "parallelism.recompute": "selective",
            "parallelism.recompute_modules": ["moe_act", "layernorm"]}
    with pytest.raises(SpecError, match="delayed scaling"):
        parse_spec(spec_data(**base))
    spec = parse_spec(spec_data(**base, **{"training.fp8_recipe": "tensorwise"}))
    assert layout_from_spec(spec).recompute == "selective"


def test_plan_says_which_fields_generate_would_refuse():
    from orchestrator.planner import search  # noqa: PLC0415

    note = [r for r in search(_published("glm_130b"), top_k=1).reasons if r.startswith("software:")]
    assert len(note) == 1 and "training.engine_version" in note[0] and "model.hidden_dropout" in note[0]
    assert not any(r.startswith("software:") for r in search(_published("opt_175b"), top_k=1).reasons)
