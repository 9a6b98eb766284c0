"""orch cancel RUN_DIR: stop a launched run dir's job."""
from __future__ import annotations

import click


@click.command(name="cancel")
@click.argument("run_dir", type=click.Path(file_okay=False))
def command(run_dir) -> None:
    """Cancel the job started from RUN_DIR (every rank, on every node)."""
    from ..launch import backend_module
    from ..launch.base import CommandRunner, JobRecord

    record = JobRecord.load(run_dir)
    runner = CommandRunner()
    module = backend_module(record.backend)
    module.cancel(record, runner)
    click.echo(f"{record.backend} job {record.job_id}: {module.status(record, runner).value}")
