"""A user script's own DeepSpeed checkpoints: which step dirs orch trusts (no orch manifest there).

The script saves into RUN_DIR/training.checkpoint.dir (handed to it with program.save_arg) under DeepSpeed's
default tags (``global_step<N>``). A step dir is sound when its model states and optimizer shards are there and
every torch archive passes its CRCs (nothing is unpickled). Read by orch resize (the source's step), the
conversion step (orchestrator.train.convert) and each start of the script (orchestrator.programs.resume).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import Problem, SpecError
from ..train import checkpoint

UNIVERSAL_DS_CONFIG = "ds_config.load_universal.json"    # under RUN_DIR/resume: a universal resume's first config


def step_problem(ckpt_dir: Path, step: int, *, shards: int | None = None) -> str | None:
    """Why the script's checkpoint of ``step`` must not be converted or loaded (None: it is sound): the step
    dir, at least one ``*model_states.pt``, ``shards`` optimizer shards (``*optim_states.pt``: one per dp rank
    at ZeRO-1/2) when given, every ``.pt`` a torch archive whose members pass their CRCs. Nothing is unpickled."""
    step_dir = Path(ckpt_dir) / checkpoint.tag_for(step)
    if step_dir.is_symlink() or not step_dir.is_dir():
        return "missing" if not step_dir.is_symlink() else "a symlink, not a directory the script wrote"
    if not list(step_dir.glob("*model_states.pt")):
        return "holds no *model_states.pt (not a DeepSpeed checkpoint)"
    optim = sorted(step_dir.glob("*optim_states.pt"))
    if shards is not None and len(optim) != shards:
        return (f"holds {len(optim)} optimizer shard(s) (*optim_states.pt), the run saved {shards}: a save that "
                "did not finish, or another run's files")
    for path in sorted(step_dir.rglob("*.pt")):
        problem = checkpoint.file_problem(path)
        if problem:
            return f"{path.relative_to(step_dir)}: {problem}"
    return None


def newest_step(ckpt_dir: Path, *, shards: int | None = None) -> tuple[int | None, list[tuple[int, str]]]:
    """The newest ``global_step<N>`` that is sound, and the newer ones that are not (step, why)."""
    unusable = []
    for step in checkpoint.saved_steps(ckpt_dir):
        problem = step_problem(ckpt_dir, step, shards=shards)
        if problem is None:
            return step, unusable
        unusable.append((step, problem))
    return None, unusable


def source_checkpoint(run, step: int | None, *, shards: int | None) -> tuple[Path, int]:
    """A script run's checkpoint dir and the step a resize continues from (``step``, or its newest sound
    one); SpecError (exit 2) naming what is wrong. Read only."""
    program = run.spec.program
    if not program.save_arg:
        raise SpecError(Problem("program.save_arg", f"{run.path}'s script was not told where to save checkpoints, so "
                                "orch has none to resume from", "set program.save_arg and program.load_arg (e.g. "
                                "--save_dir and --load_dir) to the flags your script passes to "
                                "engine.save_checkpoint and engine.load_checkpoint, then train the source run"))
    if not program.load_arg:
        raise SpecError(Problem("program.load_arg", "orch cannot tell the script where to load the converted "
                                "checkpoint from", "set program.load_arg (e.g. --load_dir) to the flag your script "
                                "passes to engine.load_checkpoint"))
    ckpt = checkpoint.checkpoint_dir(run.path, run.spec)
    if step is not None:
        problem = step_problem(ckpt, step, shards=shards)
        if problem:
            raise SpecError(Problem("--step", f"the script's checkpoint of step {step} under {ckpt} is unusable: "
                                    f"{problem}", "leave --step out to resume from the newest sound checkpoint"))
        return ckpt, step
    step, unusable = newest_step(ckpt, shards=shards)
    if step is None:
        why = f" ({', '.join(f'step {s}: {p}' for s, p in unusable)})" if unusable else ""
        raise SpecError(Problem(str(run.path), f"has no sound checkpoint under {ckpt} to resume from{why}",
                                f"the script must save there with engine.save_checkpoint(dir) under DeepSpeed's "
                                f"default tags (global_step<N>); {program.save_arg} receives the dir"))
    return ckpt, step
