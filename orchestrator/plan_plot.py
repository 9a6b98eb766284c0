"""The picture of a plan (``orch plan --plot FILE.png``, ``orch generate --plot``): for the top candidates, where
the predicted step time goes (with the prediction's error bar) and where each GPU's memory goes, against the
GPU's capacity and the planner's headroom. Drawn from the LAYOUT records alone (plan.json's shape)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from .estimate.to_train import short_amount
from .plotting import check_plot_path, new_figure, png_bytes

MAX_BARS = 5
LABEL_CHARS = 16          # a tick label line at most this long stays within its bar's slot
FIGSIZE_IN = (14.0, 8.6)
DPI = 110
GiB = 2**30

# (label, colour, breakdown keys): the estimator's StepBreakdown terms, which add up to step_time_s.
TIME_PARTS = (("compute", "#4c72b0", ("compute_s",)), ("pipeline bubble", "#dd8452", ("bubble_s",)),
              ("TP comm (exposed)", "#c44e52", ("tp_exposed_s",)), ("PP comm (exposed)", "#8172b3", ("pp_exposed_s",)),
              ("DP comm (exposed)", "#937860", ("dp_exposed_s",)), ("EP all-to-all (exposed)", "#da8bc3",
                                                                     ("ep_exposed_s",)),
              ("CP K/V ring (exposed)", "#ccb974", ("cp_exposed_s",)), ("optimizer", "#55a868", ("optimizer_s",)),
              ("other (offload, host work, contention)", "#8c8c8c", ("offload_s", "engine_s", "contention_s")))
# (label, colour, memory key): MemoryEstimate's terms, which add up to total_bytes (busiest pipeline stage).
MEMORY_PARTS = (("parameters", "#64b5cd", "params_bytes"), ("gradients", "#8172b3", "grads_bytes"),
                ("optimizer states", "#55a868", "optimizer_bytes"), ("activations", "#dd8452", "activations_bytes"),
                ("other (buffers, workspace)", "#8c8c8c", "other_bytes"))


def time_parts_s(layout: dict) -> dict[str, float]:
    """Seconds per step by TIME_PARTS label, from a LAYOUT record's breakdown (they sum to step_time_s)."""
    b = layout["breakdown"]
    return {label: sum(b.get(k, 0.0) for k in keys) for label, _, keys in TIME_PARTS}


def memory_parts_bytes(layout: dict) -> dict[str, float]:
    """Bytes per GPU by MEMORY_PARTS label, from a LAYOUT record's memory (they sum to total_bytes)."""
    return {label: float(layout["memory"][key]) for label, _, key in MEMORY_PARTS}


def layout_label(rank: int, layout: dict) -> str:
    """'#1 (chosen)\\ntp2 pp1 dp32\\nZeRO-1 mb2 sp': the rank, the layout's degrees, its options (one per line
    beyond the first three, so labels stay narrow)."""
    degrees = [f"tp{layout['tp']}", f"pp{layout['pp']}" + (f"\xa0v{layout['vpp']}" if layout["vpp"] > 1 else "")]
    degrees += [f"{k}{layout[k]}" for k in ("cp", "ep") if layout.get(k, 1) > 1]
    degrees.append(f"dp{layout['dp']}")
    options = [f"ZeRO-{layout['zero_stage']}", f"mb{layout['micro_batch_size']}"]
    options += ["sp"] if layout["sequence_parallel"] else []
    lines = [f"#{rank}" + (" (chosen)" if rank == 1 else ""), *textwrap.wrap(" ".join(degrees), LABEL_CHARS),
             " ".join(options)]
    lines += [f"recompute {layout['recompute']}"] if layout["recompute"] != "none" else []
    lines += [f"offload {layout['offload']}"] if layout["offload"] != "none" else []
    return "\n".join(lines)


def render_plan_png(record: dict, title: str) -> bytes:
    """The picture of ``record`` ({"candidates": [LAYOUT, ...]}) as PNG bytes (the same record: the same bytes)."""
    layouts = record["candidates"][:MAX_BARS]
    fig = new_figure(FIGSIZE_IN, DPI)
    grid = fig.add_gridspec(2, 2, width_ratios=(1.1, 1), height_ratios=(1, 0.8))
    _time_panel(fig.add_subplot(grid[0, 0]), layouts)
    _overhead_panel(fig.add_subplot(grid[1, 0]), layouts)
    _memory_panel(fig.add_subplot(grid[:, 1]), layouts)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.text(0.5, 0.005, "orch plan: predictions of orch's cost model for the busiest GPU. Error bars: the typical "
             "error of tokens/s on published runs of the layout's regime.", ha="center", va="bottom", fontsize=8,
             color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    return png_bytes(fig, DPI)


def write_plan_png(record: dict, title: str, path: str | Path) -> Path:
    """Draw the plan into the PNG file ``path``; returns the path."""
    out = check_plot_path(path)
    out.write_bytes(render_plan_png(record, title))
    return out


def plan_title(spec) -> str:
    return (f"{spec.name}: {spec.world_size} x {spec.cluster.gpu}, global batch "
            f"{spec.training.global_batch_size} x {spec.model.seq_length} tokens ({spec.training.precision})")


def _stack(ax, layouts: list[dict], parts: list[dict[str, float]], styles, scale: float,
           short_labels: bool = False) -> list[float]:
    """Stacked bars (values / scale), one legend entry per part that any bar shows; returns the bar tops."""
    tops = [0.0] * len(layouts)
    for label, color, *_ in styles:
        values = [p[label] / scale for p in parts]
        if max(values) <= 0:
            continue
        ax.bar(range(len(layouts)), values, bottom=tops, color=color, width=0.62, edgecolor="white",
               linewidth=0.6, label=label)
        tops = [t + v for t, v in zip(tops, values)]
    ax.set_xticks(range(len(layouts)))
    ax.set_xticklabels([f"#{i}" + (" (chosen)" if i == 1 else "") if short_labels else layout_label(i, lay)
                        for i, lay in enumerate(layouts, 1)], fontsize=8.5)
    pad = max(0.0, (3 - len(layouts)) / 2)          # one or two bars keep the width of three
    ax.set_xlim(-0.6 - pad, len(layouts) - 0.4 + pad)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return tops


def _time_panel(ax, layouts: list[dict]) -> None:
    tops = _stack(ax, layouts, [time_parts_s(lay) for lay in layouts], TIME_PARTS, 1.0, short_labels=True)
    errors = [lay["step_time_s"] * lay["uncertainty"]["relative_error"] for lay in layouts]
    ax.errorbar(range(len(layouts)), tops, yerr=errors, fmt="none", ecolor="black", elinewidth=1.2, capsize=6,
                label="prediction's error (±)")
    for i, lay in enumerate(layouts):
        note = f"{lay['step_time_s']:.3g} s ±{lay['uncertainty']['relative_error']:.0%}\nMFU {lay['mfu']:.1%}"
        if "to_train" in lay:
            t = lay["to_train"]
            note += f"\n{t['days']:.3g} days to train" + (
                f"\n{short_amount(t['cost']['amount'])} {t['cost']['currency']}" if "cost" in t else "")
        ax.annotate(note, (i, tops[i] + errors[i]), xytext=(0, 4), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8)
    first = layouts[0].get("to_train")
    extra_lines = 0 if first is None else 1 + ("cost" in first)     # days, cost: more room above the bars
    ax.set_ylim(0, max(t + e for t, e in zip(tops, errors)) * (1.45 + 0.1 * extra_lines))
    ax.set_ylabel("time per optimizer step (s)")
    ax.set_title("Where the step time goes (predicted, with its error)", fontsize=11)
    ax.legend(fontsize=7.5, loc="upper center", ncol=3, framealpha=0.9)


def _overhead_panel(ax, layouts: list[dict]) -> None:
    """The same bars less compute, in ms: what the layouts differ by when compute dominates."""
    parts = [time_parts_s(lay) for lay in layouts]
    tops = _stack(ax, layouts, parts, [t for t in TIME_PARTS if t[0] != "compute"], 1e-3)
    for i, lay in enumerate(layouts):
        ax.annotate(f"{tops[i]:,.0f} ms ({tops[i] * 1e-3 / lay['step_time_s']:.1%})", (i, tops[i]), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(max(tops), 1e-9) * 1.25)
    ax.set_ylabel("time per step, compute left out (ms)")
    ax.set_title("Overheads: the step less compute (share of the step)", fontsize=10)


def _memory_panel(ax, layouts: list[dict]) -> None:
    tops = _stack(ax, layouts, [memory_parts_bytes(lay) for lay in layouts], MEMORY_PARTS, GiB)
    mem = layouts[0]["memory"]
    capacity, usable = mem["capacity_bytes"] / GiB, mem["usable_bytes"] / GiB
    ax.axhline(capacity, color="#b2182b", linewidth=1.6, label=f"GPU capacity ({capacity:.1f} GiB)")
    kept = 1 - mem["usable_bytes"] / mem["hbm_bytes"]
    ax.axhline(usable, color="#b2182b", linewidth=1.2, linestyle="--",
               label=f"headroom limit ({usable:.1f} GiB, {kept:.0%} of HBM kept free)")
    for i, lay in enumerate(layouts):
        note = f"{tops[i]:.1f} GiB" + ("" if lay["memory"]["within_headroom"] else "\ninside the headroom")
        note += f"\n({lay['memory']['stage']} stage)" if lay["pp"] > 1 else ""
        ax.annotate(note, (i, tops[i]), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    ax.set_ylim(0, max(max(tops), capacity) * 1.38)
    ax.set_ylabel("memory per GPU on the busiest pipeline stage (GiB)")
    ax.set_title("Where the memory goes (predicted peak per GPU)", fontsize=11)
    ax.legend(fontsize=7.5, loc="upper left", ncol=2, framealpha=0.9)
