"""Really slowing one node or rank for a test: a CPU quota (cgroup v1 cpu controller) on exactly the
test's own processes, removed in a finally block.

The cgroup's processes get ``fraction`` of one core (CFS quota over a 10 ms period, longer for quotas under 1 ms, so a short measurement
cannot fit between throttled periods). :func:`python_wrapper` writes an interpreter wrapper for ORCH_PYTHON:
run on the slowed node (SLURM's node name or pdsh's ORCH_HOST), it joins the cgroup before it execs the real
Python, so torchrun and every rank it starts there inherit the quota; elsewhere it only execs.
"""
from __future__ import annotations

import contextlib
import os
import sys
import uuid
from pathlib import Path

import pytest

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000
MIN_QUOTA_US = 1_000


def slow_fraction(cap: float = 0.2) -> float:
    """A quota that really slows a process on this shared machine: under load every runnable process gets
    about cores / (load + 1) of a core, so a fixed quota can be no slower than what the healthy ranks get.
    Takes 0.3 of that fair share (at most ``cap``, at least 0.03 of a core)."""
    share = len(os.sched_getaffinity(0)) / (os.getloadavg()[0] + 1)
    return max(0.03, min(cap, 0.3 * share))


@contextlib.contextmanager
def cpu_quota(fraction: float):
    """A fresh cgroup limited to ``fraction`` of a core; yields its directory; empties and removes it after."""
    if not (CGROUP_CPU / "cpu.cfs_quota_us").is_file() or not os.access(CGROUP_CPU, os.W_OK):
        pytest.skip(f"no writable cgroup v1 cpu controller at {CGROUP_CPU}")
    group = CGROUP_CPU / f"orch-test-slow-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        period_us = max(PERIOD_US, int(MIN_QUOTA_US / fraction) + 1)   # the kernel refuses quotas under 1 ms
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(int(period_us * fraction)))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
        group.rmdir()


def python_wrapper(directory: Path, group: Path, slow_host: str) -> Path:
    """An ORCH_PYTHON that puts itself into ``group`` on ``slow_host`` and then runs the real Python."""
    path = directory / "slow-python"
    path.write_text("#!/bin/bash\n"
                    f'if [ "${{SLURMD_NODENAME:-${{ORCH_HOST:-}}}}" = "{slow_host}" ]; then\n'
                    f'  echo $$ > "{group}/cgroup.procs"\n'
                    "fi\n"
                    f'exec "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return path


def join(group: Path, pid: int) -> None:
    """Move one running process (all its threads) into the cgroup."""
    (group / "cgroup.procs").write_text(str(pid))


def rank_pid(run_dir: Path, rank: int, timeout_s: float = 120) -> int:
    """The pid of the live trainer process of ``run_dir`` with RANK=rank (polls until it is there)."""
    import time  # noqa: PLC0415

    from tests.deadlines import Deadline  # noqa: PLC0415

    deadline = Deadline(timeout_s)
    while not deadline.expired():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                words = (entry / "cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
                if words[-3:] != ["-m", "orchestrator.train", str(run_dir)]:
                    continue
                environ = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if f"RANK={rank}" in environ:
                return int(entry.name)
        time.sleep(0.1)
    raise AssertionError(f"no trainer process with RANK={rank} for {run_dir} after {deadline}")
