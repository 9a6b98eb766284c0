"""Resizing a Megatron-LM program: reshardable checkpoint arguments from the first run on, the follower's rules,
the resized run's --load of the source (read only) and the switch to its own checkpoint once it has one."""
from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import SpecError
from orchestrator.programs import load_program, substitute_run_dir
from orchestrator.render.megatron import render_megatron_args
from orchestrator.resize_megatron import TRACKER, can_follow, checkpoint_format, start_argv
from tests.conftest import fixed_plan, spec_data
from tests.unit.test_programs import checkout  # noqa: F401  (a stand-in Megatron-LM checkout)

SOURCE_STEP = 20


def orch(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def lm_spec(root, **changes) -> dict:
    """GPT-3 1.7B on 2 x 4 H100s at tp 2 pp 2 dp 2 with the distributed optimizer: a Megatron-LM program."""
    base = {"name": "gpt-lm", "model": {"preset": "gpt3-1.7b"}, "cluster.gpu": "h100-sxm", "cluster.num_nodes": 2,
            "cluster.gpus_per_node": 4, "training.engine": "megatron", "training.precision": "bf16",
            "training.global_batch_size": 16, "training.train_iters": 100, "training.checkpoint.interval": 10,
            "parallelism.tensor": 2, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
            "parallelism.micro_batch_size": 1, "training.checkpoint.reshardable": True,
            "program": {"kind": "megatron-lm", "megatron_lm": str(root)}}
    return spec_data(**{**base, **changes})


def fake_megatron_checkpoint(run, step: int = SOURCE_STEP, *, fmt: str = "torch_dist"):
    """The files Megatron-LM core_v0.16.1 leaves for a saved iteration (dist_checkpointing's metadata.json, the
    torch DCP files; or the legacy mp_rank_* dirs) and the tracker naming it."""
    ckpt = run / "checkpoints"
    step_dir = ckpt / f"iter_{step:07d}"
    step_dir.mkdir(parents=True)
    if fmt == "torch_dist":
        (step_dir / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                            "common_backend": "torch", "common_backend_version": 1}))
        for name in ("common.pt", ".metadata", "__0_0.distcp"):
            (step_dir / name).write_bytes(b"x")
    else:
        (step_dir / "mp_rank_00_000").mkdir()
        (step_dir / "mp_rank_00_000" / "model_optim_rng.pt").write_bytes(b"x")
    (ckpt / TRACKER).write_text(f"{step}\n")
    return ckpt


def generate(tmp_path, data: dict, name: str):
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert orch("generate", str(spec), "-o", str(tmp_path / name)) == 0
    return tmp_path / name


@pytest.fixture
def source(tmp_path, checkout):
    run = generate(tmp_path, lm_spec(checkout), "src")
    fake_megatron_checkpoint(run)
    return run


def digests(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def argv_of(run):
    return substitute_run_dir(load_program(run)["argv"], run)[1:]


def value(argv, flag):
    return argv[argv.index(flag) + 1]


# --- the reshardable arguments, from the first run on ----------------------------------------------------

@pytest.mark.parametrize("zero, reshardable, extra", [
    (1, True, ["--dist-ckpt-optim-fully-reshardable", "--ckpt-fully-parallel-load"]),
    (1, None, []), (0, True, []), (2, True, [])])
def test_reshardable_checkpoints_add_the_fully_reshardable_optimizer_format(checkout, zero, reshardable, extra):
    data = lm_spec(checkout, **{"parallelism.zero_stage": zero, "training.checkpoint.reshardable": reshardable,
                                **({"parallelism.pipeline": 1} if zero >= 2 else {})})
    args = render_megatron_args(fixed_plan(data))
    tail = args[args.index("--ckpt-format"):args.index("--ckpt-format") + 2 + len(extra)]
    assert tail == ["--ckpt-format", "fsdp_dtensor" if zero >= 2 else "torch_dist", *extra]
    assert ("--dist-ckpt-optim-fully-reshardable" in args) == bool(extra)


def test_an_unset_reshardable_field_leaves_the_resolved_spec_and_its_hash_alone(checkout):
    from orchestrator.spec import spec_sha256, spec_to_data
    from orchestrator.spec_loader import parse_spec

    plain = parse_spec(lm_spec(checkout, **{"training.checkpoint.reshardable": None}))
    assert "reshardable" not in spec_to_data(plain)["training"]["checkpoint"]
    assert spec_sha256(plain) != spec_sha256(parse_spec(lm_spec(checkout)))


@pytest.mark.parametrize("argv, expected", [
    (["--use-distributed-optimizer", "--ckpt-format", "torch_dist", "--dist-ckpt-optim-fully-reshardable"],
     ("torch_dist", "fully_reshardable")),
    (["--use-distributed-optimizer", "--ckpt-format", "torch_dist"], ("torch_dist", "dp_reshardable")),
    (["--use-distributed-optimizer"], ("torch_dist", "dp_reshardable")),      # core_v0.16.1's default format
    (["--use-distributed-optimizer", "--no-ckpt-fully-parallel-save"], ("torch_dist", "not_reshardable")),
    (["--ckpt-format", "torch_dist"], ("torch_dist", "model_space")),
    (["--use-distributed-optimizer", "--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"],
     ("fsdp_dtensor", "fsdp_dtensor")),
    (["--use-distributed-optimizer", "--ckpt-format", "torch_dist", "--ckpt-format", "torch"], ("torch", None)),
])
def test_the_checkpoint_format_is_read_from_the_argv_as_megatron_parses_it(argv, expected):
    found = checkpoint_format(argv)
    assert (found["ckpt_format"], found["optimizer"]) == expected


# --- the follower ----------------------------------------------------------------------------------------

def _layouts(src_optimizer, old, new, fmt=("torch_dist", "torch_dist"), schedule=({}, {})):
    base = {"tp": 2, "pp": 2, "vpp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "zero_stage": 1}
    sched = {"lr": 3e-4, "min_lr": 3e-5, "warmup_iters": 10, "decay": "cosine", "weight_decay": 0.1,
             "global_batch_size": 16}
    before = {**base, **old, "checkpoint": {"ckpt_format": fmt[0], "optimizer": src_optimizer,
                                            "schedule": {**sched, **schedule[0]}}}
    after = {**base, **new, "checkpoint": {"ckpt_format": fmt[1], "optimizer": "fully_reshardable",
                                           "schedule": {**sched, **schedule[1]}}}
    return before, after


@pytest.mark.parametrize("src, old, new, refused", [
    ("fully_reshardable", {}, {"tp": 4, "pp": 1, "dp": 4}, None),
    ("fully_reshardable", {}, {"pp": 4, "vpp": 2, "dp": 1}, None),
    ("fully_reshardable", {"ep": 2}, {"ep": 4, "etp": 2}, None),
    ("model_space", {"zero_stage": 0}, {"zero_stage": 0, "tp": 1, "dp": 4}, None),
    ("dp_reshardable", {}, {"dp": 4}, None),
    ("dp_reshardable", {}, {"tp": 4, "pp": 1, "dp": 4}, "tp, pp: the distributed optimizer's state was saved in "
     "Megatron-LM's default 'dp_reshardable' layout"),
    ("not_reshardable", {}, {"dp": 4}, "dp: the source saved with --no-ckpt-fully-parallel-save"),
    (None, {}, {"dp": 4}, "the source saved Megatron-LM's --ckpt-format torch, which loads only under the layout"),
    (None, {}, {}, None),                    # same layout, another cluster: the legacy format loads as is
    ("fsdp_dtensor", {"zero_stage": 3}, {"zero_stage": 3, "dp": 4}, None),
    ("fsdp_dtensor", {"zero_stage": 3}, {"zero_stage": 3, "tp": 4, "pp": 1}, "tp, pp: Megatron FSDP's fsdp_dtensor"),
    ("fully_reshardable", {"zero_stage": 1}, {"zero_stage": 0}, "zero_stage 1 -> 0: the plain optimizer"),
])
def test_what_a_megatron_checkpoint_can_follow(src, old, new, refused):
    fmt = ("torch" if src is None else "fsdp_dtensor" if src == "fsdp_dtensor" else "torch_dist",) * 2
    before, after = _layouts(src, old, new, fmt)
    if refused is None:
        method, changes, how = can_follow(before, after)
        assert method == "reshard" and len(changes) == sum(before[k] != after[k] for k in new)
        assert "--load SOURCE --ckpt-step N" in how
    else:
        with pytest.raises(SpecError) as error:
            can_follow(before, after)
        assert refused in str(error.value), str(error.value)
        fix = "training.checkpoint.reshardable: true" if src in ("dp_reshardable", "not_reshardable") else ""
        assert fix in str(error.value)


def test_a_format_or_schedule_change_is_refused_by_name():
    with pytest.raises(SpecError, match=r"--ckpt-format torch_dist \(source\) -> fsdp_dtensor"):
        can_follow(*_layouts("fully_reshardable", {}, {"zero_stage": 2}, ("torch_dist", "fsdp_dtensor")))
    with pytest.raises(SpecError, match=r"global_batch_size 16 -> 32, lr 0.0003 -> 0.0006.*leave out --scale-batch|"
                       r"lr 0.0003 -> 0.0006, .*global_batch_size 16 -> 32.*leave out --scale-batch"):
        can_follow(*_layouts("fully_reshardable", {}, {"dp": 4}, schedule=({}, {"lr": 6e-4, "global_batch_size": 32})))


# --- orch resize of a Megatron-LM run dir -----------------------------------------------------------------

def test_resize_loads_the_source_checkpoint_read_only_under_the_new_layout(source, tmp_path, capsys):
    before = digests(source)
    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 0
    assert "checkpoint: reshard (tp 2 -> 4, pp 2 -> 1, dp 2 -> 4)" in capsys.readouterr().err
    resume = json.loads((new / "resume.json").read_text())
    src_ckpt = (source / "checkpoints").resolve()
    assert resume["source_checkpoint"] == str(src_ckpt / "iter_0000020") and resume["source_step"] == SOURCE_STEP
    assert resume["conversion"]["method"] == "reshard" and resume["conversion"]["output"] is None
    assert resume["old_layout"]["checkpoint"]["optimizer"] == "fully_reshardable"
    assert resume["new_layout"]["checkpoint"]["optimizer"] == "fully_reshardable"
    argv = argv_of(new)
    assert (value(argv, "--tensor-model-parallel-size"), value(argv, "--pipeline-model-parallel-size")) == ("4", "1")
    assert value(argv, "--load") == str(src_ckpt) and value(argv, "--ckpt-step") == "20"
    assert value(argv, "--save") == str((new / "checkpoints").resolve()) and "--finetune" not in argv
    assert "--exit-on-missing-checkpoint" in argv and "--dist-ckpt-optim-fully-reshardable" in argv
    args = (new / "megatron_args.txt").read_text().split()
    assert value(args, "--load") == str(src_ckpt) and value(args, "--save") == "checkpoints"
    from orchestrator.rundir import manifest_problems, read_run_dir

    assert manifest_problems(read_run_dir(new)) == []
    assert orch("validate", str(new)) == 0
    assert digests(source) == before


def test_a_source_saved_without_reshardable_checkpoints_is_refused_naming_the_fix(tmp_path, checkout, capsys):
    run = generate(tmp_path, lm_spec(checkout, **{"training.checkpoint.reshardable": None}), "plain")
    fake_megatron_checkpoint(run)
    new = tmp_path / "new"
    assert orch("resize", str(run), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 2
    err = capsys.readouterr().err
    assert "the Megatron-LM checkpoint cannot follow tp 2 -> 4, pp 2 -> 1, dp 2 -> 4: tp, pp:" in err
    assert "'dp_reshardable'" in err and "set training.checkpoint.reshardable: true in the source spec" in err
    assert not new.exists()
    assert orch("resize", str(run), "--nodes", "4", "-o", str(new)) == 0       # dp 2 -> 4 only: it reshards
    assert json.loads((new / "resume.json").read_text())["conversion"]["changes"] == ["dp 2 -> 4"]


def test_a_legacy_torch_checkpoint_on_disk_is_refused_whatever_the_argv_says(tmp_path, checkout, capsys):
    run = generate(tmp_path, lm_spec(checkout), "legacy")
    fake_megatron_checkpoint(run, fmt="torch")
    assert orch("resize", str(run), "--nodes", "4", "-o", str(tmp_path / "new")) == 2
    assert "the source saved Megatron-LM's --ckpt-format torch" in capsys.readouterr().err


def test_a_source_without_its_program_json_is_refused_by_name(source, tmp_path, capsys):
    (source / "program.json").unlink()
    assert orch("resize", str(source), "--nodes", "4", "-o", str(tmp_path / "new")) == 2
    assert "program.json: cannot be read (FileNotFoundError)" in capsys.readouterr().err


def test_a_run_without_a_megatron_checkpoint_cannot_be_resized(tmp_path, checkout, capsys):
    run = generate(tmp_path, lm_spec(checkout), "empty")
    assert orch("resize", str(run), "--nodes", "4", "-o", str(tmp_path / "new")) == 2
    assert "has no Megatron-LM checkpoint under" in capsys.readouterr().err
    fake_megatron_checkpoint(run, 10)
    assert orch("resize", str(run), "--nodes", "4", "--step", "20", "-o", str(tmp_path / "new")) == 2
    assert "iter_0000020 is not a checkpoint Megatron-LM finished saving" in capsys.readouterr().err


def test_each_start_loads_the_runs_own_checkpoint_once_it_has_one(source, tmp_path):
    """Requeued after its first save, the resized run loads its own newest checkpoint, not the source's again."""
    from orchestrator.train.convert import main as convert_main

    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 0
    argv = argv_of(new)
    assert start_argv(new, argv) == argv
    assert convert_main([str(new)]) == 0         # the conversion step: the source step is there, nothing to write
    assert not (new / "resume").exists()
    fake_megatron_checkpoint(new, 30)
    own = start_argv(new, argv)
    assert value(own, "--load") == str((new / "checkpoints").resolve()) and "--ckpt-step" not in own
    assert convert_main([str(new)]) == 0


def test_telemetry_numbers_a_resized_runs_steps_from_the_iteration_megatron_resumes_after(source, tmp_path):
    """The resized run loads iteration 20 of the source: its first step is 21 (metrics.jsonl continues the source's
    numbering), and once it saved iteration 30 of its own a restart numbers from 31."""
    from orchestrator.programs.__main__ import load_program as start_program
    from orchestrator.programs.__main__ import plan_start

    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 0
    assert plan_start(new, start_program(new))[1].step == SOURCE_STEP
    fake_megatron_checkpoint(new, 30)
    assert plan_start(new, start_program(new))[1].step == 30


@pytest.mark.parametrize("argv, tracker, expected", [
    (["--save", "ck"], "40", 0),                                   # nothing to load
    (["--load", "ck"], None, 0),                                   # an empty --load dir: from scratch
    (["--load", "ck"], "40", 40),
    (["--load=ck", "--ckpt-step", "20"], "40", 20),                # --ckpt-step picks the iteration
    (["--load", "ck", "--finetune"], "40", 0),                     # finetune resets the iteration
    (["--load", "ck"], "release", 0),
])
def test_the_start_iteration_follows_megatron_lms_load_rules(tmp_path, argv, tracker, expected):
    from orchestrator.resize_megatron import start_iteration

    (tmp_path / "ck").mkdir()
    if tracker is not None:
        (tmp_path / "ck" / TRACKER).write_text(tracker + "\n")
    assert start_iteration(argv, tmp_path) == expected


def test_the_conversion_step_fails_when_the_source_step_is_gone(source, tmp_path, capsys):
    from orchestrator.train.convert import main as convert_main

    new = tmp_path / "new"
    assert orch("resize", str(source), "--nodes", "4", "-o", str(new)) == 0
    (source / "checkpoints" / TRACKER).write_text("10\n")
    assert convert_main([str(new)]) == 1
    assert "is not a checkpoint Megatron-LM finished saving" in capsys.readouterr().err
