"""A resized Megatron-LM program for real: the argv of a run dir resized from tp 2 pp 2 dp 2 (8 GPUs) to tp 4 pp 1
dp 4 (16 GPUs), with the resharding arguments (--ckpt-format torch_dist, --dist-ckpt-optim-fully-reshardable,
--load SOURCE --ckpt-step N), passes Megatron-LM core_v0.16.1's own parse_args + validate_args under every launch
script's environment, as do the source's argv and the argv of a later start that loads the run's own checkpoint.
Skipped unless ORCH_MEGATRON_LM names a Megatron-LM tree (tests/tools/prepare_megatron_lm.sh)."""
from __future__ import annotations

import pytest

from orchestrator.validate.megatron_lm import LmRun, launch_script_env, megatron_lm_reports
from tests.integration.test_program_kinds_real import lm_root
from tests.unit.test_resize_megatron import (argv_of, fake_megatron_checkpoint, generate, lm_spec, orch, value)
from orchestrator.resize_megatron import start_argv

pytestmark = pytest.mark.integration


def test_a_resized_megatron_lm_run_dir_passes_megatron_lms_validate_args(tmp_path):
    root = lm_root()
    source = generate(tmp_path, lm_spec(root), "src")
    fake_megatron_checkpoint(source)
    new, other = tmp_path / "tp4", tmp_path / "dp4"
    assert orch("resize", str(source), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 0
    assert orch("resize", str(source), "--nodes", "4", "-o", str(other)) == 0          # tp 2 pp 2 dp 4
    resized = argv_of(new)
    assert value(resized, "--load") == str((source / "checkpoints").resolve()) and value(resized, "--ckpt-step") == "20"
    assert "--dist-ckpt-optim-fully-reshardable" in resized and value(resized, "--ckpt-format") == "torch_dist"
    fake_megatron_checkpoint(new, 30)
    own = start_argv(new, resized)
    assert "--ckpt-step" not in own
    cases = {"source": (source, argv_of(source), 8), "tp4-pp1-dp4": (new, resized, 16),
             "tp4-pp1-dp4 own checkpoint": (new, own, 16), "tp2-pp2-dp4": (other, argv_of(other), 16)}
    runs = [LmRun(argv, world, launch_script_env((run / "launch_local.sh").read_text()), name)
            for name, (run, argv, world) in cases.items()]
    verdicts = megatron_lm_reports(runs, megatron_lm_root=root)
    failed = {name: [str(p) for p in problems] for name, (problems, _) in zip(cases, verdicts) if problems}
    assert failed == {}
    dp = {name: facts.get("data_parallel_size") for name, (_, facts) in zip(cases, verdicts)}
    assert dp == {"source": 2, "tp4-pp1-dp4": 4, "tp4-pp1-dp4 own checkpoint": 4, "tp2-pp2-dp4": 4}


def test_megatron_lm_refuses_what_orch_would_let_through_without_the_checks(tmp_path):
    """The check can fail: the resized argv with the fully reshardable format's memory-efficient variant and no
    gloo process groups is one Megatron-LM's validate_args rejects."""
    root = lm_root()
    source = generate(tmp_path, lm_spec(root), "src")
    fake_megatron_checkpoint(source)
    new = tmp_path / "tp4"
    assert orch("resize", str(source), "--nodes", "4", "--tensor", "4", "--pipeline", "1", "-o", str(new)) == 0
    argv = argv_of(new) + ["--distrib-optim-fully-reshardable-mem-efficient", "--disable-gloo-process-groups"]
    [(problems, _)] = megatron_lm_reports([LmRun(argv, 16, launch_script_env((new / "launch_local.sh").read_text()))],
                                          megatron_lm_root=root)
    assert problems and "requires -enable-gloo-process-groups" in str(problems[0]), problems
