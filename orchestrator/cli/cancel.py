"""orch cancel RUN_DIR: stop a launched run dir's job."""
from __future__ import annotations

import click


@click.command(name="cancel")
@click.argument("run_dir", type=click.Path(file_okay=False))
def command(run_dir) -> None:
    """Cancel the job started from RUN_DIR (every rank, on every node).

    Signals only what orch started: the process group whose leader job.json records (same start time and
    boot), the processes holding RUN_DIR's lock, the SLURM job id; nothing when the job has finished.
    Exit 2 when job.json is missing or not what orch writes.
    """
    from ..launch import backend_module
    from ..launch.base import CommandRunner, JobRecord

    record = JobRecord.load(run_dir)
    runner = CommandRunner()
    module = backend_module(record.backend)
    signalled = module.cancel(record, runner)
    state = module.status(record, runner).value
    click.echo(f"{record.backend} job {record.job_id}: {state}" +
               ("" if signalled else " (already finished; nothing signalled)"))
