"""Module docstrings stay short: a few lines saying what the module is for. The reasoning, derivations and
sources live in docs/ (docs/cost-model.md, docs/internals.md), in a section named for the module."""
from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

MAX_LINES = 20
POINTER = re.compile(r'(docs/[\w-]+\.md), "([\w/]+\.py)"')


def _docstrings() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): doc for path in sorted((ROOT / "orchestrator").rglob("*.py"))
            if (doc := ast.get_docstring(ast.parse(path.read_text()), clean=False))}


def test_no_module_docstring_in_the_package_is_longer_than_20_lines():
    long = {path: n for path, doc in _docstrings().items() if (n := len(doc.strip("\n").splitlines())) > MAX_LINES}
    assert not long, (f"module docstrings over {MAX_LINES} lines: {long}; keep what the module is for, and move the "
                      "reasoning and sources to a section of docs/cost-model.md or docs/internals.md named for it")


def test_every_docs_section_a_docstring_points_to_exists():
    pointers = [(path, page, module) for path, doc in _docstrings().items()
                for page, module in POINTER.findall(" ".join(doc.split()))]
    assert len(pointers) >= 19
    missing = [f"{path} -> {page}, {module}" for path, page, module in pointers
               if not re.search(rf"^## {re.escape(module)}\b", (ROOT / page).read_text(), re.M)]
    assert not missing, missing
