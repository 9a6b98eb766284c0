"""orch plan SPEC: search parallel layouts, rank them by predicted step time, explain the choice."""
from __future__ import annotations

import json

import click

from .table import Column, hidden_note, render_table, terminal_width, use_style, wrap_text

GiB = 2**30


@click.command(name="plan")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--top", "top_k", default=5, show_default=True, type=click.IntRange(min=1),
              help="How many ranked layouts to show.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"chosen": LAYOUT, "candidates": [LAYOUT, ...]} instead of the table '
                   '(the fields are listed in the README, "orch plan --json").')
@click.option("--wide", is_flag=True,
              help="Show every column whatever the terminal width (by default columns that do not fit are left out).")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False),
              help="calib.json from `orch calibrate`: plan with the cost-model terms fitted to measured runs.")
@click.option("--measured", "measured_path", type=click.Path(dir_okay=False),
              help="doctor.json from `orch doctor`: measured bandwidths, latency and GEMM rate replace the catalog's.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Also draw the top candidates (up to 5) into a PNG: where the step time and the memory go "
                   "(needs matplotlib: pip install 'orch[plot]').")
def command(spec_path: str, top_k: int, as_json: bool, wide: bool, calibration_path: str | None,
            measured_path: str | None, plot_path: str | None) -> None:
    """Search the parallel layouts SPEC leaves open (tp, pp, vpp, dp, ZeRO stage, micro-batch,
    recompute, sequence parallel, offload), drop those that break a rule or do not fit in GPU memory,
    and rank the rest by predicted step time. Prints the top layouts with their memory breakdown, bubble,
    communication time by kind, tokens/s, TFLOP/s per GPU and MFU, and why the winner won.

    Exit 0, or 2 when the spec is invalid, the calibration file is invalid or for another GPU or
    precision, or no layout fits (the error says what is closest and what would make it fit).
    """
    from ..planner import search
    from ..spec_loader import load_spec

    if plot_path is not None:
        from ..plotting import check_plot_path, require_matplotlib

        check_plot_path(plot_path)
        require_matplotlib()
    spec = load_spec(spec_path)
    cost, measured = calibrated_cost(calibration_path, spec, measured_path)
    result = search(spec, top_k=top_k, cost=cost)
    if plot_path is not None:
        from ..plan_plot import plan_title, write_plan_png

        write_plan_png(result.to_dict(), plan_title(spec), plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), **({"measured": measured} if measured else {})},
                              sort_keys=True, indent=2, allow_nan=False))
        for line in result.warnings:   # stdout stays the documented JSON; people read stderr
            click.echo(line, err=True)
        return
    click.echo(render_plan(spec, result, wide=wide, width=terminal_width(), style=use_style()))


def calibrated_cost(path: str | None, spec, measured_path: str | None = None):
    """(CostModel, measured record): a calib.json's terms for this spec, then a doctor.json's measured
    figures on top; (None, None) without either. Notes each file on stderr."""
    cost = None
    if path is not None:
        from ..calibrate import load_calibration

        cost = load_calibration(path).cost_for(spec)
        click.echo(f"note: cost model calibrated by {path}", err=True)
    if measured_path is None:
        return cost, None
    from ..doctor.measured import measured_cost

    cost, measured = measured_cost(measured_path, spec, cost)
    click.echo(f"note: measured by orch doctor ({measured_path}): {', '.join(measured['figures']) or 'nothing'}",
               err=True)
    return cost, measured


# Identity and the ranking first; the memory split and per-kind communication go when the terminal is narrow.
# "±" is the tokens/s estimate's typical error on the reference runs of its regime (estimate/uncertainty.py).
COLUMNS = (Column("#", keep=True), Column("layout", "left", keep=True, wrap=True), Column("step s", keep=True),
           Column("total GiB", priority=1), Column("tokens/s", priority=2), Column("±", priority=3),
           Column("MFU", priority=4), Column("bubble", priority=5), Column("TFLOP/s", priority=6),
           Column("recompute", "left", priority=7), Column("acts", priority=8), Column("TP s", priority=9),
           Column("PP s", priority=10), Column("DP s", priority=11), Column("params", priority=12),
           Column("grads", priority=13), Column("optim", priority=14), Column("other", priority=15))


def columns_for(spec) -> tuple[Column, ...]:
    """COLUMNS, or with training.total_tokens: days (and cost, in the spec's currency) to train after the memory
    total, then the ± that bounds them (and tokens/s), all before the other columns in priority."""
    if spec.training.total_tokens is None:
        return COLUMNS
    extra = [Column("days", priority=1)]
    if spec.cluster.gpu_hour_cost is not None:
        extra.append(Column(f"cost {spec.cluster.gpu_hour_cost.currency}", priority=1))
    extra.append(Column("±", priority=1))
    rest = [c for c in COLUMNS if c.header != "±"]
    at = [c.header for c in rest].index("total GiB") + 1
    return tuple(rest[:at] + extra + rest[at:])


def render_plan(spec, result, *, width: int, wide: bool = False, style: bool = False) -> str:
    """The ranked candidates (memory in GiB per GPU, exposed communication in s/step) and the why-lines."""
    title = (f"{spec.name}: {spec.world_size} x {spec.cluster.gpu}, global batch {spec.training.global_batch_size}"
             f" x {spec.model.seq_length} tokens; {result.num_fitting} of {result.num_considered} layouts fit")
    columns = columns_for(spec)
    rows = [_row(rank, est, columns) for rank, est in enumerate(result.candidates, 1)]
    table = render_table(columns, rows, width=width, wide=wide, title=title, style=style)
    lines = [table.text]
    if table.hidden:
        lines.append(hidden_note(table.hidden, width))
    for line in result.reasons:
        lines.append(f"- {line}" if wide else wrap_text(line, width, first="- ", indent="  "))
    return "\n".join(lines)


def _row(rank: int, est, columns=COLUMNS) -> list[str]:
    from ..estimate.to_train import short_amount
    from ..estimate.uncertainty import plus_minus

    lay, mem, comm = est.layout, est.memory, est.comm
    name = lay.tag() + (" sp" if lay.sequence_parallel else "") + (
        f" offload={lay.offload}" if lay.offload != "none" else "")
    gib = {k: f"{getattr(mem, k + '_bytes') / GiB:.1f}" for k in ("params", "grads", "optimizer", "activations",
                                                                  "other", "total")}
    cells = {"#": str(rank), "layout": name, "recompute": lay.recompute + (
                 f" ({'+'.join(lay.recompute_modules)})" if lay.recompute_modules else ""), "params": gib["params"],
             "grads": gib["grads"], "optim": gib["optimizer"], "acts": gib["activations"], "other": gib["other"],
             "total GiB": gib["total"], "bubble": f"{est.bubble_fraction:.1%}", "TP s": f"{comm.tp_exposed_s:.2f}",
             "PP s": f"{comm.pp_exposed_s:.2f}", "DP s": f"{comm.dp_exposed_s:.2f}",
             "step s": f"{est.step_time_s:.3g}", "tokens/s": f"{est.tokens_per_s:,.0f}",
             "±": plus_minus(est.uncertainty), "TFLOP/s": f"{est.tflops_per_gpu:.3g}", "MFU": f"{est.mfu:.1%}"}
    if est.to_train is not None:
        cells["days"] = f"{est.to_train['days']:.3g}"
        if "cost" in est.to_train:
            cells[f"cost {est.to_train['cost']['currency']}"] = short_amount(est.to_train["cost"]["amount"])
    return [cells[c.header] for c in columns]
