"""orch resize / generate --resume-from without training: sizes, refusals, resume.json, status."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.resize import describe
from orchestrator.rundir import manifest_problems, read_run_dir
from orchestrator.train import checkpoint
from tests.conftest import ROOT

SOURCE_STEP = 4


def orch(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def _spec_file(tmp_path, **changes):
    data = yaml.safe_load((ROOT / "examples" / "tiny-gpt-cpu.yaml").read_text())
    data["training"]["train_iters"] = 8
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*')))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def source(tmp_path):
    """A generated tiny-gpt-cpu run dir (dp 2, ZeRO-2) with a verified (stand-in) checkpoint of step 4."""
    run = tmp_path / "src"
    assert orch("generate", str(_spec_file(tmp_path)), "-o", str(run)) == 0
    step_dir = run / "checkpoints" / checkpoint.tag_for(SOURCE_STEP)
    step_dir.mkdir(parents=True)
    (step_dir / "stand-in.bin").write_bytes(b"weights")
    assert checkpoint.write_manifest(run / "checkpoints", SOURCE_STEP) is None
    return run


def _digests(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_resize_writes_a_run_dir_that_records_where_it_resumes_from(source, tmp_path, capsys):
    before = _digests(source)
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "-o", str(new)) == 0
    assert "checkpoint: universal (dp 2 -> 1)" in capsys.readouterr().err
    resume = json.loads((new / "resume.json").read_text())
    assert resume["source_run_dir"] == str(source.resolve()) and resume["source_step"] == SOURCE_STEP
    assert resume["source_checkpoint"] == str((source / "checkpoints" / "global_step4").resolve())
    assert (resume["old_layout"]["dp"], resume["new_layout"]["dp"]) == (2, 1)
    assert resume["old_layout"]["global_batch_size"] == resume["new_layout"]["global_batch_size"] == 16
    assert resume["conversion"]["method"] == "universal" and resume["conversion"]["changes"] == ["dp 2 -> 1"]
    run = read_run_dir(new)
    assert "resume.json" in run.manifest["files"] and manifest_problems(run) == []
    assert run.ds_config["gradient_accumulation_steps"] == 8 and run.spec.training.global_batch_size == 16
    assert describe(new).startswith(f"resized continuation of {source.resolve()} from step 4: 1x2 tp1-pp1-dp2-z2")
    assert describe(source) is None
    assert _digests(source) == before


def test_a_size_the_batch_cannot_divide_names_the_nearest_that_work(source, tmp_path, capsys):
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "3", "-o", str(new)) == 2
    err = capsys.readouterr().err
    assert "global_batch_size 16 does not divide by dp 6 * micro_batch_size 2 = 12" in err
    assert "--nodes 2 (4 GPUs) and --nodes 4 (8 GPUs)" in err
    assert not new.exists() and not list(tmp_path.glob(".new*"))


@pytest.mark.parametrize("args, named", [
    (("--zero-stage", "0"), "ZeRO stage 0 in the new layout"),
], ids=["zero0"])
def test_a_change_the_checkpoint_cannot_follow_is_refused_by_name(source, tmp_path, capsys, args, named):
    new = tmp_path / "new"
    gpus = () if "--gpus-per-node" in args else ("--gpus-per-node", "1")
    assert orch("resize", str(source), "--nodes", "1", *gpus, *args, "-o", str(new)) == 2
    assert named in capsys.readouterr().err
    assert not new.exists()


@pytest.mark.parametrize("args, changes", [
    (("--zero-stage", "3"), ["zero_stage 2 -> 3"]),
    (("--pipeline", "2", "--zero-stage", "1"), ["pp 1 -> 2", "dp 2 -> 1", "zero_stage 2 -> 1"]),
], ids=["zero3", "pp2"])
def test_pp_and_zero3_changes_convert_parameter_by_parameter(source, tmp_path, capsys, args, changes):
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "1", *args, "-o", str(new)) == 0
    conversion = json.loads((new / "resume.json").read_text())["conversion"]
    assert (conversion["method"], conversion["changes"]) == ("universal-params", changes)
    assert conversion["output"] == "resume/universal-params/global_step4"
    assert "safe_set_full_fp32_param" in conversion["how"]
    assert "checkpoint: universal-params" in capsys.readouterr().err


def test_scale_batch_scales_the_batch_and_the_learning_rate(source, tmp_path, capsys):
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "2", "--scale-batch", "-o", str(new)) == 0
    spec = read_run_dir(new).spec
    assert spec.training.global_batch_size == 32 and spec.training.optimizer.lr == pytest.approx(6e-3)
    assert spec.training.lr_schedule.min_lr == pytest.approx(6e-4) and spec.training.lr_schedule.warmup_iters == 3
    resume = json.loads((new / "resume.json").read_text())
    assert resume["lr_schedule"] == ("global batch 16 -> 32: peak lr 0.003 -> 0.006 and min_lr 0.0003 -> 0.0006 (x2, "
                                     "the linear scaling rule); warm-up 3 -> 3 steps, decay to step 8")


def test_generate_resume_from_refuses_another_training(source, tmp_path, capsys):
    spec = _spec_file(tmp_path, **{"training.seed": 7, "cluster.gpus_per_node": 1, "parallelism.data": 1})
    assert orch("generate", str(spec), "-o", str(tmp_path / "new"), "--resume-from", str(source)) == 2
    assert "training.seed: differs from the source run's" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    spec = _spec_file(tmp_path, **{"cluster.gpus_per_node": 1, "parallelism.data": 1})
    assert orch("generate", str(spec), "-o", str(tmp_path / "new"), "--resume-from", str(source)) == 0
    assert json.loads((tmp_path / "new" / "resume.json").read_text())["new_layout"]["dp"] == 1


def test_a_run_without_a_checkpoint_cannot_be_resized(tmp_path, capsys):
    run = tmp_path / "src"
    assert orch("generate", str(_spec_file(tmp_path)), "-o", str(run)) == 0
    assert orch("resize", str(run), "--nodes", "1", "--gpus-per-node", "1", "-o", str(tmp_path / "new")) == 2
    assert "has no intact checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("old, new, method", [
    ((2, 2), (2, 2), "copy"), ((2, 2), (1, 2), "universal"), ((2, 2), (4, 1), "universal"),
    ((2, 1), (1, 2), "universal"), ((2, 3), (1, 3), "universal"),
    ((2, 2), (1, 3), "universal-params"), ((2, 3), (1, 2), "universal-params"), ((2, 2), (2, 3), "universal-params"),
    ((2, 0), (1, 0), None), ((2, 2), (2, 0), None), ((2, 0), (2, 2), None)])
def test_what_the_reference_trainer_converts(old, new, method):
    """(dp, zero_stage) -> (dp, zero_stage) at pp 1 (docs/resize.md): DeepSpeed loads a dp change within
    ZeRO-1/2 or within ZeRO-3; orch loads a change into or out of ZeRO-3 parameter by parameter; ZeRO-0 is
    refused."""
    layout = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "offload": "none"}
    before, after = ({**layout, "dp": dp, "zero_stage": z} for dp, z in (old, new))
    _follows(before, after, method)


def _follows(before: dict, after: dict, method, named: str = "cannot convert the checkpoint", moe: bool = False):
    from orchestrator.errors import SpecError
    from orchestrator.resize import follow_reference
    from orchestrator.spec_loader import parse_spec
    from tests.conftest import spec_data

    data = spec_data()
    spec = parse_spec(data)
    if moe:
        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, moe=object()))
    if method is None:
        with pytest.raises(SpecError, match=named):
            follow_reference(before, after, spec)
    else:
        assert follow_reference(before, after, spec).method == method


BASE = {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "zero_stage": 2, "offload": "none"}


@pytest.mark.parametrize("old, new, method, named", [
    ({"pp": 1, "dp": 2, "zero_stage": 2}, {"pp": 2, "dp": 1, "zero_stage": 1}, "universal-params", None),
    ({"pp": 2, "dp": 1, "zero_stage": 1}, {"pp": 1, "dp": 2, "zero_stage": 2}, "universal-params", None),
    ({"pp": 2, "dp": 1, "zero_stage": 1}, {"pp": 1, "dp": 2, "zero_stage": 3}, "universal-params", None),
    ({"pp": 2, "dp": 1, "zero_stage": 1}, {"pp": 2, "dp": 2, "zero_stage": 1}, "universal-params", None),
    ({"pp": 2, "dp": 1, "zero_stage": 1}, {"pp": 2, "dp": 1, "zero_stage": 1}, "copy", None),
    ({}, {"tp": 2, "dp": 1}, None, "tp 1 -> 2: the reference trainer's DeepSpeed engine trains with tp 1"),
    ({}, {"cp": 2, "dp": 1}, None, "cp 1 -> 2: Ulysses context groups are not converted"),
    ({}, {"ep": 2}, None, "ep 1 -> 2: expert-parallel checkpoints are not converted"),
    ({}, {"offload": "cpu"}, None, "offload none -> cpu: loading a universal checkpoint into an offloaded"),
    ({"offload": "cpu"}, {"offload": "cpu", "dp": 1}, None, "offload cpu: loading a universal checkpoint"),
    ({"pp": 2, "dp": 1, "zero_stage": 0}, {"pp": 1, "dp": 2, "zero_stage": 2}, None,
     "ZeRO stage 0 in the source layout"),
], ids=["pp1-2", "pp2-1", "pp2-z3", "pp2-dp", "pp2-same", "tp", "cp", "ep", "offload", "offloaded", "pp-z0"])
def test_the_follower_accepts_pp_and_zero_changes_and_names_what_it_refuses(old, new, method, named):
    _follows({**BASE, **old}, {**BASE, **new}, method, named or "cannot convert the checkpoint")


def test_a_moe_model_is_refused_even_for_a_dp_change():
    _follows(BASE, {**BASE, "dp": 1}, None, "a MoE model: its expert checkpoint files are not converted", moe=True)
    _follows(BASE, BASE, "copy", moe=True)


def test_the_pipeline_names_of_the_gpt_parameters_are_deepspeeds():
    """model.pipeline_param_name / gpt_param_name against the names DeepSpeed's PipelineModule gives the layers
    of pipeline_specs (a LayerSpec's module under its index, a TiedLayerSpec's under tied_modules.<key>), tied
    and untied embeddings."""
    pytest.importorskip("deepspeed")
    from deepspeed.pipe import TiedLayerSpec

    from orchestrator.spec_loader import parse_spec
    from orchestrator.train.model import GPT, gpt_param_name, pipeline_param_name, pipeline_specs
    from tests.conftest import spec_data

    for tied in (True, False):
        m = dataclasses.replace(parse_spec(spec_data()).model, num_layers=3, hidden_size=32, num_attention_heads=2,
                                ffn_hidden_size=64, vocab_size=64, seq_length=16, tie_embeddings=tied)
        piped = []
        for index, layer in enumerate(pipeline_specs(m)):
            prefix = f"tied_modules.{layer.key}" if isinstance(layer, TiedLayerSpec) else str(index)
            piped += [f"{prefix}.{n}" for n, _ in layer.build().named_parameters()]
        piped = list(dict.fromkeys(piped))          # a tied module's parameters once, as named_parameters does
        names = [n for n, _ in GPT(m).named_parameters()]
        assert [pipeline_param_name(n, m) for n in names] == piped
        assert [gpt_param_name(n, m) for n in piped] == names
    with pytest.raises(ValueError, match="not a parameter name"):
        gpt_param_name("99.weight", m)


def test_the_copy_conversion_is_verified_idempotent_and_reads_the_source_only(source, tmp_path, capsys):
    """Same checkpoint layout (a spec as the source's): the step dir is copied into the new run dir, verified,
    reused by a second run, and a source checkpoint that no longer verifies fails the step (exit 1)."""
    from orchestrator.train.convert import main as convert_main

    spec = _spec_file(tmp_path)
    new = tmp_path / "new"
    assert orch("generate", str(spec), "-o", str(new), "--resume-from", str(source)) == 0
    assert json.loads((new / "resume.json").read_text())["conversion"]["method"] == "copy"
    before = _digests(source)
    assert convert_main([str(new)]) == 0
    copied = new / "resume" / "copy" / "global_step4"
    assert (copied / "stand-in.bin").read_bytes() == b"weights"
    assert checkpoint.step_problem(copied.parent, SOURCE_STEP) is None
    assert convert_main([str(new)]) == 0 and "verifies: reused" in capsys.readouterr().err
    assert _digests(source) == before

    other = tmp_path / "other"
    assert orch("generate", str(spec), "-o", str(other), "--resume-from", str(source)) == 0
    (source / "checkpoints" / "global_step4" / "stand-in.bin").write_bytes(b"torn")
    assert convert_main([str(other)]) == 1
    assert "stand-in.bin has 4 bytes, 7 were written" in capsys.readouterr().err
    assert not (other / "resume" / "copy").exists()


def test_the_local_launch_runs_the_conversion_step_before_torchrun(source, tmp_path):
    from orchestrator.launch import local

    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "1", "--gpus-per-node", "1", "-o", str(new)) == 0
    argv = local.build(read_run_dir(new)).argv
    assert argv[2].startswith('"$2" -m orchestrator.train.convert . && bash "$0"') and argv[-1] == sys.executable
    assert "orchestrator.train.convert" not in " ".join(local.build(read_run_dir(source)).argv)


def test_an_expert_grid_the_new_size_cannot_hold_names_the_nearest_sizes():
    from orchestrator.errors import SpecError
    from orchestrator.plan import build_plan
    from orchestrator.resize import check_size, resize_spec
    from orchestrator.spec_loader import load_spec

    source = build_plan(load_spec(ROOT / "examples" / "tiny-moe-cpu.yaml")).spec      # ep 2 on 2 ranks
    with pytest.raises(SpecError) as error:
        check_size(lambda n: resize_spec(source, nodes=n, gpus_per_node=1), 1, 1)
    assert ("the expert grid expert(2) * expert_tensor(1) = 2 needs a multiple of 2 ranks per pipeline stage, this "
            "size has 1 (nearest sizes that work: --nodes 2 (2 GPUs))") in str(error.value)


def test_resizing_a_pdsh_run_to_fewer_nodes_keeps_its_first_hosts(tmp_path, capsys):
    run = tmp_path / "src-pdsh"
    spec = _spec_file(tmp_path, **{"cluster.num_nodes": 2, "cluster.gpus_per_node": 1, "launch": {"backend": "pdsh",
                                   "pdsh": {"hosts": ["node-a", "node-b"]}}})
    assert orch("generate", str(spec), "-o", str(run)) == 0
    step_dir = run / "checkpoints" / checkpoint.tag_for(SOURCE_STEP)
    step_dir.mkdir(parents=True)
    (step_dir / "stand-in.bin").write_bytes(b"weights")
    assert checkpoint.write_manifest(run / "checkpoints", SOURCE_STEP) is None
    capsys.readouterr()
    assert orch("resize", str(run), "--nodes", "1", "-o", str(tmp_path / "new")) == 0   # 2 hosts for 1 node: refused before
    assert "launch.pdsh.hosts: the first 1 of the source's hosts (node-a)" in capsys.readouterr().err
    assert read_run_dir(tmp_path / "new").spec.launch.pdsh.hosts == ["node-a"]
    assert "HOSTS=node-a\n" in (tmp_path / "new" / "launch_pdsh.sh").read_text()


def test_a_program_that_is_not_the_reference_trainer_gets_no_parameter_by_parameter_load():
    """Another program kind's follower may defer to follow_reference (a user's DeepSpeed script loads with
    engine.load_checkpoint): the changes only orch's trainer can load stay refused for it, by name."""
    from orchestrator.errors import SpecError
    from orchestrator.resize import follow_reference
    from orchestrator.spec_loader import parse_spec
    from tests.conftest import spec_data

    spec = parse_spec(spec_data())
    spec = dataclasses.replace(spec, program=type("Program", (), {"kind": "script"})())
    with pytest.raises(SpecError, match="zero_stage 2 -> 3: DeepSpeed 0.19.8's universal loader looks for its own "
                                        "ZeRO stage's .* a 'script' program loads with engine.load_checkpoint"):
        follow_reference(BASE, {**BASE, "zero_stage": 3}, spec)
    assert follow_reference(BASE, {**BASE, "dp": 1}, spec).method == "universal"
