"""Where step records go. Every sink has the same two methods: ``write(record)`` and ``close(...)``.

- :class:`JsonlSink`: ``metrics.jsonl`` in the run dir, one JSON object per line, flushed every step
  (a killed job keeps every step it finished). :func:`truncate_metrics` drops the records after a
  checkpoint when a job resumes, so the file ends up with each step exactly once.
- :class:`ConsoleSink`: one progress line per step on stdout, the line ``orch launch --wait`` streams.
- :class:`~orchestrator.telemetry.wandb_sink.WandbSink`: one W&B run per job.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Protocol, TextIO

from ..outfiles import NO_FOLLOW, replace_file
from .record import MetricsRecord

METRICS_FILE = "metrics.jsonl"
PROGRESS_PREFIX = "[orch-train]"


class Sink(Protocol):
    def write(self, record: MetricsRecord) -> None: ...

    def close(self, *, exit_code: int = 0) -> None: ...


def record_dict(record: MetricsRecord) -> dict:
    """The record as JSON-ready data (non-finite floats become null, as JSON has no NaN)."""
    out = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        out[f.name] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


class JsonlSink:
    """Appends records to metrics.jsonl. Starts on a fresh line (garbage or a torn line at the end of the
    file never swallows a record), and notices when the file is deleted or replaced under it: it re-creates
    the file and says so, instead of writing on into an unlinked file that nobody will read. It never
    writes through a symlink (the link is removed, its target left alone) and never opens a FIFO, device
    or directory put there (records are then not written to the file until it is gone, and it says so)."""

    def __init__(self, path: str | Path, warn=None):
        self.path = Path(path)
        self._warn = warn or (lambda message: print(f"{PROGRESS_PREFIX} warning: {message}", file=sys.stderr,
                                                    flush=True))
        self._fd: int | None = None
        self._inode = None
        self._blocked = False
        self._open(step=None)

    def _open(self, step: int | None) -> bool:
        """Open the file for appending (re-creating it when needed); False when something that is not a
        regular file is in the way."""
        at = "" if step is None else f" at step {step}"
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            info = None
        self._unlinked = info is not None and stat.S_ISLNK(info.st_mode)
        if self._unlinked:
            target = os.readlink(self.path)
            os.unlink(self.path)          # the link only: what it points to is not ours to touch
            self._warn(f"{self.path} was a symlink (to {target}): removed the link{at} and write a new file in "
                       "its place; nothing was written through the link, its target is untouched")
        elif info is not None and not stat.S_ISREG(info.st_mode):
            if not self._blocked:
                self._warn(f"{self.path} is not a regular file (something else was put there): not writing "
                           f"records to it{at} until it is removed")
            self._blocked = True
            return False
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | NO_FOLLOW, 0o644)
        except OSError as e:
            if not self._blocked:
                self._warn(f"cannot open {self.path} ({e.strerror}): not writing records to it{at}")
            self._blocked = True
            return False
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            self._blocked = True
            return False
        if info.st_size > 0 and os.pread(fd, 1, info.st_size - 1) != b"\n":
            os.write(fd, b"\n")
        self._fd, self._inode, self._blocked = fd, (info.st_dev, info.st_ino), False
        return True

    def _still_ours(self) -> bool:
        try:
            info = os.lstat(self.path)      # lstat: a symlink put in its place is not the file
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == self._inode

    def write(self, record: MetricsRecord) -> None:
        if self._fd is None or not self._still_ours():
            replaced = self._fd is not None
            if replaced:
                os.close(self._fd)
                self._fd = None
            if not self._open(step=record.step):
                return
            if replaced and not self._unlinked:
                self._warn(f"{self.path} was deleted or replaced while the job ran: re-created it at step "
                           f"{record.step}; the records before that step are not in it")
        data = (json.dumps(record_dict(record), separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self._fd, data):]

    def close(self, *, exit_code: int = 0) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def parse_record(line: bytes | str) -> dict | None:
    """One metrics.jsonl line as a record; None for anything else (a torn line, bytes that are not UTF-8,
    JSON that is not an object, numbers Python will not convert)."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl (torn, garbage and non-object lines are skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    return [r for r in map(parse_record, _lines(path)) if r is not None]


def _step_of(record: dict) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Keep only the records of steps <= last_step, each step once (atomically); returns how many lines
    were dropped (records after the checkpoint, repeats, garbage)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return 0                  # nothing of ours to keep: the sink replaces a link (and says so)
    lines = _lines(path)
    kept, seen = [], set()
    for record in map(parse_record, lines):
        step = None if record is None else _step_of(record)
        if step is not None and step <= last_step and step not in seen:
            kept.append(record)
            seen.add(step)
    dropped = len(lines) - len(kept)
    if dropped:
        replace_file(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))
    return dropped


def progress_line(record: MetricsRecord, total_steps: int) -> str:
    """`[orch-train] step 12/50 loss 4.3121 tokens/s 5120 tflops/gpu 0.0321 mfu 32.1% bubble 0.0%
    allreduce 12.3% mem 512 MiB`"""
    r = record
    loss = "-" if r.loss is None else f"{r.loss:.4f}"
    return (f"{PROGRESS_PREFIX} step {r.step}/{total_steps} loss {loss} tokens/s {r.tokens_per_s:.0f} "
            f"tflops/gpu {r.tflops_per_gpu:.4f} mfu {100 * r.mfu:.1f}% bubble {100 * r.bubble_fraction:.1f}% "
            f"allreduce {100 * r.allreduce_overhead:.1f}% mem {r.mem_peak_bytes / 2**20:.0f} MiB")


class ConsoleSink:
    def __init__(self, total_steps: int, stream: TextIO | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout

    def write(self, record: MetricsRecord) -> None:
        print(progress_line(record, self.total_steps), file=self.stream, flush=True)

    def close(self, *, exit_code: int = 0) -> None:
        self.stream.flush()
