"""Shared test helpers: specs and fixed-layout plans without running the planner."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Examples whose program lives outside this repository: examples/megatron-lm-gpt.yaml runs the Megatron-LM checkout
# named by ORCH_MEGATRON_LM (tests/tools/prepare_megatron_lm.sh extracts one with pretrain_gpt.py).
NEEDS_MEGATRON_LM_CHECKOUT = {"megatron-lm-gpt"}


def example_names() -> list[str]:
    """Every examples/*.yaml stem that loads here (the Megatron-LM one only with a checkout in ORCH_MEGATRON_LM)."""
    checkout = Path(os.environ.get("ORCH_MEGATRON_LM") or "/nonexistent") / "pretrain_gpt.py"
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml")
                  if p.stem not in NEEDS_MEGATRON_LM_CHECKOUT or checkout.is_file())

TINY_SPEC = {
    "name": "tiny",
    "model": {"preset": "tiny-gpt"},
    "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 2},
    "training": {"global_batch_size": 8, "precision": "fp32", "train_iters": 10,
                 "lr_schedule": {"warmup_iters": 2}, "checkpoint": {"interval": 5}},
    "parallelism": {"tensor": 1, "pipeline": 1, "virtual_pipeline": 1, "zero_stage": 2, "micro_batch_size": 2,
                    "sequence_parallel": False, "recompute": "none", "offload": "none"},
}


def spec_data(**overrides) -> dict:
    """A copy of TINY_SPEC with dotted-path overrides: spec_data(**{"parallelism.zero_stage": 3})."""
    data = copy.deepcopy(TINY_SPEC)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


def fixed_plan(data: dict):
    """A Plan for a spec whose layout is fully fixed, without estimates (renderer tests)."""
    from orchestrator.layout import require_complete
    from orchestrator.plan import Plan
    from orchestrator.spec_loader import parse_spec

    spec = parse_spec(data)
    return Plan(spec=spec, layout=require_complete(spec), chosen={})


@pytest.fixture
def orch_env(tmp_path):
    """Environment for running the installed `orch` in a subprocess."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def pytest_report_header(config):
    from tests.deadlines import load_factor, probe_factor, time_factor

    return (f"deadlines x{time_factor():.1f} for this machine (CPU probe x{probe_factor():.1f}, load x{load_factor():.1f};"
            " tests/deadlines.py; ORCH_TEST_TIME_FACTOR forces one)")


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """`orch ARGV` in this process: (exit code, stdout, stderr)."""
    from orchestrator.cli import main  # noqa: PLC0415

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err
