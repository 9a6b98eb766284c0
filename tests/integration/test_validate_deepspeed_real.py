"""The real DeepSpeed 0.19.8 behind `orch validate` for ds_config files.

1. The generated key data is not stale against the installed DeepSpeed.
2. Good ZeRO-0/1/2/3 configs pass DeepSpeed's own config classes at world size 2 and 64.
3. Every defect orch calls "silently accepted" really IS accepted by DeepSpeedConfig (what DeepSpeed made of
   it is shown), so each static check documents why it exists; the few DeepSpeed rejects itself are listed
   separately and orch keeps checking them (earlier, with a "did you mean").
4. A batch mismatch at world size 64 is caught by both layers.

All DeepSpeed questions go through one subprocess (one ~1.5 s import) via a module-scoped fixture.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.validate.deepspeed import (ProbeRequest, check_ds_config, check_ds_config_with_deepspeed,
                                             deepspeed_installed, probe_ds_configs, validate_ds_config_file)
from tests.unit.test_validate_deepspeed import DELETE, at_world, good_config, with_

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not deepspeed_installed(), reason="needs deepspeed (the [train] extra)")]
F = "ds_config.json"
DP = 2  # good_config(stage) is written for dp = 2

# (name, config, path orch reports, check on what DeepSpeed resolved: it took the defect without complaint)
SILENTLY_ACCEPTED = [
    ("misspelled zero_optimization: ZeRO falls back to stage 0",
     with_(0, zero_optimization=DELETE, zero_optimisation={"stage": 3}), "zero_optimisation",
     lambda r: r["zero_stage"] == 0),
    ("unknown top-level key", {**good_config(1), "learning_rate_schedule": {"x": 1}}, "learning_rate_schedule",
     lambda r: True),
    ("unknown optimizer type", with_(1, optimizer__type="adamw_typo"), "optimizer.type",
     lambda r: r["optimizer_name"] == "adamw_typo"),
    ("unknown scheduler type", with_(1, scheduler__type="WarmupCosine"), "scheduler.type",
     lambda r: r["scheduler_name"] == "WarmupCosine"),
    ("optimizer without type: the section is ignored", with_(1, optimizer={"params": {"lr": 1e-3}}),
     "optimizer.type", lambda r: r["optimizer_name"] is None),
    ("unknown key in optimizer", with_(1, optimizer={"type": "AdamW", "parms": {"lr": 1e-3}}), "optimizer.parms",
     lambda r: r["optimizer_name"] == "adamw"),
    ("unknown key in scheduler", with_(1, scheduler__warmup=10), "scheduler.warmup", lambda r: True),
    ("unknown key in pipeline", with_(1, pipeline={"stage": 2}), "pipeline.stage",
     lambda r: r["pipeline"]["stage"] == 2 and r["pipeline"]["stages"] == "auto"),
    ("gradient_clipping 'x' is stored as a string", with_(1, gradient_clipping="x"), "gradient_clipping",
     lambda r: r["gradient_clipping"] == "x"),
    ("gradient_clipping '1.0' is stored as a string", with_(1, gradient_clipping="1.0"), "gradient_clipping",
     lambda r: r["gradient_clipping"] == "1.0"),
    ("bf16.enabled 'yes' becomes true", with_(1, bf16__enabled="yes"), "bf16.enabled",
     lambda r: r["bf16_enabled"] is True),
    ("bf16.enabled 'true' becomes true", with_(1, bf16__enabled="true"), "bf16.enabled",
     lambda r: r["bf16_enabled"] is True),
    ("zero stage '2' becomes 2", with_(2, zero_optimization__stage="2"), "zero_optimization.stage",
     lambda r: r["zero_stage"] == 2),
    ("quoted optimizer lr", with_(1, optimizer__params__lr="3e-4"), "optimizer.params.lr", lambda r: True),
    ("zero stage 'auto' is dropped: stage 0", with_(3, zero_optimization__stage="auto"),
     "zero_optimization.stage", lambda r: r["zero_stage"] == 0),
    ("gradient_clipping 'auto' is kept as a string", with_(1, gradient_clipping="auto"), "gradient_clipping",
     lambda r: r["gradient_clipping"] == "auto"),
    ("bf16.enabled 'auto' is dropped: bf16 off", with_(1, bf16__enabled="auto"), "bf16.enabled",
     lambda r: r["bf16_enabled"] is False),
    ("optimizer lr 'auto'", with_(1, optimizer__params__lr="auto"), "optimizer.params.lr", lambda r: True),
    ("optimizer offload at stage 0", with_(0, zero_optimization__offload_optimizer={"device": "cpu"}),
     "zero_optimization.offload_optimizer.device",
     lambda r: r["zero_stage"] == 0 and r["offload_optimizer_device"] == "cpu"),
    ("parameter offload at stage 2", with_(2, zero_optimization__offload_param={"device": "cpu"}),
     "zero_optimization.offload_param.device", lambda r: r["zero_stage"] == 2 and r["offload_param_device"] == "cpu"),
    ("nvme offload without nvme_path", with_(3, zero_optimization__offload_param={"device": "nvme"}),
     "zero_optimization.offload_param.nvme_path", lambda r: r["offload_param_device"] == "nvme"),
    ("pipeline section with ZeRO-2", with_(2, pipeline={"stages": 2}), "zero_optimization.stage",
     lambda r: r["zero_stage"] == 2 and r["pipeline"]["stages"] == 2),
    ("pipeline section with ZeRO-3", with_(3, pipeline={"stages": 2}), "zero_optimization.stage",
     lambda r: r["zero_stage"] == 3),
    ("legacy bfloat16 ignored next to bf16",
     with_(1, bf16={"enabled": False}, bfloat16={"enabled": True}), "bfloat16", lambda r: r["bf16_enabled"] is False),
    ("max_grad_norm in optimizer params (only a warning)", with_(1, optimizer__params__max_grad_norm=1.0),
     "optimizer.params.max_grad_norm", lambda r: r["optimizer_name"] == "adamw"),
    ("wall_clock_breakdown 1 (a number, not a boolean)", with_(1, wall_clock_breakdown=1), "wall_clock_breakdown",
     lambda r: True),
]

# Defects DeepSpeedConfig rejects itself: orch still checks them statically (earlier, with a fix).
# (name, config, dp, path DeepSpeed's message is located at, DeepSpeed's words)
REJECTED_BY_DEEPSPEED = [
    ("unknown key in zero_optimization", with_(2, zero_optimization__overlap_com=True), DP,
     "zero_optimization.overlap_com", "Extra inputs are not permitted"),
    ("unknown key in bf16", with_(1, bf16={"enabled": True, "enable": True}), DP, "bf16.enable",
     "Extra inputs are not permitted"),
    ("fp16 and bf16 both enabled", with_(1, fp16={"enabled": True}), DP, "fp16", "cannot be simultaneously enabled"),
    ("communication_data_type fp8 (training.grad_reduce_dtype knows fp32, bf16, fp16)",
     with_(1, communication_data_type="fp8"), DP, "communication_data_type", "Invalid communication_data_type"),
    ("ZeRO stage 4", with_(1, zero_optimization__stage=4), DP, "zero_optimization.stage",
     "Input should be 0, 1, 2, 3"),
    ("offload device gpu", with_(3, zero_optimization__offload_param={"device": "gpu"}), DP,
     "zero_optimization.offload_param.device", "Input should be 'none', 'cpu' or 'nvme'"),
    ("removed feature key", {**good_config(1), "elasticity": {"enabled": True}}, DP, "elasticity",
     "Elastic training has been removed"),
    # why parallelism.shard_degree refuses engine deepspeed (docs/hybrid-sharding.md): MiCS is gone in 0.19.8
    ("MiCS hybrid sharding (removed)", with_(3, zero_optimization__mics_shard_size=2), DP, "zero_optimization",
     "MiCS ZeRO-3 sharding has been removed"),
    ("wall_clock_breakdown 'yes'", with_(1, wall_clock_breakdown="yes"), DP, "", "unsupported operand"),
    ("train_batch_size 'auto'", with_(1, train_batch_size="auto"), DP, "", "not supported between"),
    ("two of three batch keys, not whole at dp 64 (DeepSpeed floors, then asserts)",
     {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 1}, 64, "train_batch_size", "100 != 1 * 1 * 64"),
]

GOOD = [(stage, world) for stage in (0, 1, 2, 3) for world in (2, 64)]
BATCH_MISMATCH_64 = {**good_config(1), "train_batch_size": 100, "train_micro_batch_size_per_gpu": 1,
                     "gradient_accumulation_steps": 2}


@pytest.fixture(scope="module")
def verdicts():
    requests = [ProbeRequest(at_world(good_config(stage), world), world) for stage, world in GOOD]
    requests += [ProbeRequest(config, DP) for _, config, _, _ in SILENTLY_ACCEPTED]
    requests += [ProbeRequest(config, dp) for _, config, dp, _, _ in REJECTED_BY_DEEPSPEED]
    requests.append(ProbeRequest(BATCH_MISMATCH_64, 64))
    started = time.perf_counter()
    results = probe_ds_configs(requests)
    print(f"\n{len(requests)} configs checked by DeepSpeed in one subprocess: {time.perf_counter() - started:.2f} s")
    cut1, cut2 = len(GOOD), len(GOOD) + len(SILENTLY_ACCEPTED)
    return {"good": results[:cut1], "silent": results[cut1:cut2],
            "rejected": results[cut2:cut2 + len(REJECTED_BY_DEEPSPEED)], "batch64": results[-1]}


def test_key_data_is_not_stale():
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    done = subprocess.run([sys.executable, "-m", "orchestrator.validate.deepspeed_keys", "--check"],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("index", range(len(GOOD)), ids=[f"zero{s}-world{w}" for s, w in GOOD])
def test_good_configs_pass_both_layers(verdicts, index):
    stage, world = GOOD[index]
    config = at_world(good_config(stage), world)
    assert check_ds_config(config, world_size=world) == []
    result = verdicts["good"][index]
    assert result.problems == []
    assert result.resolved["zero_stage"] == stage and result.resolved["world_size"] == world
    assert result.resolved["train_batch_size"] == 4 * world


@pytest.mark.parametrize("index", range(len(SILENTLY_ACCEPTED)), ids=[c[0] for c in SILENTLY_ACCEPTED])
def test_deepspeed_accepts_what_orch_rejects(verdicts, index):
    name, config, where, took_it = SILENTLY_ACCEPTED[index]
    result = verdicts["silent"][index]
    assert result.problems == [], f"DeepSpeed now rejects '{name}': note it, keep orch's check"
    assert took_it(result.resolved), result.resolved
    problems = check_ds_config(config, world_size=DP)
    assert any(p.path == f"{F}:{where}" for p in problems), [str(p) for p in problems]


@pytest.mark.parametrize("index", range(len(REJECTED_BY_DEEPSPEED)), ids=[c[0] for c in REJECTED_BY_DEEPSPEED])
def test_what_deepspeed_rejects_itself_orch_also_catches(verdicts, index):
    name, config, dp, where, words = REJECTED_BY_DEEPSPEED[index]
    (problem,) = verdicts["rejected"][index].problems
    assert problem.path == (f"{F}:{where}" if where else F)
    assert words in problem.message and "DeepSpeed" in problem.message
    static = check_ds_config(config, world_size=dp)
    assert static, f"orch's static checks miss '{name}'"


def test_batch_mismatch_at_world_size_64_is_caught_by_both_layers(verdicts):
    (static,) = check_ds_config(BATCH_MISMATCH_64, world_size=64)
    assert static.path == f"{F}:train_batch_size" and "dp(64) = 128" in static.message
    (deep,) = verdicts["batch64"].problems
    assert deep.path == f"{F}:train_batch_size" and "100 != 1 * 2 * 64" in deep.message


def test_check_ds_config_with_deepspeed_time_and_model_parallel_size():
    config = {**good_config(1), "train_batch_size": 32}  # dp = 64 / 8 = 8; 1 * 4 * 8 = 32
    started = time.perf_counter()
    assert check_ds_config_with_deepspeed(config, world_size=64, model_parallel_size=8) == []
    elapsed_s = time.perf_counter() - started
    print(f"\ncheck_ds_config_with_deepspeed: {elapsed_s:.2f} s")
    assert elapsed_s < 30


def test_validate_file_end_to_end(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(at_world(good_config(3), 64), indent=2))
    notes: list[str] = []
    assert validate_ds_config_file(path, world_size=64, notes=notes) == []
    assert notes == []
    assert validate_ds_config_file(path, world_size=None, notes=notes) == []
    assert "world size 64" in notes[0]


def test_validating_several_run_dirs_asks_each_library_once_and_says_what_it_does(tmp_path, monkeypatch, capsys):
    """`orch validate RUN_DIR...`: one DeepSpeed and one Megatron-Core subprocess for all paths (before: one
    DeepSpeed probe per run dir and two Megatron-Core ones, for its args and its config), with progress."""
    from orchestrator.cli import main
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir
    from orchestrator.spec_loader import parse_spec
    from orchestrator.validate import _ds_probe, megatron_lm
    from orchestrator.validate.megatron_core import megatron_core_available
    from tests.conftest import spec_data

    runs = [write_run_dir(build_plan(parse_spec(spec_data(**{"parallelism.zero_stage": z}))), tmp_path / f"z{z}")
            for z in (1, 2, 3)]
    calls = {"deepspeed": 0, "megatron": 0}
    real_probe, real_child = _ds_probe._run_probe, megatron_lm.run_child

    def probe(*args, **kw):
        calls["deepspeed"] += 1
        return real_probe(*args, **kw)

    def child(request, *args, **kw):   # Megatron-Core's config check; Megatron-LM's own (ORCH_MEGATRON_LM) is apart
        calls["megatron"] += request.get("mode") == "batch" and all(
            r.get("mode") == "core-config" for r in request.get("requests", ()))
        return real_child(request, *args, **kw)

    monkeypatch.setattr(_ds_probe, "_run_probe", probe)
    monkeypatch.setattr(megatron_lm, "run_child", child)
    with pytest.raises(SystemExit) as info:
        main(["validate", *map(str, runs)])
    err = capsys.readouterr().err
    assert info.value.code == 0, err
    assert calls["deepspeed"] == 1
    assert calls["megatron"] == (1 if megatron_core_available() else 0)
    assert "asking DeepSpeed's and Megatron-Core's own config classes about 3 paths" in err
    assert f"[3/3] checking {runs[2]}" in err
