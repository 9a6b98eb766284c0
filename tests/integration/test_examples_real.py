"""Every example spec, generated, is accepted by the real consumers: DeepSpeed's config classes at the
plan's data-parallel size, orch's static checks, and the launch scripts' shell syntax (bash -n).
(Megatron-Core's TransformerConfig and Megatron-LM's validate_args: tests/integration/test_megatron_real.py.)"""
from __future__ import annotations

import subprocess

import pytest

from orchestrator.plan import build_plan
from orchestrator.rundir import write_run_dir
from orchestrator.spec_loader import load_spec
from orchestrator.validate import validate_path
from orchestrator.validate._ds_probe import ProbeRequest, probe_ds_configs
from tests.conftest import EXAMPLES, example_names

pytestmark = pytest.mark.integration
NAMES = example_names()


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    return {name: write_run_dir(build_plan(load_spec(EXAMPLES / f"{name}.yaml")), root / name) for name in NAMES}


def test_there_are_the_examples_the_readme_names():
    assert {"tiny-gpt-cpu", "gpt3-1.7b-32xa100", "llama3-8b-64xh100", "gpt3-175b-1024xa100"} <= set(NAMES)


def test_deepspeed_accepts_every_generated_config(run_dirs):
    import json

    requests = []
    for name, run in run_dirs.items():
        spec = load_spec(run / "spec.resolved.yaml")
        p = spec.parallelism
        requests.append(ProbeRequest(json.loads((run / "ds_config.json").read_text()), p.data, f"{name}/ds_config.json"))
    results = probe_ds_configs(requests)
    assert [str(problem) for r in results for problem in r.problems] == []
    for request, result in zip(requests, results):
        assert result.resolved["train_batch_size"] == request.config["train_batch_size"]
        assert result.resolved["zero_stage"] == request.config["zero_optimization"]["stage"]


@pytest.mark.parametrize("name", NAMES)
def test_static_validation_of_each_run_dir_is_clean(run_dirs, name):
    assert [str(p) for p in validate_path(run_dirs[name], deep=False)] == []


@pytest.mark.parametrize("script", ["launch_local.sh", "launch.sbatch", "launch_pdsh.sh"])
def test_launch_scripts_are_valid_bash(run_dirs, script):
    for run in run_dirs.values():
        result = subprocess.run(["bash", "-n", str(run / script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{run / script}: {result.stderr}"
