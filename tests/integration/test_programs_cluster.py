"""The example programs under orch on the real local cluster, through SLURM (slurm/cluster.sh) and over pdsh
(slurm/sshd.sh): examples/programs/ds_train.py at ZeRO-1, -2 and -3 and as a PipelineModule (pp = 2), and
hf_train.py (the Hugging Face Trainer), each rank running `python -m orchestrator.programs RUN_DIR`. The
wrapper's records must come from both nodes. The local backend runs the same programs in
test_programs_real.py.

Each backend runs ZeRO-3 (the wrapper's parameter all-gathers), the pipeline and the HF Trainer; ZeRO-1 and
ZeRO-2 take the same path through orch (launch script, wrapper, gradient reduction hooks; they differ only
inside DeepSpeed), so SLURM runs ZeRO-1 and pdsh ZeRO-2 rather than both of them twice."""
from __future__ import annotations

import json

import pytest

from tests.integration.launch_support import launch_env, make_run, orch
from tests.integration.program_support import ENTRY, assert_observed, ds_argv, hf_argv, write_program
from tests.integration.train_support import load_metrics

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")
STEPS = 4
COMMON = {"training.train_iters": STEPS}
VARIANTS = {   # name: (spec overrides, pipeline)
    "zero1": ({"parallelism.zero_stage": 1}, False),
    "zero2": ({"parallelism.zero_stage": 2}, False),
    "zero3": ({"parallelism.zero_stage": 3}, False),
    "pipeline": ({"cluster.gpus_per_node": 2, "parallelism.pipeline": 2, "parallelism.zero_stage": 1}, True),
    "hf": ({"parallelism.zero_stage": 2}, False),
}


def _program_run(tmp_path, name: str, variant: str, **overrides):
    spec, pipeline = VARIANTS[variant]
    run = make_run(tmp_path, name, **COMMON, **spec, **overrides)
    if variant == "hf":
        config = json.loads((run / "ds_config.json").read_text())
        argv = hf_argv(STEPS, lr=3e-3, warmup=1, micro=config["train_micro_batch_size_per_gpu"],
                       accumulation=config["gradient_accumulation_steps"])
        return write_program(run, argv, log_format="hf"), pipeline
    extra = ("--pipeline-parallel-size", "2") if pipeline else ()
    return write_program(run, ds_argv(STEPS, *extra)), pipeline


def _check(run, pipeline: bool) -> None:
    records = load_metrics(run)
    assert_observed(records, STEPS, pipeline=pipeline, bubble_every_step=False)
    assert {r["slowest_host"] for r in records} <= {"orch-n1", "orch-n2"}
    status = json.loads((run / "train_status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", STEPS)


@pytest.mark.slurm
@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"zero2"}))
def test_program_on_two_slurm_nodes(variant, slurm_cluster, tmp_path):
    run, pipeline = _program_run(tmp_path, f"slurm {variant}", variant,
                                 **{"launch.slurm.partition": slurm_cluster.partition})
    result = orch("launch", str(run), "--backend", "slurm", "--wait", env=launch_env(slurm_cluster.env, **ENTRY))
    assert result.returncode == 0, result.stderr[-4000:]
    _check(run, pipeline)


@pytest.mark.pdsh
@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"zero1"}))
def test_program_on_two_pdsh_hosts(variant, ssh_hosts, tmp_path):
    run, pipeline = _program_run(tmp_path, f"pdsh {variant}", variant)
    result = orch("launch", str(run), "--backend", "pdsh", "--wait", env=launch_env(ssh_hosts.env, **ENTRY))
    assert result.returncode == 0, result.stderr[-4000:]
    _check(run, pipeline)
