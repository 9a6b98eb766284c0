"""Follow a run's metrics.jsonl while the job runs: one progress line per optimizer step."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Iterator

from ..telemetry.sinks import parse_record

METRICS = "metrics.jsonl"


def format_progress(record: dict, train_iters: int | None = None) -> str:
    """'step 12/50  loss 4.211  1,234 tok/s  bubble 0.25  allreduce 12.0%' from a metrics record."""
    step = f"step {record.get('step')}" + (f"/{train_iters}" if train_iters else "")
    parts = [step]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    if record.get("tokens_per_s") is not None:
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if record.get("bubble_fraction") is not None:
        parts.append(f"bubble {record['bubble_fraction']:.2f}")
    if record.get("allreduce_overhead") is not None:
        parts.append(f"allreduce {100 * record['allreduce_overhead']:.1f}%")
    return "  ".join(parts)


TRAINER_TAG = "[orch-train]"
_STEP_LINE = re.compile(r"step \d+/")


class StartupWatch:
    """Until the first step: relay the trainer's own lines (``[orch-train] ...``, e.g. the one-time op build)
    from the job's log, and every ``heartbeat_s`` say how long the job has been starting, so that a start
    is never a silent wait. ``poll()`` on each check; ``stop()`` at the first step."""

    def __init__(self, log_path: str | Path | None, note: Callable[[str], None], *, heartbeat_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(log_path) if log_path else None
        self.offset = _inode_size(self.path)[1] if self.path else 0
        self.note, self.heartbeat_s, self.clock = note, heartbeat_s, clock
        self.start = self.last = clock()
        self.stopped = False

    def poll(self) -> None:
        if self.stopped:
            return
        for line in self._new_lines():
            said = line.split(TRAINER_TAG, 1)[1].strip() if TRAINER_TAG in line else ""
            if said and not _STEP_LINE.match(said):     # step lines: the progress lines from metrics say them
                self.note(said)
                self.last = self.clock()
        now = self.clock()
        if now - self.last >= self.heartbeat_s:
            where = f"; its log: {self.path}" if self.path else ""
            self.note(f"starting: {now - self.start:.0f} s, no step yet{where}")
            self.last = now

    def stop(self) -> None:
        self.stopped = True

    def _new_lines(self) -> list[str]:
        if not self.path or not self.path.is_file():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk.rfind(b"\n") + 1
        self.offset += complete
        return chunk[:complete].decode(errors="replace").splitlines()


def follow(path: Path, done: Callable[[], bool], *, poll_s: float = 0.5, offset: int = 0) -> Iterator[dict]:
    """Yield metrics records appended to ``path`` after byte ``offset`` until ``done()``, then the rest.

    A resumed (e.g. requeued) trainer rewrites the file without the records after its checkpoint and
    appends again: when the file is replaced or shrinks, reading restarts at its beginning and skips the
    records already seen (a record is its step and time, so a re-run step shows again).
    """
    partial, seen, inode = b"", _records_before(path, offset), _inode_size(path)[0]
    while True:
        finished = done()
        if path.is_file():
            now, size = _inode_size(path)
            if now != inode or size < offset:
                inode, offset, partial = now, 0, b""
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
            except OSError:      # deleted between the check and the open: next round
                chunk = b""
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for record in _parse(lines):
                key = (record.get("step"), record.get("time_unix"))
                if key not in seen:
                    seen.add(key)
                    yield record
        if finished:
            return
        time.sleep(poll_s)


def _inode_size(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_size)


def _records_before(path: Path, offset: int) -> set:
    if not offset or not path.is_file():
        return set()
    with open(path, "rb") as f:
        head = f.read(offset)
    return {(r.get("step"), r.get("time_unix")) for r in _parse(head.split(b"\n"))}


_NUMERIC = ("loss", "tokens_per_s", "bubble_fraction", "allreduce_overhead")


def _parse(lines: list[bytes]) -> Iterator[dict]:
    """The step records among ``lines``; garbage (not UTF-8, not a JSON object, no whole step, a
    non-number where a number belongs) is skipped, never fatal."""
    for line in lines:
        record = parse_record(line)
        if record is not None and _well_formed(record):
            yield record


def _well_formed(record: dict) -> bool:
    step = record.get("step")
    numbers_ok = all(record.get(k) is None or (isinstance(record[k], (int, float)) and not isinstance(record[k], bool))
                     for k in _NUMERIC)
    return isinstance(step, int) and not isinstance(step, bool) and numbers_ok
