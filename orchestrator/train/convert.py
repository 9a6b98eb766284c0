"""The conversion step of a resized run: bring the source run's checkpoint into the new run dir, verified.

``python -m orchestrator.train.convert RUN_DIR`` runs before the ranks start (the local launch path runs it
before torchrun; on SLURM it belongs inside the allocation, before srun starts the ranks). It reads
resume.json, verifies the source step (read only), then writes ``RUN_DIR/resume/<method>/global_step<N>``:
``copy`` copies the step dir, ``universal`` and ``universal-params`` run DeepSpeed's ds_to_universal (the
trainer loads the first through DeepSpeed, the second parameter by parameter: universal.py). The result is
verified and recorded (checkpoint.write_manifest) before it is renamed into place, so a second run reuses it
and a half-written one is never loaded. Exit 0 done (or nothing to do), 1 conversion failed, 2 bad resume.json.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrchError, SpecError
from ..resize import METHODS, RESUME_FILE, UNIVERSAL_PARAMS
from . import checkpoint

RESUME_DIR = "resume"


@dataclass(frozen=True)
class ResumeSource:
    """The converted checkpoint a resized run starts from."""

    ckpt_dir: Path       # holds global_step<step>
    step: int
    method: str          # one of resize.METHODS
    source_pp: int = 1   # the source's pipeline stages (names its universal parameters: model.gpt_param_name)

    def ds_config(self, config: dict) -> dict:
        """The ds_config for deepspeed.initialize: a universal checkpoint loads with checkpoint.load_universal
        (only for this first start: ds_config.json stays as generated, for the run's own checkpoints)."""
        if self.method != "universal":
            return config
        return {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}


def read_resume(run_path: Path) -> dict | None:
    path = Path(run_path) / RESUME_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        for key in ("source_checkpoint", "source_step", "conversion"):
            data[key]
        if data["conversion"]["method"] not in METHODS:
            raise ValueError(f"unknown conversion method {data['conversion']['method']!r}")
        return data
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"unreadable ({e.__class__.__name__}: {e}); re-create it with `orch resize`",
                        path=str(path)) from None


def target(run_path: Path, resume: dict) -> ResumeSource:
    method = resume["conversion"]["method"]
    return ResumeSource(Path(run_path) / RESUME_DIR / method, int(resume["source_step"]), method,
                        int((resume.get("old_layout") or {}).get("pp") or 1))


def converted_problem(source: ResumeSource) -> str | None:
    """Why the converted checkpoint cannot be loaded (None: it verifies)."""
    return checkpoint.step_problem(source.ckpt_dir, source.step)


def convert(run_path: str | Path, *, log=print) -> ResumeSource | None:
    """Write and verify the converted checkpoint of a resized run dir (reused when it verifies already).
    None when the run dir is not a resized one or has a checkpoint of its own (it resumes from that).
    Never writes outside ``run_path``."""
    run_path = Path(run_path)
    resume = read_resume(run_path)
    if resume is None:
        return None
    if resume["conversion"]["method"] == "reshard":     # Megatron-LM reshards at load: only check the source
        from ..resize_megatron import verify_source  # noqa: PLC0415

        problem, said = verify_source(run_path, resume)
        if problem:
            raise RuntimeError(f"source checkpoint {resume['source_checkpoint']} is unusable: {problem}")
        log(said)
        return None
    out = target(run_path, resume)
    own = _own_checkpoint(run_path)
    if own is not None:
        log(f"the run has a checkpoint of its own (step {own}): it resumes from that, nothing to convert")
        return None
    if converted_problem(out) is None:
        log(f"converted checkpoint {out.ckpt_dir / checkpoint.tag_for(out.step)} verifies: reused")
        return out
    src = Path(resume["source_checkpoint"])
    problem = _source_problem(resume, src.parent, out.step)
    if problem:
        raise RuntimeError(f"source checkpoint {src} is unusable: {problem}")
    out.ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.method}.tmp-", dir=out.ckpt_dir.parent))
    try:
        step_dir = tmp / checkpoint.tag_for(out.step)
        if out.method == "copy":
            shutil.copytree(src, step_dir, ignore=shutil.ignore_patterns(checkpoint.CHECKPOINT_MANIFEST))
            if resume.get("program") == "script":     # its engine.load_checkpoint(dir) reads the tag from latest
                (tmp / checkpoint.LATEST).write_text(checkpoint.tag_for(out.step))
        else:                                # universal, universal-params: the same files, loaded two ways
            _ds_to_universal(src, step_dir)
        problem = checkpoint.write_manifest(tmp, out.step) or _universal_problem(src, step_dir, out.method)
        if problem:
            raise RuntimeError(f"the converted checkpoint fails verification: {problem}")
        if out.ckpt_dir.exists():
            shutil.rmtree(out.ckpt_dir)      # an earlier, unverified attempt (ours: under the new run dir)
        tmp.rename(out.ckpt_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"converted {src} ({resume['conversion']['method']}: {', '.join(resume['conversion'].get('changes') or [])}"
        f") -> {out.ckpt_dir / checkpoint.tag_for(out.step)}, verified")
    return out


def _own_checkpoint(run_path: Path) -> int | None:
    from ..rundir import read_run_dir  # noqa: PLC0415

    run = read_run_dir(run_path)
    ckpt = checkpoint.checkpoint_dir(run.path, run.spec)
    if run.spec.program is not None and run.spec.program.kind == "script":
        from ..programs.checkpoints import newest_step  # noqa: PLC0415

        return newest_step(ckpt)[0]
    return checkpoint.resume_choice(ckpt).step


def _source_problem(resume: dict, ckpt_dir: Path, step: int) -> str | None:
    """A user script's checkpoint has no orch manifest (orchestrator.programs.checkpoints checks its files)."""
    if resume.get("program") == "script":
        from ..programs.checkpoints import step_problem  # noqa: PLC0415

        return step_problem(ckpt_dir, step)
    return checkpoint.step_problem(ckpt_dir, step)


def _ds_to_universal(src: Path, out: Path) -> None:
    """DeepSpeed's converter (deepspeed/checkpoint/ds_to_universal.py, 0.19.8), in this process. orch's
    model records no universal_checkpoint_info, so the converter injects the default (inject_missing_state).
    DeepSpeed 0.19.8 builds globs and a regular expression from the paths unescaped (`[`, `$`, `(` in a run
    dir's path break them), so it runs in ``out``'s parent with plain relative names: ``out.name`` and a link
    to ``src`` that is removed again."""
    import contextlib  # noqa: PLC0415

    from deepspeed.checkpoint import ds_to_universal  # noqa: PLC0415

    link = out.parent / ".source"
    link.symlink_to(src.resolve(), target_is_directory=True)
    try:
        with contextlib.chdir(out.parent):
            ds_to_universal.main(Namespace(input_folder=link.name, output_folder=out.name, num_extract_workers=1,
                                           num_merge_workers=1, keep_temp_folder=False, strict=True,
                                           inject_missing_state=True))
    finally:
        link.unlink()


def _universal_problem(src: Path, out: Path, method: str) -> str | None:
    """A universal checkpoint holds fp32 weights and both Adam moments for every parameter of the source."""
    if method not in ("universal", UNIVERSAL_PARAMS):
        return None
    import torch  # noqa: PLC0415

    model_states = sorted(src.glob("*model_states.pt"))
    names = set()
    for path in model_states:
        state = torch.load(path, map_location="cpu", weights_only=False)
        shapes = state.get("param_shapes") or []
        for group in shapes if isinstance(shapes, list) else [shapes]:
            names.update(group)
    if not names:
        return f"no parameter names in {src}'s model states"
    missing = sorted(n for n in names for f in ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt")
                     if not (out / "zero" / n / f).is_file())
    return f"{len(missing)} parameter files missing, e.g. zero/{missing[0]}" if missing else None


def resume_source(run_dir, *, resume: bool, rank: int) -> ResumeSource | None:
    """Where a resized run's first start loads from (call on all ranks; rank 0 decides): None when resuming is
    off, the run dir is not resized, or it has a checkpoint of its own (that one wins). SpecError (exit 2) when
    the converted checkpoint is missing or fails verification."""
    import torch.distributed as dist  # noqa: PLC0415

    decision = [None]
    if rank == 0 and resume:
        data = read_resume(run_dir.path)
        own = checkpoint.resume_choice(checkpoint.checkpoint_dir(run_dir.path, run_dir.spec)).step
        if data is not None and own is None:
            source = target(run_dir.path, data)
            problem = converted_problem(source)
            decision = [source if problem is None else problem]
    dist.broadcast_object_list(decision, src=0)
    if isinstance(decision[0], str):
        raise SpecError(f"the converted checkpoint of this resized run is not usable ({decision[0]}): run the "
                        f"conversion step first (`python -m orchestrator.train.convert {run_dir.path}`; "
                        "`orch launch` runs it)", path=str(Path(run_dir.path) / RESUME_DIR))
    return decision[0]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestrator.train.convert RUN_DIR", file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(f"[orch-convert] {message}", file=sys.stderr, flush=True)

    try:
        convert(args[0], log=log)
    except OrchError as e:
        print(f"orch-convert: error: {e}", file=sys.stderr)
        return e.exit_code
    except (RuntimeError, OSError, ValueError, AssertionError) as e:
        print(f"orch-convert: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
