"""The local SLURM cluster and sshd hosts are real: jobs span both nodes, pdsh reaches both hosts.

These tests check the test infrastructure (slurm/), not orch; they fail first when the daemons are sick.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO_ROOT, SlurmCluster, SshHosts
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration

JOB_TIMEOUT_S = 60


def _write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    return path


def _run_job(cluster: SlurmCluster, tmp_path: Path, body: str, *sbatch_args: str) -> str:
    """Run a batch script to completion; its output."""
    script = _write_script(tmp_path / "job.sh", body)
    out = tmp_path / "job.out"
    job_id = cluster.sbatch(
        f"--partition={cluster.partition}", f"--output={out}", f"--chdir={tmp_path}", *sbatch_args, str(script)
    )
    state = cluster.wait_job(job_id, timeout_s=JOB_TIMEOUT_S)
    text = out.read_text() if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} ended {state}; output:\n{text}"
    return text


@pytest.mark.slurm
def test_two_node_job_runs_one_task_on_each_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    text = _run_job(
        slurm_cluster,
        tmp_path,
        'srun bash -c \'echo "task node=$SLURMD_NODENAME nodeid=$SLURM_NODEID procid=$SLURM_PROCID"\'\n',
        "--nodes=2",
        "--ntasks-per-node=1",
    )
    task_lines = [line.split()[1:] for line in text.splitlines() if line.startswith("task ")]
    tasks = [dict(kv.split("=", 1) for kv in fields) for fields in task_lines]
    assert len(tasks) == 2, text
    first, second = slurm_cluster.nodes[:2]
    assert {t["node"]: t["nodeid"] for t in tasks} == {first: "0", second: "1"}, text
    assert sorted(t["procid"] for t in tasks) == ["0", "1"], text


@pytest.mark.slurm
def test_first_host_of_the_nodelist_resolves_to_its_own_address(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    text = _run_job(
        slurm_cluster,
        tmp_path,
        'master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)\n'
        'echo "master=$master addr=$(getent ahostsv4 "$master" | head -1 | cut -d" " -f1)"\n',
        "--nodes=2",
        "--ntasks-per-node=1",
    )
    first = slurm_cluster.nodes[0]
    assert f"master={first} addr={slurm_cluster.node_addrs[first]}\n" in text
    assert slurm_cluster.node_addrs[first] == "127.0.0.11"
    assert socket.gethostbyname(first) == "127.0.0.11"


@pytest.mark.slurm
def test_fake_gpus_are_allocated_per_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    gpus = slurm_cluster.gpus_per_node
    if gpus == 0:
        pytest.skip("the cluster has no fake GPUs (slurm/cluster.sh up --gpus 2)")
    text = _run_job(
        slurm_cluster,
        tmp_path,
        "srun bash -c 'echo \"gpus $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"'\n",
        "--nodes=2",
        "--ntasks-per-node=1",
        f"--gpus-per-node={gpus}",
    )
    visible = ",".join(str(i) for i in range(gpus))
    for node in slurm_cluster.nodes[:2]:
        assert f"gpus {node} {visible}\n" in text


@pytest.mark.slurm
def test_cluster_status_reports_up(slurm_cluster: SlurmCluster) -> None:
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "slurm" / "cluster.sh"), "status"],
        capture_output=True, text=True, timeout=scaled_s(30),
    )
    assert proc.returncode == 0, proc.stderr
    for node in slurm_cluster.nodes:
        assert node in proc.stdout


def _pdsh(ssh_hosts: SshHosts, command: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = ["pdsh", *flags, "-R", "ssh", "-w", ",".join(ssh_hosts.hosts[:2]), command]
    return subprocess.run(argv, env=ssh_hosts.environ(), capture_output=True, text=True, timeout=scaled_s(60))


@pytest.mark.pdsh
def test_pdsh_runs_on_both_hosts_at_their_own_addresses(ssh_hosts: SshHosts) -> None:
    proc = _pdsh(ssh_hosts, 'echo "rank=%n server=${SSH_CONNECTION}"', "-S")
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert len(lines) == 2, proc.stdout
    for rank, (host, line) in enumerate(zip(ssh_hosts.hosts[:2], lines, strict=True)):
        # SSH_CONNECTION = client_ip client_port server_ip server_port: the server address is the host's own.
        prefix, _, rest = line.partition(": ")
        assert prefix == host, line
        fields = dict(kv.split("=", 1) for kv in rest.split(" ", 1))
        assert fields["rank"] == str(rank), line
        assert fields["server"].split()[2:] == [ssh_hosts.addrs[host], str(ssh_hosts.port)], line


@pytest.mark.pdsh
def test_pdsh_dash_S_returns_the_failing_hosts_exit_code(ssh_hosts: SshHosts) -> None:
    failing = ssh_hosts.hosts[1]
    command = f'case "$SSH_CONNECTION" in *" {ssh_hosts.addrs[failing]} "*) exit 3 ;; esac; echo fine'
    proc = _pdsh(ssh_hosts, command, "-S")
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert f"{failing}: ssh exited with exit code 3" in proc.stderr
    assert f"{ssh_hosts.hosts[0]}: fine" in proc.stdout


@pytest.mark.pdsh
def test_pdsh_without_dash_S_hides_the_failure(ssh_hosts: SshHosts) -> None:
    # Why every pdsh call in orch passes -S: without it a failing host still exits 0.
    failing = ssh_hosts.addrs[ssh_hosts.hosts[1]]
    proc = _pdsh(ssh_hosts, f'case "$SSH_CONNECTION" in *" {failing} "*) exit 3 ;; esac')
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
