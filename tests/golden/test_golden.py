"""Golden files: every generated file of each example, byte for byte.

After an intended change, review the diff and accept it with:  make golden
(ORCH_UPDATE_GOLDEN=1 pytest tests/golden).
"""
from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest

from orchestrator.plan import build_plan
from orchestrator.rundir import write_run_dir
from orchestrator.spec_loader import load_spec
from tests.conftest import EXAMPLES

GOLDEN = Path(__file__).resolve().parent
CASES = ["tiny-gpt-cpu", "tiny-gpt-cpu-pp2", "gpt3-1.7b-32xa100", "llama3-8b-64xh100", "gpt3-175b-1024xa100"]
UPDATE = os.environ.get("ORCH_UPDATE_GOLDEN") == "1"


def _generate(case: str, out: Path) -> Path:
    return write_run_dir(build_plan(load_spec(EXAMPLES / f"{case}.yaml")), out)


@pytest.mark.parametrize("case", CASES)
def test_generated_files_match_golden(case, tmp_path):
    run = _generate(case, tmp_path / case)
    expected_dir = GOLDEN / case
    if UPDATE:
        shutil.rmtree(expected_dir, ignore_errors=True)
        shutil.copytree(run, expected_dir)
        pytest.skip("golden files updated")
    assert expected_dir.is_dir(), f"no golden files for {case}: run `make golden`"
    produced = sorted(p.name for p in run.iterdir())
    assert produced == sorted(p.name for p in expected_dir.iterdir())
    for name in produced:
        got, want = (run / name).read_text(), (expected_dir / name).read_text()
        if got != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                                f"golden/{case}/{name}", f"generated/{name}"))
            pytest.fail(f"{case}/{name} differs from the golden file (accept with `make golden`):\n{diff}")


def test_generation_is_byte_identical_across_runs(tmp_path):
    a = _generate("llama3-8b-64xh100", tmp_path / "a")
    b = _generate("llama3-8b-64xh100", tmp_path / "b")
    for file in a.iterdir():
        assert file.read_bytes() == (b / file.name).read_bytes(), file.name
    assert {f.name: f.stat().st_mode for f in a.iterdir()} == {f.name: f.stat().st_mode for f in b.iterdir()}
