"""Busy (compute) time of one rank and its peak memory.

:class:`BusyTimer` wraps the functions that do a rank's compute (forward, backward, optimizer step:
DeepSpeed's pipeline instructions ForwardPass / BackwardPass / OptimizerStep, or the engine's forward,
backward and step calls) and sums their wall time, MINUS the time the same thread spent blocked in
collectives inside them (a backward pass that waits on a gradient all-reduce is not busy computing).
The bubble of a pipeline stage is then ``1 - busy / step wall time``: the time it sat idle waiting for
its neighbours (pipeline fill and drain, imbalance) or in communication.

On an accelerator the work is asynchronous: pass ``synchronize`` (e.g. ``torch.cuda.synchronize``) and
every timed call waits for the device at its start and end, which makes the measurement exact but
serialises the device at those points.
"""
from __future__ import annotations

import functools
import resource
import sys
import time
from typing import Callable, Optional


class BusyTimer:
    def __init__(self, comm=None, synchronize: Optional[Callable[[], None]] = None):
        self.comm = comm
        self.synchronize = synchronize
        self.enabled = True
        self.busy_s = 0.0

    def wrap(self, fn):
        """``fn`` with its calls charged to this timer."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            if self.synchronize:
                self.synchronize()
            blocked0 = self.comm.stats.blocked_s if self.comm else 0.0
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.synchronize:
                    self.synchronize()
                blocked = (self.comm.stats.blocked_s - blocked0) if self.comm else 0.0
                self.busy_s += max(0.0, time.perf_counter() - t0 - blocked)

        return timed

    def take(self) -> float:
        busy, self.busy_s = self.busy_s, 0.0
        return busy


def peak_memory_bytes() -> int:
    """This process's peak memory: the CUDA caching allocator's peak when CUDA is in use, otherwise
    the peak resident set size (``getrusage`` ru_maxrss; KiB on Linux, bytes on macOS). Both are
    high-water marks since the process started."""
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
    except ImportError:  # pragma: no cover
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
