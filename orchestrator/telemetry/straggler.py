"""Stragglers during training: which rank computes slower than the others, step after step.

Synchronous training makes every rank's *step* time equal (the fast ranks wait for the slow one inside the
collectives), so the comparison uses each rank's compute time with its waits in collectives excluded
(``compute_time_s`` of the per-rank row, timing.py). Per step:

- ``rank_step_time_spread`` = the slowest rank's compute time / the median rank's (1.0: all equal); with
  pipeline parallelism, within each stage (one rank per stage: nothing to compare, 1.0);
- ``slowest_rank`` and ``slowest_host`` name that rank.

A rank is a *persistent* straggler when it was the slowest with a spread above ``threshold`` in each of the
last ``window`` steps. Then rank 0 names it once (until another rank takes its place or it recovers): a log
line, ``RUN_DIR/straggler.json`` (read by ``orch status``) and a W&B alert. Settings, from the environment
of the job (pdsh forwards ``ORCH_STRAGGLER_*`` to the hosts):

- ``ORCH_STRAGGLER_THRESHOLD`` (default 1.2: 20% slower than the median rank);
- ``ORCH_STRAGGLER_WINDOW`` (default 5 steps).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import Problem, SpecError

STRAGGLER_FILE = "straggler.json"
DEFAULT_THRESHOLD = 1.2
DEFAULT_WINDOW = 5


@dataclass(frozen=True)
class StragglerConfig:
    threshold: float = DEFAULT_THRESHOLD
    window: int = DEFAULT_WINDOW

    @staticmethod
    def from_env(env: dict | None = None) -> "StragglerConfig":
        env = os.environ if env is None else env
        try:
            threshold = float(env.get("ORCH_STRAGGLER_THRESHOLD") or DEFAULT_THRESHOLD)
            window = int(env.get("ORCH_STRAGGLER_WINDOW") or DEFAULT_WINDOW)
        except ValueError:
            print("[orch-train] warning: ORCH_STRAGGLER_THRESHOLD / ORCH_STRAGGLER_WINDOW are not numbers; "
                  f"using {DEFAULT_THRESHOLD} and {DEFAULT_WINDOW}", file=sys.stderr, flush=True)
            return StragglerConfig()
        return StragglerConfig(threshold=max(1.0, threshold), window=max(1, window))


def rank_spread(compute_times: list[float], num_stages: int = 1) -> tuple[float, int]:
    """(slowest / median, the slowest rank) of per-rank compute times; (1.0, 0) when there is nothing to compare.

    With pipeline parallelism ranks are compared within their stage only (stages do different work: the
    first holds the embedding, the last the loss); pp is the outermost rank dimension, so stage s is the
    s-th contiguous block of ranks. The stage with the largest spread gives the answer.
    """
    n = len(compute_times)
    if not n:
        return 1.0, 0
    size = n // num_stages if num_stages > 1 and n % num_stages == 0 else n
    best = (1.0, max(range(n), key=lambda r: compute_times[r]) if size == n else 0)
    for start in range(0, n, size):
        block = compute_times[start:start + size]
        slowest = max(range(len(block)), key=lambda r: block[r])
        mid = statistics.median(block)
        spread = block[slowest] / mid if mid > 0 else 1.0
        if spread > best[0] or (spread == best[0] and start == 0):
            best = (spread, start + slowest)
    return best


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    spread: float          # median spread over the window
    since_step: int
    step: int
    threshold: float
    window: int

    def message(self) -> str:
        return (f"straggler: rank {self.rank} on {self.host} computes {self.spread:.2f}x the median rank's time "
                f"(steps {self.since_step}-{self.step}; threshold {self.threshold}, window {self.window})")


class StragglerDetector:
    """Feed it every step's spread and slowest rank; it returns a Straggler when one becomes persistent."""

    def __init__(self, config: StragglerConfig):
        self.config = config
        self._recent: deque = deque(maxlen=config.window)
        self._named: int | None = None

    def observe(self, step: int, spread: float, rank: int, host: str) -> Straggler | None:
        self._recent.append((step, rank if spread > self.config.threshold else None, spread))
        ranks = {r for _, r, _ in self._recent}
        persistent = len(self._recent) == self.config.window and len(ranks) == 1 and None not in ranks
        if not persistent:
            if self._named is not None and rank != self._named:
                self._named = None
            return None
        if self._named == rank:
            return None
        self._named = rank
        return Straggler(rank=rank, host=host, spread=statistics.median(s for _, _, s in self._recent),
                         since_step=self._recent[0][0], step=step, threshold=self.config.threshold,
                         window=self.config.window)


class StragglerWatch:
    """Rank 0's side: detect, then tell the log, straggler.json and every sink that can alert (W&B)."""

    def __init__(self, run_dir: str | Path, config: StragglerConfig | None = None):
        self.path = Path(run_dir) / STRAGGLER_FILE
        self.detector = StragglerDetector(config or StragglerConfig.from_env())
        self.path.unlink(missing_ok=True)     # a new start of the job: what an earlier one saw is stale

    def observe(self, record, sinks: list) -> Straggler | None:
        found = self.detector.observe(record.step, record.rank_step_time_spread, record.slowest_rank,
                                      record.slowest_host)
        if found is None:
            return None
        print(f"[orch-train] warning: {found.message()}", file=sys.stderr, flush=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({**asdict(found), "time_unix": time.time()}, sort_keys=True, indent=2) + "\n")
        os.replace(tmp, self.path)
        for sink in sinks:
            if hasattr(sink, "alert"):
                sink.alert(f"straggler: rank {found.rank} on {found.host}", found.message())
        return found


def read_straggler(run_dir: str | Path) -> dict | None:
    """What the job last reported about a persistent straggler (None when it named none); a straggler.json
    that is not what the trainer writes is a SpecError naming the file and field."""
    path = Path(run_dir) / STRAGGLER_FILE
    if not path.exists() and not path.is_symlink():
        return None
    hint = f"the trainer rewrites {STRAGGLER_FILE} when it names a straggler; delete {path}"
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > 1 << 20:
            raise SpecError(Problem(str(path), "not a regular file of at most 1 MiB", hint))
        data = json.loads(path.read_text())
    except OSError as e:
        raise SpecError(Problem(str(path), f"cannot read it: {e.strerror}", hint)) from None
    except (ValueError, RecursionError) as e:
        raise SpecError(Problem(str(path), f"not valid JSON ({str(e)[:120]})", hint)) from None
    if not isinstance(data, dict):
        raise SpecError(Problem(str(path), f"expected a JSON object, found {type(data).__name__}", hint))
    for name, kind in (("rank", int), ("host", str), ("spread", float), ("since_step", int), ("step", int)):
        value = data.get(name)
        ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if not ok or (kind is float and not math.isfinite(value)):
            wanted = {float: "a finite number", int: "an integer", str: "a string"}[kind]
            raise SpecError(Problem(f"{path}: {name}", f"expected {wanted}, found {str(value)[:40]!r}", hint))
    return data
