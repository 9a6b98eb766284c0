"""Deadlines that follow the machine: every wait in the tests scales its nominal figure (what the wait takes,
with a margin, on an idle 2-core machine) by how slow this machine is now.

The factor is the larger of (a) a CPU probe taken once per session: a fixed pure-Python loop's wall time
over its idle reference (a slower core, or a core shared with other processes, both stretch it), and (b) the
load now: runnable processes per core (os.getloadavg over the cores this process may use), read at every
check, so a wait that began on a quiet machine still gets its time when the load rises. Never below 1, at
most MAX_FACTOR (a hung job must still fail). ORCH_TEST_TIME_FACTOR=F forces a factor instead.
"""
from __future__ import annotations

import functools
import os
import time

# The probe's loop took 0.023 s of wall (and CPU) time on the project's 2-core machine at load 0.5.
PROBE_REFERENCE_S = 0.023
MAX_FACTOR = 8.0


def _probe_s() -> float:
    start = time.perf_counter()
    total = 0
    for i in range(300_000):
        total += i * i
    return time.perf_counter() - start


@functools.cache
def probe_factor() -> float:
    """The session's CPU probe: the median of three runs of the loop over its reference, at least 1."""
    runs = sorted(_probe_s() for _ in range(3))
    return max(1.0, runs[1] / PROBE_REFERENCE_S)


def load_factor() -> float:
    """Runnable processes per usable core now (1-minute load average; 1 on an idle machine)."""
    cores = len(os.sched_getaffinity(0)) or 1
    return max(1.0, (os.getloadavg()[0] + 1) / cores)


def time_factor() -> float:
    forced = os.environ.get("ORCH_TEST_TIME_FACTOR")
    if forced:
        return max(1.0, float(forced))
    return min(MAX_FACTOR, max(probe_factor(), load_factor()))


def scaled_s(nominal_s: float) -> float:
    """``nominal_s`` (the figure for an idle machine) stretched by how slow the machine is now."""
    return nominal_s * time_factor()


class Deadline:
    """A deadline of ``nominal_s`` idle-machine seconds, re-scaled at every check by the load then.

        deadline = Deadline(120)
        while not deadline.expired(): ...
        raise AssertionError(f"... after {deadline}")
    """

    def __init__(self, nominal_s: float):
        self.nominal_s = nominal_s
        self.start = time.monotonic()
        self.allowed_s = scaled_s(nominal_s)

    def expired(self) -> bool:
        self.allowed_s = max(self.allowed_s, scaled_s(self.nominal_s))   # only ever grows
        return time.monotonic() - self.start >= self.allowed_s

    def left_s(self) -> float:
        """Seconds left (for a subprocess timeout), at least 1."""
        self.expired()
        return max(1.0, self.allowed_s - (time.monotonic() - self.start))

    def __str__(self) -> str:
        return (f"{time.monotonic() - self.start:.0f} s ({self.nominal_s:g} s nominal x "
                f"{self.allowed_s / self.nominal_s:.1f} for this machine's speed and load)")
