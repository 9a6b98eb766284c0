"""One user of a run dir at a time: an advisory ``flock`` on ``RUN_DIR/.orch.lock``.

`orch launch` takes it and hands the open descriptor to the job it starts (local backend), so the lock is
held for exactly as long as any process of the job lives — torchrun and every rank inherit it — and the
kernel drops it when the last of them exits, however it dies: a dead job cannot leave it behind.
`orch generate --force` and `orch doctor` take it too. The lock file must be a regular file (never a
symlink); its holders are the processes whose descriptors carry the flock, not any that opened the file.
"""
from __future__ import annotations

import fcntl
import os
import stat
from contextlib import contextmanager
from pathlib import Path

from .errors import OrchError, Problem, SpecError

LOCK_FILE = ".orch.lock"


class RunDirBusy(OrchError):
    """Another orch command or a live job holds the run dir."""


def _lock_path(run_dir: str | Path) -> tuple[Path, os.stat_result | None]:
    """RUN_DIR/.orch.lock and its lstat (None when absent); SpecError when it is not a plain regular file."""
    path = Path(run_dir) / LOCK_FILE
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path, None
    except OSError as e:
        raise SpecError(Problem(str(path), f"cannot inspect the run-dir lock file: {e.strerror}")) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise SpecError(Problem(str(path), f"the run-dir lock file is {kind}; orch locks only a regular file it "
                                "created", f"remove {path} (orch re-creates it) once no job uses the run dir"))
    return path, info


def _take(run_dir: str | Path, mode: int, refused: type[OSError] = BlockingIOError) -> int | None:
    """An open descriptor holding the lock in ``mode`` (never blocks), or None when ``refused`` is raised."""
    path, _ = _lock_path(run_dir)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if isinstance(e, refused):
            return None
        raise SpecError(Problem(str(path), f"cannot open the run-dir lock file: {e.strerror}")) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):        # swapped between the look and the open
        os.close(fd)
        _lock_path(run_dir)
        raise SpecError(Problem(str(path), "the run-dir lock file is not a regular file"))
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
    when an exclusive holder has it, the file system has no locks, or the lock file is not a regular file)."""
    try:
        return _take(run_dir, fcntl.LOCK_SH, refused=OSError)
    except (OSError, SpecError):
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
    """Pids of live processes (other than this one) holding the run dir's flock.

    A holder has a descriptor on the lock file (same device and inode) whose open file carries a FLOCK
    lock: ``/proc/PID/fdinfo/FD`` lists it (the line ``/proc/locks`` shows for it). A process that merely
    opened the file (``sleep 300 < .orch.lock``) holds nothing and is not one.
    """
    _, info = _lock_path(run_dir)
    if info is None:
        return []
    key = (info.st_dev, info.st_ino)
    if not _flock_listed(info):
        return []
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
                target = os.stat(fd)
                if (target.st_dev, target.st_ino) == key and _carries_flock(proc / "fdinfo" / fd.name):
                    pids.append(int(proc.name))
                    break
            except OSError:
                continue
    return pids


def _flock_listed(info: os.stat_result) -> bool:
    """/proc/locks lists a FLOCK on this inode (lines ``N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF``);
    True when /proc/locks cannot be read, so the caller looks at every descriptor instead."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return True
    inode = str(info.st_ino)
    return any(len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == inode
               for parts in (line.split() for line in text.splitlines()))


def _carries_flock(fdinfo: Path) -> bool:
    return any(line.startswith("lock:") and " FLOCK " in line for line in fdinfo.read_text().splitlines())
