"""`orch plan --plot` / `orch generate --plot`: the picture's bars are the estimator's own terms (they add up to the
predicted step time and memory total), the PNG is real and reproducible, and matplotlib stays off the plain paths."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from orchestrator.plan_plot import (MAX_BARS, MEMORY_PARTS, TIME_PARTS, layout_label, memory_parts_bytes,
                                    time_parts_s)
from orchestrator.planner import search
from orchestrator.spec_loader import load_spec
from tests.conftest import EXAMPLES, ROOT
from tests.unit.test_cli_plan import run_cli

BREAKDOWN_EXAMPLES = ["llama3-8b-64xh100", "mixtral-8x7b-64xh100", "gpt3-175b-1024xa100", "llama3-8b-128k-32xh100",
                      "tiny-gpt-cpu-pp2"]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("name", BREAKDOWN_EXAMPLES)
def test_bars_add_up_to_the_predicted_step_time_and_memory(name):
    result = search(load_spec(EXAMPLES / f"{name}.yaml"), top_k=MAX_BARS)
    for layout in result.to_dict()["candidates"]:
        time = time_parts_s(layout)
        assert set(time) == {label for label, *_ in TIME_PARTS}
        assert min(time.values()) >= 0
        assert sum(time.values()) == pytest.approx(layout["step_time_s"], rel=1e-9)
        memory = memory_parts_bytes(layout)
        assert set(memory) == {label for label, *_ in MEMORY_PARTS}
        assert sum(memory.values()) == pytest.approx(layout["memory"]["total_bytes"], abs=8)
        # every term of the estimator's breakdown is in exactly one bar segment
        keys = [k for *_, ks in TIME_PARTS for k in ks]
        assert sorted(keys) == sorted(layout["breakdown"])


def test_a_moe_layout_shows_its_expert_all_to_all():
    result = search(load_spec(EXAMPLES / "mixtral-8x7b-64xh100.yaml"), top_k=3)
    layout = result.to_dict()["chosen"]
    assert time_parts_s(layout)["EP all-to-all (exposed)"] == layout["breakdown"]["ep_exposed_s"] > 0


def test_labels_say_the_layout():
    layout = {"tp": 2, "pp": 4, "vpp": 3, "dp": 8, "cp": 2, "ep": 1, "zero_stage": 1, "micro_batch_size": 2,
              "sequence_parallel": True, "recompute": "full", "offload": "none"}
    label = layout_label(1, layout)
    assert label.splitlines()[0] == "#1 (chosen)"
    assert "tp2" in label and "pp4\xa0v3" in label and "cp2" in label and "dp8" in label and "ep" not in label
    assert "ZeRO-1 mb2 sp" in label and "recompute full" in label
    assert max(len(line) for line in label.splitlines()) <= 16


def test_plan_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    code, stdout, err = run_cli(["plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--plot", str(out)], capsys)
    assert code == 0, err
    assert "- chose " in stdout and f"wrote {out}" in err
    data = out.read_bytes()
    width, height = _png_size(data)
    assert 1200 <= width <= 2400 and 700 <= height <= 1600
    assert 40_000 < len(data) < 2_000_000
    assert b"Software" not in data              # no matplotlib version stamp: the same plan, the same bytes


def test_generate_plot_saves_plan_png_outside_the_manifest(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = str(EXAMPLES / "tiny-gpt-cpu.yaml")
    with_plot, without = tmp_path / "a", tmp_path / "b"
    assert run_cli(["generate", spec, "-o", str(with_plot), "--plot"], capsys)[0] == 0
    assert run_cli(["generate", spec, "-o", str(without)], capsys)[0] == 0
    png = (with_plot / "plan.png").read_bytes()
    assert _png_size(png)[0] >= 1200
    assert "plan.png" not in json.loads((with_plot / "manifest.json").read_text())["files"]
    for name in (p.name for p in without.iterdir()):       # every hashed file is byte-identical
        assert (with_plot / name).read_bytes() == (without / name).read_bytes(), name
    assert run_cli(["validate", str(with_plot)], capsys)[0] == 0
    # --force replaces a run dir holding its own picture (plan.png is orch's, not a training output)
    assert run_cli(["generate", spec, "-o", str(with_plot), "--force", "--plot"], capsys)[0] == 0
    assert (with_plot / "plan.png").read_bytes() == png    # drawn again, the same bytes


def test_missing_matplotlib_exits_2_naming_the_extra(tmp_path):
    """In a process where matplotlib cannot be imported: exit 2, the extra named, nothing written."""
    code = ("import sys\nsys.modules['matplotlib'] = None\nfrom orchestrator.cli import main\nmain(sys.argv[1:])\n")
    out, run_dir = tmp_path / "p.png", tmp_path / "r"
    for argv in (["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--plot", str(out)],
                 ["generate", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "-o", str(run_dir), "--plot"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert "matplotlib" in proc.stderr and "pip install 'orch[plot]'" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not out.exists() and not run_dir.exists()


def test_bad_plot_path_exits_2_before_planning(tmp_path, capsys):
    code, stdout, err = run_cli(["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--plot", str(tmp_path / "p.jpg")],
                                capsys)
    assert code == 2 and stdout == "" and "PNG" in err


def test_plan_without_plot_never_imports_matplotlib():
    code = ("import sys\nfrom orchestrator.cli import main\n"
            "try:\n    main(['plan', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "tiny-gpt-cpu.yaml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
