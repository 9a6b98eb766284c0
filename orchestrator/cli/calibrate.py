"""orch calibrate RUN... -o calib.json: fit the cost model's efficiency terms to measured runs."""
from __future__ import annotations

import json

import click


@click.command(name="calibrate")
@click.argument("sources", metavar="RUN...", nargs=-1, required=True)
@click.option("-o", "--output", "out_path", required=True, type=click.Path(dir_okay=False),
              help="calib.json to write (for `orch plan/generate --calibration`).")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Leading steps to leave out of each run [default: 3, at most half of a run].")
@click.option("--json", "as_json", is_flag=True, help="Print the written calibration as JSON instead of tables.")
def command(sources, out_path: str, warmup: int | None, as_json: bool) -> None:
    """Fit the cost model's efficiency terms (achieved fraction of peak FLOP/s, per-kernel overhead,
    effective bus bandwidth, compute/communication overlap) to measured runs of ONE cluster and precision,
    and write them to calib.json. Each RUN is a trained run dir, a W&B offline run directory or a W&B run
    path (as for `orch compare`). Use it with `orch plan SPEC --calibration calib.json`.

    Exit 0, or 2 when a RUN cannot be used or the runs come from different clusters or precisions.
    """
    from ..calibrate import calibrate, write_calibration

    result = calibrate(list(sources), warmup=warmup)
    out = write_calibration(result, out_path)
    click.echo(f"wrote {out}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2))
        return
    from rich.console import Console

    console = Console(width=max(160, Console().width), soft_wrap=False)
    console.print(terms_table(result))
    console.print(runs_table(result))
    console.print(f"typical error (rms of log predicted/measured) of the runs' compute, reduction and step times: "
                  f"{result.error_before_pct:.1f}% with the defaults, {result.error_after_pct:.1f}% calibrated",
                  markup=False, highlight=False)


def terms_table(result):
    from rich.table import Table

    from ..estimate.cost import CostModel

    default = CostModel()
    table = Table(title=f"fitted cost-model terms ({result.cluster['gpu']}, {result.cluster['precision']})",
                  title_justify="left")
    for name in ("term", "default", "fitted"):
        table.add_column(name, justify="left" if name == "term" else "right", no_wrap=True)
    for name, value in result.fitted.items():
        before = getattr(default, name)
        table.add_row(name, "catalog" if before is None else f"{before:.4g}", f"{value:.4g}")
    return table


def runs_table(result):
    from rich.table import Table

    table = Table(title="measured vs predicted, default -> calibrated (seconds per step)", title_justify="left")
    table.add_column("run", no_wrap=True)
    for quantity in ("compute_s", "dp_reduction_s", "step_time_s"):
        table.add_column(quantity, justify="right", no_wrap=True)
    for run in result.runs:
        cells = []
        for key in ("compute_s", "dp_reduction_s", "step_time_s"):
            meas = run["measured"][key]
            cells.append("-" if meas is None else
                         f"{meas:.4g}: {run['predicted_before'][key]:.4g} -> {run['predicted_after'][key]:.4g}")
        table.add_row(run["label"], *cells)
    return table
