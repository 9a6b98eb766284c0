"""orch resize / generate --resume-from without training: sizes, refusals, resume.json, status."""
from __future__ import annotations

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
    (("--zero-stage", "3"), "zero_stage 2 -> 3: DeepSpeed 0.19.8's universal checkpoint keeps the source's"),
    (("--gpus-per-node", "2", "--pipeline", "2", "--zero-stage", "1"), "pp 1 -> 2: a pipeline checkpoint"),
    (("--zero-stage", "0"), "ZeRO stage 0 in the new layout"),
], ids=["zero3", "pp2", "zero0"])
def test_a_change_the_checkpoint_cannot_follow_is_refused_by_name(source, tmp_path, capsys, args, named):
    new = tmp_path / "new"
    gpus = () if "--gpus-per-node" in args else ("--gpus-per-node", "1")
    assert orch("resize", str(source), "--nodes", "1", *gpus, *args, "-o", str(new)) == 2
    assert named in capsys.readouterr().err
    assert not new.exists()


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
    ((2, 2), (1, 3), None), ((2, 3), (1, 2), None), ((2, 0), (1, 0), None)])
def test_what_the_reference_trainer_converts(old, new, method):
    """(dp, zero_stage) -> (dp, zero_stage): verified on CPU with DeepSpeed 0.19.8 (docs/resize.md)."""
    from orchestrator.errors import SpecError
    from orchestrator.resize import follow_reference
    from orchestrator.spec_loader import parse_spec
    from tests.conftest import spec_data

    layout = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "offload": "none"}
    before, after = ({**layout, "dp": dp, "zero_stage": z} for dp, z in (old, new))
    if method is None:
        with pytest.raises(SpecError, match="cannot convert the checkpoint"):
            follow_reference(before, after, parse_spec(spec_data()))
    else:
        assert follow_reference(before, after, parse_spec(spec_data())).method == method


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
