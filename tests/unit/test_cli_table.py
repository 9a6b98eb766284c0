"""Tables for people fit the terminal: orchestrator/cli/table.py, and `orch plan` / `orch compare` through it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.table import Column, render_table, wrap_text
from tests.conftest import EXAMPLES, ROOT
from tests.unit.compare_support import make_run_dir, steady
from tests.deadlines import scaled_s

ANSI = re.compile(r"\x1b\[")
NUMBER = re.compile(r"\d[\d,.]*%?")


def orch(*argv: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([str(Path(sys.executable).parent / "orch"), *argv], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=scaled_s(120))


COLUMNS = [Column("#", keep=True), Column("name", "left", keep=True, wrap=True), Column("a", priority=1),
           Column("b", priority=2), Column("c", priority=3)]
ROWS = [["1", "tp2-pp4-dp8-z1-mb1 sp offload=optimizer", "1,234,567", "12.5%", "0.003"],
        ["2", "short", "7", "100.0%", "12"]]


@pytest.mark.parametrize("width", [20, 30, 45, 80, 200])
def test_table_fits_and_never_cuts_a_number(width):
    table = render_table(COLUMNS, ROWS, width=width, title="a title long enough to wrap at narrow widths here")
    lines = table.text.splitlines()
    assert max(map(len, lines)) <= max(width, 2 + 2 + 12)   # '#', the folded name: the narrowest possible
    shown = [c.header for c in COLUMNS if c.header not in table.hidden]
    for row in ROWS:
        for col, cell in zip(COLUMNS, row):
            if col.header in shown and not col.wrap:
                assert re.search(rf"(^|\s){re.escape(cell)}(\s|$)", table.text), (cell, table.text)
    assert list(table.hidden) == [c.header for c in COLUMNS[len(shown):]]   # dropped in priority order


def test_wide_shows_every_column_and_wrap_keeps_numbers_with_units():
    table = render_table(COLUMNS, ROWS, width=20, wide=True)
    assert table.hidden == () and "tp2-pp4-dp8-z1-mb1 sp offload=optimizer" in table.text
    assert "0.2\nGiB" not in wrap_text("memory: params 0.2 GiB, grads 0.2 GiB, optimizer 1.4 GiB", 24)


def _check_output(out: str, width: int) -> None:
    assert not ANSI.search(out), "escape codes in piped output"
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out


@pytest.mark.parametrize("width", [80, 120])
def test_plan_fits_the_terminal(width):
    proc = orch("plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--top", "3", columns=width)
    assert proc.returncode == 0, proc.stderr
    _check_output(proc.stdout, width)
    chosen = json.loads(orch("plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--json", "--top", "1",
                             columns=width).stdout)["chosen"]
    assert f"{chosen['tag']} sp" in proc.stdout and "--wide shows every column" in proc.stdout
    wide = orch("plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--top", "3", "--wide", columns=width)
    assert wide.returncode == 0 and "--wide" not in wide.stdout
    header = next(line for line in wide.stdout.splitlines() if line.startswith("#"))
    assert header.split()[-1] == "other" and "params" in header and "TP s" in header
    # every number of the narrow table's rows is in the wide table's row of the same rank
    for narrow, full in zip(_rows(proc.stdout), _rows(wide.stdout)):
        assert set(NUMBER.findall(narrow)) <= set(NUMBER.findall(full))


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"\d+ +tp", line)]


@pytest.mark.parametrize("width", [80, 120])
def test_compare_fits_the_terminal(tmp_path, width):
    a = make_run_dir(tmp_path / "a", steady(8, 0.1))
    b = make_run_dir(tmp_path / "b", steady(8, 0.05), **{"parallelism.zero_stage": 1})
    proc = orch("compare", str(a), str(b), columns=width)
    assert proc.returncode == 0, proc.stderr
    _check_output(proc.stdout, width)
    assert "winner:" in proc.stdout and "breakdown: compute s" in proc.stdout


def test_demo_log_has_no_raw_escape_codes(tmp_path):
    """`make demo > demo.log`: the step headings are plain text when stdout is not a terminal."""
    code = ("import runpy, sys; demo = runpy.run_path('examples/demo.py'); "
            "demo['step']('show the version', '--version')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=scaled_s(60))
    assert proc.returncode == 0, proc.stderr
    assert "$ orch --version   # show the version" in proc.stdout and not ANSI.search(proc.stdout)
