"""Files orch writes for the user (calib.json, a starter spec) and small files it reads back from a run dir,
without following a link or touching anything but a regular file: a device node, FIFO or directory
at the target is refused, never opened or replaced; writes go through a temporary file renamed into
place; a full disk, a file-size limit or an over-long name is an error naming the path and the cause.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from .errors import OrchError, Problem, SpecError

NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC   # no link, never blocks on a FIFO
_BAD_NAME = (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.ENOENT, errno.EACCES, errno.EPERM,
             errno.EROFS, errno.EEXIST)


def kind_of(mode: int) -> str:
    """'directory', 'FIFO', 'character device', ... for an lstat mode."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def target_problem(path: Path, *, force: bool, option: str) -> Problem | None:
    """Why ``path`` must not be written (None: it is absent, or a regular file, or a link to one, and
    ``force`` is given). A link is replaced itself; what it points to is left as it is."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return Problem(option, f"cannot use {path}: {e.strerror}", "choose another path")
    if stat.S_ISLNK(info.st_mode):
        try:
            pointed = os.stat(path).st_mode
        except OSError:
            pointed = stat.S_IFREG            # a dangling link: replacing it touches nothing else
        if not stat.S_ISREG(pointed):
            return Problem(option, f"{path} is a symlink to {kind_of(pointed)}: orch writes only regular files",
                           "choose another path")
    elif not stat.S_ISREG(info.st_mode):
        return Problem(option, f"{path} is {kind_of(info.st_mode)}: orch writes only regular files, and never "
                       "replaces anything else", "choose another path")
    if not force:
        return Problem(option, f"{path} already exists", "pass --force to overwrite it, or choose another path")
    return None


def write_error(path: Path, e: OSError, option: str) -> OrchError:
    """An OSError while writing ``path`` as an error for people: a bad name or place is a usage error
    (exit 2), a full disk or a file-size limit a runtime failure (exit 1)."""
    cause = e.strerror or e.__class__.__name__
    if e.errno in _BAD_NAME:
        return SpecError(Problem(option, f"cannot write {path}: {cause}", "choose another path"))
    return OrchError(f"cannot write {path}: {cause}; nothing was written")


def temp_prefix(name: str) -> str:
    """A hidden temporary name beside ``name`` that stays short whatever ``name`` is (a name near the
    255-byte limit must fail as itself, not as its temporary file)."""
    return f".{name[:40]}.tmp-"


def write_output_file(path: str | os.PathLike, text: str, *, force: bool, option: str = "--output") -> Path:
    """Write ``text`` to ``path`` atomically (temporary file + rename; removed on any failure). Refused
    when ``path`` exists unless ``force``, and always when it is not a regular file (or a link to one)."""
    path = Path(path)
    problem = target_problem(path, force=force, option=option)
    if problem:
        raise SpecError(problem)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        problem = target_problem(path, force=force, option=option)    # changed meanwhile: still refuse
        if problem:
            raise SpecError(problem)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise write_error(path, e, option) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def read_regular_no_follow(path: str | os.PathLike, limit_bytes: int) -> bytes | None:
    """The first ``limit_bytes`` of ``path`` when it is a regular file reached without following a link;
    None when it is absent, a link, or anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | NO_FOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(limit_bytes)


def replace_file(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by a file holding ``text``, atomically, for files orch keeps in a run dir: the
    temporary file is created new (a link or file planted under its name is removed, never written
    through), and a link at ``path`` is replaced itself, not followed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
