"""orch compare RUN...: runs side by side, predicted against measured, and which one won and why."""
from __future__ import annotations

import json

import click

from .table import Column, bold, table_with_note, terminal_width, use_style, wrap_text

GiB = 2**30


@click.command(name="compare")
@click.argument("sources", metavar="RUN...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON object instead of tables.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw step time and tokens/s over steps and the time breakdown into this PNG.")
@click.option("--warmup", type=click.IntRange(min=0),
              help="Leading steps of each run to leave out of the statistics [default: 3, fewer in a short run so "
                   "that it keeps at least half of its steps; an explicit N is used as given, up to all but the "
                   "last step].")
@click.option("--wide", is_flag=True, help="Show every column whatever the terminal width.")
def command(sources, as_json: bool, plot_path: str | None, warmup: int | None, wide: bool) -> None:
    """Compare training runs. Each RUN is a run dir (trained: it has metrics.jsonl), a W&B offline run
    directory (RUN_DIR/wandb/offline-run-*, read with wandb's own reader) or a W&B run path
    entity/project/run_id (needs W&B online).

    Prints the layout and spec fields that differ; per run the steps, median and p90 step time,
    tokens/s, TFLOP/s per GPU, MFU, bubble, all-reduce overhead, exposed communication and peak memory
    (warm-up steps left out), and for MoE / context-parallel runs the all-to-all time, expert load
    imbalance, dropped tokens and aux loss; predicted (plan.json) against measured with the error in %; and
    the winner with the main reason it won (none when the runs train different models). Exit 0, or 2 when a
    RUN cannot be used (every bad one is listed).
    """
    from ..compare import compare

    if plot_path:
        from ..plotting import check_plot_path

        check_plot_path(plot_path)
    result = compare(list(sources), warmup=warmup)
    if plot_path:
        from ..compare_plot import render_plot

        render_plot(result, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2, allow_nan=False))
        return
    click.echo(render_comparison(result, width=terminal_width(), wide=wide, style=use_style()))


def render_comparison(result, *, width: int, wide: bool = False, style: bool = False) -> str:
    """Everything for people: the diff, the measured table, predicted vs measured per run, the winner."""
    blocks = [diff_table(result, width, wide, style)] + [resize_table(link, width, wide, style)
                                                         for link in result.resizes]
    blocks.append(measured_table(result, width, wide, style))
    blocks += [prediction_table(run, width, wide, style) for run in result.runs]
    blocks.append(wrap_text(warmup_line(result), width))
    blocks.append(bold(wrap_text(f"winner: {result.winner['explanation'] or result.winner['label']}", width), style))
    return "\n\n".join(blocks)


def warmup_line(result) -> str:
    kept = ", ".join(f"{run.label} {len(run.records) - run.warmup} of {len(run.records)}" for run in result.runs)
    return f"warm-up: {result.warmup_rule}; steps measured: {kept}"


def diff_table(result, width: int, wide: bool, style: bool) -> str:
    diff = result.diff
    columns = [Column("field", "left", keep=True, wrap=True)] + [
        Column(run.label, "left", priority=i, wrap=True) for i, run in enumerate(result.runs)]
    rows = [[f"layout.{row['field']}", *[_value(v) for v in row["values"]]] for row in diff["layout"]]
    rows += [[row["path"], *[_value(v) for v in row["values"]]] for row in diff["spec"]]
    if not rows:
        rows = [["(nothing: same layout and spec)", *["" for _ in result.runs]]]
    return table_with_note(columns, rows, "what differs", width, wide, style)


def _value(value) -> str:
    return json.dumps(value) if isinstance(value, (bool, list, dict)) or value is None else str(value)


RESIZE_COLUMNS = (Column("layout", "left", keep=True, wrap=True), Column("run", "left", priority=3, wrap=True),
                  Column("predicted step s", keep=True), Column("measured step s", keep=True),
                  Column("predicted tokens/s", priority=1), Column("measured tokens/s", priority=2))


def resize_table(link: dict, width: int, wide: bool, style: bool) -> str:
    """A resized run beside its source: both layouts with the plan's predicted figures and the measured ones."""
    rows = []
    for side, run in (("old", link["source"] or link["source_run_dir"]), ("new", link["run"])):
        pred, meas = link["predicted"][side], link["measured"][side] or {}
        rows.append([f"{side}: {link['layouts'][side]}", run, _fmt(pred.get("step_time_s"), "{:.4g}"),
                     _fmt(meas.get("step_time_s"), "{:.4g}"), _fmt(pred.get("tokens_per_s"), "{:,.0f}"),
                     _fmt(meas.get("tokens_per_s"), "{:,.0f}")])
    title = (f"resize: {link['run']} continues {link['source'] or link['source_run_dir']} from step "
             f"{link['source_step']} (checkpoint {link['conversion']})")
    return table_with_note(RESIZE_COLUMNS, rows, title, width, wide, style)


MEASURED_COLUMNS = (Column("run", "left", keep=True, wrap=True), Column("step s", keep=True),
                    Column("tokens/s", priority=1), Column("MFU", priority=2), Column("steps", priority=3),
                    Column("TFLOP/s/GPU", priority=4), Column("exposed comm s", priority=5),
                    Column("bubble", priority=6), Column("all-reduce", priority=7), Column("p90 s", priority=8),
                    Column("mem GiB", priority=9))


def measured_table(result, width: int, wide: bool, style: bool) -> str:
    rows = []
    for run in result.runs:
        m, n = run.measured, len(run.records)
        cells = {"run": run.label, "steps": f"{n - run.warmup}/{n}", "step s": f"{m['step_time_s']:.4g}",
                 "p90 s": f"{m['step_time_p90_s']:.4g}", "tokens/s": f"{m['tokens_per_s']:,.0f}",
                 "TFLOP/s/GPU": f"{m['tflops_per_gpu']:.4g}", "MFU": f"{m['mfu']:.1%}",
                 "bubble": f"{m['bubble_fraction']:.1%}", "all-reduce": f"{m['allreduce_overhead']:.1%}",
                 "exposed comm s": f"{run.breakdown_measured['exposed_comm_s']:.4g}",
                 "mem GiB": f"{m['mem_peak_bytes'] / GiB:.2f}"}
        rows.append([cells[c.header] for c in MEASURED_COLUMNS])
    title = ("measured (medians over the steps after warm-up; p90 of the step time; peak memory; exposed "
             "communication as in the step breakdown below)")
    return table_with_note(MEASURED_COLUMNS, rows, title, width, wide, style)


# comm_exposed_s is shown once, as the breakdown's "exposed comm" (the figure the step time adds up from).
PREDICTION_ROWS = (("step_time_s", "step time s", "{:.4g}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
                   ("tflops_per_gpu", "TFLOP/s per GPU", "{:.4g}"), ("mfu", "MFU", "{:.1%}"),
                   ("bubble_fraction", "bubble fraction", "{:.1%}"), ("allreduce_time_s", "all-reduce s", "{:.4g}"),
                   ("allreduce_overhead", "all-reduce overhead", "{:.1%}"), ("mem_peak_bytes", "peak memory GiB", "gib"))
# MoE and context parallelism (issue 10): shown for runs that measured them.
OPTIONAL_PREDICTION_ROWS = (("alltoall_time_s", "all-to-all s", "{:.4g}"),
                            ("expert_load_imbalance", "expert load imbalance", "{:.3f}"),
                            ("tokens_dropped_fraction", "tokens dropped", "{:.1%}"),
                            ("moe_aux_loss", "MoE aux loss", "{:.4g}"))
BREAKDOWN_ROWS = (("compute_s", "breakdown: compute s"), ("bubble_s", "breakdown: bubble s"),
                  ("exposed_comm_s", "breakdown: exposed comm s"), ("other_s", "breakdown: other s"))
PREDICTION_COLUMNS = (Column("metric", "left", keep=True, wrap=True), Column("predicted", keep=True),
                      Column("measured", keep=True), Column("error", keep=True))


def prediction_table(run, width: int, wide: bool, style: bool) -> str:
    from ..compare import error_pct

    errors = run.errors
    shown = PREDICTION_ROWS + tuple(r for r in OPTIONAL_PREDICTION_ROWS if run.measured.get(r[0]) is not None
                                    and (r[0] != "alltoall_time_s" or run.measured[r[0]] > 0))
    rows = [[name, _fmt(run.predicted.get(key), fmt), _fmt(run.measured.get(key), fmt), _pct(errors.get(key))]
            for key, name, fmt in shown]
    for key, name in BREAKDOWN_ROWS:
        pred, meas = run.breakdown_predicted.get(key), run.breakdown_measured.get(key)
        rows.append([name, _fmt(pred, "{:.4g}"), _fmt(meas, "{:.4g}"), _pct(error_pct(pred, meas))])
    title = f"{run.label}: predicted (plan.json) vs measured"
    return table_with_note(PREDICTION_COLUMNS, rows, title, width, wide, style)


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    return f"{value / GiB:.2f}" if fmt == "gib" else fmt.format(value)


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.0f}%"
