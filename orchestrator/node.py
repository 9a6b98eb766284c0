"""What a process can tell about the node it runs on (used by the trainer's ranks and the doctor's probe)."""
from __future__ import annotations

import os
import socket
from pathlib import Path


def host_name() -> str:
    """The node's name as the launcher knows it: SLURM's node name, pdsh's host (ORCH_HOST), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("ORCH_HOST") or socket.gethostname()


def mem_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
