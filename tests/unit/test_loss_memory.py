"""What the cross entropy keeps of the logits, per implementation (estimate/activations.py LOSS_IMPLS), and
that the published runs and orch's own runs get the loss their software called."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.estimate.activations import estimate_activations, logits_bytes, loss_bytes_per_logit
from orchestrator.estimate.compute import head_time_s, loss_bytes_per_logit_moved
from orchestrator.estimate.params import ModelShape
from orchestrator.estimate.step import EstimateContext
from tests.published import EXTRA_CASES, MPT_FSDP, case_loss, published_estimate, throughput_spec
from orchestrator.spec_loader import parse_spec

MPT_3B = ModelShape(num_layers=32, hidden_size=2560, num_attention_heads=20, num_query_groups=20,
                    ffn_hidden_size=10240, vocab_size=50368, seq_length=2048)


def test_bytes_per_logit_follow_what_each_loss_keeps():
    # Megatron: fp32 softmax (in place on the fp32 copy) + the gradient cast to the 16-bit dtype; fp32: no cast
    assert loss_bytes_per_logit("vocab_parallel", 2) == 6 and loss_bytes_per_logit("vocab_parallel", 4) == 4
    # flash-attn xentropy: the logits it saves + a new gradient of their dtype, no fp32 copy
    assert loss_bytes_per_logit("xentropy", 2) == 4 and loss_bytes_per_logit("xentropy", 4) == 8
    assert loss_bytes_per_logit("torch", 2) == 8
    with pytest.raises(ValueError, match="xentropy"):
        loss_bytes_per_logit("fused", 2)


def test_last_stage_peak_moves_by_the_loss_buffers_only():
    """pp = 1, no recompute: the peak differs between losses by exactly tokens x vocab x (bytes difference)."""
    tokens_vocab = 2048 * 12 * 50368
    est = {loss: estimate_activations(dataclasses.replace(MPT_3B, loss=loss), 1, 1, 1, False, "none", 12, 3, 50368)
           for loss in ("vocab_parallel", "xentropy", "torch")}
    assert est["torch"].first_stage_bytes - est["xentropy"].first_stage_bytes == tokens_vocab * 4
    assert est["vocab_parallel"].first_stage_bytes - est["xentropy"].first_stage_bytes == tokens_vocab * 2
    assert est["xentropy"].logits_bytes == logits_bytes(dataclasses.replace(MPT_3B, loss="xentropy"), 50368, 1, 12)


def test_fused_xentropy_moves_fewer_bytes_than_the_fp32_softmax():
    spec = parse_spec({"name": "x", "model": {"num_layers": 32, "hidden_size": 2560, "num_attention_heads": 20,
                                              "vocab_size": 50368, "seq_length": 2048},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 1, "gpus_per_node": 8},
                       "training": {"global_batch_size": 96, "precision": "bf16"}})
    hw = EstimateContext.of(spec).hw
    fused = head_time_s(dataclasses.replace(MPT_3B, loss="xentropy"), hw, 1, 12, 50368)
    unfused = head_time_s(MPT_3B, hw, 1, 12, 50368)
    # 3 x 2 bytes against Megatron-Core's eager vocab-parallel cross entropy, 52 per logit: 46 bytes less
    assert unfused - fused == pytest.approx(2048 * 12 * 50368 * 46 / hw.hbm_Bps, rel=1e-9)


def test_vocab_parallel_cross_entropy_traffic_is_counted_per_op():
    """Megatron-Core's cross entropy (tensor_parallel/cross_entropy.py): bf16 logits -> fp32 (2 + 4), max (4),
    sub_ (8), exp (8), sum (4), div_ (8); backward mul_ (8) and autograd's cast back (4 + 2): 52 bytes per logit;
    the --cross-entropy-loss-fusion functions 32; on fp32 logits no casts."""
    assert loss_bytes_per_logit_moved("vocab_parallel", 2) == 52
    assert loss_bytes_per_logit_moved("vocab_parallel", 4) == 40
    assert loss_bytes_per_logit_moved("vocab_parallel_fused", 2) == 32
    assert loss_bytes_per_logit_moved("xentropy", 2) == 6
    assert loss_bytes_per_logit("vocab_parallel_fused", 2) == loss_bytes_per_logit("vocab_parallel", 2)


def test_orch_runs_get_their_engines_loss():
    data = {"name": "x", "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                                   "vocab_size": 1024, "seq_length": 128},
            "cluster": {"gpu": "a100-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"global_batch_size": 8, "precision": "bf16"}}
    engines = {e: EstimateContext.of(parse_spec({**data, "training": {**data["training"], "engine": e}})).shape.loss
               for e in ("megatron", "deepspeed")}
    assert engines == {"megatron": "vocab_parallel", "deepspeed": "torch"}
    fused = {**data, "training": {**data["training"], "cross_entropy_impl": "flash_attn_xentropy"}}
    assert EstimateContext.of(parse_spec(fused)).shape.loss == "xentropy"


def test_published_cases_state_their_loss():
    assert {case_loss(c) for c in MPT_FSDP} == {"xentropy"}
    assert all(c["published"].get("loss_source") for c in MPT_FSDP)
    assert {case_loss(c) for c in EXTRA_CASES if c not in MPT_FSDP} == {"vocab_parallel"}


@pytest.mark.parametrize("model", ["3b", "760m", "350m"])
def test_mpt_rows_without_checkpointing_fit_with_their_loss(model):
    """llm-foundry's no-checkpointing rows fit within the planner's headroom with flash-attn's xentropy; with
    Megatron's fp32 softmax the 3b row (micro-batch 12) would leave it (76.5 GiB of 76.0)."""
    case = next(c for c in MPT_FSDP if c["id"] == f"llmfoundry_mpt_{model}_fsdp_64gpu")
    assert case["published"]["recompute"] == "none"
    assert published_estimate(case).memory.within_headroom
    if model == "3b":
        fp32_softmax = published_estimate({**case, "published": {**case["published"], "loss": "vocab_parallel"}})
        assert not fp32_softmax.memory.within_headroom
    assert throughput_spec(case).parallelism.micro_batch_size == case["published"]["micro_batch"]
