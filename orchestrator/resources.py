"""Where the shipped data lives: ``templates/`` and ``schemas/``.

In a wheel they are inside the package (setup.cfg maps them to ``orchestrator/templates`` and
``orchestrator/schemas``); in a source checkout or an editable install they are at the top level.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The directory of shipped data ``name`` ("templates" or "schemas")."""
    packaged = _HERE / name
    return packaged if packaged.is_dir() else _HERE.parent / name
