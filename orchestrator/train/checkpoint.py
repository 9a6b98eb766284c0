"""Checkpoints: DeepSpeed's save_checkpoint / load_checkpoint, plus a crash-safe ``latest`` pointer.

Layout: ``<checkpoint dir>/global_step<N>/...`` (DeepSpeed's files) and ``<checkpoint dir>/latest``
holding the tag of the newest COMPLETE checkpoint. DeepSpeed lets rank 0 write ``latest`` as soon as
rank 0 itself is done; here every rank saves, all ranks meet at a barrier, rank 0 verifies the files
(each torch archive's CRCs) and records them in the step's ``orch_checkpoint.json``, and only then
replaces ``latest`` atomically. A job killed mid-save therefore resumes from the previous checkpoint.

On resume the job takes the newest step dir that still verifies (its manifest present, every file there
with the size written and intact), whatever ``latest`` says: a truncated, emptied or overwritten shard,
a garbage or dangling ``latest`` or a deleted step dir fall back to the previous checkpoint instead of
failing every relaunch or silently starting over. Unusable newer step dirs are renamed aside, not deleted.

The checkpoint dir is ``training.checkpoint.dir`` of the spec; a relative path is inside the run dir.
"""
from __future__ import annotations

import json
import os
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

LATEST = "latest"
CHECKPOINT_MANIFEST = "orch_checkpoint.json"     # in each step dir: what was written and verified
_TAG = re.compile(r"global_step(\d+)")


def checkpoint_dir(run_dir: Path, spec) -> Path:
    path = Path(spec.training.checkpoint.dir)
    return path if path.is_absolute() else Path(run_dir) / path


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
    tmp = Path(ckpt_dir) / f".{LATEST}.tmp"
    tmp.write_text(tag_for(step))
    os.replace(tmp, Path(ckpt_dir) / LATEST)


# --- verification ------------------------------------------------------------------------------------------

def _files(step_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(step_dir)): p.stat().st_size for p in sorted(step_dir.rglob("*"))
            if p.is_file() and p.name != CHECKPOINT_MANIFEST}


def file_problem(path: Path) -> str | None:
    """Why a checkpoint file cannot be loaded, or None. torch.save writes zip archives: every member's
    CRC is checked (truncated, emptied or overwritten shards fail), nothing is unpickled."""
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


def step_problem(ckpt_dir: Path, step: int, *, trust_unlisted: bool = False) -> str | None:
    """Why the checkpoint of ``step`` is unusable, or None: its manifest (written once every rank saved and
    the files were verified) must exist and match the files, which must still verify. ``trust_unlisted``:
    a checkpoint from before manifests existed, accepted when its files verify."""
    step_dir = Path(ckpt_dir) / tag_for(step)
    if not step_dir.is_dir():
        return "missing"
    try:
        listed = json.loads((step_dir / CHECKPOINT_MANIFEST).read_text())["files"]
        if not isinstance(listed, dict):
            raise TypeError("files is not a mapping")
    except FileNotFoundError:
        if not trust_unlisted:
            return f"incomplete (no {CHECKPOINT_MANIFEST}: the job stopped while saving it)"
        listed = _files(step_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKPOINT_MANIFEST} is unreadable"
    present = _files(step_dir)
    for name, size in listed.items():
        if name not in present:
            return f"{name} is missing"
        if present[name] != size:
            return f"{name} has {present[name]} bytes, {size} were written"
        problem = file_problem(step_dir / name)
        if problem:
            return f"{name}: {problem}"
    return None


def write_manifest(ckpt_dir: Path, step: int) -> str | None:
    """After every rank saved: verify the step's files; when they are sound, record them (name -> bytes)
    in the step's manifest and return None, else return the problem."""
    step_dir = Path(ckpt_dir) / tag_for(step)
    files = _files(step_dir)
    if not files:
        return "no files were written"
    for name in files:
        problem = file_problem(step_dir / name)
        if problem:
            return f"{name}: {problem}"
    tmp = step_dir / f".{CHECKPOINT_MANIFEST}.tmp"
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, step_dir / CHECKPOINT_MANIFEST)
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
    older step): ``latest`` only vouches for a checkpoint written before manifests existed."""
    pointed = latest_step(ckpt_dir)
    unusable = []
    for step in saved_steps(ckpt_dir):
        problem = step_problem(ckpt_dir, step, trust_unlisted=step == pointed)
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
    """Load the checkpoint of ``step``; returns the step it holds (call on all ranks)."""
    path, client_state = ds_engine.load_checkpoint(str(ckpt_dir), tag=tag_for(step))
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_for(step)} from {ckpt_dir}")
    return int((client_state or {}).get("orch_step", step))
