"""Cross-checks of a run dir: files intact (manifest hashes) and agreeing with each other and the plan."""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import Problem, SpecError
from ..rundir import RunDir, manifest_problems, read_run_dir


def validate_run_dir(path: Path, *, deep: bool = True, notes: list[str] | None = None) -> list[Problem]:
    try:
        run = read_run_dir(path)
    except SpecError as e:
        return [Problem(p.path if p.path.startswith(str(path)) else f"{path}/{p.path}", p.message, p.hint)
                for p in e.problems]
    problems = check_manifest(run)
    problems += check_plan_agrees(run)
    problems += _file_checks(run, deep=deep, notes=notes)
    from ..programs.check import program_run_dir_problems  # noqa: PLC0415

    problems += program_run_dir_problems(run, deep=deep, notes=notes)
    return problems + (check_checkpoints(run) if run.spec.program is None else [])   # a program's own checkpoints are its own


def check_checkpoints(run: RunDir) -> list[Problem]:
    """Every saved checkpoint holds exactly the files the run wrote, with the sizes and sha256 recorded
    when they were written (what the trainer checks before it loads one); the checkpoint dir stays
    inside the run dir."""
    from ..train.checkpoint import checkpoint_dir_problem, saved_steps, step_problem, tag_for  # noqa: PLC0415

    problem = checkpoint_dir_problem(run.path, run.spec.training.checkpoint.dir)
    if problem:
        return [problem]
    ckpt = run.path / run.spec.training.checkpoint.dir
    fallback = "a resumed job sets it aside and falls back to an older checkpoint; delete it if you do not " \
               "need it for inspection"
    problems = [(step, step_problem(ckpt, step)) for step in saved_steps(ckpt)]
    return [Problem(str(ckpt / tag_for(step)), f"checkpoint does not verify: {why}", fallback)
            for step, why in problems if why]


def check_manifest(run: RunDir) -> list[Problem]:
    """Every generated file listed in manifest.json with the recorded sha256; the spec hash matches."""
    return manifest_problems(run)


def check_plan_agrees(run: RunDir) -> list[Problem]:
    """plan.json's chosen layout, ds_config.json and the launch scripts describe the same job."""
    from ..layout import layout_from_spec  # noqa: PLC0415

    lay, chosen, ds = layout_from_spec(run.spec), run.chosen, run.ds_config
    where = f"{run.path}/plan.json:chosen"
    problems = [Problem(f"{where}.{key}", f"{chosen.get(key)!r} but spec.resolved.yaml says {value!r}",
                        "re-run `orch generate --force`")
                for key, value in (("tp", lay.tp), ("pp", lay.pp), ("dp", lay.dp), ("zero_stage", lay.zero_stage),
                                   ("micro_batch_size", lay.micro_batch_size), ("cp", lay.cp), ("ep", lay.ep),
                                   ("etp", lay.etp)) if chosen.get(key, 1 if key in ("cp", "ep", "etp") else None) != value]
    expect = {"train_batch_size": run.spec.training.global_batch_size,
              "train_micro_batch_size_per_gpu": lay.micro_batch_size,
              "gradient_accumulation_steps": chosen.get("grad_accum_steps")}
    problems += [Problem(f"{run.path}/ds_config.json:{key}", f"{ds.get(key)!r} but the plan says {value!r}",
                         "re-run `orch generate --force`")
                 for key, value in expect.items() if ds.get(key) != value]
    stage = ds.get("zero_optimization", {}).get("stage") if isinstance(ds.get("zero_optimization"), dict) else None
    if stage != lay.zero_stage:
        problems.append(Problem(f"{run.path}/ds_config.json:zero_optimization.stage",
                                f"{stage!r} but the plan says {lay.zero_stage!r}", "re-run `orch generate --force`"))
    problems += _script_checks(run)
    return problems


def _script_checks(run: RunDir) -> list[Problem]:
    from ..layout import layout_from_spec  # noqa: PLC0415
    from ..plan import Plan  # noqa: PLC0415
    from ..render.megatron import megatron_env  # noqa: PLC0415

    problems = []
    expected_env = megatron_env(Plan(spec=run.spec, layout=layout_from_spec(run.spec), chosen=run.chosen))
    procs, nodes = run.spec.cluster.gpus_per_node, run.spec.cluster.num_nodes
    for name in ("launch_local.sh", "launch.sbatch", "launch_pdsh.sh"):
        file = run.path / name
        if not file.is_file():
            problems.append(Problem(f"{run.path}/{name}", "missing", "re-run `orch generate --force`"))
            continue
        text = file.read_text()
        found = set(re.findall(r"--nproc_per_node=(\d+)", text))
        if found != {str(procs)}:
            problems.append(Problem(f"{run.path}/{name}", f"--nproc_per_node {sorted(found)} but the plan "
                                    f"has {procs} GPUs per node", "re-run `orch generate --force`"))
        for key, value in expected_env.items():
            if f"{key}={value}" not in text:
                problems.append(Problem(f"{run.path}/{name}", f"{key}={value} is not exported (Megatron-LM "
                                        "asserts it for this layout)", "re-run `orch generate --force`"))
    sbatch = run.path / "launch.sbatch"
    if sbatch.is_file() and f"#SBATCH --nodes={nodes}\n" not in sbatch.read_text():
        problems.append(Problem(f"{sbatch}", f"#SBATCH --nodes does not say {nodes}", "re-run `orch generate --force`"))
    return problems


def _file_checks(run: RunDir, *, deep: bool, notes: list[str] | None) -> list[Problem]:
    """Each generated file through its own validator, at the plan's world size."""
    from .deepspeed import validate_ds_config_file  # noqa: PLC0415
    from .megatron import validate_megatron_run_dir  # noqa: PLC0415

    world, lay = run.spec.world_size, run.spec.parallelism
    problems = validate_ds_config_file(run.path / "ds_config.json", world_size=world,
                                       model_parallel_size=lay.tensor * lay.pipeline, deep=deep, notes=notes)
    return problems + validate_megatron_run_dir(run.path, world_size=world, deep=deep)
