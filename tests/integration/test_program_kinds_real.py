"""User programs for real: the argv a megatron-lm run dir's launch scripts run passes Megatron-LM core_v0.16.1's
own parse_args + validate_args (ORCH_MEGATRON_LM), the Hugging Face Trainer accepts the TrainingArguments orch
passes beside its ds_config.json (transformers' own HfTrainerDeepSpeedConfig), the iteration-line parser knows
training_log's labels, and a DeepSpeed tutorial-style script runs through `orch launch --wait`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan import build_plan
from orchestrator.programs import load_program, substitute_run_dir
from orchestrator.rundir import write_run_dir
from orchestrator.spec_loader import load_spec
from orchestrator.userfiles import dump_yaml
from orchestrator.validate.megatron_lm import (HOW_TO_ENABLE, LmRun, check_with_megatron_lm, launch_script_env,
                                               megatron_lm_reports, megatron_lm_root)
from tests.conftest import EXAMPLES, ROOT, spec_data
from tests.integration.train_support import job_env

pytestmark = pytest.mark.integration
ORCH = str(Path(sys.executable).parent / "orch")
LAUNCH_SCRIPTS = ("launch_local.sh", "launch.sbatch", "launch_pdsh.sh")


def lm_root() -> Path:
    root = megatron_lm_root()
    if root is None or not (root / "pretrain_gpt.py").is_file():
        pytest.skip(f"ORCH_MEGATRON_LM is not set to a tree with pretrain_gpt.py: {HOW_TO_ENABLE}")
    return root


def _megatron_specs(root: Path, tmp_path: Path) -> dict[str, Path]:
    """The example, and tiny layouts exercising pipeline, context and uneven splits through the program argv."""
    base = {"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8, "training.engine": "megatron",
            "training.precision": "bf16", "training.global_batch_size": 16, "parallelism.zero_stage": 1,
            "parallelism.micro_batch_size": 1, "program": {"kind": "megatron-lm", "megatron_lm": str(root),
                                                            "args": ["--log-memory-to-tensorboard"]}}
    cases = {"tp2-pp2": {"parallelism.tensor": 2, "parallelism.pipeline": 2},
             "tp1-pp2-vpp2": {"model.num_layers": 8, "parallelism.pipeline": 2, "parallelism.virtual_pipeline": 2},
             "tp2-cp2-dataset": {"parallelism.tensor": 2, "parallelism.context": 2,
                                 "data": {"synthetic": False, "path": "/data/my_text_document"}}}
    specs = {"example": EXAMPLES / "megatron-lm-gpt.yaml"}
    for name, overrides in cases.items():
        specs[name] = tmp_path / f"{name}.yaml"
        specs[name].write_text(yaml.safe_dump(spec_data(**base, **overrides)))
    return specs


def test_every_launch_scripts_program_argv_passes_megatron_lms_validate_args(tmp_path):
    root = lm_root()
    runs, names = [], []
    for name, spec_path in _megatron_specs(root, tmp_path).items():
        run = write_run_dir(build_plan(load_spec(spec_path), top_k=1), tmp_path / name)
        argv = substitute_run_dir(load_program(run)["argv"], run)
        assert argv[0] == str(root / "pretrain_gpt.py") and ("--log-memory-to-tensorboard" in argv) == (name != "example")
        world = load_spec(run / "spec.resolved.yaml").world_size
        for script in LAUNCH_SCRIPTS:
            text = (run / script).read_text()
            assert "orchestrator.programs" in text, script
            env = launch_script_env(text) if script != "launch_pdsh.sh" else _pdsh_env(text)
            runs.append(LmRun(argv[1:], world, env, f"{name}/{script}"))
            names.append(f"{name}/{script}")
    verdicts = megatron_lm_reports(runs, megatron_lm_root=root)
    failed = {name: [str(p) for p in problems] for name, (problems, _) in zip(names, verdicts) if problems}
    assert failed == {}
    print(f"Megatron-LM validate_args accepted {len(runs)} program argvs ({len(runs) // 3} run dirs x 3 scripts)")


def _pdsh_env(text: str) -> dict[str, str]:
    """The NAME=value settings launch_pdsh.sh puts in the ranks' environment (remote_env=...)."""
    line = next(l for l in text.splitlines() if l.startswith("remote_env="))
    import shlex

    return dict(item.split("=", 1) for item in shlex.split(shlex.split(line.split("=", 1)[1])[0]))


def test_megatron_lms_parser_names_an_unknown_flag(tmp_path):
    root = lm_root()
    run = write_run_dir(build_plan(load_spec(EXAMPLES / "megatron-lm-gpt.yaml")), tmp_path / "run")
    argv = substitute_run_dir(load_program(run)["argv"], run)[1:] + ["--no-such-flag"]
    env = launch_script_env((run / "launch_local.sh").read_text())
    [problem] = check_with_megatron_lm(argv, world_size=8, env=env, megatron_lm_root=root)
    assert "--no-such-flag" in str(problem), str(problem)


def test_training_logs_labels_are_the_parsers():
    """Every label parse_iteration_line reads is printed by the pinned release's training_log, but the loss, whose
    name is the key of pretrain_gpt.py's loss report."""
    from orchestrator.programs.megatron_log import FIELDS

    source = (lm_root() / "megatron" / "training" / "training.py").read_text()
    body = source[source.index("def training_log("):]
    body = body[:body.index("\ndef ", 1)]
    missing = [label for label in FIELDS if label not in body and label != "lm loss"]
    assert missing == [] and " iteration {:8d}/{:8d} |" in body
    assert "{'lm loss': " in (lm_root() / "pretrain_gpt.py").read_text()


HF_CHECK = r'''
import json, sys
from transformers import HfArgumentParser, TrainingArguments
results = []
for case in json.loads(sys.stdin.read()):
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(case["argv"])
    config = args.hf_deepspeed_config
    try:
        config.trainer_config_finalize(args, model=None, num_training_steps=args.max_steps)
        results.append({"name": case["name"], "error": None})
    except ValueError as e:
        results.append({"name": case["name"], "error": str(e)})
print("RESULTS " + json.dumps(results))
'''


def test_the_hf_trainer_accepts_orchs_training_arguments_beside_its_ds_config(tmp_path):
    """transformers' HfTrainerDeepSpeedConfig compares every ds_config value with TrainingArguments and refuses a
    mismatch; orch's arguments (after the user's own, which they override) must leave none."""
    pytest.importorskip("transformers")
    script = tmp_path / "hf_train.py"
    script.write_text("# a Trainer script\n")
    cases = {"cosine-warmup": {}, "linear-no-warmup": {"training.lr_schedule": {"warmup_iters": 0, "decay": "linear"}},
             "constant-sgd-zero3": {"training.lr_schedule": {"warmup_iters": 3, "decay": "constant"},
                                    "training.optimizer": {"type": "sgd", "lr": 0.05}, "parallelism.zero_stage": 3},
             "no-clipping-zero1": {"training.gradient_clipping": 0.0, "parallelism.zero_stage": 1},
             "bf16": {"training.precision": "bf16"}}
    requests = []
    for name, overrides in cases.items():
        data = spec_data(**{"cluster.gpus_per_node": 1, "training.global_batch_size": 4, **overrides,
                            "program": {"kind": "script", "path": str(script), "ds_config_arg": "--deepspeed",
                                        "args": ["--learning_rate", "5e-5", "--max_steps", "3"]}})
        spec_path = tmp_path / f"{name}.yaml"
        spec_path.write_text(dump_yaml(data))   # as orch writes YAML: '5e-05' stays a string
        run = write_run_dir(build_plan(load_spec(spec_path), top_k=1), tmp_path / name)
        requests.append({"name": name, "argv": substitute_run_dir(load_program(run)["argv"], run)[1:]})
    env = job_env(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc = subprocess.run([sys.executable, "-c", HF_CHECK], input=json.dumps(requests), capture_output=True,
                          text=True, env=env, timeout=600, cwd=tmp_path)
    found = re.search(r"^RESULTS (.*)$", proc.stdout, re.M)
    assert found, proc.stderr[-3000:]
    assert [r for r in json.loads(found.group(1)) if r["error"]] == []


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUNNER = ROOT / "orchestrator" / "programs" / "__main__.py"


@pytest.mark.skipif(not RUNNER.is_file(), reason="orchestrator/programs/__main__.py (the telemetry wrapper) is not "
                    "in this checkout yet")
def test_a_deepspeed_script_runs_through_orch_launch(tmp_path):
    run = tmp_path / "run"
    env = job_env(ORCH_ENTRY=None, WANDB_MODE="offline")
    made = subprocess.run([ORCH, "generate", str(EXAMPLES / "ds-script-cpu.yaml"), "-o", str(run)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    done = subprocess.run([ORCH, "launch", str(run), "--wait", "--timeout", "400"], capture_output=True, text=True,
                          env=env, timeout=450)
    logs = "\n".join(p.read_text(errors="replace") for p in (run / "logs").rglob("*") if p.is_file())
    assert done.returncode == 0, done.stderr[-3000:] + logs[-3000:]
    assert "COMPLETED" in done.stderr and "step 10 loss" in logs


def test_orch_doctor_measures_a_script_run_dir_through_its_launch_script(tmp_path):
    """The doctor's ORCH_ENTRY replaces the program runner as it replaces orch's trainer."""
    run = tmp_path / "run"
    env = job_env(ORCH_ENTRY=None)
    assert subprocess.run([ORCH, "generate", str(EXAMPLES / "ds-script-cpu.yaml"), "-o", str(run)], env=env,
                          capture_output=True, timeout=120).returncode == 0
    done = subprocess.run([ORCH, "doctor", str(run), "--quick", "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["healthy"] and len(report["ranks"]) == 2
