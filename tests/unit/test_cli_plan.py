"""`orch plan`: ranked table and why-lines for each example, --json as SPEC.md, exit 2 when nothing fits."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import EXAMPLES, ROOT
from tests.unit.test_estimate_step import COMM_KEYS, LAYOUT_KEYS, MEMORY_KEYS
from tests.deadlines import scaled_s
from tests.conftest import run_cli

PLAN_EXAMPLES = ["llama3-8b-64xh100", "gpt3-1.7b-32xa100", "gpt3-175b-1024xa100"]


@pytest.mark.parametrize("name", PLAN_EXAMPLES)
def test_plan_prints_a_ranked_table(name, capsys):
    code, out, err = run_cli(["plan", str(EXAMPLES / f"{name}.yaml"), "--top", "3", "--wide"], capsys)
    assert code == 0, err
    assert "layout" in out and "MFU" in out and "TFLOP/s" in out and "total GiB" in out
    ranks = [line.split()[0] for line in out.splitlines() if line[:1].isdigit()]
    assert ranks[:3] == ["1", "2", "3"]
    assert "- chose " in out and "- memory:" in out and "- time:" in out
    assert "- uncertainty ±" in out and "TFLOP/s ±" in out


@pytest.mark.parametrize("name", PLAN_EXAMPLES)
def test_plan_json_matches_spec_md(name, capsys):
    code, out, _ = run_cli(["plan", str(EXAMPLES / f"{name}.yaml"), "--json", "--top", "4"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"chosen", "candidates"}
    assert data["chosen"] == data["candidates"][0] and len(data["candidates"]) == 4
    for layout in data["candidates"]:
        assert LAYOUT_KEYS <= set(layout)
        assert MEMORY_KEYS <= set(layout["memory"]) and COMM_KEYS <= set(layout["comm"])
        assert layout["memory"]["fits"] is True
    assert out == json.dumps(data, sort_keys=True, indent=2) + "\n"


def test_plan_json_puts_the_plausibility_warning_on_stderr(capsys):
    # llama3-8b on 64 H100s is planned above the best MFU published on H100, at its margin (estimate/plausibility.py)
    code, out, err = run_cli(["plan", str(EXAMPLES / "llama3-8b-64xh100.yaml"), "--json"], capsys)
    assert code == 0 and set(json.loads(out)) == {"chosen", "candidates"}
    assert "warning: implausible prediction: MFU" in err


def test_example_fixed_fields_are_honoured(capsys):
    _, out, _ = run_cli(["plan", str(EXAMPLES / "gpt3-175b-1024xa100.yaml"), "--json"], capsys)
    chosen = json.loads(out)["chosen"]
    assert (chosen["tp"], chosen["pp"], chosen["dp"]) == (8, 16, 8)


def test_nothing_fits_exits_2_with_hints(tmp_path, capsys):
    spec = {"name": "too-big", "model": {"preset": "gpt3-1t"},
            "cluster": {"gpu": "a100-40gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"global_batch_size": 8}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run_cli(["plan", str(path)], capsys)
    assert code == 2 and out == ""
    assert "closest" in err and "more GPUs" in err and "Traceback" not in err


def test_invalid_spec_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nmodel: {preset: gpt3-1.7b}\n")
    code, _, err = run_cli(["plan", str(path)], capsys)
    assert code == 2 and "cluster" in err


def test_plan_imports_no_training_stack():
    code = ("import sys\nfrom orchestrator.cli import main\n"
            "try:\n    main(['plan', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'deepspeed', 'megatron', 'wandb') if m in sys.modules]\n"
            "sys.stderr.write(repr(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "llama3-8b-64xh100.yaml")],
                          capture_output=True, text=True, cwd=ROOT, timeout=scaled_s(120))
    assert proc.stderr.strip().endswith("[]"), proc.stderr


def test_doctor_help_and_status_import_no_training_stack(tmp_path):
    """`orch doctor --help` and `orch status` stay on the fast path: the probe's torch is imported on the ranks."""
    code = ("import sys\nfrom orchestrator.cli import main\nfrom orchestrator.launch.base import JobRecord\n"
            "JobRecord(backend='local', job_id='4194000', run_dir=sys.argv[1], submitted_unix=0.0).save()\n"
            "for argv in (['doctor', '--help'], ['status', sys.argv[1]]):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'deepspeed', 'megatron', 'wandb') if m in sys.modules]\n"
            "sys.stderr.write(repr(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=scaled_s(120))
    assert "Usage:" in proc.stdout and "local job 4194000:" in proc.stdout, proc.stdout + proc.stderr  # status ran
    assert proc.stderr.strip().endswith("[]"), proc.stdout + proc.stderr


def test_uneven_split_in_plan_json_and_generated_run_dir(tmp_path, capsys):
    """BLOOM-176B's layout: the split appears in the LAYOUT record, spec.resolved.yaml, the Megatron files,
    and plan.json notes that ds_config.json cannot express it (orch's trainer places it)."""
    from tests.published import BLOOM_176B, throughput_spec
    from tests.spec_variants import spec_with
    from orchestrator.spec import spec_to_data

    published = throughput_spec(BLOOM_176B)     # as run: DeepSpeed 0.6.2, dropout 0.1, Megatron's loss
    path = tmp_path / "bloom.yaml"
    path.write_text(yaml.safe_dump(spec_to_data(published)))
    code, out, err = run_cli(["plan", str(path), "--json"], capsys)
    assert code == 0, err                       # orch plan predicts the run as it ran ...
    code, out, err = run_cli(["generate", str(path), "-o", str(tmp_path / "refused")], capsys)
    assert code == 2 and not (tmp_path / "refused").exists()    # ... orch generate cannot write that software
    for field in ("training.engine_version", "training.cross_entropy_impl", "model.hidden_dropout"):
        assert field in err, err
    as_orch = spec_with(published, **{"training.engine_version": None, "training.cross_entropy_impl": None,
                                      "model.hidden_dropout": None, "model.attention_dropout": None})
    path.write_text(yaml.safe_dump(spec_to_data(as_orch)))
    code, out, err = run_cli(["plan", str(path), "--json"], capsys)
    assert code == 0, err
    chosen = json.loads(out)["chosen"]
    assert (chosen["first_stage_layers"], chosen["last_stage_layers"]) == (5, 5)
    assert chosen["tag"] == "tp4-pp12-f5l5-dp8-z1-mb2"
    code, out, err = run_cli(["generate", str(path), "-o", str(tmp_path / "run")], capsys)
    assert code == 0 and "orch's trainer places 5 + 10x6 + 5 transformer layers" in err
    run = tmp_path / "run"
    assert "first_stage_layers: 5" in (run / "spec.resolved.yaml").read_text()
    args = (run / "megatron_args.txt").read_text().split()
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "5"
    assert json.loads((run / "megatron_config.json").read_text())["num_layers_in_last_pipeline_stage"] == 5
    assert any("pipeline.partition" in n for n in json.loads((run / "plan.json").read_text())["notes"])
    code, out, _ = run_cli(["validate", "--static", str(run)], capsys)
    assert code == 0, out


def test_plan_prose_spells_booleans_as_the_spec_does(tmp_path, capsys):
    data = yaml.safe_load((EXAMPLES / "llama3-8b-64xh100.yaml").read_text())
    data["parallelism"] = {"tensor": 2, "pipeline": 1, "zero_stage": 3, "micro_batch_size": 2, "recompute": "none",
                           "offload": "none"}                 # open: only sequence_parallel, so the two differ in it
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(["plan", str(path), "--top", "3", "--wide"], capsys)
    assert code == 0, err
    assert "(sequence_parallel false)" in out      # YAML's spelling, not Python's
    assert "False" not in out and "True" not in out
