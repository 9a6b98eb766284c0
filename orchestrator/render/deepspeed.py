"""render_ds_config(plan) -> the DeepSpeed config dict: fully resolved, no "auto".

Every number comes from the Plan; DeepSpeed's spellings live only here.
"""
from __future__ import annotations

from ..estimate.engines import (DS_MAX_REUSE_DISTANCE, DS_REDUCE_BUCKET_ELEMENTS, ds_param_persistence_threshold,
                                ds_prefetch_bucket_elements)
from ..plan import Plan
_OPTIMIZER_TYPES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def render_ds_config(plan: Plan) -> dict:
    spec, lay = plan.spec, plan.layout
    t = spec.training
    config = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "gradient_clipping": t.gradient_clipping,
        "steps_per_print": 10,
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": _fp16(t.precision == "fp16"),
        "zero_optimization": _zero(plan),
        "optimizer": _optimizer(plan),
        "scheduler": _scheduler(plan),
        "wall_clock_breakdown": spec.tracking.wall_clock_breakdown,
    }
    if spec.tracking.comms_logger:
        # Only when asked for: DeepSpeed turns its comms logger on whenever the section exists, whatever its
        # "enabled" says (validate/deepspeed_values.py check_comms_logger).
        config["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    if t.grad_reduce_dtype:
        # The gradient reduction's dtype (DeepSpeed 0.19.8 engine.py communication_data_type); a Ulysses run
        # reduces in seq_parallel_communication_data_type instead, which replaces it (_configure_distributed_model).
        config["seq_parallel_communication_data_type" if lay.cp > 1 else "communication_data_type"] = \
            t.grad_reduce_dtype
    if lay.cp > 1:
        # DeepSpeed-Ulysses (the trainer's own sequence all-to-all): DeepSpeed's batch check then counts
        # dp = world / sequence_parallel_size. No data_parallel_size: with both keys DeepSpeed builds a
        # device mesh whose gradient reduction leaves the sequence ranks out (ZeRO's reduction group is
        # its data-parallel dimension alone), and their weights drift apart.
        config["sequence_parallel_size"] = lay.cp
    if lay.pp > 1:
        config["pipeline"] = {"stages": lay.pp, "partition": "parameters",
                              "activation_checkpoint_interval": 1 if lay.recompute == "full" else 0,
                              "pipe_partitioned": lay.tp > 1, "grad_partitioned": lay.tp > 1}
    if lay.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": lay.tp > 1, "contiguous_memory_optimization": False,
            "cpu_checkpointing": False, "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False, "profile": False}
    return config


def render_deepspeed_notes(plan: Plan) -> list[str]:
    """What ds_config.json cannot express for this plan."""
    lay = plan.layout
    if lay.pp == 1 or not lay.is_uneven:
        return []
    return [f"parallelism.first_stage_layers/last_stage_layers: DeepSpeed's pipeline partition methods cannot "
            f"place exact layer counts; orch's trainer places {plan.stage_split.describe()} transformer layers "
            "on the stages itself (orchestrator.train.engine.exact_pipeline_module); ds_config.json's "
            "pipeline.partition applies to even splits only"]


def _fp16(enabled: bool) -> dict:
    if not enabled:
        return {"enabled": False}
    # Dynamic loss scaling (loss_scale 0) starting at 2^16, DeepSpeed's documented defaults.
    return {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
            "hysteresis": 2, "min_loss_scale": 1}


def _zero(plan: Plan) -> dict:
    lay, h = plan.layout, plan.spec.model.hidden_size
    zero: dict = {"stage": lay.zero_stage}
    if lay.zero_stage == 0:
        return zero
    zero.update({"overlap_comm": True, "contiguous_gradients": True,
                 "reduce_bucket_size": DS_REDUCE_BUCKET_ELEMENTS})
    if lay.zero_stage in (1, 2):
        zero.update({"reduce_scatter": True, "allgather_partitions": True,
                     "allgather_bucket_size": DS_REDUCE_BUCKET_ELEMENTS})
    if lay.zero_stage == 3:
        # Per-layer sizing (h^2 prefetch, 10h persistence), as DeepSpeed's HF integration derives it.
        zero.update({"stage3_prefetch_bucket_size": ds_prefetch_bucket_elements(h),
                     "stage3_param_persistence_threshold": ds_param_persistence_threshold(h),
                     "stage3_max_live_parameters": DS_MAX_REUSE_DISTANCE,
                     "stage3_max_reuse_distance": DS_MAX_REUSE_DISTANCE,
                     "stage3_gather_16bit_weights_on_model_save": True})
    if lay.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": plan.spec.cluster.gpu != "cpu"}
    if lay.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": plan.spec.cluster.gpu != "cpu"}
    return zero


def _optimizer(plan: Plan) -> dict:
    o = plan.spec.training.optimizer
    params: dict = {"lr": o.lr, "weight_decay": o.weight_decay}
    if o.type == "sgd":
        params["momentum"] = o.betas[0]
    else:
        params.update({"betas": list(o.betas), "eps": o.eps})
        if plan.spec.cluster.gpu == "cpu":
            params["torch_adam"] = True  # plain torch.optim on CPU: no fused or cpu_adam op to compile
    return {"type": _OPTIMIZER_TYPES[o.type], "params": params}


def _scheduler(plan: Plan) -> dict:
    """DeepSpeed's warm-up schedulers, starting at lr/warmup (not 0: no wasted first step).

    DeepSpeed 0.19.8 rejects warmup_num_steps < 1, so "no warm-up" is one step that starts at the peak.
    """
    t = plan.spec.training
    s, lr = t.lr_schedule, t.optimizer.lr
    warmup = max(1, min(s.warmup_iters, t.train_iters))
    start_ratio = 1.0 if s.warmup_iters == 0 else 1.0 / warmup
    if s.decay == "cosine":
        return {"type": "WarmupCosineLR",
                "params": {"total_num_steps": t.train_iters, "warmup_num_steps": warmup,
                           "warmup_min_ratio": start_ratio, "cos_min_ratio": s.min_lr / lr, "warmup_type": "linear"}}
    linear = {"warmup_num_steps": warmup, "warmup_min_lr": lr * start_ratio, "warmup_max_lr": lr,
              "warmup_type": "linear"}
    if s.decay == "linear":
        return {"type": "WarmupDecayLR", "params": {"total_num_steps": t.train_iters, **linear}}
    return {"type": "WarmupLR", "params": linear}
