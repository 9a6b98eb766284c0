"""Run a test scenario inside a private PID namespace, so that a regression in what orch signals (a
``kill(-1)``, a wrong process group) can only reach the scenario's own processes, never the machine's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
# PID 1 of the namespace: runs the scenario and reaps every orphan (as a machine's init does), so that a
# job's processes, once stopped, are gone rather than zombies; its exit status is the scenario's.
INIT = """
import os, sys
os.environ["ORCH_TEST_PIDNS"] = "1"
child = os.fork()
if child == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
while True:
    pid, status = os.wait()
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        sys.exit(code if code >= 0 else 128 - code)
"""


def pid_namespace_problem() -> str | None:
    """Why a private PID namespace cannot be made here (None when it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    try:
        probe = subprocess.run([*UNSHARE, "sh", "-c", "test $$ -eq 1"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "unshare did not answer"
    if probe.returncode != 0:
        return f"cannot create a PID namespace here (needs root or user namespaces): {probe.stderr.strip()[:200]}"
    return None


def run_in_pid_namespace(script: Path, *args: str, timeout_s: float = 300) -> dict:
    """Run ``python SCRIPT ARGS`` in a fresh PID namespace (every process it leaves dies with it), under an
    init that reaps orphans. The script prints what it saw so far as one JSON object per line; the last
    line is returned, with the script's exit status as ``_rc`` (a scenario killed midway keeps its cases)."""
    problem = pid_namespace_problem()
    if problem:
        pytest.skip(problem)
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(Path(__file__).resolve().parents[1])])}
    proc = subprocess.run([*UNSHARE, sys.executable, "-c", INIT, str(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"scenario failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {**json.loads(lines[-1]), "_rc": proc.returncode, "_stderr": proc.stderr[-3000:]}
