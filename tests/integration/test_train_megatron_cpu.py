"""The Megatron-Core engine's CPU-runnable parts, for real on 2 gloo processes (tp = 2).

Megatron-Core's GPT forward and schedules need CUDA (ENV-NOTES), so training itself is GPU-only; what
runs here is what the engine builds before that: parallel state from the run dir's megatron_config.json,
the GPTModel (the same parameter count as the DeepSpeed model of the same spec), and a tensor-parallel
MLP whose forward equals model.py's MLP.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import ROOT
from tests.integration.train_support import job_env, make_run_dir, torchrun_argv
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
pytest.importorskip("megatron.core")

LLAMA_LIKE = {"model.gated_mlp": True, "model.num_query_groups": 2, "model.normalization": "rmsnorm",
              "model.position_embedding": "rope", "model.tie_embeddings": False, "model.add_bias_linear": False,
              "model.ffn_hidden_size": 352}


@pytest.mark.parametrize("overrides", [{}, LLAMA_LIKE], ids=["gpt", "llama-like"])
def test_megatron_engine_parts_on_cpu(tmp_path, overrides):
    run_dir = make_run_dir(tmp_path / "run", **{"parallelism.tensor": 2, **overrides})
    out = tmp_path / "check.json"
    argv = torchrun_argv(2, "orchestrator.train.megatron_engine", "--check", str(run_dir), "--out", str(out))
    proc = subprocess.run(argv, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=scaled_s(300))
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = json.loads(out.read_text())["ranks"]
    assert sorted(r["tp_rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert (r["tp"], r["pp"], r["dp"]) == (2, 1, 1)
        assert r["megatron_stage_params"] == r["deepspeed_model_params"]
        assert r["megatron_local_params"] < r["deepspeed_model_params"]
        assert r["tp_mlp_max_abs_diff"] < 1e-5
