"""`orch launch --backend pdsh` over the real private sshd (slurm/sshd.sh): hosts orch-n1 and orch-n2 at
127.0.0.11/12, port 2222, one torchrun per host, ZeRO-2. Run dirs live under a directory named like a
shell injection, and a W&B key is in the environment."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import SshHosts
from tests.integration.launch_support import (HOSTILE, SECRET, files_holding, launch_env, make_run, no_pwned,
                                              orch, start_orch, steps, wait_gone, wait_records, watch_ranks)
from tests.integration.train_support import assert_loss_falls, load_metrics
from tests.deadlines import scaled_s

pytestmark = [pytest.mark.integration, pytest.mark.pdsh]
pytest.importorskip("deepspeed")

# Makes the torchrun of one host exit 7 at start: a node whose command fails.
FAIL_ON_N2 = """import os
if os.environ.get("SSH_CONNECTION", "").split()[2:3] == ["127.0.0.12"] and "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in os.environ:
    os._exit(7)
"""


def sshd_accepts(ssh_hosts: SshHosts, name: str) -> bool:
    """Whether the hosts' sshd takes ``name`` from ssh's SendEnv (it needs `AcceptEnv name`)."""
    argv = ["ssh", "-F", str(ssh_hosts.ssh_config), "-o", f"SendEnv={name}", ssh_hosts.hosts[0], f"printenv {name}"]
    proc = subprocess.run(argv, env={**ssh_hosts.environ(), name: "probe"}, capture_output=True, text=True,
                          timeout=scaled_s(30))
    return proc.stdout.strip() == "probe"


def test_two_hosts_train_to_completion(ssh_hosts, tmp_path):
    run = make_run(tmp_path / HOSTILE)
    env = launch_env(ssh_hosts.env)
    job = start_orch("launch", str(run), "--backend", "pdsh", "--wait", env=env)
    ranks = watch_ranks(run, job, 2)
    out, err = job.communicate(timeout=scaled_s(240))
    assert job.returncode == 0, err
    # Each rank was started over ssh at its own host's address, with node rank = place in the host list.
    assert {r: e["SSH_CONNECTION"].split()[2:] for r, e in ranks.items()} == {
        0: [ssh_hosts.addrs["orch-n1"], "2222"], 1: [ssh_hosts.addrs["orch-n2"], "2222"]}
    assert {r: e["GROUP_RANK"] for r, e in ranks.items()} == {0: "0", 1: "1"}
    assert ranks[0]["MASTER_ADDR"] == "orch-n1"
    if sshd_accepts(ssh_hosts, "WANDB_API_KEY"):
        assert all(e.get("WANDB_API_KEY") == SECRET for e in ranks.values())
    else:  # the value never goes on a command line; only the hosts' sshd can let it through
        assert all("WANDB_API_KEY" not in e for e in ranks.values())
    assert steps(run) == list(range(1, 9))
    assert_loss_falls(load_metrics(run))
    status = orch("status", str(run), "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED"
    log = (run / "logs" / "launch.log").read_text()
    assert re.search(r"^orch-n1: \[rank0\]:\[orch-train\] step 8/8", log, re.M)
    assert re.search(r"^orch-n2: \[rank1\]:", log, re.M)
    assert list((run / "logs" / "torchrun" / "orch-n2").glob("*/attempt_0/0/stderr.log"))
    assert json.loads((run / "logs" / "pdsh_result.json").read_text())["state"] == "COMPLETED"
    assert not no_pwned(tmp_path)
    assert not files_holding(SECRET, run)
    assert SECRET not in out + err


def test_a_failing_host_fails_the_launch_with_its_name_and_code(ssh_hosts, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAIL_ON_N2)
    run = make_run(tmp_path / HOSTILE)
    env = launch_env(ssh_hosts.env)
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    started = time.monotonic()
    launched = orch("launch", str(run), "--backend", "pdsh", "--wait", env=env)
    assert launched.returncode == 7, launched.stderr
    assert "host orch-n2 failed with exit code 7" in launched.stderr
    assert time.monotonic() - started < 60    # orch-n1 was stopped, not left waiting for its peer
    assert not wait_gone(run, 5)
    status = orch("status", str(run), env=env)
    assert status.returncode == 1 and status.stdout.strip().endswith("FAILED")
    result = json.loads((run / "logs" / "pdsh_result.json").read_text())
    assert result["failed_host"] == "orch-n2" and result["exit_code"] == 7


def test_preflight_names_an_unreachable_host_and_starts_nothing(ssh_hosts, tmp_path):
    run = make_run(tmp_path, **{"launch.pdsh.hosts": ["orch-n1", "orch-n7"]})   # 127.0.0.17: no sshd there
    launched = orch("launch", str(run), "--backend", "pdsh", env=launch_env(ssh_hosts.env))
    assert launched.returncode == 1
    assert "pdsh preflight failed, nothing was started" in launched.stderr
    assert "orch-n7: not reachable over ssh on port 2222" in launched.stderr
    assert "orch-n1" not in launched.stderr.split("started")[1]
    assert not (run / "job.json").exists() and not processes_left(run)


def processes_left(run: Path) -> list[str]:
    return wait_gone(run, 1)


def test_cancel_stops_every_host(ssh_hosts, tmp_path):
    run = make_run(tmp_path / HOSTILE, **{"training.train_iters": 500})
    env = launch_env(ssh_hosts.env)
    launched = orch("launch", str(run), "--backend", "pdsh", env=env)
    assert launched.returncode == 0, launched.stderr
    wait_records(run, 2)
    assert orch("status", str(run), env=env).stdout.strip().endswith("RUNNING")
    started = time.monotonic()
    cancelled = orch("cancel", str(run), env=env)
    took_s = time.monotonic() - started
    assert cancelled.returncode == 0 and cancelled.stdout.strip().endswith("CANCELLED"), cancelled
    assert took_s < 20, took_s
    assert not wait_gone(run, 5)
    assert "stop requested (SIGTERM)" in (run / "logs" / "launch.log").read_text()
    assert len(steps(run)) < 500
