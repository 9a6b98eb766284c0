"""Plain-text tables and prose that fit the terminal, for every command that prints tables for people.

``render_table(columns, rows)`` lays out cells in aligned columns no wider than the terminal
(``COLUMNS``, else the terminal's size, else 80): it keeps the columns marked ``keep``, adds the others
in ``priority`` order while they fit, and lists the ones left out under the table (``--wide`` shows
every column whatever the width). A cell is never cut: only a column marked ``wrap`` (free text such as
a layout name) may fold onto more lines, never a number. Output carries ANSI styling (a bold header)
only when the stream is a terminal and ``NO_COLOR`` is unset, so piped output is plain text.

No click and no rich here: commands import it on their fast path, and tests call it directly.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from typing import Sequence, TextIO

GAP = "  "
_GLUE = "\x00"
_NUMBER_UNIT = re.compile(r"(?<=\d) (?=[A-Za-z%/]+\b)")
MIN_WRAP_WIDTH = 12


@dataclass(frozen=True)
class Column:
    """One table column: its header, alignment, and how it behaves when the terminal is narrow.

    ``keep``: always shown (what identifies a row). ``priority``: lower is added first among the rest.
    ``wrap``: free text that may fold onto several lines when narrow (never set it for numbers).
    """

    header: str
    align: str = "right"
    keep: bool = False
    priority: int = 100
    wrap: bool = False


@dataclass(frozen=True)
class RenderedTable:
    text: str
    hidden: tuple[str, ...]


def terminal_width(stream: TextIO | None = None) -> int:
    """Columns available: $COLUMNS when set, else the terminal's width, else 80 (a pipe or a file)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return shutil.get_terminal_size((80, 24)).columns if stream is sys.__stdout__ else 80


def use_style(stream: TextIO | None = None) -> bool:
    """Whether ANSI styling may be written: a terminal, and neither NO_COLOR nor TERM=dumb."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def plural(count: int, singular: str, many: str | None = None) -> str:
    """'1 micro-batch', '4 micro-batches': the count with the noun in its right number."""
    return f"{count} {singular if count == 1 else many or singular + 's'}"


def bold(text: str, style: bool) -> str:
    return f"\033[1m{text}\033[0m" if style and text else text


def wrap_text(text: str, width: int, *, indent: str = "", first: str = "") -> str:
    """A sentence wrapped to width at word boundaries (`first` begins line 1, `indent` the others); a
    number stays on one line with its unit ("0.2 GiB", "12 %")."""
    glued = _NUMBER_UNIT.sub(_GLUE, text)
    return textwrap.fill(glued, width=max(width, 20), initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False).replace(_GLUE, " ")


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int | None = None,
                 wide: bool = False, title: str | None = None, style: bool = False) -> RenderedTable:
    """The table as text no wider than ``width`` (unless ``wide``), and the headers it left out."""
    width = terminal_width() if width is None else width
    natural = [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    shown = list(range(len(columns))) if wide else _fit(columns, natural, width)
    widths = {i: natural[i] for i in shown}
    if not wide:
        _shrink_wrapped(columns, shown, widths, width)
    lines = [] if not title else (title.splitlines() if wide else wrap_text(title, width).splitlines())
    header = GAP.join(_align(columns[i].header, widths[i], columns[i].align) for i in shown).rstrip()
    lines.append(bold(header, style))
    lines.append(GAP.join("-" * widths[i] for i in shown))
    for row in rows:
        lines += _row_lines([(row[i], widths[i], columns[i]) for i in shown])
    hidden = tuple(columns[i].header for i in range(len(columns)) if i not in shown)
    return RenderedTable("\n".join(lines), hidden)


def hidden_note(hidden: Sequence[str], width: int) -> str:
    """'(not shown at 80 columns: a, b; --wide shows every column)', wrapped; '' when nothing was hidden."""
    if not hidden:
        return ""
    return wrap_text(f"(not shown at {width} columns: {', '.join(hidden)}; --wide shows every column)", width)


def table_with_note(columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str, width: int, wide: bool,
                    style: bool) -> str:
    """The table followed by its hidden_note, when it left columns out."""
    table = render_table(columns, rows, width=width, wide=wide, title=title, style=style)
    return table.text + ("\n" + hidden_note(table.hidden, width) if table.hidden else "")


def _fit(columns: Sequence[Column], natural: list[int], width: int) -> list[int]:
    """Indices of the columns to show: every `keep` column, then the others by priority while they fit."""
    chosen = [i for i, c in enumerate(columns) if c.keep]
    for i in sorted((i for i, c in enumerate(columns) if not c.keep), key=lambda i: (columns[i].priority, i)):
        if sum(natural[j] for j in chosen + [i]) + len(GAP) * len(chosen) > width:
            break   # the next column in priority does not fit: stop, so what is shown is a predictable prefix
        chosen.append(i)
    return sorted(chosen)


def _shrink_wrapped(columns: Sequence[Column], shown: list[int], widths: dict[int, int], width: int) -> None:
    """Narrow the wrapping columns (widest first) until the table fits, none below MIN_WRAP_WIDTH."""
    excess = sum(widths.values()) + len(GAP) * (len(shown) - 1) - width
    for i in sorted((i for i in shown if columns[i].wrap), key=lambda i: -widths[i]):
        if excess <= 0:
            return
        cut = min(excess, widths[i] - MIN_WRAP_WIDTH)
        if cut > 0:
            widths[i] -= cut
            excess -= cut


def _row_lines(cells: list[tuple[str, int, Column]]) -> list[str]:
    """One row as one or more lines: wrapping cells fold, every other cell sits on the first line."""
    folded = [_fold(text, w) if col.wrap else [text] for text, w, col in cells]
    height = max(len(f) for f in folded)
    out = []
    for k in range(height):
        parts = [_align(f[k] if k < len(f) else "", w, col.align) for f, (_, w, col) in zip(folded, cells)]
        out.append(GAP.join(parts).rstrip())
    return out


def _fold(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width=width, break_long_words=True, break_on_hyphens=False) or [""]


def _align(text: str, width: int, align: str) -> str:
    return text.ljust(width) if align == "left" else text.rjust(width)
