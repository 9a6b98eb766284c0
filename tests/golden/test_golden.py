"""Golden files: every generated file of each example, byte for byte.

After an intended change, review the diff and accept it with:  make golden
(ORCH_UPDATE_GOLDEN=1 pytest tests/golden).
"""
from __future__ import annotations

import difflib
import json
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
# Run dirs of a user's program name it by absolute path, and the spec hash covers that path: they are compared
# with the checkout's path as <ROOT>, the Megatron-LM checkout (a stand-in made here, its entry script's text
# fixed) as <MEGATRON_LM>, the spec hash as <SPEC-SHA256> and manifest.json's file hashes as <SHA256>.
PROGRAM_CASES = ["ds-script-cpu", "megatron-lm-gpt"]
UPDATE = os.environ.get("ORCH_UPDATE_GOLDEN") == "1"
ROOT = EXAMPLES.parent


def _generate(case: str, out: Path) -> Path:
    return write_run_dir(build_plan(load_spec(EXAMPLES / f"{case}.yaml")), out)


def _program_files(case: str, tmp_path: Path, monkeypatch) -> dict[str, str]:
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("# stand-in for Megatron-LM's pretrain_gpt.py\n")
    monkeypatch.setenv("ORCH_MEGATRON_LM", str(checkout))
    run = _generate(case, tmp_path / case)

    manifest = json.loads((run / "manifest.json").read_text())
    spec_hash = manifest["spec_sha256"]

    def normal(text: str) -> str:
        text = text.replace(spec_hash, "<SPEC-SHA256>").replace(spec_hash[:16], "<SPEC-SHA256>")
        return text.replace(str(checkout), "<MEGATRON_LM>").replace(str(ROOT), "<ROOT>")

    files = {p.name: normal(p.read_text()) for p in run.iterdir() if p.name != "manifest.json"}
    manifest["files"] = {name: "<SHA256>" for name in manifest["files"]}
    files["manifest.json"] = normal(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    return files


@pytest.mark.parametrize("case", CASES + PROGRAM_CASES)
def test_generated_files_match_golden(case, tmp_path, monkeypatch):
    if case in PROGRAM_CASES:
        files = _program_files(case, tmp_path, monkeypatch)
    else:
        run = _generate(case, tmp_path / case)
        files = {p.name: p.read_text() for p in run.iterdir()}
    expected_dir = GOLDEN / case
    if UPDATE:
        shutil.rmtree(expected_dir, ignore_errors=True)
        expected_dir.mkdir()
        for name, text in files.items():
            (expected_dir / name).write_text(text)
        pytest.skip("golden files updated")
    assert expected_dir.is_dir(), f"no golden files for {case}: run `make golden`"
    produced = sorted(files)
    assert produced == sorted(p.name for p in expected_dir.iterdir())
    for name in produced:
        got, want = files[name], (expected_dir / name).read_text()
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
