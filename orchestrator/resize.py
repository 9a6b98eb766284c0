"""Resize a run: re-plan its spec for another cluster and write a new run dir that resumes from its checkpoint.

``resize_spec`` keeps the model, precision, engine and every fixed parallelism field but dp (which follows the
new world size); ``plan_resize`` checks the sizes (nearest valid node counts on refusal), asks the program's
checkpoint follower (FOLLOWERS, per program kind) how its checkpoints follow the new layout, and renders
resume.json. The conversion itself runs in the new job (orchestrator/train/convert.py), never at generate time.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .errors import Problem, SpecError
from .spec import Spec

RESUME_FILE = "resume.json"
UNIVERSAL_PARAMS = "universal-params"   # ds_to_universal, loaded parameter by parameter (train/universal.py)
METHODS = ("copy", "universal", UNIVERSAL_PARAMS, "reshard")   # reshard: Megatron-LM reshards at load (resize_megatron)
# What stays the same for the checkpoint to mean anything in the new run (spec paths).
KEPT = ("model", "training.precision", "training.engine", "training.seed", "training.train_iters", "data")
LAYOUT_FIELDS = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "zero_stage", "micro_batch_size", "offload")
SEARCH_NODES = 64          # how far the nearest-size search looks on each side
SCRIPT_CKPT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "zero_stage", "offload")   # a script checkpoint's layout


@dataclass(frozen=True)
class Conversion:
    """How a checkpoint follows a layout change: ``method`` "copy" (same checkpoint layout), "universal" or
    UNIVERSAL_PARAMS."""

    method: str
    changes: tuple[str, ...]
    how: str


@dataclass(frozen=True)
class Resize:
    spec: Spec            # the new spec (planned by write_resized)
    resume: dict          # resume.json without the new layout and the conversion (added once planned)
    notes: tuple[str, ...]
    follow: object        # the program's checkpoint follower (FOLLOWERS)


def _get(spec, path: str):
    value = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def program_kind(spec: Spec) -> str:
    """The spec's program kind ("orch": orch's reference trainer when the spec names none)."""
    program = getattr(spec, "program", None)
    return getattr(program, "kind", None) or "orch"


def resize_spec(source: Spec, *, nodes: int, gpus_per_node: int | None = None, scale_batch: bool = False,
                layout: dict | None = None) -> Spec:
    """The source's spec on ``nodes`` x ``gpus_per_node``: dp opened, ``layout`` (ParallelismSpec field ->
    value, e.g. zero_stage) applied, everything else kept (the global batch scaled with dp when
    ``scale_batch``: see scaled_batch_spec)."""
    cluster = dataclasses.replace(source.cluster, num_nodes=nodes,
                                  gpus_per_node=gpus_per_node or source.cluster.gpus_per_node)
    spec = dataclasses.replace(source, cluster=cluster, launch=_pdsh_hosts_for(source.launch, nodes),
                               parallelism=dataclasses.replace(source.parallelism, data=None, **(layout or {})))
    return scaled_batch_spec(source, spec) if scale_batch else spec


def _pdsh_hosts_for(launch, nodes: int):
    """Fewer nodes than the source's pdsh hosts: the first ``nodes`` of them (the first host stays the master);
    more: the list is kept, and validation names launch.pdsh.hosts (use generate --resume-from with more hosts)."""
    hosts = list(launch.pdsh.hosts)
    if len(hosts) <= nodes:
        return launch
    return dataclasses.replace(launch, pdsh=dataclasses.replace(launch.pdsh, hosts=hosts[:nodes]))


def _dp(spec: Spec) -> int | None:
    p = spec.parallelism
    inner = (p.tensor or 1) * (p.pipeline or 1) * (p.context or 1)
    return spec.world_size // inner if spec.world_size % inner == 0 else None


def scaled_batch_spec(source: Spec, spec: Spec) -> Spec:
    """--scale-batch: global batch * k with k = new dp / old dp (the accumulation steps stay); peak and final
    learning rate * k (the linear scaling rule); warm-up and decay keep their step counts."""
    old_dp, new_dp = source.parallelism.data or _dp(source), _dp(spec)
    batch = source.training.global_batch_size
    if new_dp is None or (batch * new_dp) % old_dp:
        return spec            # size_problem names why this size does not work
    k = new_dp / old_dp
    t = source.training
    training = dataclasses.replace(
        t, global_batch_size=batch * new_dp // old_dp,
        optimizer=dataclasses.replace(t.optimizer, lr=t.optimizer.lr * k),
        lr_schedule=dataclasses.replace(t.lr_schedule, min_lr=t.lr_schedule.min_lr * k))
    return dataclasses.replace(spec, training=training)


def size_problem(spec: Spec) -> str | None:
    """Why no layout of ``spec`` (its fixed fields kept) exists on its cluster, or None."""
    from .planner import enumerate_layouts  # noqa: PLC0415

    p, batch = spec.parallelism, spec.training.global_batch_size
    inner = (p.tensor or 1) * (p.pipeline or 1) * (p.context or 1)
    if spec.world_size % inner:
        return (f"world size {spec.world_size} is not a multiple of tp * pp * cp = {inner}")
    dp, mb = spec.world_size // inner, p.micro_batch_size or 1
    if batch % (dp * mb):
        return (f"training.global_batch_size {batch} does not divide by dp {dp} * micro_batch_size {mb} = "
                f"{dp * mb}")
    grid = (p.expert or 1) * (p.expert_tensor or 1) if spec.model.moe is not None else 1
    per_stage = spec.world_size // (p.pipeline or 1)
    if per_stage % grid:
        return (f"the expert grid expert({p.expert or 1}) * expert_tensor({p.expert_tensor or 1}) = {grid} needs a "
                f"multiple of {grid} ranks per pipeline stage, this size has {per_stage}")
    rejected: list[Problem] = []
    if next(iter(enumerate_layouts(spec, rejected)), None) is None:
        return str(rejected[0]) if rejected else "no layout satisfies the parallelism rules"
    return None


def nearest_sizes(make, nodes: int) -> tuple[int | None, int | None]:
    """The nearest node counts below and above ``nodes`` whose spec ``make(n)`` has a layout."""
    below = next((n for n in range(nodes - 1, 0, -1) if size_problem(make(n)) is None), None)
    above = next((n for n in range(nodes + 1, nodes + SEARCH_NODES + 1) if size_problem(make(n)) is None), None)
    return below, above


def check_size(make, nodes: int, gpus_per_node: int) -> Spec:
    """``make(nodes)``, or a SpecError with the reason and the nearest node counts that work."""
    spec = make(nodes)
    problem = size_problem(spec)
    if problem is None:
        return spec
    below, above = nearest_sizes(make, nodes)
    near = " and ".join(f"--nodes {n} ({n * gpus_per_node} GPUs)" for n in (below, above) if n is not None)
    raise SpecError(Problem("--nodes", f"{nodes} node(s) x {gpus_per_node} GPUs cannot run this run's layout: "
                            f"{problem}", f"nearest sizes that work: {near}" if near else
                            f"no node count within {SEARCH_NODES} of {nodes} works with {gpus_per_node} GPUs per node; "
                            "try another --gpus-per-node"))


def check_kept(source: Spec, spec: Spec) -> None:
    """The new spec trains the same model, precision, engine, seed, data and steps as the source, or a SpecError."""
    problems = [Problem(path, f"differs from the source run's ({_get(source, path)!r} there)",
                        "a resized run continues the source's training: keep it as in the source spec")
                for path in KEPT if _get(source, path) != _get(spec, path)]
    if program_kind(source) != program_kind(spec):
        problems.append(Problem("program", f"{program_kind(spec)!r} differs from the source's "
                                f"{program_kind(source)!r}"))
    if problems:
        raise SpecError(problems)


def layout_record(spec: Spec) -> dict:
    """A resolved spec's layout (every parallelism field fixed) and cluster, as resume.json records it."""
    from .layout import layout_from_spec  # noqa: PLC0415

    layout = layout_from_spec(spec)
    record = {k: getattr(layout, k) for k in LAYOUT_FIELDS}
    record.update(world_size=spec.world_size, num_nodes=spec.cluster.num_nodes,
                  gpus_per_node=spec.cluster.gpus_per_node, global_batch_size=spec.training.global_batch_size)
    return record


# --- how checkpoints follow the layout, per program kind ---------------------------------------------------

def follow_reference(old: dict, new: dict, spec: Spec) -> Conversion:
    """orch's reference trainer (DeepSpeed engine): a copy when the checkpoint's layout is unchanged; else
    DeepSpeed's universal checkpoint (ds_to_universal), loaded by DeepSpeed (checkpoint.load_universal) for a dp
    change at ZeRO-1/2 (and between them) or at ZeRO-3 with pp = 1, and parameter by parameter into a fresh
    engine of the new layout (UNIVERSAL_PARAMS, train/universal.py) for a pp change, a change into or out of
    ZeRO-3, or any change under pp > 1. Dense model, no offload, tp/cp/ep unchanged; every other change is
    refused, naming it (SpecError, exit 2)."""
    ckpt_keys = ("tp", "pp", "dp", "cp", "ep", "etp", "zero_stage", "offload")
    changes = tuple(f"{k} {old.get(k)} -> {new.get(k)}" for k in ckpt_keys if old.get(k) != new.get(k))
    if (spec.training.engine or "deepspeed") != "deepspeed":
        _unsupported(changes or ("the cluster size",), f"training.engine {spec.training.engine}: orch resumes "
                     "only the DeepSpeed engine's checkpoints in a resized run")
    if not changes:
        return Conversion("copy", (), "the checkpoint's layout is unchanged: its step dir is copied and loaded as is")
    why = {"tp": "the reference trainer's DeepSpeed engine trains with tp 1",
           "cp": "Ulysses context groups are not converted", "ep": "expert-parallel checkpoints are not converted",
           "etp": "expert-parallel checkpoints are not converted",
           "offload": "loading a universal checkpoint into an offloaded optimizer is not verified"}
    for key in ("tp", "cp", "ep", "etp", "offload"):
        if old.get(key) != new.get(key):
            _unsupported(changes, f"{key} {old.get(key)} -> {new.get(key)}: {why[key]}")
    if spec.model.moe is not None:
        _unsupported(changes, "a MoE model: its expert checkpoint files are not converted")
    if old.get("offload") not in (None, "none"):
        _unsupported(changes, f"offload {old.get('offload')}: {why['offload']}")
    for side, stage in (("source", old.get("zero_stage")), ("new", new.get("zero_stage"))):
        if not stage:
            _unsupported(changes, f"ZeRO stage 0 in the {side} layout: ds_to_universal reads ZeRO optimizer shards "
                         "and orch sets the state only through a ZeRO optimizer's parameter fragments")
    pipelined = (old.get("pp") or 1) > 1 or (new.get("pp") or 1) > 1
    if not pipelined and (old.get("zero_stage") == 3) == (new.get("zero_stage") == 3):
        return Conversion("universal", changes, "deepspeed.checkpoint.ds_to_universal into the new run dir, loaded "
                          "with ds_config checkpoint: {load_universal: true} at the first start")
    reason = ("the PipelineModule names parameters by layer index (DeepSpeed's universal loader does not map them)"
              if pipelined else "DeepSpeed 0.19.8's universal loader looks for its own ZeRO stage's model-state "
              "files, the checkpoint holds the source stage's")
    if program_kind(spec) != "orch":       # a follower that defers to this one (a user's DeepSpeed script)
        _unsupported(changes, f"{reason}; orch loads such a change parameter by parameter only in its reference "
                     f"trainer, a {program_kind(spec)!r} program loads with engine.load_checkpoint")
    return Conversion(UNIVERSAL_PARAMS, changes, "deepspeed.checkpoint.ds_to_universal into the new run dir; at the "
                      "first start the trainer builds the new layout's engine and sets every parameter's fp32 "
                      "weights and Adam moments from it through DeepSpeed's tensor-fragment API "
                      "(safe_set_full_fp32_param / safe_set_full_optimizer_state), then the step count and the lr "
                      f"scheduler, and compares every value with the files before training ({reason})")


def _unsupported(changes, reason: str):
    raise SpecError(Problem("layout", f"cannot convert the checkpoint for {', '.join(changes)}: {reason}",
                            "resize to a layout that changes only dp, pp and the ZeRO stage (1-3), or train the "
                            "new layout from step 0"))


def follow_megatron(old: dict, new: dict, spec: Spec) -> Conversion:
    """kind megatron-lm: Megatron-LM reshards its torch_dist checkpoint at load (orchestrator/resize_megatron.py);
    a SpecError naming the change when the source's checkpoint format cannot follow it."""
    from .resize_megatron import can_follow  # noqa: PLC0415

    return Conversion(*can_follow(old, new))


def follow_script(old: dict, new: dict, spec: Spec) -> Conversion:
    """kind script, the user's DeepSpeed script: it saves with engine.save_checkpoint into the dir orch hands it
    (program.save_arg) and loads with engine.load_checkpoint from the one it is handed (program.load_arg). The
    conversion is the reference trainer's (dp at ZeRO-1/2 or at ZeRO-3), with pp 1 and tp 1; the Hugging Face
    Trainer's own checkpoints are refused."""
    from .programs.checkpoints import UNIVERSAL_DS_CONFIG  # noqa: PLC0415

    program = spec.program
    changes = tuple(f"{k} {old.get(k)} -> {new.get(k)}" for k in SCRIPT_CKPT_KEYS if old.get(k) != new.get(k))
    if program.log_format == "hf":
        raise SpecError(Problem("program.log_format", "hf: a Hugging Face Trainer script saves checkpoint-<N> dirs "
                                "of its own and resumes with resume_from_checkpoint; orch does not resize them yet",
                                "train the new layout from step 0 (the Trainer's own resume_from_checkpoint may "
                                "load a same-layout checkpoint)"))
    missing = [name for name in ("save_arg", "load_arg") if getattr(program, name) is None]
    if missing:
        raise SpecError([Problem(f"program.{name}", "not set: orch must tell the script where it saves and where it "
                                 "loads", "set program.save_arg: --save_dir and program.load_arg: --load_dir (the "
                                 "flags your script passes to engine.save_checkpoint / engine.load_checkpoint)")
                         for name in missing])
    if changes:
        for key, why in (("tp", "a tensor-parallel script checkpoint (mp_rank_NN files) is not converted"),
                         ("pp", "a PipelineModule checkpoint (layer_NN-model_states.pt) is not converted")):
            if (old.get(key) or 1) > 1 or (new.get(key) or 1) > 1:
                _unsupported(changes, f"{key} {old.get(key)} -> {new.get(key)}: {why}")
    conversion = follow_reference(old, new, spec)
    load = f"{program.load_arg} RUN_DIR/resume/{conversion.method}"
    how = (f"{conversion.how}; the script's first start gets {load}" if conversion.method == "copy" else
           "deepspeed.checkpoint.ds_to_universal of the script's checkpoint into the new run dir; the script's first "
           f"start gets {load} and {program.ds_config_arg} RUN_DIR/resume/{UNIVERSAL_DS_CONFIG} (ds_config.json "
           "plus checkpoint: {load_universal: true})")
    return Conversion(conversion.method, conversion.changes, how)


FOLLOWERS = {"orch": follow_reference, "megatron-lm": follow_megatron, "script": follow_script}   # program kind -> (old, new, spec) -> Conversion


def follower(spec: Spec):
    kind = program_kind(spec)
    if kind not in FOLLOWERS:
        raise SpecError(Problem("program.kind", f"resizing a {kind!r} program is not supported yet",
                                f"supported: {', '.join(sorted(FOLLOWERS))}"))
    return FOLLOWERS[kind]


# --- the whole resize ----------------------------------------------------------------------------------------

def source_checkpoint(run, step: int | None = None) -> tuple[Path, int]:
    """The source run's checkpoint dir and its newest intact step, or ``step`` when it verifies (read only);
    else a SpecError."""
    from .train.checkpoint import checkpoint_dir, resume_choice, step_problem  # noqa: PLC0415  (no torch)

    if program_kind(run.spec) == "megatron-lm":     # Megatron-LM's own iter_* dirs
        from .resize_megatron import source_checkpoint as megatron_checkpoint  # noqa: PLC0415

        return megatron_checkpoint(run, step)
    if program_kind(run.spec) == "script":      # the script's own checkpoints: no orch manifest
        from .programs.checkpoints import source_checkpoint as script_checkpoint  # noqa: PLC0415

        zero = layout_record(run.spec)["zero_stage"]
        return script_checkpoint(run, step, shards=run.spec.world_size if zero else None)
    ckpt = checkpoint_dir(run.path, run.spec)
    if step is not None:
        problem = step_problem(ckpt, step)
        if problem:
            raise SpecError(Problem("--step", f"the checkpoint of step {step} under {ckpt} is unusable: {problem}",
                                    "leave --step out to resume from the newest intact checkpoint"))
        return ckpt, step
    step = resume_choice(ckpt).step
    if step is None:
        raise SpecError(Problem(str(run.path), f"has no intact checkpoint under {ckpt} to resume from",
                                "train the source run until it saves a checkpoint"))
    return ckpt, step


def plan_resize(source_dir: str | Path, new_spec: Spec | None = None, *, nodes: int | None = None,
                gpus_per_node: int | None = None, scale_batch: bool = False, layout: dict | None = None,
                step: int | None = None) -> Resize:
    """The new spec and resume.json for continuing ``source_dir``: from ``new_spec`` (generate --resume-from)
    or from the source's own spec on ``nodes`` x ``gpus_per_node`` with ``layout`` changes (orch resize), from
    its checkpoint of ``step`` (default: the newest intact one). SpecError (exit 2) when the
    sizes cannot divide or the checkpoint cannot follow, before anything is written."""
    from .rundir import read_run_dir  # noqa: PLC0415

    run = read_run_dir(source_dir)
    source = run.spec
    follow = follower(source)
    if new_spec is None:
        gpus = gpus_per_node or source.cluster.gpus_per_node
        spec = check_size(lambda n: resize_spec(source, nodes=n, gpus_per_node=gpus, scale_batch=scale_batch,
                                                  layout=layout),
                          nodes, gpus)
    else:
        spec = new_spec
    check_kept(source, spec)
    notes = []
    if new_spec is None and list(spec.launch.pdsh.hosts) != list(source.launch.pdsh.hosts):
        notes.append(f"launch.pdsh.hosts: the first {len(spec.launch.pdsh.hosts)} of the source's hosts "
                     f"({', '.join(spec.launch.pdsh.hosts)})")
    src_ckpt, step = source_checkpoint(run, step)
    ckpt = Path(spec.training.checkpoint.dir)
    if ckpt.is_absolute() and ckpt.resolve() == src_ckpt.resolve():
        spec = dataclasses.replace(spec, training=dataclasses.replace(
            spec.training, checkpoint=dataclasses.replace(spec.training.checkpoint, dir="checkpoints")))
        notes.append(f"training.checkpoint.dir {ckpt} is the source run's: the new run saves under its own "
                     "checkpoints/ instead (the source's files are never written)")
    if step >= spec.training.train_iters:
        raise SpecError(Problem(str(run.path), f"its checkpoint is step {step} of train_iters "
                                f"{spec.training.train_iters}: nothing left to train"))
    batch_old, batch_new = source.training.global_batch_size, spec.training.global_batch_size
    old_lr, new_lr = source.training, spec.training
    why = (f"x{batch_new / batch_old:g}, the linear scaling rule" if new_spec is None else "as the new spec sets them")
    lr = ("unchanged" if (batch_old, old_lr.optimizer, old_lr.lr_schedule) == (batch_new, new_lr.optimizer,
                                                                                new_lr.lr_schedule) else
          f"global batch {batch_old} -> {batch_new}: peak lr {old_lr.optimizer.lr:g} -> {new_lr.optimizer.lr:g} and "
          f"min_lr {old_lr.lr_schedule.min_lr:g} -> {new_lr.lr_schedule.min_lr:g} ({why}); warm-up "
          f"{old_lr.lr_schedule.warmup_iters} -> {new_lr.lr_schedule.warmup_iters} steps, decay to step "
          f"{new_lr.train_iters}")
    resume = {"source_run_dir": str(run.path.resolve()), "source_step": step,
              "source_checkpoint": str((src_ckpt / f"global_step{step}").resolve()),
              "program": program_kind(source), "old_layout": layout_record(source),
              "lr_schedule": lr, "source_wandb": source_wandb(run)}
    if resume["program"] == "megatron-lm":
        from .resize_megatron import source_format, step_dir_name  # noqa: PLC0415

        resume["source_checkpoint"] = str((src_ckpt / step_dir_name(step)).resolve())
        resume["old_layout"]["checkpoint"] = source_format(run, src_ckpt, step)
    return Resize(spec=spec, resume=resume, notes=tuple(notes), follow=follow)


def finish_resume(resize: Resize, plan) -> dict:
    """resume.json for the planned new run: the new layout and the conversion (SpecError when unsupported)."""
    from dataclasses import asdict  # noqa: PLC0415

    resume = dict(resize.resume)
    new = layout_record(plan.spec)
    if resume["program"] == "megatron-lm":
        from .resize_megatron import plan_format  # noqa: PLC0415

        new["checkpoint"] = plan_format(plan)
    conversion = resize.follow(resume["old_layout"], new, plan.spec)
    output = (None if conversion.method == "reshard" else      # Megatron-LM loads the source's checkpoint itself
              f"resume/{conversion.method}/global_step{resume['source_step']}")
    resume.update(new_layout=new, conversion={**asdict(conversion), "changes": list(conversion.changes),
                                              "output": output})
    return resume


def write_resized(resize: Resize, out_dir: str | Path, *, top_k: int = 5, cost=None, measured=None,
                  force: bool = False, discard_outputs: bool = False):
    """Plan the new spec and write the run dir with its resume.json (atomic, as generate). Returns (plan, resume)."""
    from .plan import build_plan  # noqa: PLC0415
    from .rundir import dump_json, write_run_dir  # noqa: PLC0415

    plan = build_plan(resize.spec, top_k=top_k, cost=cost, measured=measured)
    resume = finish_resume(resize, plan)
    source = Path(resume["source_run_dir"])
    out = Path(out_dir).resolve()
    if out == source or source in out.parents:
        raise SpecError(Problem("-o", f"{out} is the source run dir or inside it", "write the new run dir elsewhere"))
    extra = {RESUME_FILE: dump_json(resume)}
    if resume["program"] == "megatron-lm":          # --load the source's checkpoint dir at its step
        from .resize_megatron import resumed_files  # noqa: PLC0415

        extra.update(resumed_files(plan, resume))
    write_run_dir(plan, out_dir, force=force, discard_outputs=discard_outputs, extra_files=extra)
    return plan, resume


def source_wandb(run) -> dict:
    """The source run's W&B group and run id (its wandb_run_id file; None before a W&B run was opened): the
    resized run's W&B run joins that group and names its parent (telemetry/wandb_sink.py)."""
    from .outfiles import read_regular_no_follow  # noqa: PLC0415
    from .telemetry.wandb_sink import RUN_ID_FILE  # noqa: PLC0415  (light: no wandb)

    w = run.spec.tracking.wandb
    data = read_regular_no_follow(Path(run.path) / RUN_ID_FILE, 256)
    run_id = data.decode("utf-8", "replace").strip() if data else None
    return {"group": w.group or run.spec.name, "project": w.project, "run_id": run_id or None}


def read_resume(run_dir: str | Path) -> dict | None:
    """RUN_DIR/resume.json (None when the run dir is not a resized one); ValueError when it is unreadable."""
    import json  # noqa: PLC0415

    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(str(e)) from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def describe(run_dir: str | Path) -> str | None:
    """One line for `orch status`: the run dir is a resized continuation of another (None when it is not)."""
    path = Path(run_dir) / RESUME_FILE
    try:
        r = read_resume(run_dir)
        if r is None:
            return None
        conv = r["conversion"]
        return (f"resized continuation of {r['source_run_dir']} from step {r['source_step']}: "
                f"{_tag(r['old_layout'])} -> {_tag(r['new_layout'])}, checkpoint {conv['method']}"
                + (f" ({', '.join(conv['changes'])})" if conv["changes"] else ""))
    except (ValueError, KeyError, TypeError):
        return f"resized continuation (but {path} is unreadable)"


def _tag(layout: dict) -> str:
    from .telemetry.wandb_sink import layout_tag_of  # noqa: PLC0415  (light: no wandb)

    return layout_tag_of(layout)
