"""Checkpoints: DeepSpeed's save_checkpoint / load_checkpoint, plus a crash-safe ``latest`` pointer.

Layout: ``<checkpoint dir>/global_step<N>/...`` (DeepSpeed's files) and ``<checkpoint dir>/latest``
holding the tag of the newest COMPLETE checkpoint. DeepSpeed lets rank 0 write ``latest`` as soon as
rank 0 itself is done; here every rank saves, all ranks meet at a barrier, and only then rank 0
replaces ``latest`` atomically. A job killed mid-save therefore resumes from the previous checkpoint.

The checkpoint dir is ``training.checkpoint.dir`` of the spec; a relative path is inside the run dir.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

LATEST = "latest"
_TAG = re.compile(r"global_step(\d+)")


def checkpoint_dir(run_dir: Path, spec) -> Path:
    path = Path(spec.training.checkpoint.dir)
    return path if path.is_absolute() else Path(run_dir) / path


def tag_for(step: int) -> str:
    return f"global_step{step}"


def latest_step(ckpt_dir: Path) -> int | None:
    """The step of the newest complete checkpoint, or None when there is none."""
    pointer = Path(ckpt_dir) / LATEST
    if not pointer.is_file():
        return None
    tag = pointer.read_text().strip()
    match = _TAG.fullmatch(tag)
    if not match or not (Path(ckpt_dir) / tag).is_dir():
        return None
    return int(match.group(1))


def write_latest(ckpt_dir: Path, step: int) -> None:
    tmp = Path(ckpt_dir) / f".{LATEST}.tmp"
    tmp.write_text(tag_for(step))
    os.replace(tmp, Path(ckpt_dir) / LATEST)


def save(ds_engine, ckpt_dir: Path, step: int, *, rank: int) -> None:
    """Save step ``step`` on every rank, then publish it as ``latest`` (call on all ranks)."""
    import torch.distributed as dist  # noqa: PLC0415

    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    ds_engine.save_checkpoint(str(ckpt_dir), tag=tag_for(step), client_state={"orch_step": step},
                              save_latest=False)
    dist.barrier()
    if rank == 0:
        write_latest(ckpt_dir, step)
    dist.barrier()


def load(ds_engine, ckpt_dir: Path, step: int) -> int:
    """Load the checkpoint of ``step``; returns the step it holds (call on all ranks)."""
    path, client_state = ds_engine.load_checkpoint(str(ckpt_dir), tag=tag_for(step))
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_for(step)} from {ckpt_dir}")
    return int((client_state or {}).get("orch_step", step))
