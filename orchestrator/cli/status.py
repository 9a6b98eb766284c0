"""orch status RUN_DIR: the scheduler state of a launched run dir."""
from __future__ import annotations

import json

import click


@click.command(name="status")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print {backend, job_id, state, straggler, resized} as JSON.")
def command(run_dir, as_json) -> None:
    """Print the job state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...) and the persistent
    straggler the job named, if any.

    Exit 0 when the state is known and not a failure; 1 when the job FAILED (also NODE_FAIL, OUT_OF_MEMORY,
    TIMEOUT, and a job killed from outside orch); 2 when nothing was launched from RUN_DIR (no job.json: not a
    run dir, or never launched; a resized run dir still prints its resize line), or when job.json,
    straggler.json or .orch.lock is not what orch writes.
    """
    from ..launch import backend_module
    from ..launch.base import CommandRunner, JobRecord, JobState, NotLaunched
    from ..resize import describe
    from ..telemetry.straggler import read_straggler

    resized = describe(run_dir)
    try:
        record = JobRecord.load(run_dir)
    except NotLaunched:
        if resized and not as_json:     # what the run dir will do when launched; still exit 2, as for any run dir
            click.echo(resized)
        raise
    state = backend_module(record.backend).status(record, CommandRunner())
    straggler = read_straggler(run_dir)
    if as_json:
        click.echo(json.dumps({"backend": record.backend, "job_id": record.job_id, "state": state.value,
                               "straggler": straggler, "resized": resized}))
    else:
        click.echo(f"{record.backend} job {record.job_id}: {state.value}")
        if resized:
            click.echo(resized)
        if straggler:
            click.echo(f"straggler: rank {straggler['rank']} on {straggler['host']}: {straggler['spread']:.2f}x the "
                       f"median rank's compute time, steps {straggler['since_step']}-{straggler['step']}")
    if state in (JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.TIMEOUT):
        raise click.exceptions.Exit(1)
