"""The spec: typed parsing, presets, defaults, and every problem reported at once."""
from __future__ import annotations

import json

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec import spec_sha256, spec_to_data
from orchestrator.spec_loader import load_spec, parse_spec
from tests.conftest import TINY_SPEC, spec_data


def problems_of(data) -> list:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.problems


def test_tiny_spec_resolves_preset_and_defaults():
    spec = parse_spec(TINY_SPEC)
    assert spec.model.num_layers == 4 and spec.model.hidden_size == 128
    assert spec.model.num_query_groups == spec.model.num_attention_heads  # GQA default
    assert spec.model.ffn_hidden_size == 4 * spec.model.hidden_size
    assert spec.tracking.wandb.group == "tiny"  # default group = the spec name
    assert spec.world_size == 2


def test_explicit_fields_override_the_preset():
    spec = parse_spec(spec_data(**{"model.num_layers": 6, "model.ffn_hidden_size": 300}))
    assert spec.model.num_layers == 6 and spec.model.ffn_hidden_size == 300
    assert spec.model.hidden_size == 128  # still from the preset


def test_llama_preset_has_gqa_and_swiglu():
    spec = parse_spec({"name": "l", "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm"},
                       "training": {"global_batch_size": 8}})
    m = spec.model
    assert (m.num_query_groups, m.ffn_hidden_size, m.gated_mlp, m.tie_embeddings) == (8, 28672, True, False)


def test_unknown_key_gets_did_you_mean():
    [p] = problems_of(spec_data(**{"training.global_batch_sise": 8}))
    assert p.path == "training.global_batch_sise" and "global_batch_size" in p.hint


def test_every_problem_is_reported_not_just_the_first():
    data = spec_data(**{"model.hiden_size": 1, "cluster.gpu": "h100", "training.precision": "bf32",
                        "parallelism.zero_stage": 5})
    paths = {p.path for p in problems_of(data)}
    assert paths == {"model.hiden_size", "cluster.gpu", "training.precision", "parallelism.zero_stage"}


def test_bounds_and_rules_reported_together():
    data = spec_data(**{"name": "bad name", "parallelism.tensor": 3})
    paths = [p.path for p in problems_of(data)]
    assert "name" in paths and "parallelism.tensor" in paths


def test_strings_are_not_numbers_or_booleans():
    problems = problems_of(spec_data(**{"training.global_batch_size": "8",
                                        "parallelism.sequence_parallel": "yes"}))
    messages = {p.path: p.message for p in problems}
    assert "string '8'" in messages["training.global_batch_size"]
    assert "string 'yes'" in messages["parallelism.sequence_parallel"]


def test_booleans_are_not_integers():
    [p] = problems_of(spec_data(**{"parallelism.tensor": True}))
    assert p.path == "parallelism.tensor" and "boolean" in p.message


def test_empty_section_means_defaults():
    data = spec_data()
    data["parallelism"] = None
    spec = parse_spec(data)
    assert spec.parallelism.tensor is None  # open: the planner searches it


def test_json_and_yaml_load_the_same(tmp_path):
    import yaml

    (tmp_path / "s.json").write_text(json.dumps(TINY_SPEC))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY_SPEC))
    assert load_spec(tmp_path / "s.json") == load_spec(tmp_path / "s.yaml")


def test_load_errors_name_the_file_and_position(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: [\n")
    with pytest.raises(SpecError) as info:
        load_spec(bad)
    assert str(bad) in info.value.problems[0].path and ":3:" in info.value.problems[0].path


def test_hash_is_stable_and_content_based():
    a, b = parse_spec(TINY_SPEC), parse_spec(json.loads(json.dumps(TINY_SPEC)))
    assert spec_sha256(a) == spec_sha256(b)
    assert spec_sha256(a) != spec_sha256(parse_spec(spec_data(**{"training.train_iters": 11})))


def test_resolved_data_round_trips():
    spec = parse_spec(TINY_SPEC)
    assert parse_spec(spec_to_data(spec)) == spec


def test_uneven_split_fields_are_dumped_only_when_set():
    """Optional fields added later leave existing specs' resolved data and hash unchanged."""
    spec = parse_spec(TINY_SPEC)
    assert "first_stage_layers" not in spec_to_data(spec)["parallelism"]
    uneven = parse_spec(spec_data(**{"model.num_layers": 5, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                     "parallelism.first_stage_layers": 2, "parallelism.last_stage_layers": 3}))
    data = spec_to_data(uneven)["parallelism"]
    assert (data["first_stage_layers"], data["last_stage_layers"]) == (2, 3)
    assert parse_spec(spec_to_data(uneven)) == uneven
    explicit_null = parse_spec(spec_data(**{"parallelism.first_stage_layers": None}))
    assert spec_sha256(explicit_null) == spec_sha256(spec)


def test_engine_and_host_memory_defaults_follow_the_gpu():
    cpu = parse_spec(TINY_SPEC)
    assert (cpu.training.engine, cpu.cluster.host_memory_GiB) == ("deepspeed", 8.0 * cpu.cluster.gpus_per_node)
    gpu = parse_spec(spec_data(**{"cluster.gpu": "a100-80gb", "cluster.gpus_per_node": 8, "parallelism": {}}))
    assert (gpu.training.engine, gpu.cluster.host_memory_GiB) == ("megatron", 512.0)
    given = parse_spec(spec_data(**{"cluster.gpu": "a100-80gb", "training.engine": "deepspeed",
                                    "cluster.host_memory_GiB": 1024}))
    assert (given.training.engine, given.cluster.host_memory_GiB) == ("deepspeed", 1024)
    assert [p.path for p in problems_of(spec_data(**{"training.engine": "nemo"}))] == ["training.engine"]


def test_layout_records_engine_and_host_share():
    from orchestrator.plan import build_plan
    spec = parse_spec(spec_data(**{"cluster.host_memory_GiB": 6}))
    chosen = build_plan(spec).chosen
    assert chosen["engine"] == "deepspeed"
    assert chosen["memory"]["host_capacity_bytes"] == 3 * 2**30   # 6 GiB per node over 2 processes


def test_type_errors_do_not_hide_the_rule_problems_of_the_fields_that_parsed():
    data = spec_data(**{"model.hidden_size": "big", "training.train_iters": "ten", "parallelism.tensor": 2,
                        "parallelism.pipeline": 3, "parallelism.zero_stage": "two"})
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    found = [(p.path, p.message) for p in info.value.problems]
    paths = [path for path, _ in found]
    assert {"model.hidden_size", "training.train_iters", "parallelism.zero_stage"} <= set(paths)
    assert any(path == "parallelism.pipeline" and m.startswith("world_size(2) % (tp(2) * pp(3) = 6) = 2")
               for path, m in found)                                        # a rule problem, reported at once
    assert not any("hidden_size" in m or "train_iters" in m for path, m in found
                   if path not in ("model.hidden_size", "training.train_iters"))   # nothing about stand-ins
