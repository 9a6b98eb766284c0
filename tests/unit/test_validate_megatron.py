"""Static checks of Megatron-LM argument files and megatron_config.json: every defect Megatron lets through
(or only fails on at run time) gives a Problem naming the file, line and flag, with a fix. No torch here:
``deep=False`` throughout (the real TransformerConfig / validate_args runs are integration tests).
"""
from __future__ import annotations

import json

import pytest

from orchestrator.render.megatron import render_megatron_args, render_megatron_config
from orchestrator.rundir import write_run_dir
from orchestrator.validate.megatron import (check_megatron_args, check_megatron_config, validate_megatron_args_file,
                                            validate_megatron_config_file, validate_megatron_run_dir)
from orchestrator.validate.megatron_args import parse_tokens, tokens_from_text
from tests.conftest import fixed_plan, spec_data

WORLD = 2
BASE = render_megatron_args(fixed_plan(spec_data(**{"parallelism.zero_stage": 1})))  # tp1 pp1 dp2, 4 layers
UNEVEN = render_megatron_args(fixed_plan(spec_data(**{    # 5 layers as 2 + 3 on pp 2, dp 2
    "model.num_layers": 5, "cluster.gpus_per_node": 4, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
    "parallelism.first_stage_layers": 2, "parallelism.last_stage_layers": 3})))


def edit(tokens: list[str], set_: dict | None = None, drop: tuple = (), add: tuple = ()) -> list[str]:
    """Change the value after a flag, drop a flag (and its values), append tokens."""
    out, skip = [], False
    for token in tokens:
        if token.startswith("--"):
            skip = token in drop
        if skip:
            continue
        out.append(token)
    for flag, value in (set_ or {}).items():
        out[out.index(flag) + 1] = value
    return out + list(add)


# (name, tokens, world size, the flag the problem points at, text in the message)
BAD = [
    ("misspelled-flag", edit(BASE, add=("--tensor-model-paralel-size", "2")), WORLD,
     "--tensor-model-paralel-size", "is not a Megatron-LM core_v0.16.1 argument"),
    ("hidden-heads", edit(BASE, {"--hidden-size": "130"}), WORLD, "--hidden-size",
     "hidden_size(130) % num_attention_heads(4) = 2"),
    ("layers-pp", edit(BASE, {"--num-layers": "5", "--pipeline-model-parallel-size": "2"}), 4,
     "--pipeline-model-parallel-size", "num_layers(5) % pp(2) = 1"),
    ("impossible-vpp", edit(BASE, {"--pipeline-model-parallel-size": "4"},
                            add=("--num-virtual-stages-per-pipeline-rank", "2")), 4,
     "--num-virtual-stages-per-pipeline-rank", "not divisible into vpp(2)"),
    ("vpp-without-pp", edit(BASE, add=("--num-virtual-stages-per-pipeline-rank", "2")), WORLD,
     "--num-virtual-stages-per-pipeline-rank", "there is no pipeline to interleave"),
    ("tp-zero", edit(BASE, {"--tensor-model-parallel-size": "0"}), WORLD, "--tensor-model-parallel-size",
     "must be >= 1, got 0"),
    ("tp-negative", edit(BASE, {"--tensor-model-parallel-size": "-2"}), WORLD, "--tensor-model-parallel-size",
     "must be >= 1, got -2"),
    ("groups-tp", edit(BASE, {"--tensor-model-parallel-size": "4"}, add=("--group-query-attention",
                                                                         "--num-query-groups", "3")), 4,
     "--num-query-groups", "num_query_groups(3) and tp(4): neither divides the other"),
    ("groups-without-gqa", edit(BASE, add=("--num-query-groups", "2")), WORLD, "--num-query-groups",
     "is ignored without --group-query-attention"),
    ("sp-tp1", edit(BASE, add=("--sequence-parallel",)), WORLD, "--sequence-parallel", "silently turns it off"),
    ("seq-tp-sp", edit(BASE, {"--tensor-model-parallel-size": "4", "--seq-length": "126",
                              "--max-position-embeddings": "126"}, add=("--sequence-parallel",)), 4,
     "--seq-length", "seq_length(126) % tp(4) = 2"),
    ("batch-world", edit(BASE, {"--global-batch-size": "6"}), 4, "--global-batch-size",
     "global_batch_size(6) % (micro_batch_size(2) * dp(4) = 8) = 6"),
    ("world-model", edit(BASE, {"--tensor-model-parallel-size": "4"}), 6, "--pipeline-model-parallel-size",
     "world_size(6) % (tp(4) * pp(1) * cp(1) = 4) = 2"),
    ("interleave-microbatches", edit(BASE, {"--pipeline-model-parallel-size": "4", "--num-layers": "8",
                                            "--global-batch-size": "12"},
                                     add=("--num-virtual-stages-per-pipeline-rank", "2")), 4,
     "--num-virtual-stages-per-pipeline-rank", "num_microbatches(6)"),
    ("missing-value", edit(BASE, {"--num-layers": "--hidden-size"}, drop=("--hidden-size",)) , WORLD,
     "--num-layers", "takes exactly one value, got none"),
    ("not-an-int", edit(BASE, {"--num-layers": "four"}), WORLD, "--num-layers", "needs an integer, got 'four'"),
    ("bad-choice", edit(BASE, {"--normalization": "rmsnorm"}), WORLD, "--normalization", "not one of Megatron's"),
    ("duplicate", edit(BASE, add=("--micro-batch-size", "1")), WORLD, "--micro-batch-size",
     "argparse silently keeps the last value"),
    ("deprecated", edit(BASE, add=("--use-mcore-models",)), WORLD, "--use-mcore-models", "is deprecated"),
    ("retired", edit(BASE, add=("--checkpoint-activations",)), WORLD, "--checkpoint-activations",
     "no longer accepted"),
    ("switch-with-value", edit(BASE, add=("--bf16", "true")), WORLD, "--bf16", "takes no value"),
    ("no-eval-interval", edit(BASE, drop=("--eval-interval",)), WORLD, "--eval-interval", "crashes (TypeError)"),
    ("default-tokenizer", edit(BASE, drop=("--tokenizer-type", "--vocab-size")), WORLD, "--tokenizer-type",
     "GPT2BPETokenizer (pretrain_gpt.py's default tokenizer) needs --vocab-file and --merge-file"),
    ("no-data", edit(BASE, drop=("--mock-data",)), WORLD, "--data-path", "exactly one data source, got none"),
    ("min-lr", edit(BASE, {"--min-lr": "0.1"}), WORLD, "--min-lr", "min_lr(0.1) > lr(0.0003)"),
    ("warmup-decay", edit(BASE, {"--lr-warmup-iters": "10"}), WORLD, "--lr-warmup-iters",
     "lr_warmup_iters(10) >= lr_decay_iters(10)"),
    ("seq-positions", edit(BASE, {"--max-position-embeddings": "64"}), WORLD, "--max-position-embeddings",
     "max_position_embeddings(64) < seq_length(128)"),
    ("param-gather", edit(BASE, drop=("--use-distributed-optimizer",)), WORLD, "--overlap-param-gather",
     "needs --use-distributed-optimizer"),
    ("cpu-offload", edit(BASE, add=("--optimizer-cpu-offload",)), WORLD, "--optimizer-cpu-offload",
     "needs --use-precision-aware-optimizer"),
    ("fp16-bf16", edit(BASE, add=("--fp16", "--bf16")), WORLD, "--bf16", "are exclusive"),
    ("full-recompute", edit(BASE, add=("--recompute-granularity", "full")), WORLD, "--recompute-granularity",
     "needs --recompute-method"),
    ("fsdp-ckpt", edit(BASE, add=("--use-megatron-fsdp",)), WORLD, "--ckpt-format", "fsdp_dtensor"),
    ("required", edit(BASE, drop=("--num-attention-heads",)), WORLD, "--num-attention-heads", "is required"),
    # uneven pipeline splits: Megatron-Core's TransformerConfig rules, and flags Megatron refuses beside them
    ("uneven-sum", edit(UNEVEN, {"--decoder-first-pipeline-num-layers": "1"}), 4,
     "--decoder-first-pipeline-num-layers", "= 4 != num_layers(5) with pp(2)"),
    ("uneven-middle", edit(UNEVEN, {"--num-layers": "8", "--pipeline-model-parallel-size": "4"}), 8,
     "--decoder-first-pipeline-num-layers", "= 3 middle layers % 2 middle stages (pp(4) - 2) = 1"),
    ("uneven-zero", edit(UNEVEN, {"--decoder-last-pipeline-num-layers": "0"}), 4,
     "--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers(0) must be >= 1"),
    ("uneven-vpp", edit(UNEVEN, {"--num-layers": "10", "--pipeline-model-parallel-size": "4",
                                 "--decoder-last-pipeline-num-layers": "2", "--global-batch-size": "16"},
                        add=("--num-virtual-stages-per-pipeline-rank", "2")), 8,
     "--num-virtual-stages-per-pipeline-rank", "= 3 layers each, % num_virtual_stages_per_pipeline_rank(2) = 1"),
    ("uneven-vpp-first", edit(UNEVEN, {"--num-layers": "9", "--pipeline-model-parallel-size": "4",
                                       "--decoder-first-pipeline-num-layers": "3",
                                       "--decoder-last-pipeline-num-layers": "2", "--global-batch-size": "16"},
                              add=("--num-virtual-stages-per-pipeline-rank", "2")), 8,
     "--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers(3) % num_virtual_stages_per_pipeline"),
    ("uneven-per-stage-vpp", edit(UNEVEN, add=("--num-layers-per-virtual-pipeline-stage", "1")), 4,
     "--num-layers-per-virtual-pipeline-stage", "cannot be combined with --decoder-first-pipeline-num-layers"),
    ("uneven-account-embedding", edit(UNEVEN, add=("--account-for-embedding-in-pipeline-split",)), 4,
     "--account-for-embedding-in-pipeline-split", "cannot be combined with"),
    ("uneven-layout-string", edit(UNEVEN, add=("--pipeline-model-parallel-layout", "Et|ttttL")), 4,
     "--pipeline-model-parallel-layout", "cannot be combined with"),
    ("accounted-layers-pp", edit(BASE, {"--pipeline-model-parallel-size": "2"},
                                 add=("--account-for-embedding-in-pipeline-split",)), 4,
     "--pipeline-model-parallel-size", "num_layers(4) + 1 (embedding/loss counted as layers"),
]


def write_args(tmp_path, tokens: list[str]):
    path = tmp_path / "megatron_args.txt"
    path.write_text("\n".join(tokens) + "\n")
    return path


def test_the_base_file_is_clean(tmp_path):
    assert validate_megatron_args_file(write_args(tmp_path, BASE), world_size=WORLD, deep=False) == []


@pytest.mark.parametrize("name, tokens, world, flag, text", BAD, ids=[case[0] for case in BAD])
def test_each_bad_args_file_gives_a_located_problem_with_a_hint(tmp_path, name, tokens, world, flag, text):
    path = write_args(tmp_path, tokens)
    problems = validate_megatron_args_file(path, world_size=world, deep=False)
    matching = [p for p in problems if text in p.message]
    assert matching, f"no problem with {text!r} in {[str(p) for p in problems]}"
    problem = matching[0]
    assert problem.path.startswith(str(path)) and problem.path.endswith(flag), problem.path
    assert problem.hint


def test_line_numbers_point_at_the_flag(tmp_path):
    tokens = edit(BASE, {"--hidden-size": "130"})
    problems = validate_megatron_args_file(write_args(tmp_path, tokens), world_size=WORLD, deep=False)
    line = tokens.index("--hidden-size") + 1
    assert any(p.path == f"{tmp_path / 'megatron_args.txt'}:{line} --hidden-size" for p in problems)


def test_misspelled_flag_says_did_you_mean():
    problems = check_megatron_args(edit(BASE, add=("--tensor-model-paralel-size", "2")), WORLD, deep=False)
    assert "did you mean '--tensor-model-parallel-size'?" in problems[0].hint


def test_bad_choice_says_did_you_mean():
    problems = check_megatron_args(edit(BASE, {"--normalization": "rmsnorm"}), WORLD, deep=False)
    assert problems[0].hint == "did you mean 'RMSNorm'?"


def test_every_problem_is_reported_at_once():
    tokens = edit(BASE, {"--hidden-size": "130", "--num-layers": "x", "--min-lr": "1.0"}, add=("--bogus",))
    messages = " | ".join(p.message for p in check_megatron_args(tokens, WORLD, deep=False))
    for text in ("needs an integer", "--bogus is not", "hidden_size(130)", "min_lr(1.0)"):
        assert text in messages


def test_file_format_comments_multiword_lines_and_equals():
    text = ("# a comment\n\n--num-layers 4\n--hidden-size=128\n--data-path\n/my data/prefix\n"
            "--tokenizer-model 'a b'\n")
    assert [t.text for t in tokens_from_text(text)] == [
        "--num-layers", "4", "--hidden-size=128", "--data-path", "/my data/prefix", "--tokenizer-model", "a b"]
    args, problems = parse_tokens(tokens_from_text(text), "f")
    assert problems == []
    assert args.values["num_layers"] == 4 and args.values["hidden_size"] == 128
    assert args.values["data_path"] == ["/my data/prefix"] and args.origin["hidden_size"] == ("--hidden-size", 4)


def test_stray_value_and_empty_file(tmp_path):
    problems = check_megatron_args(["4"] + BASE, WORLD, deep=False)
    assert problems[0].path == "megatron_args:1" and "no flag before it" in problems[0].message
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert "no arguments" in validate_megatron_args_file(empty, deep=False)[0].message


def test_a_consistent_uneven_split_is_clean():
    assert check_megatron_args(UNEVEN, 4, deep=False) == []
    # 5 layers + the loss counted as a layer = 6 = 2 x 3: Megatron's other way to lighten a stage
    assert check_megatron_args(edit(UNEVEN, drop=("--decoder-first-pipeline-num-layers",
                                                  "--decoder-last-pipeline-num-layers"),
                                    add=("--account-for-loss-in-pipeline-split",)), 4, deep=False) == []
    # pp 4 with only the first count: the other three stages share 9 - 3 = 6 layers
    only_first = edit(UNEVEN, {"--num-layers": "9", "--pipeline-model-parallel-size": "4",
                               "--decoder-first-pipeline-num-layers": "3"},
                      drop=("--decoder-last-pipeline-num-layers",))
    assert check_megatron_args(only_first, 8, deep=False) == []
    # the same layers without the split flags: layers % pp is back, and the hint names the split
    [p] = check_megatron_args(edit(only_first, drop=("--decoder-first-pipeline-num-layers",)), 8, deep=False)
    assert "num_layers(9) % pp(4) = 1" in p.message
    assert "--decoder-first-pipeline-num-layers" in p.hint and "--decoder-last-pipeline-num-layers" in p.hint


def test_without_world_size_the_batch_rule_waits():
    assert check_megatron_args(edit(BASE, {"--global-batch-size": "6"}), None, deep=False) == []


# --- megatron_config.json ----------------------------------------------------------------------

CONFIG = render_megatron_config(fixed_plan(spec_data(**{"parallelism.zero_stage": 1})))


@pytest.mark.parametrize("change, path, text", [
    ({"num_layer": 4}, "num_layer", "not a TransformerConfig field"),
    ({"hidden_size": 130}, "hidden_size", "hidden_size(130) % num_attention_heads(4) = 2"),
    ({"pipeline_model_parallel_size": 3}, "pipeline_model_parallel_size", "num_layers(4) % pp(3) = 1"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4},
     "virtual_pipeline_model_parallel_size", "not divisible into vpp(4)"),
    ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size", "must be an integer >= 1"),
    ({"params_dtype": "bfloat16"}, "params_dtype", "dotted name"),
    ({"sequence_parallel": True}, "sequence_parallel", "needs tensor_model_parallel_size > 1"),
    ({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 1,
      "num_layers_in_last_pipeline_stage": 2}, "num_layers_in_first_pipeline_stage", "= 3 != num_layers(4) with pp(2)"),
    ({"pipeline_model_parallel_size": 3, "num_layers_in_last_pipeline_stage": 1}, "num_layers_in_last_pipeline_stage",
     "= 3 middle layers % 2 middle stages"),
    ({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 0},
     "num_layers_in_first_pipeline_stage", "must be an integer >= 1"),
])
def test_bad_megatron_config(tmp_path, change, path, text):
    from orchestrator.validate.megatron_core import transformer_config_fields

    if "num_layer" in change and transformer_config_fields() is None:
        pytest.skip("megatron-core is not installed")
    problems = check_megatron_config({**CONFIG, **change}, path="cfg.json", deep=False)
    assert any(p.path == f"cfg.json:{path}" and text in p.message and p.hint for p in problems), problems


def test_unknown_config_key_says_did_you_mean():
    from orchestrator.validate.megatron_core import transformer_config_fields

    if transformer_config_fields() is None:
        pytest.skip("megatron-core is not installed")
    problems = check_megatron_config({**CONFIG, "num_layer": 4}, deep=False)
    assert problems[0].hint == "did you mean 'num_layers'?"


def test_config_file_errors(tmp_path):
    bad = tmp_path / "megatron_config.json"
    bad.write_text("{not json")
    assert "not valid JSON" in validate_megatron_config_file(bad, deep=False)[0].message
    bad.write_text("[1, 2]")
    assert "JSON object" in validate_megatron_config_file(bad, deep=False)[0].message


def test_uneven_config_is_clean():
    assert check_megatron_config({**CONFIG, "pipeline_model_parallel_size": 3, "num_layers_in_first_pipeline_stage": 2},
                                 deep=False) == []


def test_run_dir_split_must_agree(tmp_path):
    plan = fixed_plan(spec_data(**{"model.num_layers": 5, "cluster.gpus_per_node": 4, "parallelism.pipeline": 2,
                                   "parallelism.zero_stage": 1, "parallelism.first_stage_layers": 2,
                                   "parallelism.last_stage_layers": 3}))
    run = write_run_dir(plan, tmp_path / "run")
    assert validate_megatron_run_dir(run, world_size=plan.world_size, deep=False) == []
    config = json.loads((run / "megatron_config.json").read_text())
    del config["num_layers_in_last_pipeline_stage"]
    (run / "megatron_config.json").write_text(json.dumps(config))
    problems = validate_megatron_run_dir(run, world_size=plan.world_size, deep=False)
    assert [p.path.rsplit(":", 1)[1] for p in problems] == ["num_layers_in_last_pipeline_stage"]
    assert "None but megatron_args.txt gives 3" in problems[0].message


def test_run_dir_files_agree(tmp_path):
    plan = fixed_plan(spec_data(**{"parallelism.zero_stage": 1}))
    run = write_run_dir(plan, tmp_path / "run")
    assert validate_megatron_run_dir(run, world_size=plan.world_size, deep=False) == []
    config = json.loads((run / "megatron_config.json").read_text())
    (run / "megatron_config.json").write_text(json.dumps({**config, "num_layers": 8}))
    problems = validate_megatron_run_dir(run, world_size=plan.world_size, deep=False)
    assert [p.path for p in problems] == [f"{run / 'megatron_config.json'}:num_layers"]
    assert "megatron_args.txt gives 4" in problems[0].message
