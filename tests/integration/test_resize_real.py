"""Resize for real: one tiny-gpt-cpu source run (2 procs, ZeRO-2 dp 2, 20 steps, checkpoints every 5) is
resized from its step-10 checkpoint to pp 2 and to ZeRO-3 (orch's parameter-by-parameter load,
universal-params), those two back to ZeRO-2 dp 2 from their own step 15, and from its step 15 to dp 1
(DeepSpeed's universal loader).

The source's losses are the unresized run's. Every resumed run goes through `orch resize` and `orch launch`
(the conversion step before torchrun), records each remaining step once, leaves the source run byte-identical,
and reproduces the unresized losses to a relative 1e-5. Why that tolerance: the weights, both Adam moments, the
step count, the lr schedule and the samples are the source's exactly (the loader compares them with the files
before training), so only the floating-point summation order differs (dp all-reduce, ZeRO partitions, the
pipeline's per-micro-batch loss): measured <= 1e-7 relative in fp32 at every step, 100x below the bound. The
first resumed step's loss checks the weights; the later ones the optimizer state (zeroed moments or a reset
step count would change the update, and with it the next loss, by far more).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.deadlines import scaled_s
from tests.integration.train_support import JOB_TIMEOUT_S, job_env, load_metrics, train

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

ORCH = str(Path(sys.executable).parent / "orch")
STEPS, RESIZED_AT, BACK_AT = 20, 10, 15
REL_TOLERANCE = 1e-5


def _orch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *args], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                          timeout=scaled_s(JOB_TIMEOUT_S))


def _digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The unresized run, trained to the end: (run dir, step -> loss, digests of its files)."""
    root = tmp_path_factory.mktemp("resize")
    data = yaml.safe_load((ROOT / "examples" / "tiny-gpt-cpu.yaml").read_text())
    data["training"].update(train_iters=STEPS, checkpoint={"dir": "checkpoints", "interval": 5})
    data["tracking"] = {"wandb": {"mode": "disabled"}}
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    run = root / "src"
    assert _orch("generate", str(spec), "-o", str(run)).returncode == 0
    train(run)
    losses = {r["step"]: r["loss"] for r in load_metrics(run)}
    assert sorted(losses) == list(range(1, STEPS + 1))
    return run, losses, _digests(run)


def _resize_and_launch(from_dir: Path, new: Path, step: int, *args: str) -> dict:
    """orch resize FROM --step STEP ARGS, then orch launch --wait; returns resume.json."""
    out = _orch("resize", str(from_dir), "--nodes", "1", "--step", str(step), *args, "-o", str(new))
    assert out.returncode == 0, out.stderr
    launched = _orch("launch", str(new), "--wait")
    log = (new / "logs" / "launch.log").read_text()
    assert launched.returncode == 0, f"{launched.stderr[-3000:]}\n{log[-6000:]}"
    resume = json.loads((new / "resume.json").read_text())
    verified = ("; every parameter's fp32 weights, Adam moments and the step count verified against it"
                if resume["conversion"]["method"] == "universal-params" else "")
    assert f"({resume['conversion']['method']}, step {step}){verified}" in log, log[-6000:]
    return resume


def _continues(source, new: Path, step: int) -> None:
    """``new`` recorded each step after ``step`` once, with the unresized run's losses; the source is untouched."""
    run, losses, before = source
    records = load_metrics(new)
    assert [r["step"] for r in records] == list(range(step + 1, STEPS + 1))
    assert json.loads((new / "train_info.json").read_text())["start_step"] == step
    for record in records:
        assert record["loss"] == pytest.approx(losses[record["step"]], rel=REL_TOLERANCE), record["step"]
    assert _digests(run) == before


def test_resized_to_dp1_continues_through_deepspeeds_universal_loader(source, tmp_path):
    """dp 2 -> 1 from step 15 (5 steps on one process): DeepSpeed's own universal loader; the conversion step run
    by hand first, then again by `orch launch` (reused). The new run dir's path holds `$`, `(`, `+` and `[`, which
    DeepSpeed's converter cannot take in its own paths (convert._ds_to_universal runs it on relative names) and
    its load_checkpoint globs unescaped (checkpoint.globless loads through a plain-named link)."""
    run = source[0]
    new = tmp_path / "odd $(x) + y [1]" / "dp1"
    out = _orch("resize", str(run), "--nodes", "1", "--gpus-per-node", "1", "--step", str(BACK_AT), "-o", str(new))
    assert out.returncode == 0, out.stderr
    resume = json.loads((new / "resume.json").read_text())
    assert resume["source_step"] == BACK_AT and resume["conversion"]["changes"] == ["dp 2 -> 1"]
    assert resume["conversion"]["method"] == "universal"
    convert = subprocess.run([sys.executable, "-m", "orchestrator.train.convert", str(new)], cwd=ROOT, env=job_env(),
                             capture_output=True, text=True, timeout=scaled_s(JOB_TIMEOUT_S))
    assert convert.returncode == 0 and "[orch-convert] converted" in convert.stderr, convert.stderr[-3000:]
    converted = new / "resume" / "universal" / f"global_step{BACK_AT}"
    assert (converted / "orch_checkpoint.json").is_file() and (converted / "zero").is_dir()

    launched = _orch("launch", str(new), "--wait")          # runs the conversion step again: reused
    log = (new / "logs" / "launch.log").read_text()
    assert launched.returncode == 0, f"{launched.stderr[-3000:]}\n{log[-6000:]}"
    assert "[orch-convert] converted checkpoint" in log and "verifies: reused" in log
    assert "resized run: resumed from" in log and f"(universal, step {BACK_AT})" in log
    status = _orch("status", str(new))
    assert f"resized continuation of {run.resolve()} from step {BACK_AT}" in status.stdout, status.stdout
    _continues(source, new, BACK_AT)


@pytest.fixture(scope="module")
def to_pp2(source, tmp_path_factory):
    new = tmp_path_factory.mktemp("pp2") / "run"
    resume = _resize_and_launch(source[0], new, RESIZED_AT, "--pipeline", "2", "--zero-stage", "1")
    assert resume["conversion"]["method"] == "universal-params"
    assert resume["conversion"]["changes"] == ["pp 1 -> 2", "dp 2 -> 1", "zero_stage 2 -> 1"]
    return new


@pytest.fixture(scope="module")
def to_zero3(source, tmp_path_factory):
    new = tmp_path_factory.mktemp("zero3") / "run"
    resume = _resize_and_launch(source[0], new, RESIZED_AT, "--zero-stage", "3")
    assert (resume["conversion"]["method"], resume["conversion"]["changes"]) == ("universal-params",
                                                                                 ["zero_stage 2 -> 3"])
    return new


def test_resized_to_pp2_continues(source, to_pp2):
    assert json.loads((to_pp2 / "train_info.json").read_text())["layout"].startswith("tp1-pp2-dp1")
    _continues(source, to_pp2, RESIZED_AT)


def test_resized_to_zero3_continues(source, to_zero3):
    _continues(source, to_zero3, RESIZED_AT)


@pytest.mark.parametrize("origin, changes", [
    ("to_pp2", ["pp 2 -> 1", "dp 1 -> 2", "zero_stage 1 -> 2"]), ("to_zero3", ["zero_stage 3 -> 2"])])
def test_resized_back_to_zero2_dp2_continues(source, origin, changes, request, tmp_path):
    """The resized runs' own checkpoints (a pipeline one, a ZeRO-3 one) convert back to the source's layout."""
    new = tmp_path / "back"
    resume = _resize_and_launch(request.getfixturevalue(origin), new, BACK_AT, "--pipeline", "1", "--zero-stage", "2")
    assert (resume["conversion"]["method"], resume["conversion"]["changes"]) == ("universal-params", changes)
    _continues(source, new, BACK_AT)


VERIFY_SCRIPT = r'''
import json, os, sys
from pathlib import Path
import deepspeed, torch
from deepspeed.utils import safe_get_full_optimizer_state, safe_set_full_optimizer_state
from orchestrator.rundir import read_run_dir
from orchestrator.train import universal
from orchestrator.train.model import GPT
from orchestrator.train.trainer import ensure_process_group_env

source, converted, step = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
ensure_process_group_env()
deepspeed.init_distributed(verbose=False)
run = read_run_dir(source)
config = {**run.ds_config, "gradient_accumulation_steps": 8}           # the source's on 1 process: dp 1
torch.manual_seed(0)
model = GPT(run.spec.model)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
assert universal.load(engine, converted, step, run.spec.model, source_pp=1, pipelined=False) == step
name, param = next(iter(engine.module.named_parameters()))
safe_set_full_optimizer_state(param, safe_get_full_optimizer_state(param, "exp_avg") * 2, "exp_avg")
zero = converted / f"global_step{step}" / "zero"
params = [(n, p, zero / n) for n, p in engine.module.named_parameters()]
values = {n: {k: universal._read(d / f"{k}.pt") for k in ("fp32", *universal.MOMENTS)} for n, _, d in params}
adam_step = universal._adam_step(converted / f"global_step{step}", params)
found = universal.mismatches(engine, params, values, engine.optimizer.optimizer, adam_step)
print(json.dumps(found))
engine.destroy()
'''


def test_the_parameter_by_parameter_load_reads_back_what_it_set_and_catches_a_difference(source, to_pp2):
    """In one process (ZeRO-2 dp 1) the checkpoint converted for the pp 2 run loads and verifies; a moment
    changed afterwards is the one difference the read-back names."""
    converted = to_pp2 / "resume" / "universal-params"
    out = subprocess.run([sys.executable, "-c", VERIFY_SCRIPT, str(source[0]), str(converted), str(RESIZED_AT)],
                         cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=scaled_s(JOB_TIMEOUT_S))
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["embed.weight exp_avg differs from the checkpoint's"]


def test_a_converted_checkpoint_the_new_layout_cannot_hold_fails_the_run_cleanly(source, tmp_path):
    """A parameter in the universal checkpoint that no rank of the new layout has (here: a layer the model does
    not have, the manifest rewritten so that it verifies) fails every rank together, exit 1, naming it."""
    from orchestrator.train import checkpoint
    from orchestrator.train.convert import main as convert_main

    new = tmp_path / "zero3"
    out = _orch("resize", str(source[0]), "--nodes", "1", "--zero-stage", "3", "--step", str(RESIZED_AT),
                "-o", str(new))
    assert out.returncode == 0, out.stderr
    assert convert_main([str(new)]) == 0
    converted = new / "resume" / "universal-params"
    zero = converted / f"global_step{RESIZED_AT}" / "zero"
    (zero / "blocks.9.norm1.weight").mkdir()
    for name in ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"):
        (zero / "blocks.9.norm1.weight" / name).write_bytes((zero / "blocks.0.norm1.weight" / name).read_bytes())
    assert checkpoint.write_manifest(converted, RESIZED_AT) is None
    launched = _orch("launch", str(new), "--wait")
    log = (new / "logs" / "launch.log").read_text()
    assert launched.returncode == 1, log[-4000:]
    assert ("1 parameter(s) of the checkpoint are held by no rank of this layout, e.g. blocks.9.norm1.weight"
            in log), log[-4000:]
    assert not (new / "metrics.jsonl").exists() or not load_metrics(new)
    assert _digests(source[0]) == source[2]
