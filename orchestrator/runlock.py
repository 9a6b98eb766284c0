"""One user of a run dir at a time: an advisory ``flock`` on ``RUN_DIR/.orch.lock``.

`orch launch` takes it and hands the open descriptor to the job it starts (local backend), so the lock is
held for exactly as long as any process of the job lives — torchrun and every rank inherit it — and the
kernel drops it when the last of them exits, however it dies: a dead job cannot leave it behind.
`orch generate --force` takes it before replacing a run dir, so it never replaces one a job is using.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from .errors import OrchError

LOCK_FILE = ".orch.lock"


class RunDirBusy(OrchError):
    """Another orch command or a live job holds the run dir."""


def _take(run_dir: str | Path, mode: int, refused: type[OSError] = BlockingIOError) -> int | None:
    """An open descriptor holding the lock in ``mode`` (never blocks), or None when ``refused`` is raised."""
    fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except refused:
        os.close(fd)
        return None
    return fd


def try_lock(run_dir: str | Path) -> int | None:
    """An open descriptor holding the run dir's lock, or None when someone else holds it."""
    return _take(run_dir, fcntl.LOCK_EX)


def share(fd: int) -> None:
    """Downgrade a held lock to shared: the job's own processes may then take it shared as well, while
    every exclusive taker (another launch, generate --force) is still refused."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def hold_shared(run_dir: str | Path) -> int | None:
    """For a job's process: take the lock shared and keep it for the process's life (never blocks; None
    when an exclusive holder has it, or the file system has no locks)."""
    try:
        return _take(run_dir, fcntl.LOCK_SH, refused=OSError)
    except OSError:
        return None


@contextmanager
def locked(run_dir: str | Path, busy_message: str):
    """Hold the lock for the block (raises RunDirBusy with ``busy_message`` when it is held)."""
    fd = try_lock(run_dir)
    if fd is None:
        raise RunDirBusy(busy_message)
    try:
        yield fd
    finally:
        os.close(fd)


def holders(run_dir: str | Path) -> list[int]:
    """Pids of live processes that have the run dir's lock file open (the job's processes), from /proc."""
    target = os.path.realpath(Path(run_dir) / LOCK_FILE)
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    pids.append(int(proc.name))
                    break
            except OSError:
                continue
    return pids
