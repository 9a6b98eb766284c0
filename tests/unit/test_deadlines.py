"""tests/deadlines.py: a wait's idle-machine figure stretches with the machine's load and speed, never shrinks."""
from __future__ import annotations

import time

from tests import deadlines


def test_a_forced_factor_scales_every_deadline(monkeypatch):
    monkeypatch.setenv("ORCH_TEST_TIME_FACTOR", "3")
    assert deadlines.scaled_s(10) == 30
    assert deadlines.Deadline(10).allowed_s == 30


def test_the_load_now_stretches_a_running_deadline(monkeypatch):
    monkeypatch.delenv("ORCH_TEST_TIME_FACTOR", raising=False)
    monkeypatch.setattr(deadlines, "probe_factor", lambda: 1.0)
    monkeypatch.setattr(deadlines.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(deadlines.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    deadline = deadlines.Deadline(0.2)
    assert deadline.allowed_s == 0.2                     # idle: the nominal figure
    monkeypatch.setattr(deadlines.os, "getloadavg", lambda: (7.0, 3.0, 1.0))
    time.sleep(0.25)
    assert not deadline.expired()                        # 8 runnable per 2 cores: 4x the time
    assert deadline.allowed_s == 0.8
    monkeypatch.setattr(deadlines.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert deadline.allowed_s == 0.8 and not deadline.expired()   # never shrinks
    monkeypatch.setattr(deadlines.os, "getloadavg", lambda: (99.0, 0.0, 0.0))
    assert deadlines.time_factor() == deadlines.MAX_FACTOR           # a hung job still fails


def test_the_probe_factor_is_at_least_one():
    assert deadlines.probe_factor() >= 1.0
