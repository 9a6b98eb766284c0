"""orch calibrate RUN... -o calib.json: fit the cost model's efficiency terms to measured runs."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .table import Column, table_with_note, terminal_width, use_style, wrap_text


@click.command(name="calibrate")
@click.argument("sources", metavar="RUN...", nargs=-1, required=True)
@click.option("-o", "--output", "out_path", required=True, type=click.Path(dir_okay=False),
              help="calib.json to write (for `orch plan/generate --calibration`).")
@click.option("--force", is_flag=True, help="Overwrite an existing --output file (never anything but a regular file).")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Leading steps of each run to leave out [default: 3, fewer in a short run so that it keeps at "
                   "least half of its steps; an explicit N is used as given, up to all but the last step].")
@click.option("--json", "as_json", is_flag=True, help="Print the written calibration as JSON instead of tables.")
@click.option("--wide", is_flag=True, help="Show every column whatever the terminal width.")
def command(sources, out_path: str, force: bool, warmup: int | None, as_json: bool, wide: bool) -> None:
    """Fit the cost model's efficiency terms (achieved fraction of peak FLOP/s, per-kernel overhead,
    effective bus bandwidth, compute/communication overlap) to measured runs of ONE cluster and precision,
    and write them to calib.json. Each RUN is a trained run dir, a W&B offline run directory or a W&B run
    path (as for `orch compare`). Use it with `orch plan SPEC --calibration calib.json`.

    Only the terms the runs determine are fitted (fewer terms than measured values; none that runs to the
    edge of its range); each term left at its default is a warning on stderr.

    Exit 0, or 2 when a RUN cannot be used or the runs come from different clusters or precisions.
    """
    from ..calibrate import calibrate, write_calibration
    from ..errors import SpecError
    from ..outfiles import target_problem

    problem = target_problem(Path(out_path), force=force, option="--output")   # before the fit, not after
    if problem:
        raise SpecError(problem)
    result = calibrate(list(sources), warmup=warmup)
    out = write_calibration(result, out_path, force=force)
    click.echo(f"wrote {out}", err=True)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2, allow_nan=False))
        return
    width, style = terminal_width(), use_style()
    click.echo("\n\n".join([terms_table(result, width, wide, style), runs_table(result, width, wide, style),
                            wrap_text("typical error (rms of log predicted/measured) of the runs' compute, reduction "
                                      f"and step times: {result.error_before_pct:.1f}% with the defaults, "
                                      f"{result.error_after_pct:.1f}% calibrated", width)]))


def terms_table(result, width: int, wide: bool, style: bool) -> str:
    from ..estimate.cost import CostModel

    default = CostModel()
    columns = (Column("term", "left", keep=True), Column("default", keep=True), Column("fitted", keep=True))
    rows = [[name, "catalog" if getattr(default, name) is None else f"{getattr(default, name):.4g}", f"{value:.4g}"]
            for name, value in result.fitted.items()]
    title = f"fitted cost-model terms ({result.cluster['gpu']}, {result.cluster['precision']})"
    return table_with_note(columns, rows, title, width, wide, style)


QUANTITY_COLUMNS = ("step_time_s", "compute_s", "dp_reduction_s")


def runs_table(result, width: int, wide: bool, style: bool) -> str:
    columns = [Column("run", "left", keep=True, wrap=True)] + [
        Column(q, keep=i == 0, priority=i) for i, q in enumerate(QUANTITY_COLUMNS)]
    rows = []
    for run in result.runs:
        cells = [run["label"]]
        for key in QUANTITY_COLUMNS:
            meas = run["measured"][key]
            cells.append("-" if meas is None else
                         f"{meas:.4g}: {run['predicted_before'][key]:.4g} -> {run['predicted_after'][key]:.4g}")
        rows.append(cells)
    title = "measured: predicted by default -> calibrated (seconds per step)"
    return table_with_note(columns, rows, title, width, wide, style)
