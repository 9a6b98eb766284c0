"""orch plan SPEC: search parallel layouts, rank them by predicted step time, explain the choice."""
from __future__ import annotations

import json

import click

GiB = 2**30


@click.command(name="plan")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--top", "top_k", default=5, show_default=True, type=click.IntRange(min=1),
              help="How many ranked layouts to show.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"chosen": LAYOUT, "candidates": [LAYOUT, ...]} (SPEC.md) instead of the table.')
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False),
              help="calib.json from `orch calibrate`: plan with the cost-model terms fitted to measured runs.")
def command(spec_path: str, top_k: int, as_json: bool, calibration_path: str | None) -> None:
    """Search the parallel layouts SPEC leaves open (tp, pp, vpp, dp, ZeRO stage, micro-batch,
    recompute, sequence parallel, offload), drop those that break a rule or do not fit in GPU memory,
    and rank the rest by predicted step time. Prints the top layouts with their memory breakdown, bubble,
    communication time by kind, tokens/s, TFLOP/s per GPU and MFU, and why the winner won.

    Exit 0, or 2 when the spec is invalid, the calibration file is invalid or for another GPU or
    precision, or no layout fits (the error says what is closest and what would make it fit).
    """
    from ..planner import search
    from ..spec import load_spec

    spec = load_spec(spec_path)
    cost = calibrated_cost(calibration_path, spec)
    result = search(spec, top_k=top_k, cost=cost)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2))
        return
    from rich.console import Console

    console = Console(width=max(180, Console().width), soft_wrap=False)
    console.print(render_table(spec, result))
    for line in result.reasons:
        console.print(f"- {line}", markup=False, highlight=False)


def calibrated_cost(path: str | None, spec):
    """The CostModel of a calib.json for this spec (None without one); notes the file on stderr."""
    if path is None:
        return None
    from ..calibrate import load_calibration

    cost = load_calibration(path).cost_for(spec)
    click.echo(f"note: cost model calibrated by {path}", err=True)
    return cost


COLUMNS = ("#", "layout", "recompute", "params", "grads", "optim", "acts", "other", "total GiB", "bubble",
           "TP s", "PP s", "DP s", "step s", "tokens/s", "TFLOP/s", "±", "MFU")


def render_table(spec, result):
    """The rich Table of the ranked candidates (memory in GiB per GPU, exposed communication in s/step)."""
    from rich.table import Table

    title = (f"{spec.name}: {spec.world_size} x {spec.cluster.gpu}, global batch {spec.training.global_batch_size}"
             f" x {spec.model.seq_length} tokens; {result.num_fitting} of {result.num_considered} layouts fit")
    table = Table(title=title, title_justify="left")
    for header in COLUMNS:
        left = header in ("layout", "recompute")
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    for rank, est in enumerate(result.candidates, 1):
        table.add_row(*_row(rank, est))
    return table


def _row(rank: int, est) -> list[str]:
    from ..estimate.uncertainty import plus_minus

    lay, mem, comm = est.layout, est.memory, est.comm
    name = lay.tag() + (" sp" if lay.sequence_parallel else "") + (
        f" offload={lay.offload}" if lay.offload != "none" else "")
    gib = [f"{getattr(mem, k) / GiB:.1f}" for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                    "activations_bytes", "other_bytes", "total_bytes")]
    return [str(rank), name, lay.recompute, *gib, f"{est.bubble_fraction:.1%}", f"{comm.tp_exposed_s:.2f}",
            f"{comm.pp_exposed_s:.2f}", f"{comm.dp_exposed_s:.2f}", f"{est.step_time_s:.3g}",
            f"{est.tokens_per_s:,.0f}", f"{est.tflops_per_gpu:.3g}", plus_minus(est.uncertainty), f"{est.mfu:.1%}"]
