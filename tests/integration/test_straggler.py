"""A training run with one rank really slowed (a CPU quota on that rank's process, tests/integration/
slow_support.py): metrics.jsonl reports rank_step_time_spread > 1 naming the rank and its host, the job log
and `orch status` name the persistent straggler, and W&B (offline) takes the alert without failing."""
from __future__ import annotations

import json

import pytest

from orchestrator.node import host_name
from orchestrator.runs import read_wandb_offline
from tests.integration.launch_support import launch_env, make_run, orch, start_orch, wait_records
from tests.integration.slow_support import cpu_quota, slow_fraction, join, rank_pid
from tests.integration.train_support import load_metrics
from tests.deadlines import scaled_s

pytestmark = [pytest.mark.integration]
pytest.importorskip("deepspeed")


def test_slowed_rank_is_named_in_metrics_log_status_and_wandb(tmp_path):
    run = make_run(tmp_path, **{"cluster.num_nodes": 1, "cluster.gpus_per_node": 2, "training.train_iters": 10,
                                "tracking.wandb.mode": "offline"})
    env = launch_env({}, ORCH_STRAGGLER_WINDOW="3", ORCH_STRAGGLER_THRESHOLD="1.25")
    with cpu_quota(slow_fraction(0.1)) as group:
        job = start_orch("launch", str(run), "--wait", env=env)
        pid = rank_pid(run, 1)
        wait_records(run, 1, job=job)     # slowed once training runs: the start-up stays fast
        join(group, pid)
        out, err = job.communicate(timeout=scaled_s(300))
    assert job.returncode == 0, err[-3000:]
    records = load_metrics(run)
    # With 2 ranks the median is their mean, so the spread is at most 2: rank 1 at 1/4 of rank 0's speed gives
    # 1.6 (measured at a 0.2 quota: compute 0.25 s against ~0.06-0.1 s); a quota of at most 0.1 (less under load: slow_fraction) leaves a margin.
    late = records[3:]        # after warm-up and after the quota took hold (from step 2 or 3)
    assert all(r["rank_step_time_spread"] > 1.25 for r in late), [r["rank_step_time_spread"] for r in records]
    assert {(r["slowest_rank"], r["slowest_host"]) for r in late} == {(1, host_name())}
    straggler = json.loads((run / "straggler.json").read_text())
    assert (straggler["rank"], straggler["host"], straggler["window"]) == (1, host_name(), 3)
    assert f"straggler: rank 1 on {host_name()} computes" in (run / "logs" / "launch.log").read_text()
    status = orch("status", str(run), env=env)
    assert f"straggler: rank 1 on {host_name()}:" in status.stdout, status.stdout
    wandb_files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(wandb_files) == 1, "no offline W&B run"
    history = read_wandb_offline("w&b", wandb_files[0]).history
    assert [h["slowest_host"] for h in history[3:]] == [host_name()] * (len(history) - 3)
    assert all(h["rank_step_time_spread"] > 1.25 for h in history[3:])
