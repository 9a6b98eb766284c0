"""`orch launch --backend slurm` on the real local cluster (slurm/cluster.sh): 2 nodes x 1 rank, ZeRO-2.

Run dirs live under a directory named like a shell injection, and a W&B key is in the environment: the
name must never execute, and the key must reach the ranks but no file.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.integration.conftest import SlurmCluster
from tests.integration.launch_support import (HOSTILE, SECRET, files_holding, launch_env, make_run, no_pwned,
                                              orch, start_orch, steps, wait_gone, wait_records, watch_ranks)
from tests.integration.train_support import assert_loss_falls, load_metrics
from tests.deadlines import scaled_s

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
pytest.importorskip("deepspeed")


def slurm_run(cluster: SlurmCluster, tmp_path, **overrides):
    run = make_run(tmp_path / HOSTILE, **{"launch.slurm.partition": cluster.partition, **overrides})
    return run, launch_env(cluster.env)


def job_id(run) -> str:
    return json.loads((run / "job.json").read_text())["job_id"]


def test_two_node_zero2_job_completes_with_ranks_on_both_nodes(slurm_cluster, tmp_path):
    run, env = slurm_run(slurm_cluster, tmp_path)
    job = start_orch("launch", str(run), "--backend", "slurm", "--wait", env=env)
    ranks = watch_ranks(run, job, 2)
    out, err = job.communicate(timeout=scaled_s(240))
    assert job.returncode == 0, err
    # The ranks themselves: rank 0 started by the torchrun of orch-n1, rank 1 by that of orch-n2; the secret
    # reached both through the environment.
    assert {r: env["SLURMD_NODENAME"] for r, env in ranks.items()} == {0: "orch-n1", 1: "orch-n2"}
    assert {r: env["SLURM_NODEID"] for r, env in ranks.items()} == {0: "0", 1: "1"}
    assert all(env.get("WANDB_API_KEY") == SECRET for env in ranks.values())
    assert ranks[0]["MASTER_ADDR"] == ranks[1]["MASTER_ADDR"] == "orch-n1"
    # Every step once, the loss falls, the state is COMPLETED.
    assert steps(run) == list(range(1, 9))
    assert_loss_falls(load_metrics(run))
    assert [line.split("  ")[0] for line in out.splitlines()] == [f"step {i}/8" for i in range(1, 9)]
    status = orch("status", str(run), "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED"
    # The job's own logs name both nodes; each node's torchrun kept its ranks' logs.
    jid = job_id(run)
    logs = (run / "logs" / f"slurm-{jid}.out").read_text() + (run / "logs" / f"slurm-{jid}.err").read_text()
    assert "orch: node orch-n1 (SLURM_NODEID 0) starts torchrun --node_rank=0" in logs
    assert "orch: node orch-n2 (SLURM_NODEID 1) starts torchrun --node_rank=1" in logs
    assert re.search(r"^\[orch-n1 rank0\]:\[orch-train\] step 8/8", logs, re.M)
    assert re.search(r"^\[orch-n2 rank1\]:", logs, re.M)
    assert list((run / "logs" / "torchrun" / "orch-n2").glob("*/attempt_0/0/stderr.log"))
    # Nothing executed from the path; the secret is in no file orch or SLURM's logs wrote.
    assert not no_pwned(tmp_path)
    assert not files_holding(SECRET, run, slurm_cluster.state_dir / "log")
    assert SECRET not in out + err


def test_cancel_stops_a_running_job_within_seconds(slurm_cluster, tmp_path):
    run, env = slurm_run(slurm_cluster, tmp_path, **{"training.train_iters": 500})
    launched = orch("launch", str(run), "--backend", "slurm", env=env)
    assert launched.returncode == 0, launched.stderr
    wait_records(run, 2)
    started = time.monotonic()
    cancelled = orch("cancel", str(run), env=env)
    took_s = time.monotonic() - started
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip().endswith("CANCELLED") and took_s < 20, (cancelled.stdout, took_s)
    assert not wait_gone(run, 5)
    status = orch("status", str(run), env=env)
    assert status.returncode == 0 and status.stdout.strip().endswith("CANCELLED")
    assert len(steps(run)) < 500


def test_failing_trainer_ends_failed_with_the_ranks_last_lines(slurm_cluster, tmp_path):
    # The trainer's fault injection: rank 1 (on orch-n2) exits 3 at step 3; the environment reaches it
    # through sbatch --export=ALL.
    run, env = slurm_run(slurm_cluster, tmp_path)
    env = {**env, "ORCH_FAULT_AT_STEP": "3", "ORCH_FAULT_RANK": "1"}
    launched = orch("launch", str(run), "--backend", "slurm", "--wait", env=env)
    assert launched.returncode == 3          # the rank's own code (EXIT_INJECTED_FAULT), not torchrun's / srun's 1
    err = launched.stderr
    assert f"job {job_id(run)} FAILED" in err
    assert "rank 1 failed with exit code 3; its last lines" in err, err
    assert "[orch-n2 rank1]:[orch-train] rank 1: injected fault at step 3" in err, err
    assert "rank0]" not in err.split("its last lines")[1]
    assert steps(run) == [1, 2]
    status = orch("status", str(run), env=env)
    assert status.returncode == 1 and status.stdout.strip().endswith("FAILED")
    assert not wait_gone(run, 5)


def test_usr1_checkpoints_requeues_and_resumes_without_losing_a_step(slurm_cluster, tmp_path):
    run, env = slurm_run(slurm_cluster, tmp_path, **{"training.train_iters": 10})
    job = start_orch("launch", str(run), "--backend", "slurm", "--wait", env=env)
    wait_records(run, 3, job=job)
    jid = job_id(run)
    # What `#SBATCH --signal=B:USR1@120` does before the time limit: USR1 to the batch script.
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", jid)
    # SLURM holds a requeued batch job until the old start's (revoked) credential expires: slurm.conf's
    # cred_expire, 10 s on the test cluster (120 s by default). Forcing StartTime=now earlier races with
    # that ("Killing non-startable batch job: Job credential revoked"), so the test just waits.
    out, err = job.communicate(timeout=scaled_s(240))
    assert job.returncode == 0, err
    assert f"job {jid} PENDING" in err and f"job {jid} RUNNING" in err    # the follower saw the requeue
    assert steps(run) == list(range(1, 11))
    logs = (run / "logs" / f"slurm-{jid}.err").read_text() + (run / "logs" / f"slurm-{jid}.out").read_text()
    assert f"orch: every rank saved a checkpoint; requeueing job {jid}" in logs
    assert f"orch: job {jid} start 2 on" in logs
    stopped = re.search(r"stop requested \(SIGUSR1\): checkpoint of step (\d+) saved", logs)
    resumed = re.search(r"resumed from .*global_step(\d+) \(step (\d+)\)", logs)
    assert stopped and resumed and stopped.group(1) == resumed.group(2), logs[-3000:]
    assert 3 <= int(stopped.group(1)) < 10
    assert "Restarts=1" in slurm_cluster.run("scontrol", "show", "job", jid).stdout
    assert orch("status", str(run), env=env).stdout.strip().endswith("COMPLETED")
    # The follower printed each step once per run of it, across the requeue.
    printed = [int(line.split()[1].split("/")[0]) for line in out.splitlines() if line.startswith("step ")]
    assert sorted(set(printed)) == list(range(1, 11))


def test_sweep_array_waits_for_its_dependency(slurm_cluster, tmp_path, monkeypatch):
    """Two run dirs as one job array (the library's sweep API), held by --dependency until another job ends."""
    from orchestrator.launch import slurm
    from orchestrator.launch.base import CommandRunner, JobRecord, JobState
    from orchestrator.rundir import read_run_dir

    one_rank = {"cluster.num_nodes": 1, "cluster.gpus_per_node": 1, "training.train_iters": 2,
                "launch.slurm.partition": slurm_cluster.partition, "launch.pdsh.hosts": []}
    members = [make_run(tmp_path / HOSTILE, f"sweep {i}", **{**one_rank, "training.optimizer.lr": 1e-3 * (i + 1)})
               for i in range(2)]
    for name, value in launch_env(slurm_cluster.env).items():
        monkeypatch.setenv(name, value)
    first_id = str(slurm_cluster.sbatch(f"--partition={slurm_cluster.partition}", "--output=/dev/null",
                                        "--wrap=sleep 3"))
    runner = CommandRunner()
    records = slurm.submit_sweep(slurm.build_sweep([read_run_dir(m) for m in members],
                                                   dependency=f"afterok:{first_id}"), runner)
    array_id = records[0].extra["array_job_id"]
    shown = runner.run(["scontrol", "show", "job", "-o", array_id]).stdout
    assert f"Dependency=afterok:{first_id}" in shown and "JobState=PENDING" in shown
    deadline = time.monotonic() + scaled_s(180)
    states = []
    while time.monotonic() < deadline:
        states = [slurm.status(JobRecord.load(m), runner) for m in members]
        if all(s.finished for s in states):
            break
        time.sleep(0.5)
    assert states == [JobState.COMPLETED] * 2
    first_end = _time_field(runner, first_id, "EndTime")
    for member, record in zip(members, records):
        assert steps(member) == [1, 2]
        assert _time_field(runner, record.job_id, "StartTime") >= first_end
        assert (members[0] / "logs" / f"slurm-{record.job_id}.out").exists()
    assert not no_pwned(tmp_path)


def _time_field(runner, job_id: str, name: str) -> str:
    text = runner.run(["scontrol", "show", "job", "-o", job_id]).stdout
    return re.search(rf"(?:^|\s){name}=(\S+)", text).group(1)
