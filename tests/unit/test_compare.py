"""orch compare on synthetic metrics: statistics, warm-up rule, breakdown, diff, winner, loading errors, CLI."""
from __future__ import annotations

import json
import random
import statistics

import pytest
import yaml

from orchestrator import compare as cmp
from orchestrator.errors import SpecError
from orchestrator.runs import load_run, load_runs, parse_transaction_log, parse_wandb_path, run_from_wandb
from tests.unit.compare_support import make_run_dir, record, steady, write_metrics
from tests.deadlines import scaled_s
from tests.conftest import run_cli


# --- statistics ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 101])
def test_percentile_is_numpys_linear_interpolation(n):
    np = pytest.importorskip("numpy")
    rng = random.Random(n)
    values = [rng.uniform(0.1, 2.0) for _ in range(n)]
    for q in (0, 10, 50, 90, 99, 100):
        assert cmp.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert cmp.median(values) == pytest.approx(statistics.median(values), rel=1e-12)


@pytest.mark.parametrize("num_steps, requested, expected", [
    (1, None, 0), (2, None, 0), (3, None, 1), (4, None, 1), (5, None, 2), (7, None, 3), (50, None, 3),
    (10, 0, 0), (10, 5, 5), (4, 9, 3)])
def test_warmup_rule(num_steps, requested, expected):
    assert cmp.warmup_steps(num_steps, requested) == expected


def test_measured_stats_skip_warmup_and_keep_peak_memory():
    records = steady(10, 0.1)
    records[0]["mem_peak_bytes"] = 999 * 2**20            # the peak may be reached in a warm-up step
    stats = cmp.measured_stats(records, 3)
    kept = [r["step_time_s"] for r in records[3:]]
    assert stats["step_time_s"] == pytest.approx(statistics.median(kept))
    assert stats["step_time_p90_s"] == pytest.approx(statistics.quantiles(kept, n=10, method="inclusive")[8])
    assert stats["tokens_per_s"] == pytest.approx(statistics.median(r["tokens_per_s"] for r in records[3:]))
    assert stats["mem_peak_bytes"] == 999 * 2**20
    assert max(kept) < 0.2 < records[0]["step_time_s"]    # warm-up steps are not in the statistics


def test_step_breakdown_adds_up_and_clips():
    b = cmp.step_breakdown(record(1, 1.0, compute_s=0.6, allreduce_s=0.3, exposed_s=0.2, bubble=0.1))
    assert b == pytest.approx({"compute_s": 0.6, "bubble_s": 0.1, "exposed_comm_s": 0.2, "other_s": 0.1})
    b = cmp.step_breakdown(record(1, 1.0, compute_s=0.7, exposed_s=0.5, bubble=0.4))   # overlapping measures
    assert b == pytest.approx({"compute_s": 0.7, "bubble_s": 0.3, "exposed_comm_s": 0.0, "other_s": 0.0})
    assert sum(b.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("pred, meas, expected", [(1.2, 1.0, 20.0), (0.5, 1.0, -50.0), (0.0, 0.0, 0.0),
                                                  (0.1, 0.0, None), (None, 1.0, None)])
def test_error_pct(pred, meas, expected):
    assert cmp.error_pct(pred, meas) == (pytest.approx(expected) if expected is not None else None)


def test_predicted_breakdown_sums_to_the_predicted_step(tmp_path):
    run = load_run(str(make_run_dir(tmp_path / "r", steady(6, 0.1))))
    parts = cmp.predicted_breakdown(run.chosen)
    assert sum(parts.values()) == pytest.approx(run.chosen["step_time_s"], rel=1e-9)
    assert cmp.predicted_breakdown({}) == {}


# --- across runs ---------------------------------------------------------------------------------------

@pytest.fixture
def two_runs(tmp_path):
    """ZeRO-1 (slower, comm-bound) and ZeRO-2 with a different train_iters."""
    z1 = make_run_dir(tmp_path / "z1", steady(8, 0.2, allreduce_s=0.08), **{"parallelism.zero_stage": 1})
    z2 = make_run_dir(tmp_path / "z2", steady(8, 0.1, allreduce_s=0.01),
                      **{"parallelism.zero_stage": 2, "training.train_iters": 12})
    return z1, z2


def test_diff_names_layout_and_spec_fields(two_runs):
    result = cmp.compare([str(p) for p in two_runs])
    assert result.diff["layout"] == [{"field": "zero_stage", "values": [1, 2]}]
    assert result.diff["spec"] == [{"path": "training.train_iters", "values": [10, 12]}]


def test_winner_and_reason(two_runs):
    result = cmp.compare([str(p) for p in two_runs])
    w = result.winner
    assert (w["label"], w["runner_up"], w["criterion"]) == ("tp1-pp1-dp2-z2-mb2", "tp1-pp1-dp2-z1-mb2", "tokens_per_s")
    rates = [r.measured["tokens_per_s"] for r in result.runs]
    assert w["speedup"] == pytest.approx(rates[1] / rates[0])
    assert w["reason"] == "compute_s"   # record(): compute is 80% of each step, so most of the 2x is compute
    assert "wins" in w["explanation"] and "MFU" in w["explanation"]


def test_reason_bubble_and_comm(tmp_path):
    base = make_run_dir(tmp_path / "a", [record(s, 0.1, compute_s=0.08, allreduce_s=0.01) for s in range(1, 8)])
    bubbly = make_run_dir(tmp_path / "b", [record(s, 0.2, compute_s=0.08, allreduce_s=0.01, bubble=0.5)
                                           for s in range(1, 8)], **{"parallelism.zero_stage": 1})
    chatty = make_run_dir(tmp_path / "c", [record(s, 0.2, compute_s=0.08, allreduce_s=0.11)
                                           for s in range(1, 8)], **{"parallelism.zero_stage": 3})
    assert cmp.compare([str(base), str(bubbly)]).winner["reason"] == "bubble_s"
    result = cmp.compare([str(chatty), str(base)])
    assert (result.winner["index"], result.winner["reason"]) == (1, "exposed_comm_s")
    assert "less exposed communication" in result.winner["explanation"]


def test_labels_tell_runs_apart(tmp_path):
    a = make_run_dir(tmp_path / "a", steady(5, 0.1))
    b = make_run_dir(tmp_path / "b", steady(5, 0.1), name="other")
    runs = load_runs([str(a), str(b), str(a)])
    assert cmp.run_labels(runs) == ["tp1-pp1-dp2-z2-mb2#1", "tp1-pp1-dp2-z2-mb2#2", "tp1-pp1-dp2-z2-mb2#3"]
    assert cmp.run_labels(runs[:2]) == ["tiny:tp1-pp1-dp2-z2-mb2", "other:tp1-pp1-dp2-z2-mb2"]


def test_winner_criteria_for_other_models_and_world_sizes(tmp_path):
    a = make_run_dir(tmp_path / "a", steady(5, 0.1))
    wide = make_run_dir(tmp_path / "w", steady(5, 0.1), **{"model.hidden_size": 256})
    big = make_run_dir(tmp_path / "n", steady(5, 0.1), **{"cluster.gpus_per_node": 4,
                                                          "training.global_batch_size": 16})
    assert cmp.compare([str(a), str(big)]).winner["criterion"] == "tokens_per_s_per_gpu"
    winner = cmp.compare([str(a), str(wide)]).winner     # different models: their rates measure different work
    assert (winner["label"], winner["criterion"], winner["speedup"]) == (None, None, None)
    assert winner["models_differ"] == ["model.ffn_hidden_size", "model.hidden_size"]   # ffn derives from hidden
    assert winner["explanation"].startswith("no winner: the runs train different models (model.ffn_hidden_size, "
                                            "model.hidden_size differ)")


def test_cli_says_the_models_differ_and_names_no_winner(tmp_path, capsys):
    a = make_run_dir(tmp_path / "a", steady(5, 0.1))
    wide = make_run_dir(tmp_path / "w", steady(5, 0.05), **{"model.hidden_size": 256})
    code, out, err = run_cli(["compare", str(a), str(wide)], capsys)
    assert code == 0, err
    assert "winner: no winner: the runs train different models" in out and " wins" not in out


def test_json_shape(two_runs):
    data = cmp.compare([str(p) for p in two_runs]).to_dict()
    assert set(data) == {"warmup", "runs", "diff", "winner", "resizes"} and data["resizes"] == []
    run = data["runs"][0]
    assert set(run) == {"label", "source", "kind", "spec_name", "tag", "layout", "cluster", "steps", "measured",
                        "predicted", "error_pct", "breakdown", "series"}
    assert run["steps"] == {"recorded": 8, "first": 1, "last": 8, "warmup": 3, "measured": 5}
    assert set(run["measured"]) == set(cmp.PREDICTED_KEYS) | {"step_time_p90_s"}
    assert set(run["error_pct"]) == set(cmp.PREDICTED_KEYS)
    assert set(run["predicted"]) == set(cmp.PREDICTED_KEYS) - set(cmp.OPTIONAL_MEDIAN_KEYS)   # a dense run
    assert all(run["measured"][k] is None for k in cmp.OPTIONAL_MEDIAN_KEYS)
    assert set(run["breakdown"]["measured"]) == set(cmp.COMPONENTS)
    assert run["series"]["step"] == list(range(1, 9))
    assert json.loads(json.dumps(data)) == data


# --- loading -------------------------------------------------------------------------------------------

def test_metrics_reader(tmp_path):
    run_dir = make_run_dir(tmp_path / "r", steady(5, 0.1))
    path = run_dir / "metrics.jsonl"
    text = path.read_text()
    path.write_text(text + json.dumps(record(3, 0.5)) + "\n" + '{"step": 6, "time')   # re-logged step, torn line
    run = load_run(str(run_dir))
    assert [r["step"] for r in run.records] == [1, 2, 3, 4, 5] and run.records[2]["step_time_s"] == 0.5


@pytest.mark.parametrize("content, message", [
    ("", "no metrics records"),
    ('{"step": 1}\n' + json.dumps(record(2, 0.1)) + "\n", "step_time_s is missing"),
    ("not json\n" + json.dumps(record(2, 0.1)) + "\n", "not a JSON record"),
    (json.dumps({**record(1, 0.1), "mfu": "high"}) + "\n", "mfu must be a number"),
    (json.dumps({**record(1, 0.1), "step": 0}) + "\n", "step must be an integer"),
])
def test_bad_metrics_are_clear_errors(tmp_path, capsys, content, message):
    run_dir = make_run_dir(tmp_path / "r")
    (run_dir / "metrics.jsonl").write_text(content)
    code, _, err = run_cli(["compare", str(run_dir)], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_bad_run_arguments_exit_2_all_listed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    untrained = make_run_dir(tmp_path / "untrained")
    old = make_run_dir(tmp_path / "old", steady(5, 0.1))
    spec_file = old / "spec.resolved.yaml"
    data = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**data, "spec_version": 2}))
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(["compare", str(tmp_path / "missing"), str(untrained), str(old), str(tmp_path / "empty"),
                              "acme/orch/abc123"], capsys)
    assert code == 2 and out == ""
    assert f"{tmp_path / 'missing'}: no such run dir" in err
    assert f"{untrained}: metrics.jsonl: no metrics" in err
    assert "spec_version: the run was written for spec version 2; this orch reads version 1" in err
    assert f"{tmp_path / 'empty'}: not a run dir" in err
    assert "acme/orch/abc123: no such run dir, and reading W&B run acme/orch/abc123 needs W&B online, but " \
           "WANDB_MODE=offline" in err
    assert "5 problems found" in err


def test_wandb_path_without_login_is_refused(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with pytest.raises(SpecError, match="needs a W&B login"):
        load_run("acme/orch/abc123")


@pytest.mark.parametrize("text, path", [("acme/orch/abc123", "acme/orch/abc123"),
                                        ("https://wandb.ai/acme/orch/runs/abc123", "acme/orch/abc123"),
                                        ("acme/orch/runs/abc123", "acme/orch/abc123"),
                                        ("/abs/path/x", None), ("a/b", None), ("a/b/c/d", None)])
def test_wandb_paths(text, path):
    assert parse_wandb_path(text) == path


def test_wandb_transaction_log_gives_the_run_dirs_numbers(tmp_path):
    """The JSON lines of `wandb leet inspect --json`, as the trainer's W&B sink writes them."""
    run_dir = make_run_dir(tmp_path / "r", steady(6, 0.1))
    direct = load_run(str(run_dir))
    lines = [{"type": "header", "header": {}},
             {"type": "run", "run": {"config": {"update": {"spec": yaml.safe_load((run_dir / "spec.resolved.yaml")
                                                                               .read_text()),
                                                           "plan": direct.chosen, "layout": direct.tag}}}}]
    for i, r in enumerate(direct.records):
        lines.append({"type": "history", "history": {"item": {"_step": i, "_runtime": 1.0 * i, **r}}})
        lines.append({"type": "summary", "summary": {"update": dict(r)}})
    run = parse_transaction_log("\n".join(json.dumps(x) for x in lines))
    from_wandb = run_from_wandb("w", "wandb_offline", run)
    assert from_wandb.records == direct.records and from_wandb.spec == direct.spec
    a, b = cmp.compare_runs([direct]).to_dict()["runs"][0], cmp.compare_runs([from_wandb]).to_dict()["runs"][0]
    assert {k: v for k, v in a.items() if k not in ("source", "kind")} == \
        {k: v for k, v in b.items() if k not in ("source", "kind")}
    with pytest.raises(SpecError, match="not a W&B run logged by orch"):
        run_from_wandb("w", "wandb_offline", parse_transaction_log(json.dumps(lines[0])))


def test_resumed_wandb_runs_are_read_together(tmp_path, monkeypatch):
    """A resumed job leaves two offline-run-* directories of one run id; RUN_DIR/wandb reads both."""
    import orchestrator.runs as runs_module

    run_dir = make_run_dir(tmp_path / "r", steady(6, 0.1))
    direct = load_run(str(run_dir))
    config = {"spec": yaml.safe_load((run_dir / "spec.resolved.yaml").read_text()), "plan": direct.chosen}
    parts = {"offline-run-20260101_000000-abc": direct.records[:4],                 # preempted after step 4
             "offline-run-20260101_010000-abc": direct.records[2:]}                 # resumed from step 2
    for name in parts:
        (tmp_path / "r" / "wandb" / name).mkdir(parents=True)
        (tmp_path / "r" / "wandb" / name / "run-abc.wandb").write_bytes(b"")
    seen = []

    def fake_reader(source, wandb_file):
        seen.append(wandb_file.parent.name)
        return runs_module.WandbRun(config=dict(config), history=[dict(r) for r in parts[wandb_file.parent.name]],
                                    summary={})

    monkeypatch.setattr(runs_module, "read_wandb_offline", fake_reader)
    run = load_run(str(run_dir / "wandb"))
    assert seen == sorted(parts) and run.kind == "wandb_offline" and run.records == direct.records
    (tmp_path / "r" / "wandb" / "offline-run-20260102_000000-xyz").mkdir()
    (tmp_path / "r" / "wandb" / "offline-run-20260102_000000-xyz" / "run-xyz.wandb").write_bytes(b"")
    with pytest.raises(SpecError, match="2 different runs"):
        load_run(str(run_dir / "wandb"))


# --- CLI -----------------------------------------------------------------------------------------------

def test_cli_tables(two_runs, capsys):
    code, out, err = run_cli(["compare", *map(str, two_runs)], capsys)
    assert code == 0, err
    for text in ("what differs", "layout.zero_stage", "training.train_iters", "measured", "predicted (plan.json) vs "
                 "measured", "breakdown: compute s", "warm-up: the first 3 steps", "winner: tp1-pp1-dp2-z2-mb2 wins"):
        assert text in out


def test_cli_shows_one_exposed_communication_figure_per_run(tmp_path, capsys):
    # the median of comm_exposed_s (0.0217) and the breakdown's mean (pulled up by one step) differ
    records = [record(s, 0.1, exposed_s=0.0217) for s in range(1, 9)]
    records[-1] = record(8, 0.1, exposed_s=0.0917)
    run = make_run_dir(tmp_path / "a", records)
    result = cmp.compare([str(run)])
    median_s, mean_s = result.runs[0].measured["comm_exposed_s"], result.runs[0].breakdown_measured["exposed_comm_s"]
    assert f"{median_s:.4g}" != f"{mean_s:.4g}"
    code, out, _ = run_cli(["compare", str(run), "--wide"], capsys)
    assert code == 0
    assert f"{mean_s:.4g}" in out and f"{median_s:.4g}" not in out


def test_warmup_help_matches_what_it_does(tmp_path, capsys):
    run = make_run_dir(tmp_path / "a", steady(40, 0.1))
    code, out, _ = run_cli(["compare", str(run), "--warmup", "100"], capsys)
    assert code == 0 and "steps measured: tp1-pp1-dp2-z2-mb2 1 of 40" in " ".join(out.split())
    code, out, _ = run_cli(["compare", "--help"], capsys)
    assert code == 0 and "at most half" not in out and "up to all but the last step" in " ".join(out.split())


def test_cli_json_is_the_library_result(two_runs, capsys):
    code, out, _ = run_cli(["compare", *map(str, two_runs), "--json", "--warmup", "2"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data == json.loads(json.dumps(cmp.compare([str(p) for p in two_runs], warmup=2).to_dict()))
    assert data["warmup"]["steps"] == [2, 2]


def test_cli_plot_path_checked_before_work(two_runs, tmp_path, capsys):
    code, _, err = run_cli(["compare", *map(str, two_runs), "--plot", str(tmp_path / "nodir" / "x.png")], capsys)
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(["compare", *map(str, two_runs), "--plot", str(tmp_path / "x.jpg")], capsys)
    assert code == 2 and "name the file *.png" in err


def test_write_metrics_helper_roundtrip(tmp_path):
    path = write_metrics(tmp_path, [record(1, 0.1)])
    assert json.loads(path.read_text())["step"] == 1


def test_compare_and_calibrate_import_no_heavy_modules(two_runs):
    """--help, compare (no --plot) and calibrate never import matplotlib, wandb or the training stack."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys\nfrom orchestrator.cli import main\n"
            "for argv in (['--help'], ['compare', '--help'], ['calibrate', '--help'], ['compare', *sys.argv[1:3]],\n"
            "             ['calibrate', *sys.argv[1:3], '-o', sys.argv[3]]):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "heavy = [m for m in ('matplotlib', 'wandb', 'torch', 'deepspeed', 'numpy') if m in sys.modules]\n"
            "sys.stderr.write(repr(heavy))\n")
    calib = two_runs[0].parent / "calib.json"
    proc = subprocess.run([sys.executable, "-c", code, *map(str, two_runs), str(calib)], capture_output=True,
                          text=True, cwd=ROOT, timeout=scaled_s(120))
    assert proc.stderr.strip().endswith("[]"), proc.stderr
    assert calib.is_file()
