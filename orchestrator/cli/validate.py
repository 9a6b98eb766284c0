"""orch validate PATH...: every problem in specs, ds_config.json, Megatron args files and run dirs."""
from __future__ import annotations

import json

import click


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
    from ..validate import validate_path

    problems, notes = [], []
    for path in paths:
        problems += validate_path(path, world_size=world_size, model_parallel_size=model_parallel_size,
                                  deep=not static_only, notes=notes)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in problems], indent=2))
    else:
        for problem in problems:
            click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        raise click.exceptions.Exit(2)
    click.echo(f"ok: {len(paths)} path{'s' if len(paths) != 1 else ''} checked, no problems", err=True)
