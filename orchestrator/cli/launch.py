"""orch launch RUN_DIR: run it locally (torchrun), on SLURM or over pdsh."""
from __future__ import annotations

import click

from .options import FiniteFloatRange


@click.command(name="launch")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--backend", type=click.Choice(["local", "slurm", "pdsh"]),
              help="Where to run [default: the spec's launch.backend].")
@click.option("--dry-run", is_flag=True, help="Print the exact command and environment; run nothing.")
@click.option("--wait", is_flag=True,
              help="Stream one progress line per step; exit with the job's code (a failed rank's own code).")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=0, min_open=True),
              help="With --wait: give up (and cancel the job) after this many seconds (> 0).")
@click.option("--allow-modified", is_flag=True,
              help="Run even though generated files differ from manifest.json (logged in logs/overrides.log).")
@click.option("--preflight", is_flag=True,
              help="First run `orch doctor --quick` on the job's nodes; refuse to start when a node fails it.")
@click.option("--preflight-timeout", "preflight_timeout_s", type=FiniteFloatRange(min=5),
              help="With --preflight: give up after this many seconds, naming the nodes that did not report "
                   "[default: 90].")
def command(run_dir, backend, dry_run, wait, timeout_s, allow_modified, preflight, preflight_timeout_s) -> None:
    """Start the training job of RUN_DIR (written by `orch generate`).

    First checks that every generated file is as `orch generate` wrote it (manifest.json) and that no
    other job runs in RUN_DIR. Without --wait the job runs in the background: follow it with
    `orch status RUN_DIR`, stop it with `orch cancel RUN_DIR`. Per-rank logs go to RUN_DIR/logs/.

    Exit 0 when started (or, with --wait, completed); 2 when the run dir or the backend cannot work (a
    multi-node spec with the local backend is refused at once, so is an edited generated file); 1 when
    another job holds the run dir; with --wait the failed rank's exit code (1 when none is known), 130
    when interrupted. A run dir whose last step is already checkpointed is not launched again (exit 0,
    with how to train again).
    """
    from ..launch.run import launch_run_dir

    code = launch_run_dir(run_dir, backend=backend, dry_run=dry_run, wait=wait, timeout_s=timeout_s,
                          echo=lambda line: click.echo(line), note=lambda line: click.echo(line, err=True),
                          allow_modified=allow_modified, preflight=preflight,
                          preflight_timeout_s=preflight_timeout_s)
    raise click.exceptions.Exit(code)
