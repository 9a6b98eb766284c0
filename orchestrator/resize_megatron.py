"""How a Megatron-LM program's checkpoints follow a resize (resize.FOLLOWERS["megatron-lm"]); no torch here.

Megatron-LM reshards a distributed (torch_dist) checkpoint itself when it loads it under another layout, so
nothing is converted: the resized run loads the source's checkpoint dir read-only (``--load SRC --ckpt-step
N``) and saves into its own (``--save``). What a checkpoint can follow depends on how it was saved, read from
the source's recorded argv (program.json) and its step dir (:func:`checkpoint_format`, :func:`can_follow`).
Once the resized run has saved a checkpoint of its own, each start loads that one (:func:`start_argv`).
Why each rule: docs/resize.md, "Megatron-LM programs".
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import Problem, SpecError

METHOD = "reshard"
TRACKER = "latest_checkpointed_iteration.txt"     # Megatron-LM's newest-checkpoint file in a checkpoint dir
DEFAULT_FORMAT = "torch_dist"                    # core_v0.16.1's --ckpt-format default
RESHARDABLE_FLAG = "--dist-ckpt-optim-fully-reshardable"
LAYOUT_KEYS = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "zero_stage")
MODEL_KEYS = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp")
# Optimizer-state layouts (Megatron's distrib_optim_sharding_type, or the plain optimizer's) -> what may change.
RESHARDS = {"model_space": MODEL_KEYS, "fully_reshardable": MODEL_KEYS, "dp_reshardable": ("dp",),
            "fsdp_dtensor": ("dp",)}
FIX = ("set training.checkpoint.reshardable: true in the source spec before its first run (orch generate "
       "--force keeps nothing else different), or resize keeping the source's checkpoint layout")


def step_dir_name(step: int) -> str:
    return f"iter_{step:07d}"


def parsed_args(argv: list[str]):
    """``argv`` as Megatron-LM's argparse reads it (validate.megatron_args' parser over its own flag table:
    aliases, ``--flag=value``, the last value winning, each dest's default); the user's own flags are skipped."""
    from .validate.megatron_args import Token, parse_tokens  # noqa: PLC0415  (light: the flag table's json)

    return parse_tokens([Token(text, 0) for text in argv], "program.json")[0]


def checkpoint_format(argv: list[str]) -> dict:
    """How a Megatron-LM argv saves its checkpoints: ``{"ckpt_format", "optimizer"}``, optimizer one of
    RESHARDS' keys or "not_reshardable" (--no-ckpt-fully-parallel-save with the distributed optimizer:
    Megatron warns it cannot resume under another parallelism), None for the legacy torch format."""
    args = parsed_args(argv)
    fmt = args.get("ckpt_format") or DEFAULT_FORMAT
    if fmt in ("torch", "torch_dcp"):
        return {"ckpt_format": fmt, "optimizer": None}
    if args.get("use_megatron_fsdp") or fmt == "fsdp_dtensor":
        return {"ckpt_format": fmt, "optimizer": "fsdp_dtensor"}
    if not args.get("use_distributed_optimizer"):
        return {"ckpt_format": fmt, "optimizer": "model_space"}
    if args.get("dist_ckpt_optim_fully_reshardable"):
        return {"ckpt_format": fmt, "optimizer": "fully_reshardable"}
    if not args.get("ckpt_fully_parallel_save"):
        return {"ckpt_format": fmt, "optimizer": "not_reshardable"}
    return {"ckpt_format": fmt, "optimizer": "dp_reshardable"}


def format_on_disk(step_dir: Path) -> str | None:
    """The format of a saved step dir as Megatron-LM's _get_checkpoint_format reads it (metadata.json:
    torch_dist; mp_rank_0*: torch; .metadata: torch_dcp or fsdp_dtensor), None when it holds none."""
    config = step_dir / "metadata.json"
    if config.is_file():
        try:
            return "torch_dist" if json.loads(config.read_text()).get("sharded_backend") else None
        except (OSError, ValueError, AttributeError):
            return None
    if any(p.name.startswith("mp_rank_0") for p in step_dir.iterdir()):
        return "torch"
    return "dcp" if (step_dir / ".metadata").is_file() else None


# --- the source -----------------------------------------------------------------------------------------

def saved_steps(ckpt: Path) -> list[int]:
    """The iterations Megatron-LM finished saving under ``ckpt``: iter_* dirs up to the tracker's iteration."""
    try:
        newest = int((ckpt / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return []
    steps = []
    for path in ckpt.glob("iter_*"):
        suffix = path.name.removeprefix("iter_")
        if suffix.isdigit() and path.is_dir() and not path.is_symlink() and int(suffix) <= newest:
            steps.append(int(suffix))
    return sorted(steps)


def step_problem(ckpt: Path, step: int) -> str | None:
    """Why the source's checkpoint of ``step`` cannot be loaded (None: it is there, in a format Megatron reads)."""
    step_dir = ckpt / step_dir_name(step)
    if step not in saved_steps(ckpt):
        return (f"{step_dir} is not a checkpoint Megatron-LM finished saving (no such iter dir, or {ckpt / TRACKER} "
                "names an older iteration)")
    if format_on_disk(step_dir) is None:
        return f"{step_dir} holds no metadata.json, mp_rank_* or .metadata: not a Megatron-LM checkpoint"
    return None


def source_checkpoint(run, step: int | None) -> tuple[Path, int]:
    """The source run's Megatron-LM checkpoint dir and its newest saved step (or ``step``), else a SpecError."""
    ckpt = Path(run.path) / run.spec.training.checkpoint.dir
    if step is None:
        steps = saved_steps(ckpt)
        if not steps:
            raise SpecError(Problem(str(run.path), f"has no Megatron-LM checkpoint under {ckpt} (no {TRACKER} "
                                    "naming a saved iter_* dir) to resume from",
                                    "train the source run until it saves a checkpoint (--save-interval)"))
        step = steps[-1]
    problem = step_problem(ckpt, step)
    if problem:
        raise SpecError(Problem("--step", problem, "leave --step out to resume from the newest checkpoint"))
    return ckpt, step


def source_format(run, ckpt: Path, step: int) -> dict:
    """How the source saved the checkpoint of ``step``: its recorded argv's format, checked against the disk."""
    from .programs import load_program  # noqa: PLC0415  (light: json)

    try:
        argv = list(load_program(run.path)["argv"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(Problem(f"{run.path}/program.json", f"cannot be read ({e.__class__.__name__}): orch reads "
                                "how the source saved its checkpoints from it", "the source run dir must be one "
                                "`orch generate` wrote for a megatron-lm program")) from None
    record = checkpoint_format(argv)
    on_disk = format_on_disk(ckpt / step_dir_name(step))
    expected = {"torch_dist": "torch_dist", "torch": "torch"}.get(record["ckpt_format"], "dcp")
    if on_disk != expected:
        record = {"ckpt_format": {"dcp": "torch_dcp"}.get(on_disk, on_disk), "optimizer": None}
    return {**record, "schedule": schedule(run.spec), "reshardable": bool(run.spec.training.checkpoint.reshardable)}


def schedule(spec) -> dict:
    """What Megatron's OptimizerParamScheduler asserts equal to the checkpoint's at load (its steps count samples)."""
    t = spec.training
    return {"lr": t.optimizer.lr, "min_lr": min(t.lr_schedule.min_lr, t.optimizer.lr),
            "warmup_iters": min(t.lr_schedule.warmup_iters, t.train_iters - 1), "decay": t.lr_schedule.decay,
            "weight_decay": t.optimizer.weight_decay, "global_batch_size": t.global_batch_size}


def plan_format(plan) -> dict:
    """How the new run dir's argv saves (and so how Megatron-LM builds its state to load into)."""
    from .programs.argv import megatron_program_args  # noqa: PLC0415

    return {**checkpoint_format(megatron_program_args(plan)), "schedule": schedule(plan.spec),
            "reshardable": bool(plan.spec.training.checkpoint.reshardable)}


# --- the follower ----------------------------------------------------------------------------------------

def can_follow(old: dict, new: dict) -> tuple[str, tuple[str, ...], str]:
    """(method, changes, how) for the layout records ``old`` -> ``new`` (each with the ``checkpoint`` record of
    source_format / plan_format), or a SpecError naming the change the source checkpoint cannot follow."""
    src, dst = old["checkpoint"], new["checkpoint"]
    changes = tuple(f"{k} {old.get(k)} -> {new.get(k)}" for k in LAYOUT_KEYS if old.get(k) != new.get(k))
    what = ", ".join(changes) or "the cluster size"
    moved = [k for k in LAYOUT_KEYS if old.get(k) != new.get(k)]
    diff = [f"{k} {src['schedule'][k]} -> {dst['schedule'][k]}" for k in src["schedule"]
            if src["schedule"][k] != dst["schedule"].get(k)]
    if diff:
        _refuse(what, f"{', '.join(diff)}: Megatron-LM's OptimizerParamScheduler asserts the learning rate, weight "
                "decay and the sample-counted warm-up and decay of the checkpoint equal the run's", "keep the "
                "source's global batch and optimizer (leave out --scale-batch)")
    if moved and src["optimizer"] is None:
        _refuse(what, f"the source saved Megatron-LM's --ckpt-format {src['ckpt_format']}, which loads only under "
                "the layout that saved it", "resize keeping tp, pp and dp, or save the source with --ckpt-format "
                "torch_dist (orch's default: drop it from program.args)")
    if src["ckpt_format"] != dst["ckpt_format"] and "fsdp_dtensor" in (src["ckpt_format"], dst["ckpt_format"]):
        _refuse(what, f"--ckpt-format {src['ckpt_format']} (source) -> {dst['ckpt_format']}: Megatron FSDP "
                "(zero_stage 2/3) saves and loads only fsdp_dtensor, the others torch_dist", "keep the source's "
                "zero_stage on the same side of 1 | 2")
    if "zero_stage" in moved and {old.get("zero_stage"), new.get("zero_stage")} & {0}:
        _refuse(what, f"zero_stage {old.get('zero_stage')} -> {new.get('zero_stage')}: the plain optimizer and the "
                "distributed optimizer keep their state in different checkpoint layouts; loading one into the other "
                "is not verified", "keep the distributed optimizer on (zero_stage >= 1) or off in both runs")
    allowed = RESHARDS.get(src["optimizer"], ())
    refused = [k for k in moved if k not in allowed]
    if refused:
        why = {"dp_reshardable": "the distributed optimizer's state was saved in Megatron-LM's default "
                                 "'dp_reshardable' layout, which loads at another dp only (a (TP, PP) mismatch "
                                 f"raises in load_checkpoint); {RESHARDABLE_FLAG} saves the 'fully_reshardable' one",
               "fsdp_dtensor": "Megatron FSDP's fsdp_dtensor checkpoint reshards over dp; other changes are not "
                               "supported by Megatron-LM core_v0.16.1 (train at zero_stage 1 with reshardable "
                               "checkpoints to change tp / pp)",
               "not_reshardable": "the source saved with --no-ckpt-fully-parallel-save and the distributed "
                                  "optimizer (Megatron-LM: 'impossible to resume training with different "
                                  "parallelism')"}[src["optimizer"]]
        _refuse(what, f"{', '.join(refused)}: {why}", FIX if src["optimizer"] != "fsdp_dtensor" else
                "resize changing dp only")
    how = ("Megatron-LM loads the source's torch_dist checkpoint read-only (--load SOURCE --ckpt-step N) and "
           "reshards it to the new layout at load; the new run saves into its own dir (--save)")
    return METHOD, changes, how


def _refuse(what: str, reason: str, fix: str):
    raise SpecError(Problem("layout", f"the Megatron-LM checkpoint cannot follow {what}: {reason}", fix))


# --- the new run's argv ----------------------------------------------------------------------------------

def resumed_args(tokens: list[str], resume: dict) -> list[str]:
    """``tokens`` (megatron_args.txt or a program argv) loading the source's checkpoint: --load SOURCE_DIR
    --ckpt-step N --exit-on-missing-checkpoint in place of --load (and its value); --save stays the run's own."""
    source = str(Path(resume["source_checkpoint"]).parent)
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] == "--load" and i + 1 < len(tokens) and "--ckpt-step" not in out:
            out += ["--load", source, "--ckpt-step", str(resume["source_step"]), "--exit-on-missing-checkpoint"]
            i += 2
            continue
        out.append(tokens[i])
        i += 1
    return out


def resumed_files(plan, resume: dict) -> dict[str, str]:
    """megatron_args.txt and program.json of the resized run dir (write_run_dir's extra_files)."""
    from .programs.argv import render_program  # noqa: PLC0415
    from .render.megatron import render_megatron_args  # noqa: PLC0415
    from .rundir import dump_json  # noqa: PLC0415

    files = {"megatron_args.txt": "\n".join(resumed_args(render_megatron_args(plan), resume)) + "\n"}
    program = render_program(plan)
    if program is not None:
        program["argv"] = [program["argv"][0], *resumed_args(program["argv"][1:], resume)]
        files["program.json"] = dump_json(program)
    return files


def start_argv(run_dir: Path, argv: list[str]) -> list[str]:
    """At each start of a resized run (every rank alike): once the run saved a checkpoint of its own (Megatron-LM
    wrote its --save dir's tracker), load that one (--load SAVE, no --ckpt-step) instead of the source's."""
    from .programs import RUN_DIR_TOKEN  # noqa: PLC0415

    args = parsed_args(argv)
    save = args.get("save")
    if save is None or not args.get("ckpt_step") or not (Path(run_dir) / "resume.json").is_file():
        return argv
    save = save.replace(RUN_DIR_TOKEN, str(Path(run_dir).resolve()))
    if not (Path(run_dir) / save / TRACKER).is_file():
        return argv
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--load", "--ckpt-step") and i + 1 < len(argv):
            out += ["--load", save] if argv[i] == "--load" else []
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def start_iteration(argv: list[str], cwd: Path) -> int:
    """The iteration Megatron-LM's training starts after for this argv (the step telemetry numbers from), as
    core_v0.16.1's checkpointing.py decides it: 0 without --load, with --finetune or a ``release`` tracker;
    else --ckpt-step when set, else the --load dir's tracker; 0 when there is no checkpoint to load. A
    relative --load is read from ``cwd`` (the program's working dir)."""
    args = parsed_args(argv)
    load = args.get("load")
    if not load or args.get("finetune"):
        return 0
    tracker = Path(cwd) / load / TRACKER
    if not tracker.is_file():
        return 0
    if args.get("ckpt_step"):
        return int(args.get("ckpt_step"))
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else 0


def verify_source(run_dir: Path, resume: dict) -> tuple[str | None, str]:
    """The conversion step of a resized Megatron-LM run (nothing to convert): (why the source step cannot be
    loaded or None, what to log). Once the run has a checkpoint of its own the source is not read."""
    from .rundir import read_run_dir  # noqa: PLC0415

    run = read_run_dir(run_dir)
    own = saved_steps(Path(run_dir) / run.spec.training.checkpoint.dir)
    if own:
        return None, f"the run has a checkpoint of its own (step {own[-1]}): it resumes from that, nothing to load"
    src = Path(resume["source_checkpoint"])
    return (step_problem(src.parent, int(resume["source_step"])),
            f"source checkpoint {src} is there: Megatron-LM loads it read-only and reshards it to this layout")
