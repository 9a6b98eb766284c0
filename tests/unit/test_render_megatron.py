"""render_megatron_args / render_megatron_config: the tokens and kwargs each layout turns into.

The flags are checked against schemas/megatron_lm_args.json (Megatron-LM core_v0.16.1's own flag table)
and the config keys against the installed megatron-core's TransformerConfig fields, read without importing
torch. Real Megatron-LM / TransformerConfig runs are in tests/integration/test_megatron_real.py.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.layout import padded_vocab_size
from orchestrator.render.megatron import (OBJECT_FIELDS, megatron_env, render_megatron_args, render_megatron_config,
                                          render_megatron_notes)
from orchestrator.validate.megatron import check_megatron_args, check_megatron_config
from orchestrator.validate.megatron_args import flag_table
from orchestrator.validate.megatron_core import transformer_config_fields
from tests.conftest import ROOT, fixed_plan, spec_data
from tests.megatron_layouts import GPU8, MEGATRON_LAYOUTS

LAYOUTS = MEGATRON_LAYOUTS


def plan_for(name: str):
    return fixed_plan(spec_data(**LAYOUTS[name]))


def values(tokens: list[str]) -> dict[str, list[str]]:
    """flag -> the tokens after it up to the next flag."""
    out: dict[str, list[str]] = {}
    flag = None
    for token in tokens:
        if token.startswith("--"):
            flag = token
            out[flag] = []
        else:
            out[flag].append(token)
    return out


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_flag_exists_in_core_v0_16_1_and_none_is_deprecated(name):
    tokens = render_megatron_args(plan_for(name))
    table = flag_table()
    flags = [t for t in tokens if t.startswith("--")]
    assert flags and all(t.strip() == t and t for t in tokens)
    assert [f for f in flags if f not in table] == []
    assert [f for f in flags if table[f].get("deprecated")] == []
    assert len(flags) == len(set(flags)), "a flag rendered twice"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_rendered_args_and_config_pass_the_static_checks(name):
    plan = plan_for(name)
    assert check_megatron_args(render_megatron_args(plan), world_size=plan.world_size, deep=False) == []
    assert check_megatron_config(render_megatron_config(plan), deep=False) == []


def test_rendering_is_deterministic():
    a, b = plan_for("pp4-vpp3"), plan_for("pp4-vpp3")
    assert render_megatron_args(a) == render_megatron_args(b)
    assert json.dumps(render_megatron_config(a), sort_keys=True) == json.dumps(render_megatron_config(b), sort_keys=True)


def test_parallel_layout_tokens():
    v = values(render_megatron_args(plan_for("pp4-vpp3")))
    assert v["--tensor-model-parallel-size"] == ["2"] and v["--pipeline-model-parallel-size"] == ["4"]
    assert v["--num-virtual-stages-per-pipeline-rank"] == ["3"]
    assert "--num-layers-per-virtual-pipeline-stage" not in v and "--use-mcore-models" not in v
    assert "--sequence-parallel" not in v and v["--micro-batch-size"] == ["1"] and v["--global-batch-size"] == ["32"]
    assert "--data-parallel-size" not in v, "dp is derived by Megatron from WORLD_SIZE"


def test_uneven_split_flags_and_config_fields():
    plan = plan_for("uneven-pp4-vpp2")
    v = values(render_megatron_args(plan))
    assert v["--decoder-first-pipeline-num-layers"] == ["4"] and v["--decoder-last-pipeline-num-layers"] == ["4"]
    assert v["--num-virtual-stages-per-pipeline-rank"] == ["2"] and v["--num-layers"] == ["24"]
    config = render_megatron_config(plan)
    assert config["num_layers_in_first_pipeline_stage"] == 4 and config["num_layers_in_last_pipeline_stage"] == 4
    assert plan.stage_split.counts == (4, 8, 8, 4)
    even = plan_for("pp4-vpp3")          # an even split renders neither
    assert "--decoder-first-pipeline-num-layers" not in values(render_megatron_args(even))
    assert not {"num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"} & set(
        render_megatron_config(even))


def test_only_one_end_given_renders_only_that_flag():
    plan = fixed_plan(spec_data(**{**LAYOUTS["uneven-pp4-vpp2"], "parallelism.last_stage_layers": None,
                                   "parallelism.first_stage_layers": 6, "parallelism.virtual_pipeline": 1}))
    v = values(render_megatron_args(plan))
    assert v["--decoder-first-pipeline-num-layers"] == ["6"] and "--decoder-last-pipeline-num-layers" not in v
    assert plan.stage_split.counts == (6, 6, 6, 6)


def test_gqa_swiglu_rmsnorm_rope_untied_no_bias_full_recompute():
    v = values(render_megatron_args(plan_for("gqa-swiglu-tp4-pp2-full")))
    assert "--group-query-attention" in v and v["--num-query-groups"] == ["8"]
    assert "--swiglu" in v and v["--ffn-hidden-size"] == ["14336"] and v["--normalization"] == ["RMSNorm"]
    assert v["--position-embedding-type"] == ["rope"] and "--untie-embeddings-and-output-weights" in v
    assert "--disable-bias-linear" in v and "--sequence-parallel" in v and "--bf16" in v
    assert v["--recompute-granularity"] == ["full"] and v["--recompute-method"] == ["uniform"]
    assert v["--recompute-num-layers"] == ["1"]
    assert v["--seq-length"] == v["--max-position-embeddings"] == ["8192"]


def test_gpt_defaults_stay_unflagged():
    v = values(render_megatron_args(plan_for("tiny-zero0-cpu")))
    for flag in ("--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear", "--recompute-granularity", "--use-distributed-optimizer", "--bf16"):
        assert flag not in v
    assert v["--normalization"] == ["LayerNorm"] and v["--position-embedding-type"] == ["learned_absolute"]


def test_selective_recompute_and_sequence_parallel():
    v = values(render_megatron_args(plan_for("tp2-sp-selective-cpu")))
    assert v["--recompute-granularity"] == ["selective"] and "--recompute-method" not in v
    assert "--sequence-parallel" in v and v["--tensor-model-parallel-size"] == ["2"]


@pytest.mark.parametrize("stage, expect, absent", [
    (0, [], ["--use-distributed-optimizer", "--use-megatron-fsdp"]),
    (1, ["--use-distributed-optimizer", "--overlap-param-gather"], ["--use-megatron-fsdp"]),
    (2, ["--use-distributed-optimizer", "--use-megatron-fsdp", "--no-gradient-accumulation-fusion"], []),
    (3, ["--use-distributed-optimizer", "--use-megatron-fsdp"], []),
])
def test_zero_stages_map_onto_megatron(stage, expect, absent):
    v = values(render_megatron_args(fixed_plan(spec_data(**{"parallelism.zero_stage": stage}))))
    assert all(flag in v for flag in expect) and not any(flag in v for flag in absent)
    strategy = {2: ["optim_grads"], 3: ["optim_grads_params"]}.get(stage)
    assert v.get("--data-parallel-sharding-strategy") == strategy
    assert v["--ckpt-format"] == (["fsdp_dtensor"] if stage >= 2 else ["torch_dist"])


def test_offload_maps_to_the_cpu_optimizer_and_notes_what_megatron_cannot_do():
    plan = plan_for("zero3-offload")
    v = values(render_megatron_args(plan))
    assert "--optimizer-cpu-offload" in v and "--use-precision-aware-optimizer" in v
    assert any("no parameter CPU offload" in n for n in render_megatron_notes(plan))


def test_sgd_offload_is_not_rendered_and_noted():
    plan = fixed_plan(spec_data(**{**LAYOUTS["zero3-offload"], "training.optimizer": {"type": "sgd"}}))
    v = values(render_megatron_args(plan))
    assert v["--optimizer"] == ["sgd"] and "--optimizer-cpu-offload" not in v
    assert any("needs Adam" in n for n in render_megatron_notes(plan))


def test_fp16_uses_dynamic_loss_scaling_like_ds_config():
    v = values(render_megatron_args(plan_for("fp16-tp2-pp2-zero0")))
    assert "--fp16" in v and v["--initial-loss-scale"] == ["65536"] and "--loss-scale" not in v


def test_training_hyperparameters():
    plan = fixed_plan(spec_data(**{"training.optimizer": {"lr": 1e-3, "betas": [0.8, 0.9], "eps": 1e-6},
                                   "training.lr_schedule": {"warmup_iters": 3, "decay": "linear", "min_lr": 1e-4},
                                   "training.gradient_clipping": 0.5, "training.seed": 7}))
    v = values(render_megatron_args(plan))
    assert v["--lr"] == ["0.001"] and v["--min-lr"] == ["0.0001"] and v["--lr-decay-style"] == ["linear"]
    assert v["--lr-warmup-iters"] == ["3"] and v["--lr-decay-iters"] == v["--train-iters"] == ["10"]
    assert v["--adam-beta1"] == ["0.8"] and v["--adam-beta2"] == ["0.9"] and v["--adam-eps"] == ["1e-06"]
    assert v["--clip-grad"] == ["0.5"] and v["--seed"] == ["7"] and v["--weight-decay"] == ["0.1"]
    assert v["--save"] == v["--load"] == ["checkpoints"] and v["--save-interval"] == ["5"]
    assert v["--eval-interval"] == ["5"] and v["--log-interval"] == ["1"]


def test_warmup_is_kept_below_the_decay_length():
    plan = fixed_plan(spec_data(**{"training.lr_schedule": {"warmup_iters": 50}}))
    assert values(render_megatron_args(plan))["--lr-warmup-iters"] == ["9"]
    assert any("warm-up < train_iters" in n for n in render_megatron_notes(plan))


@pytest.mark.parametrize("tp", [1, 2])
def test_null_tokenizer_vocab_pads_to_the_plans_padded_vocab(tp):
    plan = fixed_plan(spec_data(**{"parallelism.tensor": tp, "training.global_batch_size": 4,
                                   "model.vocab_size": 50257}))
    v = values(render_megatron_args(plan))
    assert "--mock-data" in v and v["--tokenizer-type"] == ["NullTokenizer"]
    # Megatron's null tokenizer appends EOD: its vocabulary is --vocab-size + 1, then padded to 128 * tp.
    assert padded_vocab_size(int(v["--vocab-size"][0]) + 1, tp) == plan.padded_vocab_size


def test_dataset_path_and_tokenizer():
    plan = fixed_plan(spec_data(**{"data": {"synthetic": False, "path": "/data/my corpus_text_document",
                                            "tokenizer": "meta-llama/Meta-Llama-3-8B"}}))
    v = values(render_megatron_args(plan))
    assert v["--data-path"] == ["/data/my corpus_text_document"] and "--mock-data" not in v
    assert v["--tokenizer-type"] == ["HuggingFaceTokenizer"] and v["--tokenizer-model"] == ["meta-llama/Meta-Llama-3-8B"]
    assert v["--split"] == ["949,50,1"]


def test_megatron_env_follows_megatron_lm_rules():
    assert megatron_env(plan_for("tp2-sp-selective-cpu")) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_env(plan_for("tiny-zero2-cpu")) == {}
    fsdp_tp = fixed_plan(spec_data(**{**LAYOUTS["gqa-swiglu-tp4-pp2-full"], "parallelism.pipeline": 1,
                                      "parallelism.zero_stage": 3}))
    assert megatron_env(fsdp_tp) == {}, "Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1"


def test_launch_scripts_export_what_megatron_needs():
    from orchestrator.render.scripts import env_assignments

    plan = fixed_plan(spec_data(**{**LAYOUTS["gqa-swiglu-tp4-pp2-full"], "parallelism.pipeline": 1,
                                   "parallelism.zero_stage": 3}))
    assert env_assignments(plan).get("CUDA_DEVICE_MAX_CONNECTIONS") == megatron_env(plan).get(
        "CUDA_DEVICE_MAX_CONNECTIONS")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_config_keys_are_transformer_config_fields(name):
    fields = transformer_config_fields()
    if fields is None:
        pytest.skip("megatron-core is not installed (the [train] extra)")
    config = render_megatron_config(plan_for(name))
    assert sorted(set(config) - fields) == []
    json.dumps(config)  # JSON-serialisable
    assert all(isinstance(config[k], str) and "." in config[k] for k in OBJECT_FIELDS)


def test_config_values():
    c = render_megatron_config(plan_for("gqa-swiglu-tp4-pp2-full"))
    assert (c["tensor_model_parallel_size"], c["pipeline_model_parallel_size"], c["num_query_groups"]) == (4, 2, 8)
    assert c["gated_linear_unit"] and c["activation_func"] == "torch.nn.functional.silu"
    assert c["params_dtype"] == c["pipeline_dtype"] == "torch.bfloat16" and c["bf16"] and not c["fp16"]
    assert c["recompute_granularity"] == "full" and c["recompute_num_layers"] == 1 and c["sequence_parallel"]
    assert render_megatron_config(plan_for("pp4-vpp3"))["virtual_pipeline_model_parallel_size"] == 3
    assert render_megatron_config(plan_for("tiny-zero0-cpu"))["virtual_pipeline_model_parallel_size"] is None


def test_rendering_and_field_lookup_import_no_torch():
    code = ("import sys\nfrom orchestrator.render.megatron import render_megatron_args\n"
            "from orchestrator.validate.megatron import check_megatron_args\n"
            "from orchestrator.validate.megatron_core import transformer_config_fields\n"
            "transformer_config_fields()\n"
            "print(sorted(m for m in ('torch', 'megatron.core') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_flag_table_matches_the_targeted_tag():
    from orchestrator.render.megatron import MEGATRON_LM_TAG

    table = json.loads((ROOT / "schemas" / "megatron_lm_args.json").read_text())
    assert table["megatron_lm_tag"] == MEGATRON_LM_TAG and len(table["flags"]) > 600


def test_moe_context_fp8_flags_and_config():
    mix = plan_for("mixtral-tp2-ep8-sp")
    v = values(render_megatron_args(mix))
    assert v["--num-experts"] == ["8"] and v["--moe-router-topk"] == ["2"] and v["--moe-ffn-hidden-size"] == ["14336"]
    assert v["--expert-model-parallel-size"] == ["8"] and v["--expert-tensor-parallel-size"] == ["1"]
    assert v["--moe-token-dispatcher-type"] == ["alltoall"] and "--moe-grouped-gemm" in v
    assert "--moe-expert-capacity-factor" not in v          # dropless
    small = plan_for("moe-top1-capacity-shared-dense-etp2")
    v = values(render_megatron_args(small))
    assert v["--moe-layer-freq"] == ["([0]*2+[1]*22)"] and "--moe-router-pre-softmax" in v
    assert v["--moe-expert-capacity-factor"] == ["1.25"] and v["--moe-shared-expert-intermediate-size"] == ["4096"]
    # padded to capacity: the layer then needs no host sync on its token counts, as the cost model counts it
    assert "--moe-pad-expert-input-to-capacity" in v
    assert render_megatron_config(small)["moe_layer_freq"] == [0, 0] + [1] * 22
    assert render_megatron_config(small)["moe_pad_expert_input_to_capacity"] is True
    cp = plan_for("llama-128k-tp4-cp4-fp8")
    v = values(render_megatron_args(cp))
    assert v["--context-parallel-size"] == ["4"] and v["--cp-comm-type"] == ["p2p"]
    assert v["--fp8-format"] == ["hybrid"] and v["--fp8-recipe"] == ["delayed"] and "--bf16" in v
    config = render_megatron_config(cp)
    assert config["context_parallel_size"] == 4 and config["fp8"] == "hybrid" and config["bf16"] is True
    assert megatron_env(cp) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    qwen = plan_for("qwen3-kv128-ep8-pp2-fp8")
    assert values(render_megatron_args(qwen))["--kv-channels"] == ["128"]
    assert render_megatron_config(qwen)["kv_channels"] == 128
