"""The DeepSpeed example script (examples/programs/ds_train.py, ZeRO-2) under orch on the real local cluster:
2 nodes x 1 rank through SLURM (slurm/cluster.sh) and over pdsh (slurm/sshd.sh), each rank running
`python -m orchestrator.programs RUN_DIR`. The wrapper's records must come from both nodes."""
from __future__ import annotations

import json

import pytest

from tests.integration.launch_support import launch_env, make_run, orch
from tests.integration.program_support import ENTRY, assert_observed, ds_argv, write_program
from tests.integration.train_support import load_metrics

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")
STEPS = 8      # launch_support.TWO_NODES


def _check(run) -> None:
    records = load_metrics(run)
    assert_observed(records, STEPS)
    assert {r["slowest_host"] for r in records} <= {"orch-n1", "orch-n2"}
    status = json.loads((run / "train_status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", STEPS)


@pytest.mark.slurm
def test_script_on_two_slurm_nodes(slurm_cluster, tmp_path):
    run = write_program(make_run(tmp_path, "slurm run", **{"launch.slurm.partition": slurm_cluster.partition}),
                        ds_argv(STEPS))
    result = orch("launch", str(run), "--backend", "slurm", "--wait", env=launch_env(slurm_cluster.env, **ENTRY))
    assert result.returncode == 0, result.stderr[-4000:]
    _check(run)


@pytest.mark.pdsh
def test_script_on_two_pdsh_hosts(ssh_hosts, tmp_path):
    run = write_program(make_run(tmp_path, "pdsh run"), ds_argv(STEPS))
    result = orch("launch", str(run), "--backend", "pdsh", "--wait", env=launch_env(ssh_hosts.env, **ENTRY))
    assert result.returncode == 0, result.stderr[-4000:]
    _check(run)
