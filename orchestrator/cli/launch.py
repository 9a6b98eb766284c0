"""orch launch RUN_DIR: run it locally (torchrun), on SLURM or over pdsh."""
from __future__ import annotations

import click


@click.command(name="launch")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--backend", type=click.Choice(["local", "slurm", "pdsh"]),
              help="Where to run [default: the spec's launch.backend].")
@click.option("--dry-run", is_flag=True, help="Print the exact command and environment; run nothing.")
@click.option("--wait", is_flag=True, help="Stream one progress line per step; exit with the job's code.")
@click.option("--timeout", "timeout_s", type=float, help="With --wait: give up (and cancel) after this many seconds.")
@click.option("--preflight", is_flag=True,
              help="First run `orch doctor --quick` on the job's nodes; refuse to start when a node fails it.")
@click.option("--preflight-timeout", "preflight_timeout_s", type=click.FloatRange(min=5),
              help="With --preflight: give up after this many seconds, naming the nodes that did not report "
                   "[default: 90].")
def command(run_dir, backend, dry_run, wait, timeout_s, preflight, preflight_timeout_s) -> None:
    """Start the training job of RUN_DIR (written by `orch generate`).

    Without --wait the job runs in the background: follow it with `orch status RUN_DIR`, stop it with
    `orch cancel RUN_DIR`. Per-rank logs go to RUN_DIR/logs/.
    """
    from ..launch.run import launch_run_dir

    code = launch_run_dir(run_dir, backend=backend, dry_run=dry_run, wait=wait, timeout_s=timeout_s,
                          echo=lambda line: click.echo(line), note=lambda line: click.echo(line, err=True),
                          preflight=preflight, preflight_timeout_s=preflight_timeout_s)
    raise click.exceptions.Exit(code)
