"""Resizing a kind-script DeepSpeed program without training: the spec flags, the follower, the script's
checkpoint checks, the copy conversion and what each start of the script is handed."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from orchestrator.errors import SpecError
from orchestrator.programs import RUN_DIR_TOKEN
from orchestrator.programs.argv import program_warnings, render_program
from orchestrator.programs.checkpoints import UNIVERSAL_DS_CONFIG, step_problem
from orchestrator.programs.resume import start_argv, start_of
from orchestrator.resize import follow_script
from orchestrator.rundir import read_run_dir
from orchestrator.spec_loader import parse_spec
from tests.conftest import ROOT, fixed_plan, run_cli, spec_data
from tests.unit.test_programs import problems_of, script, script_spec  # noqa: F401  (script: a fixture)

FLAGS = {"save_arg": "--save_dir", "load_arg": "--load_dir"}
LAYOUT = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "offload": "none"}


def save_step(ckpt_dir, step: int, shards: int = 2):
    """A stand-in for what engine.save_checkpoint writes at ZeRO-1/2 (real torch archives) and its latest file."""
    step_dir = ckpt_dir / f"global_step{step}"
    step_dir.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "step": step}, step_dir / "mp_rank_00_model_states.pt")
    for rank in range(shards):
        torch.save({"optimizer_state_dict": {"rank": rank}}, step_dir / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (ckpt_dir / "latest").write_text(f"global_step{step}")
    return step_dir


# --- the spec flags -------------------------------------------------------------------------------------

def test_the_save_flag_hands_the_script_the_checkpoint_dir_and_the_load_flag_is_left_to_each_start(script):
    program = render_program(fixed_plan(script_spec(script, **FLAGS)))
    assert program["argv"][-4:] == ["--deepspeed_config", f"{RUN_DIR_TOKEN}/ds_config.json", "--save_dir",
                                    f"{RUN_DIR_TOKEN}/checkpoints"]
    assert "--load_dir" not in program["argv"]
    warnings = program_warnings(fixed_plan(script_spec(script, args=["--save_dir", "x", "--load_dir", "y"], **FLAGS)))
    assert warnings and "--save_dir, --load_dir" in warnings[0]


def test_checkpoint_flags_must_differ_need_each_other_and_belong_to_kind_script(script):
    assert "is program.save_arg too" in problems_of(script_spec(script, save_arg="--ckpt", load_arg="--ckpt"))[
        "program.load_arg"]
    assert "set without program.save_arg" in problems_of(script_spec(script, load_arg="--load_dir"))["program.load_arg"]
    assert "is program.save_arg too" in problems_of(script_spec(script, save_arg="--deepspeed_config"))[
        "program.ds_config_arg"]
    megatron = spec_data(**{"program": {"kind": "megatron-lm", "megatron_lm": str(script.parent), "save_arg": "--s"}})
    assert "only kind script takes it" in problems_of(megatron)["program.save_arg"]
    assert "one flag such as --save_dir" in problems_of(script_spec(script, save_arg="two words"))["program.save_arg"]


# --- the follower ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, method", [
    ((2, 2), (1, 2), "universal"), ((2, 1), (1, 1), "universal"), ((2, 2), (1, 1), "universal"),
    ((2, 2), (2, 2), "copy"), ((2, 3), (1, 3), "universal"), ((2, 2), (1, 3), None), ((2, 0), (1, 0), None)])
def test_what_a_scripts_checkpoint_follows(script, old, new, method):
    spec = parse_spec(script_spec(script, **FLAGS))
    before, after = ({**LAYOUT, "dp": dp, "zero_stage": z} for dp, z in (old, new))
    if method is None:
        with pytest.raises(SpecError, match="cannot convert the checkpoint"):
            follow_script(before, after, spec)
        return
    conversion = follow_script(before, after, spec)
    assert conversion.method == method and f"--load_dir RUN_DIR/resume/{method}" in conversion.how
    assert (UNIVERSAL_DS_CONFIG in conversion.how) == (method == "universal")


def test_the_follower_refuses_a_pipeline_the_hf_trainer_and_a_script_orch_cannot_point_at_its_checkpoints(script):
    old, new = {**LAYOUT, "dp": 2, "zero_stage": 2}, {**LAYOUT, "dp": 1, "zero_stage": 2}
    with pytest.raises(SpecError, match="pp 2 -> 2: a PipelineModule checkpoint"):
        follow_script({**old, "pp": 2}, {**new, "pp": 2}, parse_spec(script_spec(script, **FLAGS)))
    with pytest.raises(SpecError, match="Hugging Face Trainer script saves checkpoint-<N>"):
        follow_script(old, new, parse_spec(script_spec(script, ds_config_arg="--deepspeed")))
    with pytest.raises(SpecError) as info:
        follow_script(old, new, parse_spec(script_spec(script)))
    assert [p.path for p in info.value.problems] == ["program.save_arg", "program.load_arg"]


# --- the script's checkpoints ---------------------------------------------------------------------------

def test_a_scripts_step_dir_is_sound_when_its_shards_are_all_there_and_pass_their_crcs(tmp_path):
    step_dir = save_step(tmp_path, 4)
    assert step_problem(tmp_path, 4, shards=2) is None
    assert "holds 2 optimizer shard(s)" in step_problem(tmp_path, 4, shards=3)
    assert step_problem(tmp_path, 5) == "missing"
    shard = step_dir / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:-40])
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt: not a readable torch archive" in step_problem(tmp_path, 4)
    (step_dir / "mp_rank_00_model_states.pt").unlink()
    assert "no *model_states.pt" in step_problem(tmp_path, 4)


@pytest.fixture
def source(tmp_path, script, capsys):
    """A generated 2-process kind-script run dir (ZeRO-2) whose script saved steps 4 and 6 (step 6 torn)."""
    data = yaml.safe_load((ROOT / "examples" / "ds-script-cpu.yaml").read_text())
    data["program"].update(path=str(script), **FLAGS)
    data["tracking"] = {"wandb": {"mode": "disabled"}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    run = tmp_path / "src"
    assert run_cli(["generate", str(spec), "-o", str(run)], capsys)[0] == 0
    save_step(run / "checkpoints", 4)
    save_step(run / "checkpoints", 6, shards=1)
    return run


def test_resize_continues_from_the_newest_sound_checkpoint_the_script_saved(source, tmp_path, capsys):
    new = tmp_path / "new"
    code, _, err = run_cli(["resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "-o", str(new)], capsys)
    assert code == 0, err
    resume = json.loads((new / "resume.json").read_text())
    assert resume["program"] == "script" and resume["source_step"] == 4      # step 6 lacks rank 1's shard
    assert resume["conversion"]["method"] == "universal" and resume["conversion"]["changes"] == ["dp 2 -> 1"]
    code, _, err = run_cli(["resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "--step", "6", "-o",
                            str(tmp_path / "six")], capsys)
    assert code == 2 and "holds 1 optimizer shard(s)" in err and not (tmp_path / "six").exists()


def test_a_script_without_checkpoint_flags_cannot_be_resized(tmp_path, script, capsys):
    data = yaml.safe_load((ROOT / "examples" / "ds-script-cpu.yaml").read_text())
    data["program"]["path"] = str(script)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    run = tmp_path / "src"
    assert run_cli(["generate", str(spec), "-o", str(run)], capsys)[0] == 0
    code, _, err = run_cli(["resize", str(run), "--nodes", "1", "--gpus-per-node", "1", "-o", str(tmp_path / "n")],
                           capsys)
    assert code == 2 and "program.save_arg" in err and "--save_dir" in err


# --- what each start loads ------------------------------------------------------------------------------

def test_each_start_loads_the_converted_checkpoint_then_the_runs_own(source, tmp_path, capsys):
    """Same layout (2x1 -> a 2-process spec as the source's): the copy conversion writes the step dir and the
    latest file engine.load_checkpoint reads; the first start loads it, a later one its own checkpoint."""
    from orchestrator.train.convert import main as convert_main

    new = tmp_path / "new"
    spec = yaml.safe_load((source / "spec.resolved.yaml").read_text())
    (tmp_path / "same.yaml").write_text(yaml.safe_dump(spec))
    code, _, err = run_cli(["generate", str(tmp_path / "same.yaml"), "-o", str(new), "--resume-from", str(source)],
                           capsys)
    assert code == 0, err
    run = read_run_dir(new)
    with pytest.raises(SpecError, match="run the conversion step first"):
        start_of(new, run.spec)                    # ranks started by hand, before the conversion step
    assert convert_main([str(new)]) == 0
    assert (new / "resume" / "copy" / "latest").read_text() == "global_step4"
    start = start_of(new, run.spec)
    assert (start.load_dir, start.step, start.ds_config) == (new / "resume" / "copy", 4, None)
    argv = ["train.py", "--deepspeed_config", str(new / "ds_config.json")]
    assert start_argv(argv, run.spec.program, start, new) == argv + ["--load_dir", str(new / "resume" / "copy")]

    save_step(new / "checkpoints", 5)
    start = start_of(new, run.spec)
    assert (start.load_dir, start.step) == (new / "checkpoints", 5)
    assert convert_main([str(new)]) == 0 and "checkpoint of its own (step 5)" in capsys.readouterr().err


def test_a_universal_start_hands_the_script_a_config_that_loads_it(tmp_path, source, capsys):
    from orchestrator.programs.resume import Start

    new = tmp_path / "new"
    assert run_cli(["resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "-o", str(new)], capsys)[0] == 0
    run = read_run_dir(new)
    out = new / "resume" / "universal"
    step_dir = save_step(out, 4, shards=1)            # what the conversion step writes, verified
    from orchestrator.train import checkpoint
    assert checkpoint.write_manifest(out, 4) is None and step_dir.is_dir()
    start = start_of(new, run.spec)
    config = json.loads(start.ds_config.read_text())
    assert start.ds_config == new / "resume" / UNIVERSAL_DS_CONFIG and config["checkpoint"]["load_universal"] is True
    assert "load_universal" not in json.dumps(json.loads((new / "ds_config.json").read_text()))
    argv = ["train.py", "--deepspeed_config", str(new / "ds_config.json"), "--save_dir", str(new / "checkpoints")]
    assert start_argv(argv, run.spec.program, start, new) == [
        "train.py", "--deepspeed_config", str(start.ds_config), "--save_dir", str(new / "checkpoints"),
        "--load_dir", str(out)]
    assert start_argv(argv, run.spec.program, Start(), new) == argv


def test_the_wrappers_steps_follow_the_step_the_engine_loaded(tmp_path, capsys):
    """DeepSpeedEngine.load_checkpoint, patched: before the first step, the numbering moves to the loaded
    global_steps; a load that found nothing, or one after steps were observed, changes nothing."""
    import types

    from orchestrator.telemetry.wrapper import ProgramTelemetry

    class Engine:
        global_steps = 7

        def load_checkpoint(self, load_dir, tag=None):
            return (None, None) if load_dir == "empty" else (f"{load_dir}/global_step7", {"step": 7})

        def _take_model_step(self):
            pass

        def backward(self, loss):
            pass

    telemetry = ProgramTelemetry(tmp_path, start_step=4)
    telemetry._patch_engine(types.SimpleNamespace(DeepSpeedEngine=Engine))
    assert Engine().load_checkpoint("empty") == (None, None) and telemetry.step == 4
    assert Engine().load_checkpoint("ckpt")[1] == {"step": 7}
    assert (telemetry.step, telemetry.start_step) == (7, 7)
    assert "loaded the checkpoint of step 7 (ckpt/global_step7), not of step 4" in capsys.readouterr().err
    telemetry.step = 8
    Engine.global_steps = 3
    Engine().load_checkpoint("ckpt")
    assert telemetry.step == 8
