"""program.json for a Plan: the argv each rank runs, per program kind (a renderer; the one file it reads is the
script, for its sha256).

kind script: ``[script, *args, ds_config_arg, {run_dir}/ds_config.json, [save_arg, {run_dir}/checkpoints]]``, plus, for a Hugging Face Trainer
script, the TrainingArguments that agree with ds_config.json (:mod:`.hf_args`). kind megatron-lm:
``[checkout/entry, *megatron_args.txt, ...logging]``, run in the checkout. ``{run_dir}`` is filled in at run
time (orchestrator.programs.substitute_run_dir).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..plan import Plan
from . import RUN_DIR_TOKEN

# Megatron-LM core_v0.16.1 timers: every active timer calls torch.cuda.synchronize() at start and stop
# (megatron/core/timers.py); level 0 keeps only the per-interval ones (iteration time), levels 1 and 2 add
# forward/backward, optimizer and pipeline p2p timers inside the step.
MEGATRON_TIMING_LOG_LEVEL = 0


def render_program(plan: Plan) -> dict | None:
    """RUN_DIR/program.json's content, or None for kind orch (the launch scripts run orch's trainer)."""
    program = plan.spec.program
    if program is None or program.kind == "orch":
        return None
    if program.kind == "script":
        argv, cwd, script = script_argv(plan), None, program.path
    else:
        script = str(Path(program.megatron_lm) / program.entry)
        argv, cwd = [script, *megatron_program_args(plan)], program.megatron_lm
    return {"kind": program.kind, "argv": argv, "cwd": cwd, "log_format": program.log_format,
            "script_path": script, "script_sha256": file_sha256(script)}


def file_sha256(path: str | Path) -> str | None:
    """The file's sha256, or None when it cannot be read (the spec rules report that)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def script_argv(plan: Plan) -> list[str]:
    """The user's script, their arguments, the ds_config flag, then (HF Trainer) orch's TrainingArguments, last so
    that they win over the user's own."""
    from .hf_args import hf_training_args  # noqa: PLC0415

    program = plan.spec.program
    argv = [program.path, *program.args, program.ds_config_arg, f"{RUN_DIR_TOKEN}/ds_config.json",
            *save_args(plan.spec)]
    return argv + (hf_training_args(plan) if program.log_format == "hf" else [])


def save_args(spec) -> list[str]:
    """``[save_arg, {run_dir}/<training.checkpoint.dir>]`` when the spec names the script's save flag (the load
    flag is added at each start that has a checkpoint to load: orchestrator.programs.resume)."""
    flag = spec.program.save_arg
    return [flag, f"{RUN_DIR_TOKEN}/{spec.training.checkpoint.dir}"] if flag else []


def megatron_program_args(plan: Plan) -> list[str]:
    """megatron_args.txt's tokens (its relative directories made run-dir paths: the program runs in the
    checkout), then what makes Megatron-LM log where orch looks: TensorBoard, throughput, and timers at the
    level that does not synchronize the GPU inside a step (megatron_args.txt already names the W&B project,
    run and directory)."""
    from ..render.megatron import render_megatron_args  # noqa: PLC0415

    tokens = render_megatron_args(plan)
    args = [_in_run_dir(a) if prev in RUN_DIR_FLAGS else a for prev, a in zip([None, *tokens], tokens)]
    logging = ["--tensorboard-dir", f"{RUN_DIR_TOKEN}/tensorboard", "--log-timers-to-tensorboard",
               "--timing-log-level", str(MEGATRON_TIMING_LOG_LEVEL)]
    throughput = [] if "--log-throughput" in args else ["--log-throughput"]
    return args + logging + throughput + list(plan.spec.program.args)


RUN_DIR_FLAGS = ("--save", "--load", "--wandb-save-dir")   # directories megatron_args.txt gives relative to the run dir


def _in_run_dir(path: str) -> str:
    return path if path.startswith("/") else f"{RUN_DIR_TOKEN}/{path}"


def program_warnings(plan: Plan) -> list[str]:
    """What generate tells the user: each of their own program.args that orch's arguments override."""
    program = plan.spec.program
    if program is None:
        return []
    from .hf_args import hf_training_args, overridden_flags  # noqa: PLC0415

    if program.kind == "megatron-lm":
        flags = overridden_flags(program.args, megatron_program_args(plan)[:-len(program.args) or None])
        return [f"program.args: {', '.join(flags)} replace what orch derived from the spec (they come last, so "
                "Megatron-LM uses them); the plan's predictions still assume the spec's values"] if flags else []
    ours = [program.ds_config_arg, *save_args(plan.spec), *([program.load_arg, "DIR"] if program.load_arg else []),
            *(hf_training_args(plan) if program.log_format == "hf" else [])]
    flags = overridden_flags(program.args, ours)
    if not flags:
        return []
    why = ("ds_config.json's values must agree with the TrainingArguments (the Hugging Face Trainer refuses a "
           "mismatch), so orch passes them from the spec after yours" if program.log_format == "hf"
           else "orch hands the script RUN_DIR/ds_config.json with it")
    return [f"program.args: orch overrides {', '.join(flags)} ({why}); set them in the spec instead"]
