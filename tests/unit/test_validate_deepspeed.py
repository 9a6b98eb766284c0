"""orch's static ds_config checks (no deepspeed import): each defect is found at its dotted path with a fix.

The integration twin, tests/integration/test_validate_deepspeed_real.py, shows that DeepSpeed's own config
classes let the "silently accepted" defects below through, which is why these checks exist.
"""
from __future__ import annotations

import copy
import importlib.metadata
import json
import subprocess
import sys
import warnings

import pytest

from orchestrator.validate import _deepspeed_keys_data as KEYS
from orchestrator.validate import _ds_probe
from orchestrator.validate.deepspeed import (DeepSpeedCheckSkipped, DeepSpeedProbeError, DeepSpeedUnavailable,
                                             ProbeRequest, check_batch, check_ds_config,
                                             check_ds_config_with_deepspeed, load_ds_config_text,
                                             probe_ds_configs, validate_ds_config_file)

F = "ds_config.json"


def good_config(stage: int) -> dict:
    """A clean config for dp = 2 (micro 1, accum 4 -> 8) at the given ZeRO stage."""
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
              "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": False,
              "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.1}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 1000}},
              "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                                    "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}}
    if stage == 3:
        config["zero_optimization"].update({"stage3_prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9,
                                            "offload_param": {"device": "cpu", "pin_memory": True},
                                            "offload_optimizer": {"device": "cpu"}})
    if stage == 2:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return config


def at_world(config: dict, world_size: int) -> dict:
    config = copy.deepcopy(config)
    config["train_batch_size"] = 1 * 4 * world_size
    return config


def with_(stage: int = 1, **changes) -> dict:
    """good_config(stage) with dotted-key changes; a value of DELETE removes the key."""
    config = good_config(stage)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return config


DELETE = object()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("world_size", [2, 64])
def test_good_configs_pass(stage, world_size):
    assert check_ds_config(at_world(good_config(stage), world_size), world_size=world_size) == []


def test_good_config_with_pipeline_and_model_parallelism_passes():
    config = {**good_config(1), "pipeline": {"stages": "auto", "partition": "parameters", "pipe_partitioned": True}}
    config["train_batch_size"] = 1 * 4 * (64 // 8)
    assert check_ds_config(config, world_size=64, model_parallel_size=8) == []


# (name, config, expected path inside the file, text in message, text in hint)
BAD = [
    ("misspelled top-level key (ZeRO silently falls back to stage 0)",
     {**good_config(0), "zero_optimisation": {"stage": 3}}, "zero_optimisation", "ignores it silently",
     "did you mean 'zero_optimization'?"),
    ("unknown top-level key far from any real one", {**good_config(1), "learning_rate_schedule": {}},
     "learning_rate_schedule", "never reads", "_deepspeed_keys_data.py"),
    ("removed feature key", {**good_config(1), "elasticity": {"enabled": True}}, "elasticity", "removed",
     "delete the key"),
    ("unknown key in zero_optimization", with_(2, zero_optimization__overlap_com=True),
     "zero_optimization.overlap_com", "DeepSpeedZeroConfig forbids", "did you mean 'overlap_comm'?"),
    ("unknown key in offload_optimizer", with_(2, zero_optimization__offload_optimizer={"device": "cpu", "pin": 1}),
     "zero_optimization.offload_optimizer.pin", "unknown key", "did you mean 'pin_memory'?"),
    ("unknown key in bf16", with_(1, bf16={"enabled": True, "enable": True}), "bf16.enable", "unknown key",
     "did you mean 'enabled'?"),
    ("unknown key in fp16", with_(1, bf16=DELETE, fp16={"enabled": True, "loss_scale_windw": 500}),
     "fp16.loss_scale_windw", "unknown key", "did you mean 'loss_scale_window'?"),
    ("unknown key in optimizer (DeepSpeed ignores it)", with_(1, optimizer={"type": "AdamW", "parms": {"lr": 1e-3}}),
     "optimizer.parms", "ignores it silently", "did you mean 'params'?"),
    ("unknown key in scheduler", with_(1, scheduler__warmup=10), "scheduler.warmup", "ignores it silently",
     "move it into scheduler.params"),
    ("unknown optimizer type", with_(1, optimizer__type="adamw_typo"), "optimizer.type", '"adamw_typo"',
     "did you mean 'adamw'?"),
    ("unknown scheduler type", with_(1, scheduler__type="WarmupCosine"), "scheduler.type",
     'unknown scheduler type "WarmupCosine"', "did you mean"),
    ("optimizer without type", with_(1, optimizer={"params": {"lr": 1e-3}}), "optimizer.type",
     "ignores the whole 'optimizer' section", 'add "type"'),
    ("string boolean yes", with_(1, bf16__enabled="yes"), "bf16.enabled", 'got string "yes"',
     "write true without quotes"),
    ("string boolean true at top level", with_(1, wall_clock_breakdown="true"), "wall_clock_breakdown",
     "must be a boolean", "write true without quotes"),
    ("string number that is no number", with_(1, gradient_clipping="x"), "gradient_clipping",
     'must be a number, got string "x"', "write a number"),
    ("quoted number", with_(1, gradient_clipping="1.0"), "gradient_clipping", 'got string "1.0" (quoted)',
     "write 1.0 without quotes"),
    ("quoted ZeRO stage", with_(2, zero_optimization__stage="2"), "zero_optimization.stage",
     "must be an integer", "write 2 without quotes"),
    ("quoted optimizer lr", with_(1, optimizer__params__lr="3e-4"), "optimizer.params.lr", "quoted number",
     "write 3e-4 without quotes"),
    ("leftover auto at top level", with_(1, gradient_clipping="auto"), "gradient_clipping", 'leftover "auto"',
     "resolved value"),
    ("leftover auto in a section", with_(1, zero_optimization__reduce_bucket_size="auto"),
     "zero_optimization.reduce_bucket_size", 'leftover "auto"', "resolved value"),
    ("leftover auto inside optimizer params", with_(1, optimizer__params__lr="auto"), "optimizer.params.lr",
     'leftover "auto"', "resolved value"),
    ("leftover auto in a batch key", with_(1, train_micro_batch_size_per_gpu="auto"),
     "train_micro_batch_size_per_gpu", 'leftover "auto"', "resolved value"),
    ("fp16 and bf16 both enabled", with_(1, fp16={"enabled": True}), "fp16.enabled", "both enabled",
     "set one of fp16.enabled / bf16.enabled to false"),
    ("legacy bfloat16 next to bf16", with_(1, bfloat16={"enabled": True}), "bfloat16", "ignored",
     "merge it into 'bf16'"),
    ("ZeRO stage 4", with_(1, zero_optimization__stage=4), "zero_optimization.stage", "4 is not allowed",
     "use 0 (off), 1"),
    ("ZeRO stage -1", with_(1, zero_optimization__stage=-1), "zero_optimization.stage", "-1 is not allowed",
     "3 (+ parameters)"),
    ("optimizer offload at stage 0", with_(0, zero_optimization__offload_optimizer={"device": "cpu"}),
     "zero_optimization.offload_optimizer.device", "needs stage >= 1", "set zero_optimization.stage to 1 or higher"),
    ("parameter offload below stage 3", with_(2, zero_optimization__offload_param={"device": "cpu"}),
     "zero_optimization.offload_param.device", "no parameter is offloaded",
     "set zero_optimization.stage to 3"),
    ("nvme offload without a path", with_(3, zero_optimization__offload_param={"device": "nvme"}),
     "zero_optimization.offload_param.nvme_path", "needs an nvme_path", "nvme_path"),
    ("offload device that does not exist", with_(3, zero_optimization__offload_param={"device": "gpu"}),
     "zero_optimization.offload_param.device", '"gpu" is not allowed', '"cpu"'),
    ("pipeline with ZeRO-2", with_(2, pipeline={"stages": 2}), "zero_optimization.stage",
     "pipeline engine supports only stages 0 and 1", "use zero_optimization.stage 0 or 1"),
    ("unknown key in pipeline", with_(1, pipeline={"stage": 2}), "pipeline.stage", "ignores it silently",
     "did you mean 'stages'?"),
    ("max_grad_norm in optimizer params", with_(1, optimizer__params__max_grad_norm=1.0),
     "optimizer.params.max_grad_norm", "deepspeed.initialize then refuses it", "gradient_clipping"),
    ("section that is not a mapping", with_(1, bf16=True), "bf16", "must be a mapping", '"bf16": {...}'),
    ("zero bucket size as a non-integral number", with_(1, zero_optimization__reduce_bucket_size=2.5),
     "zero_optimization.reduce_bucket_size", "must be an integer", "whole number"),
    ("batch mismatch at world size 2", with_(1, train_batch_size=10), "train_batch_size",
     "train_batch_size(10) != train_micro_batch_size_per_gpu(1) * gradient_accumulation_steps(4) * dp(2) = 8",
     "set train_batch_size = 8"),
    ("batch key as a float", with_(1, train_batch_size=8.0), "train_batch_size", "positive whole number",
     "whole number"),
    ("batch key zero", with_(1, gradient_accumulation_steps=0), "gradient_accumulation_steps",
     "positive whole number", ">= 1"),
    ("batch key quoted", with_(1, train_micro_batch_size_per_gpu="1"), "train_micro_batch_size_per_gpu",
     'got string "1"', "write 1 without quotes"),
    ("no batch size at all", with_(1, train_batch_size=DELETE, train_micro_batch_size_per_gpu=DELETE),
     "train_batch_size", "needs at least one", "add train_micro_batch_size_per_gpu"),
    ("comms logger section said to be off", with_(1, comms_logger={"enabled": False, "prof_all": True}),
     "comms_logger.enabled", "false is ignored", "delete the comms_logger section"),
]


@pytest.mark.parametrize("name, config, where, message, hint", BAD, ids=[case[0] for case in BAD])
def test_each_bad_config_is_found_at_its_path_with_a_fix(name, config, where, message, hint):
    problems = check_ds_config(config, world_size=2)
    matching = [p for p in problems if p.path == f"{F}:{where}"]
    assert matching, f"{name}: no problem at {where}; got {[str(p) for p in problems]}"
    assert any(message in p.message and hint in p.hint for p in matching), [str(p) for p in matching]


def test_there_are_at_least_fifteen_distinct_bad_configs():
    assert len({case[2] for case in BAD}) >= 15


def test_every_problem_is_reported_at_once():
    config = {"zero_optimisation": {"stage": 3}, "bf16": {"enabled": "yes"}, "gradient_clipping": "x",
              "optimizer": {"type": "adamw_typo"}, "train_batch_size": 100, "train_micro_batch_size_per_gpu": 1,
              "gradient_accumulation_steps": 2}
    paths = {p.path.split(":", 1)[1] for p in check_ds_config(config, world_size=64)}
    assert paths == {"zero_optimisation", "bf16.enabled", "gradient_clipping", "optimizer.type", "train_batch_size"}


def test_path_prefix_is_the_file_given():
    problems = check_ds_config({"train_batch_size": 8, "zero_optimisation": {}}, path="run/ds_config.json")
    assert [p.path for p in problems] == ["run/ds_config.json:zero_optimisation"]


def test_not_a_mapping():
    (problem,) = check_ds_config(["train_batch_size", 8])
    assert problem.path == F and "JSON object" in problem.message


def test_auto_is_fine_where_it_is_deepspeeds_own_default():
    assert "pipeline.stages" in KEYS.AUTO_IS_DEEPSPEED_DEFAULT
    assert check_ds_config({**good_config(1), "pipeline": {"stages": "auto"}}, world_size=2) == []


def test_optimizer_names_follow_deepspeed_matching():
    # DeepSpeed lower-cases its own names ("ADAMW" works) but looks torch.optim classes up by exact name.
    for name in ("adamw", "ADAMW", "Lamb", "SGD", "RMSprop"):
        assert check_ds_config(with_(1, optimizer__type=name), world_size=2) == [], name
    (problem,) = check_ds_config(with_(1, optimizer__type="sgd"), world_size=2)
    assert problem.path == f"{F}:optimizer.type" and "'SGD'" in problem.hint


def test_torch_scheduler_names_are_accepted():
    config = with_(1, scheduler={"type": "CosineAnnealingLR", "params": {"T_max": 100}})
    assert check_ds_config(config, world_size=2) == []


# ---------------------------------------------------------------- batch arithmetic ----------------------------

def batch(**values) -> dict:
    return {"bf16": {"enabled": True}, **values}


def only(problems):
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def test_batch_mismatch_at_world_size_64_shows_every_operand():
    p = only(check_batch(batch(train_batch_size=100, train_micro_batch_size_per_gpu=1,
                               gradient_accumulation_steps=2), world_size=64, path=F))
    assert p.path == f"{F}:train_batch_size"
    assert p.message == ("train_batch_size(100) != train_micro_batch_size_per_gpu(1) * "
                         "gradient_accumulation_steps(2) * dp(64) = 128")
    assert p.hint.startswith("set train_batch_size = 128; dp(64) assumes every GPU is data parallel")
    assert "pass --model-parallel-size (tp * pp)" in p.hint      # the run may use tp/pp: dp is then smaller


def test_batch_mismatch_hint_offers_each_whole_fix():
    p = only(check_batch(batch(train_batch_size=256, train_micro_batch_size_per_gpu=1,
                               gradient_accumulation_steps=2), world_size=64, path=F))
    assert p.hint.startswith("set train_batch_size = 128, or gradient_accumulation_steps = 4, "
                             "or train_micro_batch_size_per_gpu = 2; ")


def test_model_parallelism_divides_the_world():
    config = batch(train_batch_size=64, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=8)
    assert check_batch(config, world_size=64, model_parallel_size=8, path=F) == []
    p = only(check_batch(config, world_size=64, model_parallel_size=1, path=F))
    assert "dp(64)" in p.message and "--model-parallel-size" in p.hint
    p = only(check_batch(config, world_size=64, model_parallel_size=2, path=F))
    assert "dp(32)" in p.message and "--model-parallel-size" not in p.hint   # given: no need to mention it


def test_world_size_not_a_multiple_of_model_parallel_size():
    p = only(check_batch(batch(train_micro_batch_size_per_gpu=1), world_size=12, model_parallel_size=8, path=F))
    assert "world_size(12)" in p.message and "model_parallel_size(8)" in p.message


@pytest.mark.parametrize("values, derived, floor", [
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 1}, "derive gradient_accumulation_steps", 1),
    ({"train_batch_size": 100, "gradient_accumulation_steps": 1}, "derive train_micro_batch_size_per_gpu", 1),
    ({"train_batch_size": 100}, "set gradient_accumulation_steps = 1 and derive train_micro_batch_size_per_gpu", 1),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 1}, "derive gradient_accumulation_steps", 0),
])
def test_two_of_three_says_what_deepspeed_would_derive_and_that_it_is_not_whole(values, derived, floor):
    p = only(check_batch(batch(**values), world_size=64, path=F))
    assert f"DeepSpeed would {derived} = train_batch_size({values['train_batch_size']}) //" in p.message
    assert f"= {floor} by floor division" in p.message and "is not whole" in p.message
    assert "multiple of 64" in p.hint


@pytest.mark.parametrize("values", [
    {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2},
    {"train_batch_size": 128, "gradient_accumulation_steps": 2},
    {"train_batch_size": 64},
    {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5},
    {"train_micro_batch_size_per_gpu": 3},
])
def test_whole_derivations_pass(values):
    assert check_batch(batch(**values), world_size=64, path=F) == []


def test_without_world_size_only_what_every_dp_needs_is_checked():
    assert check_batch(batch(train_batch_size=100, train_micro_batch_size_per_gpu=1,
                             gradient_accumulation_steps=2), world_size=None, path=F) == []
    p = only(check_batch(batch(train_batch_size=100, train_micro_batch_size_per_gpu=3,
                               gradient_accumulation_steps=1), world_size=None, path=F))
    assert "is not a multiple of train_micro_batch_size_per_gpu(3) * gradient_accumulation_steps(1) = 3" \
        in p.message


# ---------------------------------------------------------------- files ---------------------------------------

def test_bad_json_is_a_problem_with_line_and_column(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "bf16": {"enabled": true,}\n}\n')
    (problem,) = validate_ds_config_file(path, world_size=2, deep=False)
    assert problem.path == f"{path}:3:28" and "not valid JSON" in problem.message


def test_duplicate_keys_are_a_problem():
    _, problems = load_ds_config_text('{"train_batch_size": 8, "train_batch_size": 16}', F)
    assert [p.message.split(":")[0] for p in problems] == ["duplicate key 'train_batch_size'"]


def test_unreadable_file(tmp_path):
    (problem,) = validate_ds_config_file(tmp_path / "missing.json", world_size=2)
    assert "cannot read" in problem.message


def test_static_problems_skip_the_deepspeed_check(tmp_path, monkeypatch):
    monkeypatch.setattr(_ds_probe, "_run_probe", refuse_to_run)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(with_(1, zero_optimisation={})))
    (problem,) = validate_ds_config_file(path, world_size=2)
    assert problem.path == f"{path}:zero_optimisation"


def test_without_deepspeed_the_static_result_stands_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(_ds_probe, "deepspeed_installed", lambda: False)
    monkeypatch.setattr(_ds_probe, "_run_probe", refuse_to_run)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(good_config(1)))
    notes: list[str] = []
    assert validate_ds_config_file(path, world_size=2, notes=notes) == []
    assert len(notes) == 1 and "deepspeed is not installed" in notes[0] and "orch[train]" in notes[0]
    with pytest.warns(DeepSpeedCheckSkipped, match="only orch's static ds_config checks ran"):
        assert validate_ds_config_file(path, world_size=2) == []
    with pytest.raises(DeepSpeedUnavailable):
        check_ds_config_with_deepspeed(good_config(1), world_size=2)


def test_deep_false_never_asks_deepspeed(tmp_path, monkeypatch):
    monkeypatch.setattr(_ds_probe, "_run_probe", refuse_to_run)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(good_config(1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate_ds_config_file(path, world_size=2, deep=False) == []


def refuse_to_run(*args, **kwargs):
    raise AssertionError("the DeepSpeed subprocess must not run here")


# ---------------------------------------------------------------- the subprocess boundary (faked) -------------

class FakeRun:
    """Stands in for subprocess.run; refuses anything but the probe command."""

    def __init__(self, returncode: int, stdout: str, stderr: str = ""):
        self.result = subprocess.CompletedProcess([], returncode, stdout, stderr)
        self.payloads: list[dict] = []

    def __call__(self, argv, *, input, **kwargs):
        assert argv[1:] == ["-m", "orchestrator.validate._ds_probe"], f"unexpected command {argv}"
        assert kwargs["env"]["DS_ACCELERATOR"] == "cpu"
        self.payloads.append(json.loads(input))
        return self.result


@pytest.fixture
def deepspeed_present(monkeypatch):
    monkeypatch.setattr(_ds_probe, "deepspeed_installed", lambda: True)


def test_probe_answers_become_problems(monkeypatch, deepspeed_present):
    answer = {"results": [{"problems": [{"path": f"{F}:train_batch_size", "message": "m", "hint": "h"}],
                           "resolved": None, "warnings": []}]}
    fake = FakeRun(0, json.dumps(answer))
    monkeypatch.setattr(_ds_probe.subprocess, "run", fake)
    problems = check_ds_config_with_deepspeed(good_config(1), world_size=64, model_parallel_size=4)
    assert [str(p) for p in problems] == [f"{F}:train_batch_size: m (h)"]
    assert fake.payloads[0]["requests"][0]["data_parallel_size"] == 16


@pytest.mark.parametrize("returncode, stdout", [(1, ""), (0, "not json"), (0, '{"other": 1}')])
def test_a_failing_probe_is_a_runtime_error_with_its_stderr(monkeypatch, deepspeed_present, returncode, stdout):
    monkeypatch.setattr(_ds_probe.subprocess, "run", FakeRun(returncode, stdout, "Traceback...\nBoom: it broke"))
    with pytest.raises(DeepSpeedProbeError, match="Boom: it broke") as caught:
        probe_ds_configs([ProbeRequest(good_config(1), 2)])
    assert caught.value.exit_code == 1


def test_indivisible_world_size_is_reported_before_asking_deepspeed(monkeypatch, deepspeed_present):
    monkeypatch.setattr(_ds_probe, "_run_probe", refuse_to_run)
    (problem,) = check_ds_config_with_deepspeed(good_config(1), world_size=6, model_parallel_size=4)
    assert "model_parallel_size(4)" in problem.message


def test_deepspeed_messages_are_located_by_the_key_they_name():
    pytest.importorskip("pydantic")
    config = {"train_batch_size": 100, "fp16": {}, "bf16": {}}
    error = AssertionError("Check batch related parameters. train_batch_size is not equal to ...")
    (problem,) = _ds_probe.problems_from_exception(error, config, F)
    assert problem["path"] == f"{F}:train_batch_size" and "AssertionError" in problem["message"]
    (problem,) = _ds_probe.problems_from_exception(AssertionError("bfloat16 and fp16 modes ..."), config, F)
    assert problem["path"] == f"{F}:fp16"
    (problem,) = _ds_probe.problems_from_exception(TypeError("'>' not supported"), config, F)
    assert problem["path"] == F


# ---------------------------------------------------------------- the generated key data ----------------------

def test_static_checks_import_neither_deepspeed_nor_torch():
    code = ("import sys, orchestrator.validate.deepspeed as d; d.check_ds_config({'train_batch_size': 8}, "
            "world_size=2); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('deepspeed', 'torch', 'pydantic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_key_data_matches_the_installed_deepspeed_version():
    try:
        installed = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("deepspeed is not installed")
    assert KEYS.DEEPSPEED_VERSION == installed, \
        "run: python -m orchestrator.validate.deepspeed_keys --regenerate"


def test_key_data_has_every_name_the_rules_use():
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "zero_optimization", "bf16", "bfloat16", "fp16", "optimizer", "scheduler", "pipeline",
                "gradient_clipping"):
        assert key in KEYS.TOP_LEVEL, key
    zero = KEYS.SECTIONS["zero_optimization"]["keys"]
    assert zero["stage"]["choices"] == [0, 1, 2, 3]
    assert {"offload_optimizer", "offload_param"} <= set(zero)
    for section in ("zero_optimization.offload_optimizer", "zero_optimization.offload_param"):
        assert {"device", "nvme_path"} <= set(KEYS.SECTIONS[section]["keys"])
        assert KEYS.SECTIONS[section]["keys"]["device"]["choices"] == ["cpu", "none", "nvme"]
    assert "enabled" in KEYS.SECTIONS["bf16"]["keys"] and "enabled" in KEYS.SECTIONS["fp16"]["keys"]
    assert set(KEYS.SECTIONS["optimizer"]["keys"]) >= {"type", "params"}
    assert "type" in KEYS.SECTIONS["scheduler"]["keys"] and "stages" in KEYS.SECTIONS["pipeline"]["keys"]


@pytest.mark.parametrize("world_size", [8, None])
def test_prefetch_asks_deepspeed_at_the_dp_the_per_path_check_uses(tmp_path, world_size):
    """Ulysses ranks share the batch (dp = world / (mp * sp)): the prefetch must warm the very cache entry
    the per-path deep check then reads (answers are cached by config and dp)."""
    from orchestrator.validate.deepspeed import deep_check_sizes
    from orchestrator.validate.prefetch import _ds_file

    config = good_config(1) | {"sequence_parallel_size": 2, "train_batch_size": 4 * 2}
    path = tmp_path / F
    path.write_text(json.dumps(config))
    [request] = _ds_file(path, world_size, 2)
    assert request.data_parallel_size == deep_check_sizes(config, world_size, 2)[1] == 2


def test_deepspeed_enables_its_comms_logger_whenever_the_section_exists():
    """Why check_comms_logger exists, asked of the installed DeepSpeed: a section with "enabled": false turns
    the logger on (it then synchronizes after every collective); no section leaves it off."""
    from deepspeed.comm.config import DeepSpeedCommsConfig  # noqa: PLC0415
    from deepspeed.utils.comms_logging import CommsLogger  # noqa: PLC0415

    logger = CommsLogger()
    logger.configure(DeepSpeedCommsConfig({"comms_logger": {"enabled": False}}))
    assert logger.enabled
    logger = CommsLogger()
    logger.configure(DeepSpeedCommsConfig({}))
    assert not logger.enabled


@pytest.mark.parametrize("asked", [False, True])
def test_generated_config_has_a_comms_logger_only_when_asked_for(asked):
    from orchestrator.render.deepspeed import render_ds_config  # noqa: PLC0415
    from tests.conftest import fixed_plan, spec_data  # noqa: PLC0415

    config = render_ds_config(fixed_plan(spec_data(**{"tracking.comms_logger": asked})))
    assert ("comms_logger" in config) is asked
    assert check_ds_config(config, world_size=2) == []
