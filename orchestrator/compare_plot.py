"""The picture of a Comparison (``orch compare --plot FILE.png``): matplotlib, Agg canvas, no pyplot state.

Top left: step time over steps for every run; top right: tokens/s over steps (the warm-up steps left out of
the statistics are shaded). Bottom: per run, the time breakdown of a step (compute, pipeline bubble,
exposed communication, other) as two stacked bars, predicted (plan.json) beside measured.
"""
from __future__ import annotations

from pathlib import Path

from .compare import COMPONENTS, Comparison
from .plotting import check_plot_path, new_figure, png_bytes

FIGSIZE_IN = (12.0, 9.0)
DPI = 100
COMPONENT_STYLE = {"compute_s": ("compute", "#4c72b0"), "bubble_s": ("pipeline bubble", "#dd8452"),
                   "exposed_comm_s": ("exposed communication", "#c44e52"), "other_s": ("other", "#8c8c8c")}


def render_plot(comparison: Comparison, path: str | Path) -> Path:
    """Draw the comparison into a PNG file at ``path``; returns the path."""
    out = check_plot_path(path)
    fig = new_figure(FIGSIZE_IN, DPI)
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 1.1))
    _series(fig.add_subplot(grid[0, 0]), comparison, "step_time_s", "step time (s)")
    _series(fig.add_subplot(grid[0, 1]), comparison, "tokens_per_s", "tokens/s")
    _breakdown(fig.add_subplot(grid[1, :]), comparison)
    fig.suptitle(_title(comparison), fontsize=11)
    fig.tight_layout()
    out.write_bytes(png_bytes(fig, DPI))
    return out


def _title(comparison: Comparison) -> str:
    winner = comparison.winner
    names = ", ".join(r.label for r in comparison.runs)
    if len(comparison.runs) < 2:
        return f"orch compare: {names}"
    return f"orch compare: {names}" + (f"  (winner: {winner['label']})" if winner["label"] else
                                       "  (different models: no winner)")


def _series(ax, comparison: Comparison, key: str, ylabel: str) -> None:
    for run in comparison.runs:
        steps = [r["step"] for r in run.records]
        ax.plot(steps, [r[key] for r in run.records], marker="o", markersize=3, linewidth=1.2, label=run.label)
    warm = [run.records[run.warmup - 1]["step"] for run in comparison.runs if run.warmup > 0]
    if warm:
        first = min(run.records[0]["step"] for run in comparison.runs)
        ax.axvspan(first - 0.5, max(warm) + 0.5, color="#dddddd", alpha=0.6, label="warm-up (left out)")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _breakdown(ax, comparison: Comparison) -> None:
    centers = []
    for i, run in enumerate(comparison.runs):
        centers.append(3 * i + 0.5)
        for j, (kind, parts) in enumerate((("predicted", run.breakdown_predicted),
                                           ("measured", run.breakdown_measured))):
            x, bottom = 3 * i + j, 0.0
            for key in COMPONENTS:
                value_ms = 1e3 * parts.get(key, 0.0)
                label, color = COMPONENT_STYLE[key]
                ax.bar(x, value_ms, bottom=bottom, color=color, width=0.8, edgecolor="white",
                       label=label if (i, j) == (0, 1) else None, hatch="//" if kind == "predicted" else None)
                bottom += value_ms
            ax.text(x, bottom, "no prediction" if not parts else kind, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(centers)
    ax.set_xticklabels([run.label for run in comparison.runs], fontsize=8)
    ax.set_ylabel("time per step (ms)")
    ax.set_title("step time breakdown: predicted (hatched) vs measured", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
