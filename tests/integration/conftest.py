"""Fixtures for integration tests that need real daemons on this machine.

The daemons are started outside pytest, never by these fixtures: ``slurm/cluster.sh up`` (SLURM) and
``slurm/sshd.sh up`` (sshd for pdsh); ``.ci/run`` calls ``slurm/ci-up.sh``. The fixtures only detect the
daemons and describe them. When they are missing a test skips with the command that starts them, or
fails instead when ``ORCH_REQUIRE_CLUSTER=1`` (as in CI), so a broken cluster cannot pass as skipped.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import NoReturn

import pytest

from tests.deadlines import Deadline, scaled_s

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = Path(os.environ.get("ORCH_SLURM_DIR", "/tmp/orch-slurm"))
PROBE_TIMEOUT_S = 15
# sinfo %T states of a node that takes jobs.
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
# Job states after which a SLURM job never runs again (squeue's long names).
FINAL_JOB_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, values shell-quoted, as slurm/*.sh write them."""
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = " ".join(shlex.split(value))
    return env


def unavailable(what: str, start_command: str) -> NoReturn:
    """Skip the test, or fail it when ORCH_REQUIRE_CLUSTER=1."""
    message = f"{what}; start it with: {start_command}"
    if os.environ.get("ORCH_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"{message}  (ORCH_REQUIRE_CLUSTER=1: not skipping)", pytrace=False)
    pytest.skip(message)


def _probe(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=scaled_s(PROBE_TIMEOUT_S))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def _check_addresses(addrs: dict[str, str]) -> str | None:
    for name, addr in addrs.items():
        try:
            resolved = socket.gethostbyname(name)
        except OSError as exc:
            return f"{name} does not resolve ({exc})"
        if resolved != addr:
            return f"{name} resolves to {resolved}, expected {addr} (see /etc/hosts)"
    return None


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """The local cluster of slurm/cluster.sh, as its cluster.env describes it."""

    state_dir: Path
    conf_path: Path
    partition: str
    nodes: tuple[str, ...]
    node_addrs: dict[str, str]
    cpus_per_node: int
    gpus_per_node: int
    has_accounting: bool
    env: dict[str, str]  # what a client needs on top of os.environ

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def run(self, *argv: str, timeout_s: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv), env=self.environ(), capture_output=True, text=True, timeout=scaled_s(timeout_s)
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{shlex.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str) -> int:
        """Submit with ``sbatch --parsable ARGS``; the job id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        job_id, _, _cluster = out.partition(";")
        if not job_id.isdigit():
            raise AssertionError(f"sbatch --parsable printed {out!r}, expected a job id")
        return int(job_id)

    def job_state(self, job_id: int) -> str:
        out = self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T").stdout.split()
        return out[0] if out else "UNKNOWN"

    def wait_job(self, job_id: int, timeout_s: float = 60) -> str:
        """Poll squeue until the job reaches a final state; that state (sbatch --wait is slower)."""
        deadline = Deadline(timeout_s)
        state = "UNKNOWN"
        while not deadline.expired():
            state = self.job_state(job_id)
            if state in FINAL_JOB_STATES:
                return state
            time.sleep(0.2)
        details = self.run("scontrol", "show", "job", str(job_id), check=False)
        raise AssertionError(
            f"job {job_id} still {state} after {deadline}:\n{details.stdout}{details.stderr}"
        )


@dataclasses.dataclass(frozen=True)
class SshHosts:
    """The private sshd of slurm/sshd.sh: fake hosts reachable over ssh (and pdsh -R ssh)."""

    hosts: tuple[str, ...]
    addrs: dict[str, str]
    port: int
    ssh_config: Path
    identity_file: Path
    env: dict[str, str]  # what a client needs on top of os.environ (PDSH_RCMD_TYPE, PDSH_SSH_ARGS_APPEND)

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def ssh_argv(self, host: str, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), "-p", str(self.port), host, command]


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    start = "slurm/cluster.sh up"
    env_file = STATE_DIR / "cluster.env"
    if shutil.which("sinfo") is None:
        unavailable("SLURM is not installed (no sinfo on PATH)", start)
    if not env_file.exists() or not (STATE_DIR / "params").exists():
        unavailable(f"the local SLURM cluster is down (no {env_file} or {STATE_DIR / 'params'})", start)
    described = read_env_file(env_file)
    nodes = tuple(described["ORCH_SLURM_NODES"].split(","))
    addrs = dict(zip(nodes, described["ORCH_SLURM_NODE_ADDRS"].split(","), strict=True))
    cluster = SlurmCluster(
        state_dir=STATE_DIR,
        conf_path=Path(described["SLURM_CONF"]),
        partition=described["ORCH_SLURM_PARTITION"],
        nodes=nodes,
        node_addrs=addrs,
        cpus_per_node=int(described["ORCH_SLURM_CPUS_PER_NODE"]),
        gpus_per_node=int(described["ORCH_SLURM_GPUS_PER_NODE"]),
        has_accounting=described["ORCH_SLURM_ACCOUNTING"] == "1",
        env={"SLURM_CONF": described["SLURM_CONF"]},
    )
    ok, out = _probe(["sinfo", "-h", "-N", "-p", cluster.partition, "-o", "%N %T"], cluster.environ())
    if not ok:
        unavailable(f"the local SLURM cluster does not answer (sinfo: {out})", start)
    states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
    bad = {n: states.get(n, "missing") for n in nodes if states.get(n) not in USABLE_NODE_STATES}
    if bad:
        unavailable(f"SLURM nodes not usable: {bad} (sinfo: {out!r})", f"slurm/cluster.sh down && {start}")
    problem = _check_addresses(addrs)
    if problem:
        unavailable(problem, start)
    return cluster


@pytest.fixture(scope="session")
def ssh_hosts() -> SshHosts:
    start = "slurm/sshd.sh up"
    env_file = STATE_DIR / "sshd" / "sshd.env"
    for tool in ("ssh", "pdsh"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed", start)
    if not env_file.exists() or not (env_file.parent / "params").exists():
        unavailable(f"the local sshd hosts are down (no {env_file} or {env_file.parent / 'params'})", start)
    described = read_env_file(env_file)
    hosts = tuple(described["ORCH_SSH_HOSTS"].split(","))
    addrs = dict(zip(hosts, described["ORCH_SSH_HOST_ADDRS"].split(","), strict=True))
    ssh = SshHosts(
        hosts=hosts,
        addrs=addrs,
        port=int(described["ORCH_SSH_PORT"]),
        ssh_config=Path(described["ORCH_SSH_CONFIG"]),
        identity_file=Path(described["ORCH_SSH_IDENTITY"]),
        env={k: described[k] for k in ("PDSH_RCMD_TYPE", "PDSH_SSH_ARGS_APPEND")},
    )
    problem = _check_addresses(addrs)
    if problem:
        unavailable(problem, start)
    for host in hosts:
        ok, out = _probe(ssh.ssh_argv(host, "true"), ssh.environ())
        if not ok:
            unavailable(f"ssh to {host} port {ssh.port} failed: {out}", start)
    return ssh


# Two real trainer runs, ZeRO-1 (W&B offline) and ZeRO-3 (W&B disabled), planned, on 2 processes:
# trained once per session for every test that only reads a finished run (test_compare_real.py's compare and
# calibrate, test_train_deepspeed.py's ZeRO-1 and ZeRO-3 checks). Whichever test asks first trains them.
@pytest.fixture(scope="session")
def zero_stage_runs(tmp_path_factory) -> dict[int, Path]:
    """{1: run dir (with a W&B offline run), 3: run dir}: the planned tiny GPT, trained to completion."""
    pytest.importorskip("deepspeed")
    from tests.integration.train_support import SHARED_RUN_SPEC, make_run_dir, train  # noqa: PLC0415

    root = tmp_path_factory.mktemp("zero-stage-runs")
    runs = {1: make_run_dir(root / "z1", planned=True, **SHARED_RUN_SPEC, **{"parallelism.zero_stage": 1,
                                                                            "tracking.wandb.mode": "offline"}),
            3: make_run_dir(root / "z3", planned=True, **SHARED_RUN_SPEC, **{"parallelism.zero_stage": 3,
                                                                            "tracking.wandb.mode": "disabled"})}
    for run_dir in runs.values():
        train(run_dir)
    return runs
