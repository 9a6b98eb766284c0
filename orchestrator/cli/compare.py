"""orch compare RUN...: runs side by side, predicted against measured, and which one won and why."""
from __future__ import annotations

import json

import click

GiB = 2**30


@click.command(name="compare")
@click.argument("sources", metavar="RUN...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON object instead of tables.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw step time and tokens/s over steps and the time breakdown into this PNG.")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Leading steps to leave out of the statistics [default: 3, at most half of a run].")
def command(sources, as_json: bool, plot_path: str | None, warmup: int | None) -> None:
    """Compare training runs. Each RUN is a run dir (trained: it has metrics.jsonl), a W&B offline run
    directory (RUN_DIR/wandb/offline-run-*, read with wandb's own reader) or a W&B run path
    entity/project/run_id (needs W&B online).

    Prints the layout and spec fields that differ; per run the steps, median and p90 step time,
    tokens/s, TFLOP/s per GPU, MFU, bubble, all-reduce overhead, exposed communication and peak memory
    (warm-up steps left out), and for MoE / context-parallel runs the all-to-all time, expert load
    imbalance, dropped tokens and aux loss; predicted (plan.json) against measured with the error in %; and the winner
    with the main reason it won. Exit 0, or 2 when a RUN cannot be used (every bad one is listed).
    """
    from ..compare import compare

    if plot_path:
        from ..compare_plot import check_plot_path

        check_plot_path(plot_path)
    result = compare(list(sources), warmup=warmup)
    if plot_path:
        from ..compare_plot import render_plot

        render_plot(result, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2))
        return
    from rich.console import Console

    console = Console(width=max(200, Console().width), soft_wrap=False)
    for renderable in render_tables(result):
        console.print(renderable)


def render_tables(result) -> list:
    """The rich renderables for people: the diff, the measured table, predicted vs measured, the winner."""
    from rich.text import Text

    out = [diff_table(result), measured_table(result)]
    out += [prediction_table(run) for run in result.runs]
    out.append(Text(f"warm-up: {result.warmup_rule}"))
    out.append(Text(f"winner: {result.winner['explanation'] or result.winner['label']}", style="bold"))
    return out


def diff_table(result):
    from rich.table import Table

    diff = result.diff
    table = Table(title="what differs", title_justify="left")
    table.add_column("field", no_wrap=True)
    for run in result.runs:
        table.add_column(run.label, no_wrap=True)
    for row in diff["layout"]:
        table.add_row(f"layout.{row['field']}", *[_value(v) for v in row["values"]])
    for row in diff["spec"]:
        table.add_row(row["path"], *[_value(v) for v in row["values"]])
    if not diff["layout"] and not diff["spec"]:
        table.add_row("(nothing: same layout and spec)", *["" for _ in result.runs])
    return table


def _value(value) -> str:
    return json.dumps(value) if isinstance(value, (bool, list, dict)) or value is None else str(value)


MEASURED_COLUMNS = ("run", "steps", "step s", "p90 s", "tokens/s", "TFLOP/s/GPU", "MFU", "bubble", "all-reduce",
                    "exposed s", "mem GiB")


def measured_table(result):
    from rich.table import Table

    table = Table(title="measured (medians over the steps after warm-up; p90 of the step time; peak memory)",
                  title_justify="left")
    for name in MEASURED_COLUMNS:
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for run in result.runs:
        m, n = run.measured, len(run.records)
        table.add_row(run.label, f"{n - run.warmup}/{n}", f"{m['step_time_s']:.4g}", f"{m['step_time_p90_s']:.4g}",
                      f"{m['tokens_per_s']:,.0f}", f"{m['tflops_per_gpu']:.4g}", f"{m['mfu']:.1%}",
                      f"{m['bubble_fraction']:.1%}", f"{m['allreduce_overhead']:.1%}", f"{m['comm_exposed_s']:.4g}",
                      f"{m['mem_peak_bytes'] / GiB:.2f}")
    return table


PREDICTION_ROWS = (("step_time_s", "step time s", "{:.4g}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
                   ("tflops_per_gpu", "TFLOP/s per GPU", "{:.4g}"), ("mfu", "MFU", "{:.1%}"),
                   ("bubble_fraction", "bubble fraction", "{:.1%}"), ("allreduce_time_s", "all-reduce s", "{:.4g}"),
                   ("allreduce_overhead", "all-reduce overhead", "{:.1%}"),
                   ("comm_exposed_s", "exposed comm s", "{:.4g}"), ("mem_peak_bytes", "peak memory GiB", "gib"))
# MoE and context parallelism (issue 10): shown for runs that measured them.
OPTIONAL_PREDICTION_ROWS = (("alltoall_time_s", "all-to-all s", "{:.4g}"),
                            ("expert_load_imbalance", "expert load imbalance", "{:.3f}"),
                            ("tokens_dropped_fraction", "tokens dropped", "{:.1%}"),
                            ("moe_aux_loss", "MoE aux loss", "{:.4g}"))
BREAKDOWN_ROWS = (("compute_s", "breakdown: compute s"), ("bubble_s", "breakdown: bubble s"),
                  ("exposed_comm_s", "breakdown: exposed comm s"), ("other_s", "breakdown: other s"))


def prediction_table(run):
    from rich.table import Table

    from ..compare import error_pct

    table = Table(title=f"{run.label}: predicted (plan.json) vs measured", title_justify="left")
    for name in ("metric", "predicted", "measured", "error"):
        table.add_column(name, justify="left" if name == "metric" else "right", no_wrap=True)
    errors = run.errors
    rows = PREDICTION_ROWS + tuple(r for r in OPTIONAL_PREDICTION_ROWS if run.measured.get(r[0]) is not None
                                   and (r[0] != "alltoall_time_s" or run.measured[r[0]] > 0))
    for key, name, fmt in rows:
        table.add_row(name, _fmt(run.predicted.get(key), fmt), _fmt(run.measured.get(key), fmt), _pct(errors[key]))
    for key, name in BREAKDOWN_ROWS:
        pred, meas = run.breakdown_predicted.get(key), run.breakdown_measured.get(key)
        table.add_row(name, _fmt(pred, "{:.4g}"), _fmt(meas, "{:.4g}"), _pct(error_pct(pred, meas)))
    return table


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    return f"{value / GiB:.2f}" if fmt == "gib" else fmt.format(value)


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.0f}%"
