"""What orch's pictures share: the output-path check, matplotlib loaded lazily (the `plot` extra) and a PNG
written without matplotlib's version stamp, so the same picture is the same bytes."""
from __future__ import annotations

import io
from pathlib import Path

from .errors import Problem, SpecError

INSTALL_HINT = "pip install 'orch[plot]'"


def check_plot_path(path: str | Path) -> Path:
    """The output path, or SpecError when it cannot be a PNG written there (checked before any work)."""
    out = Path(path)
    problems = []
    if out.suffix.lower() != ".png":
        problems.append(Problem(str(out), "the plot is a PNG image", "name the file *.png"))
    if not out.parent.is_dir():
        problems.append(Problem(str(out), f"directory {out.parent} does not exist", "create it first"))
    if out.is_dir():
        problems.append(Problem(str(out), "is a directory", "name a file"))
    if problems:
        raise SpecError(problems)
    return out


def new_figure(figsize_in: tuple[float, float], dpi: int):
    """A matplotlib Figure on an Agg canvas (no pyplot state); SpecError (exit 2) naming the extra when
    matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        raise SpecError(Problem("--plot", "needs matplotlib, which is not installed", INSTALL_HINT)) from None
    fig = Figure(figsize=figsize_in, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def require_matplotlib() -> None:
    """Fail before any work when --plot cannot be honoured."""
    new_figure((1, 1), 10)


def png_bytes(fig, dpi: int) -> bytes:
    """The figure as PNG bytes, without the 'Software: matplotlib version ...' text chunk."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()
