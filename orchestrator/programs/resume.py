"""What each start of a user's DeepSpeed script loads (program.load_arg), decided alike on every rank.

The run's own newest sound checkpoint (orchestrator.programs.checkpoints), else a resized run's converted
checkpoint (RUN_DIR/resume/<method>, written by orchestrator.train.convert; a universal one with a copy of
ds_config.json that adds ``checkpoint.load_universal``), else nothing: the script starts from step 0.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..train import checkpoint
from .checkpoints import UNIVERSAL_DS_CONFIG, newest_step


@dataclass(frozen=True)
class Start:
    """What this start of the script loads: ``load_dir`` (None: from scratch) from ``step``; ``ds_config``: the
    config to hand it instead of RUN_DIR/ds_config.json (None: that one)."""

    load_dir: Path | None = None
    step: int = 0
    ds_config: Path | None = None
    why: str = "starts from step 0"


def start_of(run_dir: Path, spec) -> Start:
    """This start's Start (program.load_arg unset: always from scratch, as the script decides). SpecError (exit
    2) when a resized run's converted checkpoint is missing or unsound."""
    from ..train.convert import converted_problem, read_resume, target  # noqa: PLC0415

    if not spec.program.load_arg:
        return Start()
    ckpt = checkpoint.checkpoint_dir(run_dir, spec)
    own, _ = newest_step(ckpt)
    if own is not None:
        return Start(ckpt, own, why=f"resumes from its own checkpoint of step {own} ({ckpt})")
    resume = read_resume(run_dir)
    if resume is None:
        return Start()
    source = target(run_dir, resume)
    problem = converted_problem(source)
    if problem:
        raise SpecError(f"the converted checkpoint of this resized run is not usable ({problem}): run the conversion "
                        f"step first (`python -m orchestrator.train.convert {run_dir}`; `orch launch` runs it)",
                        path=str(source.ckpt_dir))
    ds_config = None
    if source.method == "universal":
        config = json.loads((Path(run_dir) / "ds_config.json").read_text())
        ds_config = Path(run_dir) / "resume" / UNIVERSAL_DS_CONFIG
        _write_same(ds_config, json.dumps(source.ds_config(config), indent=2, sort_keys=True) + "\n")
    return Start(source.ckpt_dir, source.step, ds_config,
                 why=f"resized run: resumes from {source.ckpt_dir} ({source.method}, step {source.step})")


def _write_same(path: Path, text: str) -> None:
    """Write ``text`` atomically; every rank may call it at once with the same text (a temp file of its own)."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def start_argv(argv: list[str], program, start: Start, run_dir: Path) -> list[str]:
    """program.json's argv (run dir filled in) for this start of ``program`` (the ProgramSpec): the ds_config
    flag's value swapped for ``start.ds_config`` and ``load_arg start.load_dir`` added, when it loads something."""
    if start.load_dir is None:
        return list(argv)
    out, generated = list(argv), (Path(run_dir) / "ds_config.json").resolve()
    if start.ds_config is not None:
        for i in range(1, len(out)):
            if out[i - 1] == program.ds_config_arg and Path(out[i]).resolve() == generated:
                out[i] = str(start.ds_config)
    return out + [program.load_arg, str(start.load_dir)]
