"""Bad input: exit 2, a message naming the field, no traceback, nothing written."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import spec_data
from tests.conftest import run_cli


def _yaml(**overrides) -> str:
    return yaml.safe_dump(spec_data(**overrides))


# (id, file text, text the error must contain). Each one is a distinct mistake a user makes.
BAD_SPECS = [
    ("malformed-yaml", "name: x\nmodel: {preset: tiny-gpt\n", "invalid YAML"),
    ("tab-indent-yaml", "name: x\nmodel:\n\tpreset: tiny-gpt\n", "invalid YAML"),
    ("top-level-list", "- name: x\n", "top level must be a mapping"),
    ("empty-file", "", "top level must be a mapping"),
    ("unknown-top-key", _yaml(trainning={"x": 1}), "did you mean 'training'"),
    ("unknown-model-key", _yaml(**{"model.hidden": 64}), "model.hidden"),
    ("unknown-parallel-key", _yaml(**{"parallelism.tensor_parallel": 2}), "parallelism.tensor_parallel"),
    ("unknown-preset", _yaml(**{"model.preset": "llama9-8b"}), "model.preset"),
    ("unknown-gpu", _yaml(**{"cluster.gpu": "a100"}), "cluster.gpu"),
    ("missing-name", yaml.safe_dump({k: v for k, v in spec_data().items() if k != "name"}), "name"),
    ("missing-cluster", yaml.safe_dump({k: v for k, v in spec_data().items() if k != "cluster"}), "cluster"),
    ("missing-batch", _yaml(**{"training": {"precision": "fp32"}}), "training.global_batch_size"),
    ("missing-model-shape", _yaml(**{"model": {"hidden_size": 64}}), "model.num_layers"),
    ("string-batch", _yaml(**{"training.global_batch_size": "8"}), "training.global_batch_size"),
    ("float-layers", _yaml(**{"model.num_layers": 4.5}), "model.num_layers"),
    ("bool-tp", _yaml(**{"parallelism.tensor": True}), "parallelism.tensor"),
    ("string-bool", _yaml(**{"model.gated_mlp": "yes"}), "model.gated_mlp"),
    ("negative-lr", _yaml(**{"training.optimizer.lr": -1.0}), "training.optimizer.lr"),
    ("zero-nodes", _yaml(**{"cluster.num_nodes": 0}), "cluster.num_nodes"),
    ("zero-stage-5", _yaml(**{"parallelism.zero_stage": 5}), "parallelism.zero_stage"),
    ("bad-precision", _yaml(**{"training.precision": "bfloat16"}), "training.precision"),
    ("bad-recompute", _yaml(**{"parallelism.recompute": "partial"}), "parallelism.recompute"),
    ("bad-offload", _yaml(**{"parallelism.offload": "cpu"}), "parallelism.offload"),
    ("bad-backend", _yaml(**{"launch.backend": "k8s"}), "launch.backend"),
    ("betas-not-list", _yaml(**{"training.optimizer.betas": 0.9}), "training.optimizer.betas"),
    ("hostile-name", _yaml(name="x; rm -rf /"), "name"),
    ("hostile-name-subshell", _yaml(name="$(touch /tmp/pwned)"), "name"),
    ("hostile-partition", _yaml(**{"launch.slurm.partition": "x; touch /tmp/pwned"}), "launch.slurm.partition"),
    ("hostile-host", _yaml(**{"launch.pdsh.hosts": ["a;reboot"]}), "launch.pdsh.hosts[0]"),
    ("bad-time", _yaml(**{"launch.slurm.time": "4 hours"}), "launch.slurm.time"),
    ("tp-not-dividing-world", _yaml(**{"parallelism.tensor": 3}), "parallelism.tensor"),
    ("heads-not-divisible", _yaml(**{"model.num_attention_heads": 3, "model.hidden_size": 129,
                                     "parallelism.tensor": 2}), "num_attention_heads(3) % tp(2)"),
    ("hidden-not-divisible", _yaml(**{"model.hidden_size": 130}), "model.hidden_size"),
    ("layers-not-divisible-pp", _yaml(**{"model.num_layers": 3, "parallelism.pipeline": 2,
                                         "parallelism.zero_stage": 1}), "parallelism.pipeline"),
    ("batch-not-divisible", _yaml(**{"training.global_batch_size": 6, "parallelism.micro_batch_size": 4}),
     "training.global_batch_size"),
    ("sp-without-tp", _yaml(**{"parallelism.sequence_parallel": True}), "parallelism.sequence_parallel"),
    ("pipeline-with-zero3", _yaml(**{"parallelism.pipeline": 2, "parallelism.zero_stage": 3}),
     "parallelism.zero_stage"),
    ("offload-without-zero", _yaml(**{"parallelism.zero_stage": 0, "parallelism.offload": "optimizer"}),
     "parallelism.offload"),
    ("param-offload-zero2", _yaml(**{"parallelism.offload": "optimizer+params"}), "parallelism.offload"),
    ("fp16-on-cpu", _yaml(**{"training.precision": "fp16"}), "training.precision"),
    ("given-dp-wrong", _yaml(**{"parallelism.data": 4}), "parallelism.data"),
    ("vpp-without-pp", _yaml(**{"parallelism.virtual_pipeline": 2}), "parallelism.virtual_pipeline"),
    ("gqa-not-dividing", _yaml(**{"model.num_query_groups": 3}), "model.num_query_groups"),
    ("real-data-without-path", _yaml(**{"data.synthetic": False}), "data.path"),
    ("pdsh-host-count", _yaml(**{"launch.backend": "pdsh", "launch.pdsh.hosts": ["a", "b"]}), "launch.pdsh.hosts"),
    ("layers-not-divisible-pp-hint", _yaml(**{"model.num_layers": 5, "parallelism.pipeline": 2,
                                              "parallelism.zero_stage": 1}),
     "set parallelism.first_stage_layers: 2 and parallelism.last_stage_layers: 3 (no middle stage)"),
    ("uneven-split-without-pipeline", _yaml(**{"parallelism.first_stage_layers": 2}), "needs pp >= 2, got pp(1)"),
    ("uneven-split-first-plus-last", _yaml(**{"model.num_layers": 5, "parallelism.pipeline": 2,
                                              "parallelism.zero_stage": 1, "parallelism.first_stage_layers": 2,
                                              "parallelism.last_stage_layers": 2}), "= 4 != num_layers(5) with pp(2)"),
    ("uneven-split-zero-layers", _yaml(**{"model.num_layers": 5, "parallelism.pipeline": 2,
                                          "parallelism.zero_stage": 1, "parallelism.last_stage_layers": 0}),
     "parallelism.last_stage_layers: 0 is below the minimum 1"),
    ("uneven-split-string", _yaml(**{"model.num_layers": 5, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                     "parallelism.first_stage_layers": "2"}), "parallelism.first_stage_layers"),
]


@pytest.mark.parametrize("text,expect", [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_a_clean_exit_2_and_writes_nothing(tmp_path, capsys, text, expect):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out_dir = tmp_path / "run"
    code, out, err = run_cli(["generate", str(spec), "-o", str(out_dir)], capsys)
    assert code == 2, err
    assert expect in err
    assert "Traceback" not in err + out
    assert not out_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no temp dirs left behind
    code, out, _ = run_cli(["validate", "--static", str(spec)], capsys)
    assert code == 2 and expect in out


def test_there_are_at_least_forty_distinct_bad_specs():
    assert len({c[0] for c in BAD_SPECS}) >= 40 and len({c[1] for c in BAD_SPECS}) == len(BAD_SPECS)


def test_every_problem_listed_at_once_in_json(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(_yaml(**{"parallelism.tensor": 3, "training.precision": "fp16", "name": "a b"}))
    code, out, _ = run_cli(["validate", "--json", str(spec)], capsys)
    problems = json.loads(out)
    assert code == 2 and {p["path"].split(":")[-1] for p in problems} >= {"parallelism.tensor", "training.precision",
                                                                          "name"}
    assert all(p["message"] and p["hint"] for p in problems)


def test_missing_spec_file(tmp_path, capsys):
    code, _, err = run_cli(["generate", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and "no such file" in err and not (tmp_path / "run").exists()


def test_usage_error_is_exit_2(capsys):
    code, _, err = run_cli(["generate"], capsys)
    assert code == 2 and "SPEC" in err
