"""Model-state memory (ZeRO closed forms, offload, DeepSpeed accounting), overheads, busiest stage."""
from __future__ import annotations

import pytest

from orchestrator.estimate.cost import CostModel
from orchestrator.estimate.memory import DEEPSPEED, estimate_model_states, estimate_overheads
from orchestrator.estimate.step import EstimateContext, estimate_memory
from orchestrator.layout import Layout
from orchestrator.spec_loader import parse_spec

PSI = 7.5e9


@pytest.mark.parametrize("n", [1, 8, 64, 1024])
def test_zero_closed_forms(n):
    """Rajbhandari et al. 2020, section 3.1: 16 / 4+12/N / 2+14/N / 16/N bytes per parameter."""
    total = {z: estimate_model_states(PSI, n, z).total_bytes for z in range(4)}
    assert total[0] == pytest.approx(16 * PSI)
    assert total[1] == pytest.approx(4 * PSI + 12 * PSI / n)
    assert total[2] == pytest.approx(2 * PSI + 14 * PSI / n)
    assert total[3] == pytest.approx(16 * PSI / n)


def test_zero_split_by_kind():
    s = estimate_model_states(PSI, 64, 2)
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == pytest.approx((2 * PSI, 2 * PSI / 64, 12 * PSI / 64))


def test_fp32_training_keeps_no_master_copy():
    s = estimate_model_states(PSI, 1, 0, precision="fp32")
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == pytest.approx((4 * PSI, 4 * PSI, 8 * PSI))


@pytest.mark.parametrize("zero,offload", [(1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params")])
def test_offload_moves_bytes_to_host_without_losing_any(zero, offload):
    on_gpu = estimate_model_states(PSI, 8, zero)
    moved = estimate_model_states(PSI, 8, zero, offload)
    assert moved.optimizer_bytes == 0
    assert moved.host_bytes > 0
    assert moved.total_bytes + moved.host_bytes == pytest.approx(on_gpu.total_bytes)
    if offload == "optimizer+params":
        assert moved.total_bytes == 0


def test_deepspeed_accounting_stage2_and_3():
    """DeepSpeed's estimator: stage 2 = 4P + 16P/N; stage 3 = 18P/N (+ 4 x largest layer in overheads)."""
    p, n = 2.851e9, 8
    assert estimate_model_states(p, n, 2, accounting=DEEPSPEED).total_bytes == pytest.approx(4 * p + 16 * p / n)
    assert estimate_model_states(p, n, 2, "optimizer", accounting=DEEPSPEED).total_bytes == pytest.approx(2 * p)
    assert estimate_model_states(p, n, 3, accounting=DEEPSPEED).total_bytes == pytest.approx(18 * p / n)
    assert estimate_model_states(p, n, 3, "optimizer", accounting=DEEPSPEED).total_bytes == pytest.approx(2 * p / n)


def test_overheads_are_explicit_terms():
    cost = CostModel()
    o = estimate_overheads(cost, num_groups=2, dp=8, zero_stage=3, local_grad_bytes=1e12,
                           largest_layer_params=1_000_000, activations_bytes=10e9)
    assert o.cuda_context_bytes == cost.cuda_context_bytes
    assert o.nccl_bytes == 2 * cost.nccl_bytes_per_group
    assert o.dp_bucket_bytes == 2 * cost.dp_bucket_bytes
    assert o.zero3_live_bytes == 4 * 1_000_000
    assert o.fragmentation_bytes == pytest.approx(cost.fragmentation * 10e9)
    assert o.total_bytes == pytest.approx(sum(vars(o).values()))
    assert estimate_overheads(cost, num_groups=0, dp=1, zero_stage=0, local_grad_bytes=1e12,
                              largest_layer_params=1, activations_bytes=0).dp_bucket_bytes == 0


def _ctx(**par):
    spec = parse_spec({"name": "m", "model": {"preset": "gpt3-7.5b"},
                       "cluster": {"gpu": "a100-80gb", "num_nodes": 8, "gpus_per_node": 8},
                       "training": {"global_batch_size": 512, "precision": "bf16"}})
    return EstimateContext.of(spec)


def test_memory_breakdown_adds_up_and_fits_uses_capacity():
    ctx = _ctx()
    lay = Layout(tp=2, pp=4, vpp=1, dp=8, zero_stage=1, micro_batch_size=1, sequence_parallel=True,
                 recompute="selective", offload="none")
    mem = estimate_memory(ctx, lay)
    parts = mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.activations_bytes + mem.other_bytes
    assert mem.total_bytes == pytest.approx(parts)
    assert mem.usable_bytes == pytest.approx(mem.hbm_bytes * (1 - ctx.cost.hbm_headroom))
    assert mem.fits == (mem.total_bytes <= mem.capacity_bytes)
    assert mem.within_headroom == (mem.total_bytes <= mem.usable_bytes)
    assert mem.stage == "first"          # 1F1B: the first stage holds p micro-batches
    d = mem.to_dict()
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes",
                "total_bytes", "hbm_bytes", "usable_bytes", "capacity_bytes", "fits", "within_headroom",
                "host_bytes"):
        assert key in d


def test_more_recompute_less_memory():
    ctx = _ctx()
    base = dict(tp=8, pp=1, vpp=1, dp=8, zero_stage=1, micro_batch_size=4, sequence_parallel=False, offload="none")
    mems = [estimate_memory(ctx, Layout(**base, recompute=r)).activations_bytes for r in ("none", "selective", "full")]
    assert mems[0] >= mems[1] > mems[2]


def test_lighter_first_stage_moves_the_memory_bottleneck_to_the_second():
    """Llama 3 405B's 7 + 14x8 + 7 on pp = 16: stage 1 holds 15 micro-batches x 8 layers > 16 x 7 on stage 0."""
    spec = parse_spec({"name": "m", "model": {"preset": "llama3-405b"},
                       "cluster": {"gpu": "h100-sxm", "num_nodes": 16, "gpus_per_node": 8},
                       "training": {"global_batch_size": 64, "precision": "bf16"}})
    ctx = EstimateContext.of(spec)
    base = dict(tp=8, pp=16, vpp=1, dp=1, zero_stage=0, micro_batch_size=1, sequence_parallel=True,
                recompute="selective", offload="none")
    uneven = estimate_memory(ctx, Layout(**base, first_stage_layers=7, last_stage_layers=7))
    assert uneven.stage == "middle"
    from orchestrator.estimate.activations import estimate_activations, layer_activation_bytes
    from orchestrator.stages import stage_split

    per = layer_activation_bytes(ctx.shape, 8, True, "selective", 1)
    acts = estimate_activations(ctx.shape, 8, 16, 1, True, "selective", 1, 64, 129024, 2, stage_split(126, 16, 7, 7))
    assert uneven.activations_bytes == acts.middle_stage_bytes == 15 * 8 * per + acts.working_bytes


def test_zero3_live_is_what_deepspeeds_reuse_rule_keeps_or_megatrons_layer():
    """DeepSpeed keeps a module gathered after its forward use while fewer than stage3_max_reuse_distance (1e9)
    parameters run before its backward use: for GPT-3 7.5B (12h^2 = 2.0e8 a layer, tied 51200 x h embedding used
    last) the embedding and the last ~1.6 layers, plus the largest module's full gradient; Megatron FSDP holds a
    whole layer (12h^2 + biases and norms) gathered with its gradient."""
    import dataclasses

    from orchestrator.estimate.ds_memory import ds_zero3_gathered_at_peak
    from orchestrator.estimate.params import ds_layer_modules

    ctx = _ctx()
    lay = Layout(tp=1, pp=1, vpp=1, dp=64, zero_stage=3, micro_batch_size=1, sequence_parallel=False,
                 recompute="full", offload="none")
    h, v = ctx.shape.hidden_size, 51200
    ds = estimate_memory(dataclasses.replace(ctx, engine="deepspeed"), lay).overheads.zero3_live_bytes
    mg = estimate_memory(dataclasses.replace(ctx, engine="megatron"), lay).overheads.zero3_live_bytes
    kept = ds_zero3_gathered_at_peak(ds_layer_modules(ctx.shape, 1), 36, 0, v * h, 1_000_000_000)
    assert v * h + 12 * h * h < kept < v * h + 2 * 12 * h * h
    assert ds == 2 * kept + 2 * max(4 * h * h, v * h)
    assert mg > 4 * 12 * h * h


def test_deepspeed_keeps_a_small_model_gathered_whole_and_the_last_half_billion_of_a_big_one():
    """The reuse rule at the forward's end: every module kept while twice the parameters after it stay under
    the distance."""
    from orchestrator.estimate.ds_memory import ds_zero3_gathered_at_peak

    assert ds_zero3_gathered_at_peak((10, 20), 4, 5, 7, 1_000_000_000) == 4 * 30 + 5 + 7
    big = ds_zero3_gathered_at_peak((10**8, 10**8), 40, 10**8, 10**8, 1_000_000_000)
    assert big == 5 * 10**8                        # the output layer and the 4 modules with < 5e8 after them
    assert ds_zero3_gathered_at_peak((10**8,), 40, 0, 10**8, 0) == 10**8     # distance 0: only the last use


def test_deepspeed_zero3_bucket_is_reduce_bucket_size_on_a_gpu_and_its_written_pages_on_the_cpu():
    """stage3.py _setup_for_real_optimizer: one torch.empty(reduce_bucket_size) (5e8); a GPU allocator hands out
    all of it, host memory holds what the gradient copies wrote."""
    from orchestrator.estimate.ds_memory import ds_zero3_bucket_bytes

    assert ds_zero3_bucket_bytes(1e8, 500_000_000, 2, resident_on_write=False) == 5e8 * 2
    assert ds_zero3_bucket_bytes(1e8, 500_000_000, 4, resident_on_write=True) == 1e8 * 4
    assert ds_zero3_bucket_bytes(2e9, 500_000_000, 4, resident_on_write=True) == 5e8 * 4
    import dataclasses

    ctx = dataclasses.replace(_ctx(), engine="deepspeed")
    lay = Layout(tp=1, pp=1, vpp=1, dp=64, zero_stage=3, micro_batch_size=1, sequence_parallel=False,
                 recompute="full", offload="none")
    assert estimate_memory(ctx, lay).overheads.dp_bucket_bytes == 5e8 * 2               # bf16
    old = dataclasses.replace(ctx, engine_version="0.3")       # contiguous_gradients off: the generic rule
    assert estimate_memory(old, lay).overheads.dp_bucket_bytes == 2 * ctx.cost.dp_bucket_bytes


def test_deepspeed_zero12_buckets_are_two_reduce_bucket_sizes_on_a_gpu_at_the_release_orch_writes():
    """DeepSpeed 0.19.8 stage_1_and_2.py setup_buckets: with the contiguous_gradients and overlap_comm orch
    writes, two torch.empty(reduce_bucket_size) of the gradient dtype each micro-step, whatever the model's size
    (one under the pipeline engine's reduce_gradients); older releases and the CPU target keep the generic rule."""
    import dataclasses

    ctx = dataclasses.replace(_ctx(), engine="deepspeed")
    lay = Layout(tp=1, pp=1, vpp=1, dp=64, zero_stage=2, micro_batch_size=1, sequence_parallel=False,
                 recompute="full", offload="none")
    assert estimate_memory(ctx, lay).overheads.dp_bucket_bytes == 2 * 5e8 * 2                 # bf16
    assert estimate_memory(ctx, dataclasses.replace(lay, zero_stage=1)).overheads.dp_bucket_bytes == 2 * 5e8 * 2
    old = dataclasses.replace(ctx, engine_version="0.5")
    assert estimate_memory(old, lay).overheads.dp_bucket_bytes == 2 * ctx.cost.dp_bucket_bytes
    megatron = dataclasses.replace(ctx, engine="megatron")
    assert estimate_memory(megatron, dataclasses.replace(lay, zero_stage=1)).overheads.dp_bucket_bytes == 0.0
    single = dataclasses.replace(lay, dp=1, zero_stage=1)
    assert estimate_memory(ctx, single).overheads.dp_bucket_bytes == 0.0
