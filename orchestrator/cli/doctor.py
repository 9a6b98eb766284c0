"""orch doctor RUN_DIR: measure the cluster through the run's launch path; name slow or broken nodes."""
from __future__ import annotations

import json

import click

from .options import FiniteFloatRange


@click.command(name="doctor")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--backend", type=click.Choice(["local", "slurm", "pdsh"]),
              help="Where to measure [default: the spec's launch.backend].")
@click.option("--json", "as_json", is_flag=True, help="Print doctor.json's content instead of the table.")
@click.option("--quick", is_flag=True, help="Only the preflight and a short GEMM/all-reduce (what "
                                             "`orch launch --preflight` runs).")
@click.option("--threshold", type=FiniteFloatRange(0.01, 0.99), default=0.2, show_default=True,
              help="An outlier is this fraction below the median (or the catalog figure).")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=5),
              help="Give up after this many seconds, naming the nodes that did not report "
                   "[default: 180, --quick 90].")
@click.option("--allow-modified", is_flag=True,
              help="Run even though generated files differ from manifest.json (logged in logs/overrides.log).")
def command(run_dir, backend, as_json, quick, threshold, timeout_s, allow_modified) -> None:
    """Measure every node and rank of RUN_DIR's cluster through the run's own launch path (torchrun here,
    srun on the job's nodes, pdsh on its hosts): a preflight (reachable, run dir and Python there, GPU type
    and count, free memory against the plan's per-rank peak, the rendezvous), a GEMM rate per rank,
    all-reduce / all-gather / reduce-scatter / all-to-all bandwidth and latency (all ranks, inside each
    node, across nodes) with the run's backend (NCCL or gloo), and p2p between every pair of nodes.

    Writes RUN_DIR/doctor.json (feed it to `orch plan/generate --measured`). Exit 0 when healthy, 1 naming
    every offender by host and rank, or when a job or another orch command holds RUN_DIR; 2 when a generated
    file differs from manifest.json (as `orch launch`, unless --allow-modified).
    """
    from ..doctor.report import render_text
    from ..doctor.run import DoctorOptions, run_doctor

    options = DoctorOptions(backend=backend, mode="quick" if quick else "full", threshold=threshold,
                            timeout_s=timeout_s, allow_modified=allow_modified)
    report = run_doctor(run_dir, options, note=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(report, sort_keys=True, indent=2, allow_nan=False))
    else:
        click.echo(render_text(report))
    if not report["healthy"]:
        raise click.exceptions.Exit(1)
