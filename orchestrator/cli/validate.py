"""orch validate PATH...: every problem in specs, ds_config.json, Megatron args files and run dirs."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .table import plural


@click.command(name="validate")
@click.argument("paths", metavar="PATH...", nargs=-1, required=True, type=click.Path())
@click.option("--world-size", type=click.IntRange(min=1),
              help="GPUs the ds_config / Megatron args are meant for (checks batch arithmetic).")
@click.option("--model-parallel-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="tp * pp of a user-written ds_config (dp = world size / this).")
@click.option("--static", "static_only", is_flag=True,
              help="Only orch's own checks; skip asking DeepSpeed / Megatron-Core.")
@click.option("--json", "as_json", is_flag=True, help="Print problems as a JSON list.")
def command(paths, world_size, model_parallel_size, static_only, as_json) -> None:
    """Check each PATH (a spec, a ds_config.json, a megatron_args.txt / megatron_config.json, or a run
    dir) and report every problem at once as `path: message (hint)`. Exit 0 when clean, 2 otherwise.
    """
    from ..validate.prefetch import shared_answers

    with shared_answers():
        problems, notes = check_paths(paths, world_size, model_parallel_size, static_only)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    _report(problems, paths, as_json)


def check_paths(paths, world_size, model_parallel_size, static_only) -> tuple[list, list]:
    """Every path's problems, saying on stderr what is being checked; the slow library checks of all paths
    are asked up front, one process per library."""
    from ..validate import detect_kind, validate_path
    from ..validate.prefetch import prefetch_deep_checks

    problems, notes = [], []
    deep = [p for p in paths if not static_only and _kind(p) not in ("spec", None)]
    if deep:
        click.echo(f"asking DeepSpeed's and Megatron-Core's own config classes about {plural(len(deep), 'path')} "
                   "(one process each, ~5-15 s) ...", err=True)
        prefetch_deep_checks(deep, world_size=world_size, model_parallel_size=model_parallel_size)
    for i, path in enumerate(paths, 1):
        if len(paths) > 1:
            click.echo(f"[{i}/{len(paths)}] checking {path}", err=True)
        problems += validate_path(path, world_size=world_size, model_parallel_size=model_parallel_size,
                                  deep=not static_only, notes=notes)
    return problems, notes


def _kind(path: str) -> str | None:
    """detect_kind, None for a path that does not exist or cannot be read (validate_path reports it)."""
    from ..validate import detect_kind

    try:
        return detect_kind(Path(path)) if Path(path).exists() else None
    except OSError:
        return None


def _report(problems, paths, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in problems], indent=2))
    else:
        for problem in problems:
            click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        raise click.exceptions.Exit(2)
    click.echo(f"ok: {len(paths)} path{'s' if len(paths) != 1 else ''} checked, no problems", err=True)
