"""`orch validate RUN_DIR` for the program: program.json agrees with the spec, the files it names are there,
an edited script is reported (a note: users edit their code), and a megatron-lm argv passes Megatron-LM's
own parser (orch's flag table always; parse_args + validate_args when ORCH_MEGATRON_LM is set)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import Problem
from . import PROGRAM_FILE, substitute_run_dir


def program_run_dir_problems(run, *, deep: bool, notes: list[str] | None) -> list[Problem]:
    """Every problem with a run dir's program; the drift notes go to ``notes``."""
    from ..rundir import program_drift  # noqa: PLC0415
    from .rules import program_file_problems  # noqa: PLC0415

    program = run.spec.program
    if program is None:
        return []
    where = f"{run.path}/{PROGRAM_FILE}"
    try:
        recorded = json.loads((run.path / PROGRAM_FILE).read_text())
    except (OSError, ValueError) as e:
        return [Problem(where, f"cannot be read ({e.__class__.__name__})", "re-run `orch generate --force`")]
    problems = [Problem(f"{run.path}/spec.resolved.yaml:{p.path}", p.message, p.hint)
                for p in program_file_problems(program)]
    if recorded.get("kind") != program.kind or not isinstance(recorded.get("argv"), list):
        problems.append(Problem(where, f"kind {recorded.get('kind')!r} but spec.resolved.yaml says {program.kind!r}",
                                "re-run `orch generate --force`"))
        return problems
    if notes is not None:
        notes.extend(program_drift(run))
    if program.kind == "megatron-lm" and not problems:
        problems += megatron_argv_problems(run, substitute_run_dir(recorded["argv"], run.path)[1:], deep=deep)
    return problems


def megatron_argv_problems(run, argv: list[str], *, deep: bool) -> list[Problem]:
    """The argv's flags in Megatron-LM's flag table, then (deep, ORCH_MEGATRON_LM set) through its parse_args +
    validate_args with the environment launch_local.sh exports: an unknown flag is named."""
    from ..validate.megatron import check_megatron_args  # noqa: PLC0415
    from ..validate.megatron_lm import check_with_megatron_lm, launch_script_env, megatron_lm_root  # noqa: PLC0415

    path = f"{run.path}/{PROGRAM_FILE}:argv"
    problems = check_megatron_args(argv, run.spec.world_size, path, deep=False)
    root = megatron_lm_root()
    if problems or not deep or root is None:
        return problems
    script = Path(run.path) / "launch_local.sh"
    env = launch_script_env(script.read_text()) if script.is_file() else {}
    return check_with_megatron_lm(argv, world_size=run.spec.world_size, env=env, megatron_lm_root=root, path=path)
