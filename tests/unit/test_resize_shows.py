"""The resize shows everywhere: `orch status` of a resized run dir (launched or not), `orch compare` of the source
and the resized run (both layouts, the plan's predicted figures for each), and the resized run's W&B run (real
wandb, offline) in its source's group, naming its parent."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.unit.compare_support import record, write_metrics
from tests.unit.test_resize import _spec_file, orch, source  # noqa: F401  (the source run dir fixture)


@pytest.fixture
def resized(source, tmp_path):  # noqa: F811
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "-o", str(new)) == 0
    return new


def test_status_of_a_resized_run_dir_never_launched_shows_the_resize_and_exits_as_any_unlaunched_run(
        source, resized, capsys):  # noqa: F811
    capsys.readouterr()
    assert orch("status", str(source)) == 2       # an ordinary run dir never launched: exit 2, no resize line
    out = capsys.readouterr()
    assert "nothing was launched" in out.err and "resized" not in out.out
    assert orch("status", str(resized)) == 2
    out = capsys.readouterr()
    assert out.out.startswith(f"resized continuation of {source.resolve()} from step 4: 1x2 tp1-pp1-dp2-z2 -> "
                              "1x1 tp1-pp1-dp1-z2, checkpoint universal (dp 2 -> 1)")
    assert "nothing was launched" in out.err


def _measured(run, first: int, last: int, step_time_s: float, world: int):
    write_metrics(run, [{**record(step, step_time_s), "world_size": world} for step in range(first, last + 1)])


def test_compare_shows_both_layouts_and_their_predicted_figures(source, resized, capsys):  # noqa: F811
    _measured(source, 1, 4, 0.2, 2)
    _measured(resized, 5, 8, 0.3, 1)
    capsys.readouterr()
    assert orch("compare", str(source), str(resized), "--json") == 0
    result = json.loads(capsys.readouterr().out)
    [link] = result["resizes"]
    plans = [json.loads((run / "plan.json").read_text())["chosen"] for run in (source, resized)]
    assert link["source_run_dir"] == str(source.resolve()) and link["source_step"] == 4
    assert link["layouts"] == {"old": "1x2 tp1-pp1-dp2-z2", "new": "1x1 tp1-pp1-dp1-z2"}
    assert link["source"] == result["runs"][0]["label"] and link["run"] == result["runs"][1]["label"]
    assert link["predicted"]["old"]["step_time_s"] == pytest.approx(plans[0]["step_time_s"])
    assert link["predicted"]["new"]["step_time_s"] == pytest.approx(plans[1]["step_time_s"])
    assert plans[0]["step_time_s"] != plans[1]["step_time_s"]
    assert link["measured"]["old"]["step_time_s"] == pytest.approx(0.2 * 1.04, rel=0.05)
    assert orch("compare", str(resized), "--wide") == 0          # the source not compared: its plan.json still
    text = capsys.readouterr().out
    assert f"continues {source.resolve()} from step 4 (checkpoint universal)" in text
    assert f"{plans[0]['step_time_s']:.4g}" in text and "old: 1x2 tp1-pp1-dp2-z2" in text
    assert orch("compare", str(source), "--json") == 0
    assert json.loads(capsys.readouterr().out)["resizes"] == []


def test_the_resized_runs_wandb_run_is_in_its_sources_group_and_names_its_parent(source, tmp_path, monkeypatch):  # noqa: F811
    """generate --resume-from with a renamed spec: without the resize, its W&B group would be the new name."""
    pytest.importorskip("wandb")
    from orchestrator.rundir import read_run_dir
    from orchestrator.runs import _wandb_cli
    from orchestrator.spec import spec_to_data
    from orchestrator.telemetry.wandb_sink import open_wandb_sink

    (source / "wandb_run_id").write_text("srcrun01\n")
    spec = _spec_file(tmp_path, name="tiny-continued")
    new = tmp_path / "continued"
    assert orch("generate", str(spec), "-o", str(new), "--resume-from", str(source)) == 0
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = read_run_dir(new)
    sink = open_wandb_sink(run_dir=run.path, spec=run.spec, spec_data=spec_to_data(run.spec),
                           chosen=run.plan["chosen"], layout_tag="tp1-pp1-dp2-z2-mb2", engine="deepspeed")
    sink.close()
    [log] = list((new / "wandb").glob("offline-run-*/run-*.wandb"))
    lines = subprocess.run([*_wandb_cli(), "leet", "inspect", "--json", str(log)], capture_output=True, text=True,
                           timeout=120).stdout.splitlines()
    [run_record] = [json.loads(line)["run"] for line in lines if json.loads(line).get("type") == "run"]
    source_name = yaml.safe_load((source / "spec.resolved.yaml").read_text())["name"]
    assert run_record["run_group"] == source_name != "tiny-continued"
    parent = run_record["config"]["update"]["resumed_from"]
    assert parent["wandb_run_id"] == "srcrun01" and parent["step"] == 4 and parent["run_dir"] == str(source.resolve())
    assert parent["old_layout"] == "1x2 tp1-pp1-dp2-z2" and parent["conversion"] == "copy"
    summaries = [json.loads(line)["summary"]["update"] for line in lines if json.loads(line).get("type") == "summary"]
    assert any(s.get("resumed_from", {}).get("wandb_run_id") == "srcrun01" for s in summaries)
    assert "resized" in run_record.get("tags", [])
