"""Checkpoints: DeepSpeed's save_checkpoint / load_checkpoint, plus a crash-safe ``latest`` pointer.

Layout: ``<checkpoint dir>/global_step<N>/...`` (DeepSpeed's files) and ``<checkpoint dir>/latest``
holding the tag of the newest COMPLETE checkpoint. DeepSpeed lets rank 0 write ``latest`` as soon as
rank 0 itself is done; here every rank saves, all ranks meet at a barrier, rank 0 verifies the files
(each torch archive's CRCs) and records each file's size and sha256 in the step's ``orch_checkpoint.json``,
and only then replaces ``latest`` atomically. A job killed mid-save resumes from the previous checkpoint.

Before anything is loaded (DeepSpeed unpickles its shards with ``weights_only=False``) the step dir must
hold exactly the files its manifest lists, each with the size and sha256 recorded: a truncated, emptied
or overwritten shard, a stale shard copied in from another step, an extra file, a missing manifest, a
garbage or dangling ``latest`` or a deleted step dir fall back to the newest checkpoint that verifies,
whatever ``latest`` says. Unusable newer step dirs are renamed aside, not deleted. See docs/checkpoints.md.

The checkpoint dir is ``training.checkpoint.dir`` of the spec: a relative path inside the run dir.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..outfiles import replace_file

LATEST = "latest"
CHECKPOINT_MANIFEST = "orch_checkpoint.json"     # in each step dir: what was written and verified
_TAG = re.compile(r"global_step(\d+)")
_GLOB_CHARS = re.compile(r"[*?\[]")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def checkpoint_dir(run_dir: Path, spec) -> Path:
    """The run's checkpoint dir; a SpecError naming training.checkpoint.dir when it would leave the run
    dir (absolute, ``..``, a symlink pointing out) or is not a directory (see checkpoint_dir_problem)."""
    from ..errors import SpecError  # noqa: PLC0415

    problem = checkpoint_dir_problem(run_dir, spec.training.checkpoint.dir)
    if problem:
        raise SpecError(problem)
    return Path(run_dir) / spec.training.checkpoint.dir


def checkpoint_dir_problem(run_dir: Path, value: str):
    """Why ``value`` cannot be the checkpoint dir of ``run_dir`` (a Problem), or None. The spec already
    refuses absolute paths and ``..``; here the run dir exists, so symlinks are followed: every existing
    component must stay inside the run dir, and the dir itself, when present, must be a directory."""
    from ..errors import Problem  # noqa: PLC0415

    field = "training.checkpoint.dir"
    if not value or Path(value).is_absolute() or ".." in Path(value).parts:
        return Problem(field, f"{value!r} is not a path inside the run dir", "use a relative path such as "
                       "'checkpoints'")
    root = Path(run_dir).resolve()
    target = (Path(run_dir) / value).resolve()
    if target != root and root not in target.parents:
        return Problem(field, f"{Path(run_dir) / value} leads out of the run dir (to {target}, through a "
                       "symlink)", "checkpoints are kept inside the run dir: remove the symlink")
    if target == root:
        return Problem(field, f"{value!r} is the run dir itself", "use a subdirectory such as 'checkpoints'")
    if target.exists() and not target.is_dir():
        return Problem(field, f"{Path(run_dir) / value} exists and is not a directory",
                       "move that file away: the checkpoints are saved in a directory of that name")
    return None


def tag_for(step: int) -> str:
    return f"global_step{step}"


def latest_step(ckpt_dir: Path) -> int | None:
    """The step ``latest`` names when it names an existing step dir, else None (see resume_choice for
    what a job resumes from)."""
    pointer = Path(ckpt_dir) / LATEST
    try:
        tag = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    match = _TAG.fullmatch(tag)
    if not match or not (Path(ckpt_dir) / tag).is_dir():
        return None
    return int(match.group(1))


def write_latest(ckpt_dir: Path, step: int) -> None:
    replace_file(Path(ckpt_dir) / LATEST, tag_for(step))


# --- verification ------------------------------------------------------------------------------------------

def _files(step_dir: Path) -> dict[str, int]:
    """Every entry under the step dir but its manifest (name -> bytes; a link or other non-regular entry
    counts as -1 bytes, so it never matches what was written)."""
    found = {}
    for p in sorted(step_dir.rglob("*")):
        info = p.lstat()
        if p.name == CHECKPOINT_MANIFEST and p.parent == step_dir or stat.S_ISDIR(info.st_mode):
            continue
        found[str(p.relative_to(step_dir))] = info.st_size if stat.S_ISREG(info.st_mode) else -1
    return found


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_problem(path: Path) -> str | None:
    """Why a freshly written checkpoint file cannot be loaded, or None. torch.save writes zip archives:
    every member's CRC is checked (truncated, emptied or overwritten shards fail), nothing is unpickled."""
    if not path.is_file() or path.is_symlink():
        return "not a regular file"
    if path.stat().st_size == 0:
        return "empty"
    if path.suffix != ".pt":
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"not a readable torch archive ({e.__class__.__name__})"
    return f"member {bad} fails its CRC" if bad else None


def _manifest(step_dir: Path) -> tuple[dict[str, int], dict[str, str]]:
    """(name -> bytes, name -> sha256) recorded in the step's manifest; ValueError when it is malformed,
    OSError when it cannot be read (FileNotFoundError: there is none)."""
    path = step_dir / CHECKPOINT_MANIFEST
    if path.is_symlink():
        raise ValueError("a symlink")
    data = json.loads(path.read_text())
    sizes, digests = (data.get(key) if isinstance(data, dict) else None for key in ("files", "sha256"))
    if not isinstance(sizes, dict) or not sizes:
        raise ValueError("files is not a mapping of file names to sizes")
    if not isinstance(digests, dict) or set(digests) != set(sizes):
        raise ValueError("it records no sha256 for some file (written by an older orch?)")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()) or \
            not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in digests.values()):
        raise ValueError("a size or sha256 is malformed")
    return sizes, digests


def step_problem(ckpt_dir: Path, step: int) -> str | None:
    """Why the checkpoint of ``step`` must not be loaded, or None: its manifest (written once every rank
    saved and the files were verified) must exist and list exactly the files in the step dir, each with
    the size and sha256 recorded when it was written. Nothing is unpickled."""
    step_dir = Path(ckpt_dir) / tag_for(step)
    if step_dir.is_symlink() or not step_dir.is_dir():
        return "missing" if not step_dir.is_symlink() else "a symlink, not a directory orch wrote"
    try:
        sizes, digests = _manifest(step_dir)
    except FileNotFoundError:
        return f"incomplete (no {CHECKPOINT_MANIFEST}: the job stopped while saving it, or orch did not write it)"
    except (OSError, ValueError) as e:
        return f"{CHECKPOINT_MANIFEST} is unreadable ({e})"
    present = _files(step_dir)
    extra = sorted(set(present) - set(sizes))
    if extra:
        return f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not among the files the run wrote"
    for name, size in sorted(sizes.items()):
        if name not in present:
            return f"{name} is missing"
        if present[name] != size:
            return (f"{name} has {present[name]} bytes, {size} were written" if present[name] >= 0 else
                    f"{name} is not a regular file")
        if file_sha256(step_dir / name) != digests[name]:
            return f"{name}'s sha256 differs from the one recorded when it was written (same size: overwritten)"
    return None


def write_manifest(ckpt_dir: Path, step: int) -> str | None:
    """After every rank saved: verify the step's files; when they are sound, record each file's bytes
    and sha256 in the step's manifest and return None, else return the problem."""
    step_dir = Path(ckpt_dir) / tag_for(step)
    files = _files(step_dir)
    if not files:
        return "no files were written"
    for name in files:
        problem = file_problem(step_dir / name)
        if problem:
            return f"{name}: {problem}"
    digests = {name: file_sha256(step_dir / name) for name in files}
    replace_file(step_dir / CHECKPOINT_MANIFEST,
                 json.dumps({"step": step, "files": files, "sha256": digests}, indent=2, sort_keys=True) + "\n")
    return None


def saved_steps(ckpt_dir: Path) -> list[int]:
    """Steps with a step dir, newest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    steps = [int(m.group(1)) for p in ckpt_dir.iterdir() if p.is_dir() and (m := _TAG.fullmatch(p.name))]
    return sorted(steps, reverse=True)


@dataclass(frozen=True)
class ResumeChoice:
    """The newest intact checkpoint (None: start from scratch) and the newer ones that are not, with why."""

    step: int | None
    unusable: tuple[tuple[int, str], ...] = ()


def resume_choice(ckpt_dir: Path) -> ResumeChoice:
    """The newest checkpoint that verifies, whatever ``latest`` says (garbage, dangling, or pointing at an
    older step): a step dir without a manifest recording every file's sha256 is never loaded."""
    unusable = []
    for step in saved_steps(ckpt_dir):
        problem = step_problem(ckpt_dir, step)
        if problem is None:
            return ResumeChoice(step, tuple(unusable))
        unusable.append((step, problem))
    return ResumeChoice(None, tuple(unusable))


def set_aside(ckpt_dir: Path, steps: list[int]) -> list[Path]:
    """Rename unusable step dirs out of the way (kept for inspection, never deleted), so that saving the
    same step again starts clean. Returns the new paths."""
    moved = []
    for step in steps:
        source = Path(ckpt_dir) / tag_for(step)
        if source.is_dir():
            target = source.with_name(f"{source.name}.unusable-{int(time.time())}")
            os.rename(source, target)
            moved.append(target)
    return moved


def publish(ckpt_dir: Path, step: int, *, rank: int) -> None:
    """After every rank saved ``step``: rank 0 verifies the files and writes the step's manifest, then
    ``latest``; every rank raises if verification failed (the previous checkpoint stays the newest)."""
    import torch.distributed as dist  # noqa: PLC0415

    dist.barrier()
    verdict = [write_manifest(ckpt_dir, step) if rank == 0 else None]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        raise RuntimeError(f"checkpoint {Path(ckpt_dir) / tag_for(step)} failed verification after saving: "
                           f"{verdict[0]}")
    if rank == 0:
        write_latest(ckpt_dir, step)
    dist.barrier()


def save(ds_engine, ckpt_dir: Path, step: int, *, rank: int) -> None:
    """Save step ``step`` on every rank, then verify and publish it (call on all ranks)."""
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    ds_engine.save_checkpoint(str(ckpt_dir), tag=tag_for(step), client_state={"orch_step": step},
                              save_latest=False)
    publish(ckpt_dir, step, rank=rank)


def load(ds_engine, ckpt_dir: Path, step: int) -> int:
    """Load the checkpoint of ``step``, which rank 0 verified (step_problem); returns ``step`` (call on
    all ranks). A checkpoint that says it holds another step is refused, not half-loaded on."""
    with globless(Path(ckpt_dir)) as load_dir:
        path, client_state = ds_engine.load_checkpoint(str(load_dir), tag=tag_for(step))
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_for(step)} from {ckpt_dir}")
    return checked_step((client_state or {}).get("orch_step"), Path(ckpt_dir) / tag_for(step), step)


@contextlib.contextmanager
def globless(ckpt_dir: Path):
    """``ckpt_dir``, or a link to it whose path has no glob characters: DeepSpeed 0.19.8 finds a step's files
    with ``glob.glob`` on the path unescaped (``engine._get_all_ckpt_names``, ``PipelineModule.ckpt_layer_path_list``),
    so a run dir named like ``runs/exp[1]`` would find none of them. The link lives in a fresh temporary dir
    and is removed after the load."""
    if not _GLOB_CHARS.search(str(ckpt_dir)):
        yield ckpt_dir
        return
    with tempfile.TemporaryDirectory(prefix="orch-ckpt-") as tmp:
        link = Path(tmp) / "checkpoints"
        link.symlink_to(Path(ckpt_dir).resolve(), target_is_directory=True)
        yield link


def checked_step(held, step_dir: Path, step: int) -> int:
    """``step`` when the loaded state says it holds that step; RuntimeError otherwise."""
    if held != step:
        raise RuntimeError(f"{step_dir} holds the state of step {held!r}, not of step {step}: it was not "
                           "written by this run's save of that step")
    return step
