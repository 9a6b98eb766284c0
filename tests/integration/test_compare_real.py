"""orch compare and orch calibrate on two REAL runs of the trainer: ZeRO-1 (logged to W&B offline) and
ZeRO-3 (W&B disabled), tiny GPT, 2 CPU processes, 10 steps each, trained once per session (the
``zero_stage_runs`` fixture of tests/integration/conftest.py, shared with test_train_deepspeed.py).

Checks: the diff names the differing fields; every number equals the one recomputed here from each
metrics.jsonl; the PNG is a valid image of the expected size; the W&B offline run directory gives the same
numbers as its run dir; calibrate + plan --calibration work on real runs; bad RUN arguments exit 2 through
the installed console script.
"""
from __future__ import annotations

import json
import statistics
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.integration.train_support import SHARED_RUN_STEPS, load_metrics, make_run_dir
from tests.deadlines import scaled_s
from tests.conftest import run_cli

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

STEPS = SHARED_RUN_STEPS
WARMUP = 3
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def real_runs(zero_stage_runs) -> dict:
    """{'z1': run dir (with a W&B offline run), 'z3': run dir}, both trained to completion."""
    return {"z1": zero_stage_runs[1], "z3": zero_stage_runs[3]}


def wandb_dir(run_dir: Path) -> Path:
    dirs = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def recomputed(run_dir: Path) -> dict:
    """The statistics of orch compare, recomputed independently from metrics.jsonl."""
    np = pytest.importorskip("numpy")
    records = load_metrics(run_dir)            # also validates every record against the schema
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    kept = records[WARMUP:]
    out = {key: statistics.median(r[key] for r in kept)
           for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "allreduce_time_s",
                       "allreduce_overhead", "comm_exposed_s")}
    out["step_time_p90_s"] = float(np.percentile([r["step_time_s"] for r in kept], 90))
    out["mem_peak_bytes"] = max(r["mem_peak_bytes"] for r in records)
    for key in ("alltoall_time_s", "expert_load_imbalance", "tokens_dropped_fraction", "moe_aux_loss"):
        values = [r[key] for r in kept]              # MoE / context parallelism: None in a dense run
        out[key] = None if None in values else statistics.median(values)
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def test_compare_two_real_runs(real_runs, tmp_path, capsys):
    png = tmp_path / "compare.png"
    code, out, err = run_cli(["compare", str(real_runs["z1"]), str(real_runs["z3"]), "--json", "--plot", str(png)],
                             capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["diff"]["layout"] == [{"field": "zero_stage", "values": [1, 3]}]
    assert {"path": "tracking.wandb.mode", "values": ["offline", "disabled"]} in data["diff"]["spec"]
    assert not [d for d in data["diff"]["spec"] if d["path"].startswith("parallelism.")]
    for run, name in zip(data["runs"], ("z1", "z3")):
        assert run["steps"] == {"recorded": STEPS, "first": 1, "last": STEPS, "warmup": WARMUP,
                                "measured": STEPS - WARMUP}
        expected = recomputed(real_runs[name])
        unmeasured = {k for k, v in expected.items() if v is None}
        assert {k: run["measured"][k] for k in unmeasured} == dict.fromkeys(unmeasured), name
        measured = {k: v for k, v in run["measured"].items() if k not in unmeasured}
        assert measured == pytest.approx({k: expected[k] for k in measured}, rel=1e-12), name
        assert set(run["measured"]) == set(expected), name
        chosen = json.loads((real_runs[name] / "plan.json").read_text())["chosen"]
        assert run["predicted"]["step_time_s"] == chosen["step_time_s"]
        assert run["error_pct"]["step_time_s"] == pytest.approx(
            100 * (chosen["step_time_s"] - expected["step_time_s"]) / expected["step_time_s"])
    rates = [run["measured"]["tokens_per_s"] for run in data["runs"]]
    winner = data["winner"]
    if winner["label"] is None:      # the two runs within their measured noise: a tie, no winner
        assert len(winner["tie"]) == 2 and winner["speedup"] - 1 <= winner["tie_margin"]
    else:
        assert winner["index"] == rates.index(max(rates)) and winner["reason"]
    width, height = png_size(png)
    assert (width, height) == (1200, 900) and png.stat().st_size > 20_000


def test_tables_for_people(real_runs, capsys):
    code, out, err = run_cli(["compare", str(real_runs["z1"]), str(real_runs["z3"])], capsys)
    assert code == 0, err
    for text in ("layout.zero_stage", "tp1-pp1-dp2-z1-mb2", "tp1-pp1-dp2-z3-mb2", "predicted (plan.json) vs measured",
                 "winner: "):
        assert text in out


def test_wandb_offline_run_gives_the_run_dirs_numbers(real_runs, capsys):
    run_dir = real_runs["z1"]
    code, out, err = run_cli(["compare", str(run_dir), str(wandb_dir(run_dir)), "--json"], capsys)
    assert code == 0, err
    direct, logged = json.loads(out)["runs"]
    assert (direct["kind"], logged["kind"]) == ("run_dir", "wandb_offline")
    for key in ("measured", "predicted", "error_pct", "breakdown", "series", "steps", "layout"):
        assert direct[key] == logged[key], key
    assert json.loads(out)["diff"] == {"layout": [], "spec": []}
    wandb_file = next(wandb_dir(run_dir).glob("run-*.wandb"))      # the .wandb file and wandb/ work too
    code, out, _ = run_cli(["compare", str(wandb_file), str(run_dir / "wandb"), "--json"], capsys)
    assert code == 0
    assert [r["measured"] for r in json.loads(out)["runs"]] == [direct["measured"], direct["measured"]]


def test_calibrate_real_runs_and_plan_with_it(real_runs, tmp_path, capsys):
    calib = tmp_path / "calib.json"
    code, out, err = run_cli(["calibrate", str(real_runs["z1"]), str(real_runs["z3"]), "-o", str(calib)], capsys)
    assert code == 0, err
    data = json.loads(calib.read_text())
    assert data["cluster"]["gpu"] == "cpu" and {"matmul_efficiency", "intra_node_efficiency"} <= set(data["cost_model"])
    assert data["fit"]["rms_error_pct"]["after"] <= data["fit"]["rms_error_pct"]["before"]
    code, out, err = run_cli(["plan", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--calibration", str(calib)], capsys)
    assert code == 0, err


def test_bad_runs_exit_2_from_the_console_script(real_runs, tmp_path, orch_env):
    orch = Path(sys.executable).with_name("orch")
    empty = make_run_dir(tmp_path / "untrained", planned=False)
    (empty / "metrics.jsonl").write_text("")
    env = {**orch_env, "WANDB_MODE": "offline"}
    proc = subprocess.run([str(orch), "compare", str(real_runs["z1"]), str(tmp_path / "nope"), str(empty),
                           "someone/project/run123"], capture_output=True, text=True, env=env, timeout=scaled_s(60))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "3 problems found" in proc.stderr and "no such run dir" in proc.stderr
    assert "no metrics records (empty)" in proc.stderr and "needs W&B online, but WANDB_MODE=offline" in proc.stderr
    assert "Traceback" not in proc.stderr
