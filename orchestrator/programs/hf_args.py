"""The Hugging Face Trainer's TrainingArguments that agree with the ds_config.json orch writes.

transformers' HfTrainerDeepSpeedConfig (integrations/deepspeed.py: trainer_config_process and
trainer_config_finalize) compares every non-"auto" ds_config value with a TrainingArguments value and refuses
a mismatch ("Please correct the following DeepSpeed config values that mismatch TrainingArguments values").
orch never writes "auto", so it passes the matching arguments, after the user's own (the last one wins).
"""
from __future__ import annotations

from ..plan import Plan
from . import RUN_DIR_TOKEN

# orch's lr_schedule.decay -> TrainingArguments.lr_scheduler_type (ds_config's scheduler section is the one that
# runs: the Trainer keeps a DeepSpeed scheduler when ds_config has one; this keeps the logged name honest).
HF_SCHEDULER = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def hf_training_args(plan: Plan) -> list[str]:
    """--flag value pairs, each matching the ds_config key HF checks it against."""
    t, lay = plan.spec.training, plan.layout
    o, s = t.optimizer, t.lr_schedule
    pairs = {
        "--learning_rate": o.lr,                                   # optimizer.params.lr, scheduler warmup_max_lr
        "--adam_beta1": o.betas[0], "--adam_beta2": o.betas[1],    # optimizer.params.betas
        "--adam_epsilon": o.eps,                                   # optimizer.params.eps
        "--weight_decay": o.weight_decay,                          # optimizer.params.weight_decay
        "--lr_scheduler_type": HF_SCHEDULER[s.decay],
        "--warmup_steps": min(s.warmup_iters, t.train_iters),      # scheduler warmup_num_steps = max(1, this)
        "--max_steps": t.train_iters,                              # scheduler total_num_steps
        "--per_device_train_batch_size": lay.micro_batch_size,     # train_micro_batch_size_per_gpu
        "--gradient_accumulation_steps": plan.grad_accum_steps,    # (and train_batch_size, calculated)
        "--max_grad_norm": t.gradient_clipping,                    # gradient_clipping
        "--bf16": "true" if t.precision == "bf16" else "false",    # bf16.enabled
        "--fp16": "true" if t.precision == "fp16" else "false",    # fp16.enabled
        "--seed": t.seed,
        "--output_dir": f"{RUN_DIR_TOKEN}/hf_output",
        "--save_steps": t.checkpoint.interval,
        "--logging_steps": 1,                                      # every step's loss reaches orch's telemetry
        "--report_to": "none",                                     # orch's wrapper logs to W&B
    }
    if plan.spec.cluster.gpu == "cpu":   # without it TrainingArguments keeps one process on CPU (world size 1, so
        pairs["--use_cpu"] = "true"      # train_batch_size mismatches) and refuses bf16 ("doesn't support bf16/gpu")
    return [token for flag, value in pairs.items() for token in (flag, _text(value))]


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def overridden_flags(user_args: list[str], orch_args: list[str]) -> list[str]:
    """The flags of ``user_args`` that orch passes too (its value wins), in the user's order; --a-b and --a_b are
    one flag (HfArgumentParser accepts both spellings)."""
    ours = {_flag_key(a) for a in orch_args if a.startswith("--")}
    seen = []
    for arg in user_args:
        flag = arg.split("=", 1)[0]
        if arg.startswith("--") and _flag_key(flag) in ours and flag not in seen:
            seen.append(flag)
    return seen


def _flag_key(flag: str) -> str:
    return flag.split("=", 1)[0].replace("-", "_")
