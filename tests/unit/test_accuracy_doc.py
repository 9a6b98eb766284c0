"""docs/accuracy.md's per-regime figures are the ones `benchmarks/accuracy.py --write` stored (residuals.py)."""
from __future__ import annotations

from pathlib import Path

from orchestrator.estimate.residuals import RESIDUALS

DOC = Path(__file__).resolve().parents[2] / "docs" / "accuracy.md"


def _regime_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and cells[2].endswith("%"):
            rows.append((cells[0], cells[2], cells[3]))
    return rows


def test_every_regime_row_states_the_stored_mean_and_rms():
    rows = _regime_rows()
    seen = set()
    for name, mean, rms in rows:
        key = next(k for k in RESIDUALS if name.startswith(k))
        seen.add(key)
        assert mean == f"{RESIDUALS[key]['mean_abs'] * 100:.1f}%", (name, mean)
        assert rms == f"{RESIDUALS[key]['rms'] * 100:.1f}%", (name, rms)
    assert seen == set(RESIDUALS)           # every regime the benchmark scores is in the page
