"""`orch doctor` for real: torchrun here, the 2-node SLURM cluster, pdsh over sshd; one node really slowed by
a CPU quota on its own processes (tests/integration/slow_support.py), never by a sleep inside orch."""
from __future__ import annotations

import json
import time

import pytest

from tests.integration.launch_support import launch_env, make_run, orch
from tests.integration.slow_support import cpu_quota, slow_fraction, python_wrapper

pytestmark = [pytest.mark.integration]
pytest.importorskip("torch")


def doctor(run, *args, env, timeout_s=200):
    result = orch("doctor", str(run), *args, env=env, timeout_s=timeout_s)
    report = json.loads((run / "doctor.json").read_text()) if (run / "doctor.json").is_file() else None
    return result, report


def test_local_healthy_two_ranks_pass_and_write_doctor_json(tmp_path):
    run = make_run(tmp_path, **{"cluster.num_nodes": 1, "cluster.gpus_per_node": 2})
    result, report = doctor(run, "--json", env=launch_env({}))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert json.loads(result.stdout) == report        # --json prints exactly doctor.json
    assert report["healthy"] and report["process_group"] == "gloo"
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and all(r["gemm_flops"] > 1e8 for r in report["ranks"])
    intra = report["collectives"]["intra_node"]["0"]
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"} <= set(intra)
    assert all(intra[op]["busbw_GBps"] > 0 for op in ("all_reduce", "all_to_all")) and intra["latency_s"] > 0
    assert report["measured"]["intra_node_bandwidth_GBps"] > 0
    # CPU: the trainer's own micro-batch on both ranks, and gloo at the trainer's gradient bytes
    from orchestrator.doctor.probe import SIZES, gradient_bucket_bytes
    from orchestrator.rundir import read_run_dir
    from orchestrator.train.model import GPT
    chosen = json.loads((run / "plan.json").read_text())["chosen"]
    assert report["measured"]["model_step_s"] > 0
    assert report["measured"]["model_step_micro_batch"] == read_run_dir(run).spec.parallelism.micro_batch_size
    assert intra["bytes"] == gradient_bucket_bytes(chosen, SIZES["full"]["cpu"]["nbytes"]) // 4 // 2 * 2 * 4
    # What it measured goes into the plan, and plan.json says which figures were measured.
    planned = orch("generate", str(run / "spec.resolved.yaml"), "-o", str(tmp_path / "measured"), "--measured",
                   str(run / "doctor.json"), env=launch_env({}))
    assert planned.returncode == 0, planned.stderr
    plan = json.loads((tmp_path / "measured" / "plan.json").read_text())
    assert plan["measured"]["figures"]["intra_node_bandwidth_GBps"]["value"] == \
        report["measured"]["intra_node_bandwidth_GBps"] == plan["cost_model"]["intra_node_bandwidth_GBps"]
    assert {"collective_latency_s", "matmul_efficiency"} <= set(plan["measured"]["figures"])
    # the probe's forward + backward sets the core's speed, its optimizer step the Adam rate
    assert plan["measured"]["figures"]["kernel_gap_s"]["from"] == "measured.model_fwd_bwd_s"
    m = report["measured"]     # medians of the parts: each below the whole step's, together about it
    assert 0 < m["model_optimizer_s"] < m["model_fwd_bwd_s"] < m["model_step_s"]
    assert m["model_fwd_bwd_s"] + m["model_optimizer_s"] == pytest.approx(m["model_step_s"], rel=0.25)
    assert m["model_optimizer_params"] == sum(p.numel() for p in GPT(read_run_dir(run).spec.model).parameters())
    assert plan["measured"]["figures"]["optimizer_params_per_s"]["from"] == "measured.model_optimizer_s"
    hop = plan["measured"]["figures"]["collective_latency_s"]
    assert hop["value"] == pytest.approx(report["measured"]["allreduce_latency_s"] / 3)   # 2 ranks: 1 + 2 hops


def doctor_with_slow_n2(run, backend: str, backend_env: dict, tmp_path):
    """`orch doctor --backend BACKEND` with orch-n2's ranks under a CPU quota: it fails and names that rank."""
    with cpu_quota(slow_fraction()) as group:
        env = launch_env(backend_env, ORCH_PYTHON=str(python_wrapper(tmp_path, group, "orch-n2")))
        result, report = doctor(run, "--backend", backend, env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    gemm = [o for o in report["offenders"] if o["what"] == "gemm"]
    assert [(o["host"], o["rank"]) for o in gemm] == [("orch-n2", 1)], report["offenders"]
    return result, report


@pytest.mark.slurm
def test_slurm_doctor_names_the_node_under_a_cpu_quota(slurm_cluster, tmp_path):
    run = make_run(tmp_path, **{"launch.slurm.partition": slurm_cluster.partition})
    result, report = doctor_with_slow_n2(run, "slurm", slurm_cluster.env, tmp_path)
    assert "orch-n2 rank 1: GEMM" in result.stdout
    assert {n["host"] for n in report["nodes"]} == {"orch-n1", "orch-n2"} and report["pairs"][0]["p2p_GBps"] > 0


@pytest.mark.slurm
def test_slurm_doctor_passes_a_healthy_cluster(slurm_cluster, tmp_path):
    run = make_run(tmp_path, **{"launch.slurm.partition": slurm_cluster.partition})
    result, report = doctor(run, "--backend", "slurm", env=launch_env(slurm_cluster.env))
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["healthy"] and [n["host"] for n in report["nodes"]] == ["orch-n1", "orch-n2"]
    assert report["measured"]["inter_node_bandwidth_GBps"] > 0


@pytest.mark.pdsh
def test_pdsh_doctor_names_the_host_under_a_cpu_quota(ssh_hosts, tmp_path):
    doctor_with_slow_n2(make_run(tmp_path), "pdsh", ssh_hosts.env, tmp_path)


def test_launch_preflight_passes_then_trains(tmp_path):
    pytest.importorskip("deepspeed")
    run = make_run(tmp_path, **{"cluster.num_nodes": 1, "cluster.gpus_per_node": 2, "training.train_iters": 2})
    result = orch("launch", str(run), "--preflight", "--wait", env=launch_env({}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preflight: 1 node(s), 2 rank(s) healthy" in result.stderr
    assert json.loads((run / "doctor.json").read_text())["mode"] == "quick"


@pytest.mark.slurm
def test_launch_preflight_refuses_more_nodes_than_the_partition_has_at_once(slurm_cluster, tmp_path):
    run = make_run(tmp_path, **{"launch.slurm.partition": slurm_cluster.partition, "cluster.num_nodes": 4,
                                "training.global_batch_size": 16})
    started = time.monotonic()
    result = orch("launch", str(run), "--backend", "slurm", "--preflight", env=launch_env(slurm_cluster.env))
    assert result.returncode == 1 and time.monotonic() - started < 30, result.stderr
    assert "preflight failed" in result.stderr and "nothing was started" in result.stderr
    assert "has 2 usable node(s) (orch-n1, orch-n2), the spec needs num_nodes(4)" in result.stderr
    assert not (run / "job.json").exists()


@pytest.mark.pdsh
def test_launch_preflight_names_a_host_that_is_not_there(ssh_hosts, tmp_path):
    run = make_run(tmp_path, **{"launch.pdsh.hosts": ["orch-n1", "orch-missing-host"]})
    started = time.monotonic()
    result = orch("launch", str(run), "--backend", "pdsh", "--preflight", env=launch_env(ssh_hosts.env))
    assert result.returncode == 1 and time.monotonic() - started < 60, result.stderr
    assert "orch-missing-host (not reachable over ssh" in result.stderr, result.stderr
    assert not (run / "job.json").exists()


@pytest.mark.slurm
def test_a_job_that_never_starts_fails_within_the_timeout_with_slurms_reason(slurm_cluster, tmp_path):
    run = make_run(tmp_path, **{"launch.slurm.partition": slurm_cluster.partition,
                                "launch.slurm.extra_args": "--begin=now+1hour"})
    started = time.monotonic()
    result, report = doctor(run, "--backend", "slurm", "--quick", "--timeout", "8", env=launch_env(slurm_cluster.env))
    assert result.returncode == 1 and time.monotonic() - started < 40, result.stderr
    assert "was still PENDING (reason BeginTime) after 8 s; cancelled it" in result.stdout, result.stdout
    assert report["offenders"][0]["what"] == "rendezvous" and report["nodes"] == []
