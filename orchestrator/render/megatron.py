"""render_megatron_args(plan) -> Megatron-LM ``pretrain_gpt.py`` tokens; render_megatron_config(plan) -> kwargs.

Targets Megatron-LM ``core_v0.16.1``: every flag exists in that tag's arguments.py (a test checks it), none is
deprecated. Megatron's spellings live only here and in render/megatron_moe.py (MoE, CP, FP8, kv_channels).
How each layout field maps onto Megatron-LM: docs/internals.md, "render/megatron.py".
"""
from __future__ import annotations

from ..catalog.gpus import GPUS
from ..plan import Plan
from .megatron_moe import (context_args, context_fp8_config, ep_overlap, fp8_args, kv_channels_args, moe_args,
                           moe_config)

MEGATRON_LM_TAG = "core_v0.16.1"
SPLIT = "949,50,1"           # train/valid/test weights for --data-path (Megatron's classic example value)
VOCAB_DIVISIBLE_BY = 128     # vocabulary padding multiple (times tp), as layout.padded_vocab_size assumes
EVAL_ITERS = 10              # validation batches per evaluation (at every checkpoint)

# TransformerConfig fields whose JSON value is the dotted name of a Python object.
OBJECT_FIELDS = ("activation_func", "attention_backend", "params_dtype", "pipeline_dtype")
_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32", "fp8": "torch.bfloat16"}
_ATTENTION_BACKEND = "megatron.core.transformer.enums.AttnBackend."
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}   # Megatron FSDP strategy per ZeRO stage
_DECAY = {"cosine": "cosine", "linear": "linear", "constant": "constant"}


def uses_megatron_fsdp(plan: Plan) -> bool:
    """ZeRO-2/3 run on Megatron FSDP (docs/internals.md)."""
    return plan.layout.zero_stage >= 2


def _attention_backend(plan: Plan) -> str:
    return "flash" if plan.spec.model.flash_attention else "unfused"


def render_megatron_args(plan: Plan) -> list[str]:
    """Megatron-LM pretrain_gpt.py arguments, one token per item, in a fixed order."""
    sections = (_parallel_args, _model_args, _precision_args, _grad_reduce_args, _optimizer_args, _schedule_args,
                _batch_args, _checkpoint_args, _data_args, _logging_args, _runtime_args)
    tokens: list[str] = []
    for section in sections:
        tokens += section(plan)
    return tokens


def _parallel_args(plan: Plan) -> list[str]:
    lay = plan.layout
    args = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)]
        if plan.spec.parallelism.overlap_p2p_comm is False:
            args.append("--no-overlap-p2p-communication")   # what the cost model assumed (step.uses_p2p_overlap)
    if lay.first_stage_layers is not None:
        args += ["--decoder-first-pipeline-num-layers", str(lay.first_stage_layers)]
    if lay.last_stage_layers is not None:
        args += ["--decoder-last-pipeline-num-layers", str(lay.last_stage_layers)]
    if lay.account_split:
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if lay.sequence_parallel:
        args.append("--sequence-parallel")
        if uses_tp_comm_overlap(plan):
            args.append("--tp-comm-overlap")  # what the cost model assumed (estimate/step.py)
    args += context_args(plan) + moe_args(plan)
    return args + _data_parallel_args(plan) + _recompute_args(plan)


def uses_tp_comm_overlap(plan: Plan) -> bool:
    """Sequence parallelism over tp > 1 on a GPU whose Transformer Engine can overlap TP comm (catalog)."""
    return bool(plan.layout.sequence_parallel) and plan.layout.tp > 1 and GPUS[plan.spec.cluster.gpu].tp_comm_overlap


def _data_parallel_args(plan: Plan) -> list[str]:
    lay = plan.layout
    args: list[str] = []
    if lay.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if uses_megatron_fsdp(plan):
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _SHARDING[lay.zero_stage],
                 "--no-gradient-accumulation-fusion"]
    if lay.replicas > 1:
        # Hybrid sharding: shard inside (dp x cp) / instances ranks, replicate across the instances (Megatron
        # FSDP's outer group keeps its default --outer-dp-sharding-strategy no_shard); docs/hybrid-sharding.md
        args += ["--num-distributed-optimizer-instances", str(lay.replicas)]
    if lay.dp > 1:
        args.append("--overlap-grad-reduce")
        if lay.zero_stage >= 1:
            args.append("--overlap-param-gather")
    if _offloads_optimizer(plan):
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--optimizer-offload-fraction", "1.0"]
    return args


def _offloads_optimizer(plan: Plan) -> bool:
    return plan.layout.offload != "none" and plan.spec.training.optimizer.type != "sgd"


def _recompute_args(plan: Plan) -> list[str]:
    # selective: + --recompute-modules (parallelism.recompute_modules); full: the spec's --recompute-method
    # and --recompute-num-layers (default uniform, 1). docs/recompute-dropout.md.
    tokens: list[str] = []
    for key, value in _recompute_config(plan).items():
        flag = f"--{key.replace('_', '-')}"
        tokens += [flag] if value is True else [flag, *(value if isinstance(value, list) else [str(value)])]
    return tokens


def _model_args(plan: Plan) -> list[str]:
    m = plan.spec.model
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--num-attention-heads", str(m.num_attention_heads), "--ffn-hidden-size", str(m.ffn_hidden_size),
            "--seq-length", str(m.seq_length), "--max-position-embeddings", str(m.seq_length)]
    args += kv_channels_args(plan)
    if m.num_query_groups != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    if m.gated_mlp:
        args.append("--swiglu")
    args += ["--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm"]
    args += ["--position-embedding-type", "rope" if m.position_embedding == "rope" else "learned_absolute"]
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    # model.hidden_dropout / model.attention_dropout: 0 unless the spec sets them (docs/recompute-dropout.md).
    args += ["--attention-dropout", str(float(m.attention_dropout or 0.0)),
             "--hidden-dropout", str(float(m.hidden_dropout or 0.0)), "--attention-backend", _attention_backend(plan)]
    return args + _model_kernel_args(plan)


def _model_kernel_args(plan: Plan) -> list[str]:
    """model.rope_fusion: false, model.activation_func_clamp_value and training.cross_entropy_impl:
    vocab_parallel_fused (Megatron-Core's fused vocab-parallel loss, its native implementation; written only
    when set)."""
    m, args = plan.spec.model, []
    if m.rope_fusion is False:
        args.append("--no-rope-fusion")
    if plan.spec.training.cross_entropy_impl == "vocab_parallel_fused":
        args.append("--cross-entropy-loss-fusion")
    if m.activation_func_clamp_value is not None:
        args += ["--activation-func-clamp-value", str(m.activation_func_clamp_value)]
    return args


def _model_kernel_config(plan: Plan) -> dict:
    m, config = plan.spec.model, {}
    if m.rope_fusion is False:
        config["apply_rope_fusion"] = False
    if plan.spec.training.cross_entropy_impl == "vocab_parallel_fused":
        config["cross_entropy_loss_fusion"] = True
    if m.activation_func_clamp_value is not None:
        config["activation_func_clamp_value"] = m.activation_func_clamp_value
    return config


def _precision_args(plan: Plan) -> list[str]:
    precision = plan.spec.training.precision
    if precision == "fp8":
        return fp8_args(plan)
    if precision == "bf16":
        return ["--bf16"]
    if precision == "fp16":
        # Dynamic loss scaling from 2^16, the same start and window as ds_config.json.
        return ["--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "1000", "--hysteresis", "2",
                "--min-loss-scale", "1.0"]
    return []


def _grad_reduce_args(plan: Plan) -> list[str]:
    """training.grad_reduce_dtype where it is not Megatron-LM's default for the precision (core_v0.16.1
    arguments.py: --bf16 reduces in fp32, --fp16 in fp16; parallel_rules.rule_grad_reduce_dtype refuses the
    rest)."""
    t = plan.spec.training
    if t.grad_reduce_dtype == "bf16" and t.precision in ("bf16", "fp8"):
        return ["--grad-reduce-in-bf16"]
    if t.grad_reduce_dtype == "fp32" and t.precision == "fp16":
        return ["--accumulate-allreduce-grads-in-fp32"]
    return []


def _optimizer_args(plan: Plan) -> list[str]:
    t = plan.spec.training
    o = t.optimizer
    if o.type == "sgd":
        args = ["--optimizer", "sgd", "--sgd-momentum", str(o.betas[0])]
    else:  # Megatron's "adam" decouples weight decay: AdamW
        args = ["--optimizer", "adam", "--adam-beta1", str(o.betas[0]), "--adam-beta2", str(o.betas[1]),
                "--adam-eps", str(o.eps)]
    return args + ["--weight-decay", str(o.weight_decay), "--clip-grad", str(t.gradient_clipping)]


def _schedule_args(plan: Plan) -> list[str]:
    t = plan.spec.training
    s = t.lr_schedule
    return ["--lr", str(t.optimizer.lr), "--min-lr", str(min(s.min_lr, t.optimizer.lr)),
            "--lr-decay-style", _DECAY[s.decay], "--lr-warmup-iters", str(_warmup_iters(plan)),
            "--lr-warmup-init", "0.0", "--lr-decay-iters", str(t.train_iters), "--train-iters", str(t.train_iters)]


def _warmup_iters(plan: Plan) -> int:
    """Megatron's scheduler asserts warm-up < decay steps (decay runs to train_iters)."""
    t = plan.spec.training
    return min(t.lr_schedule.warmup_iters, t.train_iters - 1)


def _batch_args(plan: Plan) -> list[str]:
    return ["--micro-batch-size", str(plan.layout.micro_batch_size),
            "--global-batch-size", str(plan.spec.training.global_batch_size)]


def _checkpoint_args(plan: Plan) -> list[str]:
    c = plan.spec.training.checkpoint
    fmt = "fsdp_dtensor" if uses_megatron_fsdp(plan) else "torch_dist"
    return ["--save", c.dir, "--load", c.dir, "--save-interval", str(c.interval), "--ckpt-format", fmt] + \
        reshardable_args(plan)


def reshardable_args(plan: Plan) -> list[str]:
    """training.checkpoint.reshardable with the distributed optimizer outside Megatron FSDP: its state saved in
    the model-space layout that loads at another tp / pp / ep / dp (core_v0.16.1's 'fully_reshardable'
    distrib_optim_sharding_type; the default 'dp_reshardable' loads at another dp only), loaded fully in
    parallel across dp (what Megatron-Core recommends for that format). torch_dist itself reshards the model
    and a non-distributed optimizer; Megatron FSDP's fsdp_dtensor has no such option (docs/resize.md)."""
    if not plan.spec.training.checkpoint.reshardable or uses_megatron_fsdp(plan) or plan.layout.zero_stage < 1:
        return []
    return ["--dist-ckpt-optim-fully-reshardable", "--ckpt-fully-parallel-load"]


def _data_args(plan: Plan) -> list[str]:
    d, m = plan.spec.data, plan.spec.model
    null_tokenizer = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size - 1)]
    # The multiple orch.layout.padded_vocab_size pads to (Megatron's default, written out).
    args = ["--make-vocab-size-divisible-by", str(VOCAB_DIVISIBLE_BY)]
    if d.synthetic or not d.path:
        return args + ["--mock-data"] + null_tokenizer
    args += ["--data-path", d.path, "--split", SPLIT]
    if d.tokenizer:
        return args + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", d.tokenizer]
    return args + null_tokenizer


def _logging_args(plan: Plan) -> list[str]:
    t = plan.spec.training
    args = ["--log-interval", "1", "--log-throughput", "--eval-interval", str(t.checkpoint.interval),
            "--eval-iters", str(EVAL_ITERS)]
    w = plan.spec.tracking.wandb
    if w.mode != "disabled":
        args += ["--wandb-project", w.project, "--wandb-exp-name", plan.spec.name, "--wandb-save-dir", "wandb"]
        if w.entity:
            args += ["--wandb-entity", w.entity]
    return args


def _runtime_args(plan: Plan) -> list[str]:
    args = ["--seed", str(plan.spec.training.seed)]
    if plan.spec.cluster.gpu != "cpu":
        return args + ["--transformer-impl", "transformer_engine", "--distributed-backend", "nccl"]
    # Megatron-LM's training loop needs CUDA; on cpu the arguments stay meaningful for validation.
    args += ["--transformer-impl", "local", "--distributed-backend", "gloo", "--use-cpu-initialization"]
    if not uses_megatron_fsdp(plan):  # FSDP already turned the CUDA-only fusion off
        args.append("--no-gradient-accumulation-fusion")
    return args


EP_OVERLAP_CONNECTIONS = "8"


def megatron_env(plan: Plan) -> dict[str, str]:
    """Environment Megatron-LM needs for this plan (values unquoted).

    Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tp > 1 or cp > 1 (before Blackwell), and asserts that it
    is NOT 1 with Megatron FSDP (ZeRO-2/3 here), which then only warns about tp > 1. With the EP all-to-all overlap
    it only warns too: one connection would put its comm and compute streams in one hardware queue, so the
    overlap runs with 8, Megatron-Bridge's H100 value for the alltoall dispatcher (scripts/performance/utils/
    overrides.py: 1 only with tp or cp > 1 and no moe_a2a_overlap).
    """
    if (plan.layout.tp > 1 or plan.layout.cp > 1) and not uses_megatron_fsdp(plan):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": EP_OVERLAP_CONNECTIONS if ep_overlap(plan) else "1"}
    return {}


def render_megatron_notes(plan: Plan) -> list[str]:
    """What megatron_args.txt cannot express for this plan, or expresses differently from the spec."""
    notes = []
    lay, o = plan.layout, plan.spec.training.optimizer
    if lay.offload == "optimizer+params":
        notes.append("parallelism.offload: Megatron-LM core_v0.16.1 has no parameter CPU offload; "
                     "megatron_args.txt offloads the optimizer only (parameters stay sharded on the GPUs)")
    if lay.offload != "none" and o.type == "sgd":
        notes.append("parallelism.offload: Megatron-LM's CPU optimizer offload needs Adam "
                     "(--use-precision-aware-optimizer); megatron_args.txt does not offload")
    if o.type == "adam" and o.weight_decay > 0:
        notes.append("training.optimizer.type: Megatron-LM's --optimizer adam always decouples weight decay "
                     "(AdamW)")
    if plan.spec.data.path and not plan.spec.data.synthetic and plan.spec.data.path.endswith(
            (".txt", ".json", ".jsonl")):
        notes.append("data.path: Megatron-LM reads indexed datasets (the prefix of a .bin/.idx pair); "
                     "convert text with Megatron-LM's tools/preprocess_data.py")
    if _warmup_iters(plan) < plan.spec.training.lr_schedule.warmup_iters:
        notes.append(f"training.lr_schedule.warmup_iters: Megatron needs warm-up < train_iters; "
                     f"--lr-warmup-iters is {_warmup_iters(plan)}")
    if plan.spec.cluster.gpu == "cpu":
        notes.append("cluster.gpu: Megatron-LM's pretrain_gpt.py needs CUDA; on cpu these arguments serve "
                     "validation only")
    if uses_megatron_fsdp(plan) and lay.tp > 1:
        notes.append("parallelism.zero_stage: Megatron FSDP with tp > 1 must run without "
                     "CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it); tensor-parallel overlap is reduced")
    return notes


def render_megatron_config(plan: Plan) -> dict:
    """TransformerConfig (+ ModelParallelConfig) kwargs; OBJECT_FIELDS hold dotted object names."""
    m, lay, t = plan.spec.model, plan.layout, plan.spec.training
    config = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "sequence_parallel": bool(lay.sequence_parallel),
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "ffn_hidden_size": m.ffn_hidden_size,
        "gated_linear_unit": m.gated_mlp,
        "activation_func": "torch.nn.functional.silu" if m.gated_mlp else "torch.nn.functional.gelu",
        "normalization": "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm",
        "add_bias_linear": m.add_bias_linear,
        "hidden_dropout": float(m.hidden_dropout or 0.0),
        "attention_dropout": float(m.attention_dropout or 0.0),
        "attention_backend": _ATTENTION_BACKEND + _attention_backend(plan),
        "bf16": t.precision in ("bf16", "fp8"),
        "fp16": t.precision == "fp16",
        "params_dtype": _DTYPES[t.precision],
        "pipeline_dtype": _DTYPES[t.precision],
        "use_cpu_initialization": plan.spec.cluster.gpu == "cpu",
        "deallocate_pipeline_outputs": True,
    }
    return (config | _split_config(plan) | _recompute_config(plan) | moe_config(plan) | context_fp8_config(plan)
            | _model_kernel_config(plan))


def _split_config(plan: Plan) -> dict:
    lay, config = plan.layout, {}
    if lay.first_stage_layers is not None:
        config["num_layers_in_first_pipeline_stage"] = lay.first_stage_layers
    if lay.last_stage_layers is not None:
        config["num_layers_in_last_pipeline_stage"] = lay.last_stage_layers
    if lay.account_split:
        config |= {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    return config


def _recompute_config(plan: Plan) -> dict:
    """TransformerConfig's recompute fields (in the order --recompute-* flags are written)."""
    p = plan.spec.parallelism
    if plan.layout.recompute == "selective":
        modules = {"recompute_modules": list(p.recompute_modules)} if p.recompute_modules else {}
        return {"recompute_granularity": "selective"} | modules
    if plan.layout.recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": p.recompute_method or "uniform",
                "recompute_num_layers": p.recompute_num_layers or 1} | (
                    {"distribute_saved_activations": True} if p.distribute_saved_activations else {})
    return {}
