"""The training spec: what the user asks for, as one typed, frozen record tree, and the parse of its keys.

The parse rejects unknown keys (with "did you mean"), checks types and bounds, expands the model preset and
defaults; :func:`orchestrator.spec_loader.load_spec` runs it, then the cross-field rules, and reports every
problem at once. ``schemas/spec.schema.json`` is exported from these classes (``make schemas``), never
written by hand.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from .catalog.gpus import GPUS
from .catalog.models import MODELS, preset_fields
from .errors import Problem
from .typed import did_you_mean, dump, spec_field

SPEC_VERSION = 1
NAME_PATTERN = r"[A-Za-z0-9._-]{1,64}"
SLURM_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.,-]{0,127}"  # partitions, accounts, QOS: no shell syntax
SLURM_DEPENDENCY_PATTERN = r"[a-z]+(:[0-9_+*]+)*([,?][a-z]+(:[0-9_+*]+)*)*"  # afterok:12:13,singleton
SLURM_HOSTLIST_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.,\[\]-]{0,1023}"  # node[01-04],other
_SBATCH_ARG = r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=%@/+*\[\]-]+)?"
SBATCH_ARGS_PATTERN = rf"{_SBATCH_ARG}( {_SBATCH_ARG})*"  # --mem=0 --constraint=h100: no quotes, no shell syntax

# Upper bounds of every count: far above any real cluster or model (the largest published runs use ~10^5
# GPUs, ~10^2 layers, ~10^5 hidden, 10^6-token contexts), low enough that the planner's searches and the
# cost model's arithmetic stay fast and finite. Beyond them a value is a typo, not a plan.
MAX_NODES = 1 << 16
MAX_GPUS_PER_NODE = 1 << 7         # 8 on most GPU nodes, 72 in an NVL72 rack
MAX_WORLD = 1 << 17                # GPUs in one job: 131072 (the largest clusters hold ~10^5)
MAX_LAYERS = 1 << 10               # the largest published models have ~10^2
MAX_WIDTH = 1 << 20                # hidden_size, ffn_hidden_size
MAX_HEADS = 1 << 14
MAX_VOCAB = 1 << 24
MAX_SEQ_LENGTH = 1 << 24
MAX_BATCH = 1 << 24                # sequences per step, per micro-batch
MAX_DEGREE = 1 << 20               # tp, pp, dp, vpp
MAX_STEPS = 10 ** 9                # train_iters, warm-up, checkpoint interval
MAX_SEED = 2 ** 32 - 1             # numpy's seed range (torch's is wider)
MAX_SLURM_SIGNAL_S = 65535         # sbatch --signal: sig_time must lie in 0..65535
SLURM_TIME_PATTERN = r"([0-9]{1,3}-([01]?[0-9]|2[0-3])|[0-9]{1,3}):[0-5][0-9]:[0-5][0-9]"  # ASCII digits only
MAX_TOTAL_TOKENS = 1e18            # the largest published pre-training runs read ~10^13 tokens
MAX_GPU_HOUR_COST = 1e6            # per GPU-hour, in any currency: cloud list prices are ~10^0-10^1 USD
CURRENCY_PATTERN = r"[A-Z]{3}"     # ISO 4217
WANDB_NAME_PATTERN = r"[^/\\#?%:]{1,128}"   # W&B refuses these characters in project and entity names
_DIR_PART = r"(?!\.{1,2}(/|$))[A-Za-z0-9._+=@,-]{1,255}"      # a path component that is not . or ..
RUN_DIR_PATH_PATTERN = rf"{_DIR_PART}(/{_DIR_PART}){{0,31}}/?"   # relative, inside the run dir: no /x, no ..
WANDB_TAG_PATTERN = r"^.{1,64}$"            # wandb.init refuses an empty tag or one over 64 characters

Precision = Literal["bf16", "fp16", "fp32", "fp8"]
Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "optimizer", "optimizer+params"]
Engine = Literal["megatron", "deepspeed"]
GradReduceDtype = Literal["fp32", "bf16", "fp16"]
# Megatron-LM core_v0.16.1's --recompute-modules choices (TransformerConfig.recompute_modules).
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RecomputeMethod = Literal["uniform", "block"]
# Megatron-Core core_v0.16.1 MoE token dispatchers (moe_token_dispatcher_type; flex with its backend).
TokenDispatcher = Literal["alltoall", "allgather", "flex_deepep", "flex_hybridep"]
# Defaults resolved into the spec (spec.resolved.yaml shows them).
DEFAULT_HOST_MEMORY_GiB_PER_GPU = 64
DEFAULT_HOST_MEMORY_GiB_PER_CPU_PROCESS = 8


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-Experts: every MoE layer routes each token to router_topk of num_experts expert MLPs
    (Megatron-Core MoE; Shazeer et al. 2017; Fedus et al. 2021). Absent or null: a dense model."""

    num_experts: int = spec_field(doc="routed experts per MoE layer", minimum=1)
    router_topk: int = spec_field(2, doc="experts each token is routed to (top-k)", minimum=1)
    ffn_hidden_size: Optional[int] = spec_field(
        None, doc="MLP width of one routed expert; default model.ffn_hidden_size", minimum=1)
    shared_expert_ffn_hidden_size: int = spec_field(
        0, doc="MLP width of the shared expert every token also passes (DeepSeek, Qwen2-MoE); 0: none", minimum=0)
    first_dense_layers: int = spec_field(
        0, doc="leading dense layers (DeepSeek-style); every later layer is MoE", minimum=0)
    capacity_factor: Optional[float] = spec_field(
        None, doc="null: dropless (every token reaches its experts); a number: each expert takes at most "
        "capacity_factor * tokens * topk / num_experts tokens and drops the rest", minimum=0.01, maximum=1000,
        bound_reason="below 0.01 an expert takes almost no token; above num_experts / topk nothing is dropped")
    aux_loss_coeff: float = spec_field(
        0.01, doc="load-balancing auxiliary loss coefficient (Switch Transformer's 0.01; 0 = off)", minimum=0,
        maximum=1, bound_reason="published runs use 1e-4 to 1e-1; above 1 balancing outweighs the language loss")
    router_force_load_balancing: Optional[bool] = spec_field(
        None, doc="route on random logits so every expert gets an equal share (Megatron's "
        "--moe-router-force-load-balancing, which benchmark runs such as NVIDIA's performance tables set; the "
        "model then learns nothing useful); null = false, the trained router; engine megatron", omit_if_none=True)
    token_dispatcher: Optional[TokenDispatcher] = spec_field(
        None, doc="how tokens reach their experts' ranks (Megatron's --moe-token-dispatcher-type and, for flex, "
        "--moe-flex-dispatcher-backend): alltoall (NCCL all-to-all over the ep ranks), allgather (every rank "
        "gathers all tokens; no EP all-to-all overlap), flex_deepep (DeepEP's fused dispatch/combine kernels; "
        "dropless only, as Megatron-Core refuses padding to a capacity_factor), flex_hybridep (HybridEP: one "
        "copy per remote node, then NVLink; what NVIDIA's Megatron-Bridge performance runs use); flex needs a "
        "GPU and engine megatron; null = alltoall, what orch writes", omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a dense decoder-only transformer. A preset fills these; explicit fields override it."""

    preset: Optional[Literal[tuple(MODELS)]] = spec_field(None, doc="model preset (orch init --list-presets)")
    num_layers: Optional[int] = spec_field(None, doc="transformer layers", minimum=1, maximum=MAX_LAYERS)
    hidden_size: Optional[int] = spec_field(None, doc="model width h", minimum=1, maximum=MAX_WIDTH)
    num_attention_heads: Optional[int] = spec_field(None, doc="attention heads a", minimum=1, maximum=MAX_HEADS)
    num_query_groups: Optional[int] = spec_field(None, doc="KV heads (GQA); default num_attention_heads",
                                                 minimum=1, maximum=MAX_HEADS)
    ffn_hidden_size: Optional[int] = spec_field(None, doc="MLP width; default 4 * hidden_size", minimum=1,
                                               maximum=4 * MAX_WIDTH)
    vocab_size: Optional[int] = spec_field(None, doc="tokenizer vocabulary (padded as Megatron does)",
                                           minimum=1, maximum=MAX_VOCAB)
    seq_length: Optional[int] = spec_field(None, doc="tokens per sequence", minimum=1, maximum=MAX_SEQ_LENGTH)
    gated_mlp: bool = spec_field(False, doc="SwiGLU MLP (3 matrices) instead of GeLU (2)")
    tie_embeddings: bool = spec_field(True, doc="share input embedding and output layer weights")
    flash_attention: bool = spec_field(True, doc="fused attention: no s^2 attention activations stored")
    normalization: Literal["layernorm", "rmsnorm"] = spec_field("layernorm", doc="norm layer")
    position_embedding: Literal["learned", "rope"] = spec_field("learned", doc="position embedding")
    add_bias_linear: bool = spec_field(True, doc="bias terms in linear layers")
    kv_channels: Optional[int] = spec_field(
        None, doc="per-head dimension; default hidden_size / num_attention_heads (Qwen3: 128)", minimum=1,
        omit_if_none=True)
    moe: Optional[MoESpec] = spec_field(None, doc="Mixture-of-Experts; null: a dense model", omit_if_none=True)
    hidden_dropout: Optional[float] = spec_field(
        None, doc="dropout probability of the hidden state (embedding and both residual branches; Megatron's "
        "--hidden-dropout); null = 0.0, what orch's own runs train with; > 0 is generated for engine megatron "
        "(orch plan predicts it on deepspeed, orch generate refuses it there)",
        minimum=0, exclusive_maximum=1, omit_if_none=True)
    attention_dropout: Optional[float] = spec_field(
        None, doc="dropout probability of the attention probabilities (Megatron's --attention-dropout); "
        "null = 0.0; > 0 is generated for engine megatron only", minimum=0, exclusive_maximum=1, omit_if_none=True)
    rope_fusion: Optional[bool] = spec_field(
        None, doc="apply rotary positions with Megatron-Core's fused kernel; false = --no-rope-fusion (the unfused "
        "ops Megatron-Core falls back to for a YaRN RoPE); null = true; engine megatron, position_embedding rope",
        omit_if_none=True)
    activation_func_clamp_value: Optional[float] = spec_field(
        None, doc="clamp the gated MLP's inputs at this value before the activation (Megatron's "
        "--activation-func-clamp-value; gpt-oss: 7.0); null = no clamp; engine megatron, gated_mlp",
        exclusive_minimum=0, maximum=1e6, omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class GpuHourCostSpec:
    """What one GPU-hour costs: the plan shows each layout's cost to train training.total_tokens."""

    amount: float = spec_field(doc="price of one GPU-hour, in currency", exclusive_minimum=0, maximum=MAX_GPU_HOUR_COST)
    currency: str = spec_field(doc="ISO 4217 currency code, e.g. USD, EUR", pattern=CURRENCY_PATTERN,
                               pattern_hint="write a 3-letter ISO 4217 code in capitals, e.g. USD or EUR")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Where the job runs: nodes x GPUs of one catalog type, optionally with measured bandwidths."""

    gpu: Literal[tuple(GPUS)] = spec_field(doc="GPU catalog key")
    num_nodes: int = spec_field(1, doc="nodes", minimum=1, maximum=MAX_NODES)
    gpus_per_node: int = spec_field(8, doc="GPUs (processes) per node", minimum=1,
                                    maximum=MAX_GPUS_PER_NODE)
    intra_node_bandwidth_GBps: Optional[float] = spec_field(
        None, doc="measured all-reduce bus bandwidth inside a node (overrides the catalog)", exclusive_minimum=0)
    inter_node_bandwidth_GBps: Optional[float] = spec_field(
        None, doc="measured bandwidth per GPU across nodes (overrides the catalog)", exclusive_minimum=0)
    host_memory_GiB: Optional[float] = spec_field(
        None, doc="host memory per node that offload may use (GiB); default: 64 GiB per GPU (half of a DGX "
        "A100's 1 TiB over 8 GPUs), and on gpu cpu 8 GiB per process", exclusive_minimum=0)
    gpu_hour_cost: Optional[GpuHourCostSpec] = spec_field(
        None, doc="price per GPU-hour {amount, currency}: the plan shows each layout's cost to train "
        "training.total_tokens", omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """Optimizer and its hyper-parameters."""

    type: Literal["adamw", "adam", "sgd"] = spec_field("adamw", doc="optimizer")
    lr: float = spec_field(3.0e-4, doc="peak learning rate", exclusive_minimum=0, maximum=10,
                           bound_reason="LLM pre-training uses 1e-5 to 1e-2; above 10 training diverges at once")
    weight_decay: float = spec_field(0.1, doc="decoupled weight decay", minimum=0, maximum=10,
                                     bound_reason="typical values are 0 to 0.1")
    betas: list[float] = spec_field(default_factory=lambda: [0.9, 0.95], doc="Adam betas [beta1, beta2], each in "
                                    "[0, 1)", minimum=0, exclusive_maximum=1, min_items=2, max_items=2)
    eps: float = spec_field(1.0e-8, doc="Adam epsilon", exclusive_minimum=0, maximum=1,
                            bound_reason="typical values are 1e-8 to 1e-5")


@dataclass(frozen=True, kw_only=True)
class LrScheduleSpec:
    """Learning-rate schedule: linear warm-up, then decay to min_lr at train_iters."""

    warmup_iters: int = spec_field(0, doc="linear warm-up steps", minimum=0, maximum=MAX_STEPS)
    decay: Literal["cosine", "linear", "constant"] = spec_field("cosine", doc="decay after warm-up")
    min_lr: float = spec_field(0.0, doc="learning rate at the end of decay", minimum=0, maximum=10,
                               bound_reason="at most optimizer.lr's bound")


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """Where (inside the run dir) and how often the training job checkpoints."""

    dir: str = spec_field("checkpoints", doc="checkpoint directory, inside the run dir (a relative path; symlinks "
                          "out of the run dir are refused at launch)", pattern=RUN_DIR_PATH_PATTERN, not_a_flag=True,
                          pattern_hint="a relative path inside the run dir such as 'checkpoints': no leading /, "
                          "no '..', only letters, digits and . _ - + = @ ,")
    interval: int = spec_field(100, doc="save every N optimizer steps", minimum=1,
                           maximum=MAX_STEPS)
    reshardable: Optional[bool] = spec_field(
        None, doc="save checkpoints that a resized run (orch resize) loads at another tp / pp / dp / ep, engine "
        "megatron: --ckpt-format torch_dist and, with the distributed optimizer (zero_stage 1), "
        "--dist-ckpt-optim-fully-reshardable (Megatron FSDP, zero_stage 2/3, saves fsdp_dtensor: reshardable over "
        "dp only); null = false: Megatron's distributed-optimizer state then reshards over dp only. The DeepSpeed "
        "engine's checkpoints are converted at resize instead (docs/resize.md)", omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """Batch, precision, optimizer and schedule."""

    global_batch_size: int = spec_field(doc="sequences per optimizer step", minimum=1,
                                        maximum=MAX_BATCH)
    engine: Optional[Engine] = spec_field(
        None, doc="megatron | deepspeed: the runtime that trains this spec (rules, files, launch scripts and "
        "predictions follow it); default megatron on GPUs, deepspeed on gpu cpu (Megatron-Core cannot train on CPU)")
    precision: Precision = spec_field(
        "bf16", doc="bf16 | fp16 | fp32 | fp8 (fp8: Megatron engine, Transformer Engine, Ada, Hopper or newer; "
        "FP8 GEMMs with bf16 master weights)")
    optimizer: OptimizerSpec = spec_field(default_factory=OptimizerSpec, doc="optimizer")
    lr_schedule: LrScheduleSpec = spec_field(default_factory=LrScheduleSpec, doc="learning-rate schedule")
    train_iters: int = spec_field(1000, doc="optimizer steps", minimum=1, maximum=MAX_STEPS)
    gradient_clipping: float = spec_field(1.0, doc="max global gradient norm (0 = off)", minimum=0, maximum=1e6,
                                          bound_reason="typical values are 0.5 to 10")
    checkpoint: CheckpointSpec = spec_field(default_factory=CheckpointSpec, doc="checkpointing")
    seed: int = spec_field(1234, doc="random seed (data and initialisation)", minimum=0,
                      maximum=MAX_SEED)
    total_tokens: Optional[float] = spec_field(
        None, doc="tokens to train: the plan shows each layout's days (and, with cluster.gpu_hour_cost, cost) "
        "to train them", exclusive_minimum=0, maximum=MAX_TOTAL_TOKENS, omit_if_none=True)
    engine_version: Optional[str] = spec_field(
        None, doc="the release of training.engine the run uses (DeepSpeed: e.g. 0.5.4; the cost model follows "
        "the collectives and optimizer paths of that release, docs/cost-model.md); null = the release orch "
        "writes configs for (DeepSpeed: DEEPSPEED_VERSION of orchestrator/validate/_deepspeed_keys_data.py; "
        "Megatron-LM core_v0.16.1). orch plan predicts any "
        "release; orch generate and validate refuse one orch does not write for", pattern=r"[0-9]+(\.[0-9]+){0,2}",
        pattern_hint="a release number such as 0.5 or 0.14.4", omit_if_none=True)
    grad_reduce_dtype: Optional[GradReduceDtype] = spec_field(
        None, doc="fp32 | bf16 | fp16: the dtype gradients are reduced in across data parallelism (and Megatron's "
        "gradient buffer holds); null = the engine's default for training.precision: Megatron fp32 for bf16 and "
        "fp8 (--bf16 accumulates and all-reduces in fp32 unless --grad-reduce-in-bf16), fp16 for fp16; "
        "DeepSpeed the training dtype (communication_data_type unset), fp32 with Ulysses (context > 1: "
        "seq_parallel_communication_data_type); fp32 training: fp32. orch generate writes "
        "--grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32 or communication_data_type; validate "
        "refuses a dtype the engine cannot reduce this precision in", omit_if_none=True)
    fp8_recipe: Optional[Literal["delayed", "tensorwise"]] = spec_field(
        None, doc="with precision fp8: the FP8 scaling recipe (Megatron's --fp8-recipe): delayed (amax history) "
        "or tensorwise (per-tensor current scaling, NVIDIA's FP8-CS); null = delayed", omit_if_none=True)
    attention_impl: Optional[Literal["flash_attn_2", "flash_attn_triton"]] = spec_field(
        None, doc="the fused attention kernel the run's code calls, where it is not the engine's own: "
        "flash_attn_2 (FlashAttention-2, e.g. PyTorch SDPA's flash backend), flash_attn_triton (flash-attn 1.x's "
        "Triton kernel); null = the engine's (Megatron-Core's Transformer Engine attention, the reference "
        "trainer's SDPA; the GPU catalog's rate). For predicting other software: orch plan accepts it, "
        "orch generate and validate refuse it", omit_if_none=True)
    cross_entropy_impl: Optional[Literal["vocab_parallel", "vocab_parallel_fused", "torch",
                                         "flash_attn_xentropy"]] = spec_field(
        None, doc="the cross-entropy implementation (what the loss keeps of the logits): vocab_parallel "
        "(Megatron-Core's, also Megatron-DeepSpeed's and GPT-NeoX's), vocab_parallel_fused (the same with "
        "Megatron's --cross-entropy-loss-fusion, NeMo's and Megatron-Bridge's default), torch (torch cross "
        "entropy on fp32 logits), flash_attn_xentropy (flash-attn's fused xentropy); null = the engine's own "
        "(megatron: vocab_parallel; deepspeed, orch's reference trainer: torch). orch plan accepts any; orch "
        "generate writes vocab_parallel_fused for a Megatron-LM program (--cross-entropy-loss-fusion) and, with "
        "validate, refuses one the engine does not use", omit_if_none=True)
    layer_impl: Optional[Literal["megatron_core", "torchtitan_llama"]] = spec_field(
        None, doc="the transformer layer's code: megatron_core (fused Transformer Engine kernels, what orch "
        "trains) or torchtitan_llama (torchtitan's eager Llama layer: complex RoPE, separate projections, "
        "silu * mul); null = megatron_core. orch generate and validate refuse torchtitan_llama", omit_if_none=True)
    eager_norm: Optional[bool] = spec_field(
        None, doc="the norms run as eager PyTorch ops (torchtitan's norm_type rmsnorm) instead of a fused kernel; "
        "null = false. orch generate and validate refuse true", omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """What the trainer reads. Megatron's --data-path / --tokenizer-* come from here."""

    path: Optional[str] = spec_field(None, doc="dataset path prefix (Megatron indexed) or a text file",
                                     not_a_flag=True)
    tokenizer: Optional[str] = spec_field(None, doc="tokenizer name or path; null with synthetic data",
                                          not_a_flag=True)
    synthetic: bool = spec_field(True, doc="deterministic random tokens")


def _added_degree(maximum: int, doc: str):
    """An optional count added after spec_version 1: left out of the resolved spec (and its hash) while null."""
    return spec_field(None, doc=doc, minimum=1, maximum=maximum, omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class ParallelismSpec:
    """The layout. Every field is optional: what is missing is searched by the planner (orch plan)."""

    tensor: Optional[int] = spec_field(None, doc="tensor-parallel degree tp", minimum=1, maximum=MAX_DEGREE)
    pipeline: Optional[int] = spec_field(None, doc="pipeline-parallel degree pp", minimum=1, maximum=MAX_DEGREE)
    virtual_pipeline: Optional[int] = spec_field(None, doc="interleaved stages per pp rank", minimum=1, maximum=MAX_DEGREE)
    data: Optional[int] = spec_field(None, doc="data-parallel degree dp = world / (tp * pp)", minimum=1, maximum=MAX_DEGREE)
    zero_stage: Optional[int] = spec_field(None, doc="ZeRO stage 0-3", minimum=0, maximum=3)
    micro_batch_size: Optional[int] = spec_field(None, doc="sequences per micro-batch per GPU", minimum=1,
                                              maximum=MAX_BATCH)
    sequence_parallel: Optional[bool] = spec_field(None, doc="Megatron sequence parallelism (needs tp > 1)")
    recompute: Optional[Recompute] = spec_field(None, doc="activation recomputation")
    offload: Optional[Offload] = spec_field(None, doc="ZeRO-Offload of optimizer (and parameters) to CPU")
    recompute_modules: Optional[list[RecomputeModule]] = spec_field(
        None, doc="with recompute: selective, the submodules recomputed in the backward (Megatron's "
        "--recompute-modules; engine megatron): core_attn, mlp (dense MLP), moe (whole MoE block), moe_act "
        "(experts' activation), shared_experts, layernorm (norms that are modules of their own), mla_up_proj; "
        "null = [core_attn]", min_items=1, omit_if_none=True)
    recompute_method: Optional[RecomputeMethod] = spec_field(
        None, doc="with recompute: full, which layers recompute (Megatron's --recompute-method): uniform = "
        "every layer, in groups of recompute_num_layers; block = only the first recompute_num_layers layers "
        "of each pipeline stage (chunk); null = uniform", omit_if_none=True)
    recompute_num_layers: Optional[int] = spec_field(
        None, doc="with recompute: full, Megatron's --recompute-num-layers (group size for uniform, layers "
        "recomputed per stage chunk for block); null = 1", minimum=1, maximum=MAX_LAYERS, omit_if_none=True)
    first_stage_layers: Optional[int] = _added_degree(MAX_LAYERS,
        "transformer layers on the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers); "
        "the middle stages share the rest equally; null = even split")
    last_stage_layers: Optional[int] = _added_degree(MAX_LAYERS,
        "transformer layers on the last pipeline stage (--decoder-last-pipeline-num-layers); null = even split")
    context: Optional[int] = _added_degree(MAX_DEGREE,
        "context-parallel degree cp (Megatron context parallelism: the sequence split over cp ranks, K/V "
        "exchanged in a ring); with engine deepspeed, the Ulysses sequence-parallel degree")
    expert: Optional[int] = _added_degree(MAX_DEGREE,
        "expert-parallel degree ep: the experts of each MoE layer spread over ep ranks, tokens routed to them "
        "by all-to-all (MoE models only)")
    expert_tensor: Optional[int] = _added_degree(MAX_DEGREE,
        "expert tensor-parallel degree etp: the experts' own tensor parallelism (MoE parallel folding; "
        "Megatron's --expert-tensor-parallel-size)")
    shard_degree: Optional[int] = _added_degree(MAX_DEGREE,
        "hybrid sharding (engine megatron, zero_stage 1-3): shard the ZeRO-sharded states over this many "
        "data-parallel ranks and replicate them across dp / shard_degree groups (Megatron's "
        "--num-distributed-optimizer-instances); must divide dp; null = shard over the whole data-parallel "
        "group (docs/hybrid-sharding.md)")
    account_for_embedding_loss: Optional[bool] = spec_field(
        None, doc="count the embedding and the loss as one layer each when splitting the layers over the "
        "pipeline (Megatron's --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split; "
        "engine megatron): (num_layers + 2) / pp per stage, the first and the last stage one transformer layer "
        "less, and interleaving divides that count; null = the planner decides", omit_if_none=True)
    overlap_moe_expert_parallel_comm: Optional[bool] = spec_field(
        None, doc="overlap the MoE all-to-all with compute (Megatron's --overlap-moe-expert-parallel-comm); "
        "null or true = orch writes it wherever Megatron-Core allows it (ep > 1, interleaved or no pipeline, no "
        "full recompute); false = never", omit_if_none=True)
    distribute_saved_activations: Optional[bool] = spec_field(
        None, doc="with recompute: full and tp > 1, keep each layer's checkpointed input split over the tp ranks "
        "(Megatron's --distribute-saved-activations; DeepSpeed's partition_activations); needs sequence_parallel "
        "off; null = false; orch generates it for engine megatron, and refuses it for deepspeed",
        omit_if_none=True)
    overlap_p2p_comm: Optional[bool] = spec_field(
        None, doc="overlap the interleaved pipeline schedule's send/receive with compute (Megatron-LM's "
        "overlap_p2p_comm, on by default with virtual pipeline stages since 2023-10; false writes "
        "--no-overlap-p2p-communication; engine megatron with pp > 1 and virtual_pipeline > 1); null or true = on",
        omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class SlurmSpec:
    """sbatch options."""

    partition: Optional[str] = spec_field(None, doc="partition (-p)", pattern=SLURM_NAME_PATTERN)
    account: Optional[str] = spec_field(None, doc="account (-A)", pattern=SLURM_NAME_PATTERN)
    time: str = spec_field("04:00:00", doc="time limit [D-]HH:MM:SS", pattern=SLURM_TIME_PATTERN,
                     pattern_hint="HH:MM:SS or D-HH:MM:SS in ASCII digits, minutes and seconds below 60")
    qos: Optional[str] = spec_field(None, doc="quality of service", pattern=SLURM_NAME_PATTERN)
    exclusive: bool = spec_field(True, doc="whole nodes (--exclusive)")
    requeue: bool = spec_field(True, doc="requeue on preemption or node failure (--requeue)")
    cpus_per_task: Optional[int] = spec_field(None, doc="CPUs per task (--cpus-per-task)", minimum=1,
                                                maximum=MAX_GPUS_PER_NODE * 64)
    signal_before_end_s: int = spec_field(120, doc="USR1 this many seconds before the time limit", minimum=0,
                                          maximum=MAX_SLURM_SIGNAL_S)
    dependency: Optional[str] = spec_field(None, doc="start after other jobs (--dependency), e.g. afterok:1234",
                                           pattern=SLURM_DEPENDENCY_PATTERN)
    nodelist: Optional[str] = spec_field(None, doc="run on these nodes (--nodelist), e.g. gpu[01-04]",
                                         pattern=SLURM_HOSTLIST_PATTERN)
    extra_args: Optional[str] = spec_field(None, doc="more sbatch options, space-separated, e.g. '--mem=0 "
                                           "--constraint=h100' (written last: they win)",
                                           pattern=SBATCH_ARGS_PATTERN)


@dataclass(frozen=True, kw_only=True)
class PdshSpec:
    """Hosts for the pdsh backend (DeepSpeed's multi-node launcher style)."""

    hosts: list[str] = spec_field(default_factory=list, doc="host names, one per node")
    ssh_port: int = spec_field(22, doc="sshd port on the hosts", minimum=1, maximum=65535)
    fanout: int = spec_field(1024, doc="pdsh -f: hosts contacted at once", minimum=1, maximum=MAX_NODES)


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """How `orch launch` starts the job."""

    backend: Literal["local", "slurm", "pdsh"] = spec_field("local", doc="local | slurm | pdsh")
    master_port: int = spec_field(29500, doc="rendezvous TCP port", minimum=1024, maximum=65535)
    slurm: SlurmSpec = spec_field(default_factory=SlurmSpec, doc="SLURM options")
    pdsh: PdshSpec = spec_field(default_factory=PdshSpec, doc="pdsh options")


@dataclass(frozen=True, kw_only=True)
class WandbSpec:
    """Weights & Biases: offline by default (no account needed), online when logged in."""

    project: str = spec_field("orch", doc="W&B project", pattern=WANDB_NAME_PATTERN,
                              pattern_hint="no / \\ # ? % : (W&B refuses them)", not_a_flag=True)
    entity: Optional[str] = spec_field(None, doc="W&B entity (team or user)", pattern=WANDB_NAME_PATTERN,
                              pattern_hint="no / \\ # ? % : (W&B refuses them)", not_a_flag=True)
    mode: Literal["offline", "online", "disabled"] = spec_field("offline", doc="offline | online | disabled")
    group: Optional[str] = spec_field(None, doc="run group; default the spec name")
    tags: list[str] = spec_field(default_factory=list, doc="extra run tags, 1 to 64 characters each",
                                 pattern=WANDB_TAG_PATTERN, pattern_hint="1 to 64 characters: W&B refuses an empty "
                                 "tag or a longer one (at wandb.init, after the job started)")


@dataclass(frozen=True, kw_only=True)
class TrackingSpec:
    """Telemetry sinks and DeepSpeed's own timers."""

    wandb: WandbSpec = spec_field(default_factory=WandbSpec, doc="Weights & Biases")
    wall_clock_breakdown: bool = spec_field(False, doc="DeepSpeed wall_clock_breakdown timers")
    comms_logger: bool = spec_field(False, doc="DeepSpeed comms_logger: times every collective (it then synchronizes after each one, so no communication overlaps compute); off leaves the section out of ds_config.json")


ProgramKind = Literal["orch", "megatron-lm", "script"]
DS_CONFIG_ARG_PATTERN = r"--?[A-Za-z][A-Za-z0-9_.-]*"


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    """What every rank runs (orchestrator.programs): orch's reference trainer, a Megatron-LM entry script, or
    the user's own script. Relative paths are relative to the spec file; the resolved spec records them
    absolute."""

    kind: ProgramKind = spec_field("orch", doc="orch (the reference trainer) | megatron-lm (a Megatron-LM checkout's "
                                   "entry script) | script (your Python script, handed ds_config.json)")
    megatron_lm: Optional[str] = spec_field(None, doc="kind megatron-lm: the Megatron-LM checkout (same path on every "
                                            "node); $VARIABLES and ~ are expanded", omit_if_none=True)
    entry: Optional[str] = spec_field(None, doc="kind megatron-lm: the entry script, relative to megatron_lm; "
                                      "default pretrain_gpt.py", omit_if_none=True)
    path: Optional[str] = spec_field(None, doc="kind script: your training script (a .py file); $VARIABLES and ~ "
                                     "are expanded", omit_if_none=True)
    args: list[str] = spec_field(default_factory=list, doc="kind script: arguments passed to the script; kind "
                                 "megatron-lm: Megatron-LM arguments added after orch's (they win); each one quoted")
    ds_config_arg: Optional[str] = spec_field(
        None, doc="kind script: the flag that receives RUN_DIR/ds_config.json; default --deepspeed_config "
        "(deepspeed.add_config_arguments); --deepspeed for a Hugging Face Trainer script", omit_if_none=True,
        pattern=DS_CONFIG_ARG_PATTERN, pattern_hint="one flag such as --deepspeed_config")
    log_format: Optional[Literal["deepspeed", "hf", "megatron"]] = spec_field(
        None, doc="what the program logs (the telemetry wrapper reads it): deepspeed | hf (Hugging Face Trainer: orch "
        "also passes the TrainingArguments that agree with ds_config.json) | megatron; default hf when ds_config_arg "
        "is --deepspeed, megatron for kind megatron-lm, else deepspeed", omit_if_none=True)
    save_arg: Optional[str] = spec_field(
        None, doc="kind script: the flag that receives the dir your script saves its DeepSpeed checkpoints into "
        "(engine.save_checkpoint(dir)): RUN_DIR/training.checkpoint.dir; e.g. --save_dir as in DeepSpeed's tutorial; "
        "unset: orch passes none", omit_if_none=True, pattern=DS_CONFIG_ARG_PATTERN,
        pattern_hint="one flag such as --save_dir")
    load_arg: Optional[str] = spec_field(
        None, doc="kind script: the flag that receives the dir your script loads from (engine.load_checkpoint(dir), "
        "the tag its latest file names), passed only when there is a checkpoint to resume: the run's own, or a "
        "resized run's converted one; e.g. --load_dir; unset: orch passes none", omit_if_none=True,
        pattern=DS_CONFIG_ARG_PATTERN, pattern_hint="one flag such as --load_dir")


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One training run: model, cluster, training, data, parallelism, launch and tracking."""

    name: str = spec_field(doc="names the run dir, the job and the W&B run", pattern=NAME_PATTERN, not_a_flag=True)
    model: ModelSpec = spec_field(default_factory=ModelSpec, doc="model shape")
    cluster: ClusterSpec = spec_field(doc="cluster")
    training: TrainingSpec = spec_field(doc="training")
    data: DataSpec = spec_field(default_factory=DataSpec, doc="data")
    parallelism: ParallelismSpec = spec_field(default_factory=ParallelismSpec, doc="parallel layout")
    launch: LaunchSpec = spec_field(default_factory=LaunchSpec, doc="launch")
    tracking: TrackingSpec = spec_field(default_factory=TrackingSpec, doc="telemetry")
    program: Optional[ProgramSpec] = spec_field(
        None, doc="what every rank runs; default orch's reference trainer (kind orch)", omit_if_none=True)
    spec_version: int = spec_field(SPEC_VERSION, doc="spec format version", minimum=1, maximum=SPEC_VERSION)

    @property
    def world_size(self) -> int:
        return self.cluster.num_nodes * self.cluster.gpus_per_node


REQUIRED_MODEL_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")


def read_spec_data(path: str | Path) -> Any:
    """Parse a YAML or JSON file into plain data, within orchestrator.userfiles' limits (size, depth,
    aliases, duplicate keys); every failure is a SpecError with the location."""
    from .userfiles import parse_json, parse_yaml, read_user_text  # noqa: PLC0415

    path = Path(path)
    text = read_user_text(path)
    return parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))


def check_world_bound(spec: Spec) -> list[Problem]:
    """num_nodes * gpus_per_node within what a cluster can hold (each bounded alone, the product too)."""
    c = spec.cluster
    if spec.world_size <= MAX_WORLD:
        return []
    return [Problem("cluster", f"num_nodes({c.num_nodes}) * gpus_per_node({c.gpus_per_node}) = {spec.world_size} GPUs "
                    f"is above {MAX_WORLD}", "no cluster holds that many: check num_nodes and gpus_per_node")]


def _merge_preset(model: Any, problems: list[Problem]) -> Any:
    if not isinstance(model, dict) or model.get("preset") is None:
        return model
    name = model["preset"]
    if not isinstance(name, str) or name not in MODELS:
        problems.append(Problem("model.preset", f"unknown preset {name!r}", did_you_mean(str(name), list(MODELS))))
        return {k: v for k, v in model.items() if k != "preset"}
    preset = preset_fields(name)
    merged = {**preset, **model}
    if isinstance(preset.get("moe"), dict) and isinstance(model.get("moe"), dict):
        merged["moe"] = {**preset["moe"], **model["moe"]}   # model.moe.x overrides one field of the preset's
    return merged


def _apply_defaults(spec: Spec, problems: list[Problem]) -> Spec | None:
    m = spec.model
    for name in REQUIRED_MODEL_FIELDS:
        if getattr(m, name) is None:
            problems.append(Problem(f"model.{name}", "required key is missing",
                                    "set it, or set model.preset (orch init --list-presets)"))
    if any(getattr(m, name) is None for name in REQUIRED_MODEL_FIELDS):
        return None
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    moe = m.moe and dataclasses.replace(m.moe, ffn_hidden_size=m.moe.ffn_hidden_size or ffn)
    model = dataclasses.replace(m, num_query_groups=m.num_query_groups or m.num_attention_heads,
                                ffn_hidden_size=ffn, moe=moe)
    wandb = spec.tracking.wandb
    tracking = dataclasses.replace(spec.tracking, wandb=dataclasses.replace(wandb, group=wandb.group or spec.name))
    training = dataclasses.replace(spec.training, engine=spec.training.engine or default_engine(spec.cluster.gpu))
    cluster = dataclasses.replace(spec.cluster, host_memory_GiB=spec.cluster.host_memory_GiB
                                  or default_host_memory_GiB(spec.cluster.gpu, spec.cluster.gpus_per_node))
    return dataclasses.replace(spec, model=model, tracking=tracking, training=training, cluster=cluster)


def default_engine(gpu: str) -> str:
    """megatron on GPUs; deepspeed on the CPU target (Megatron-Core cannot train on CPU)."""
    return "deepspeed" if gpu == "cpu" else "megatron"


def default_host_memory_GiB(gpu: str, gpus_per_node: int) -> float:
    """Host memory per node offload may use when the spec does not say (documented in the field)."""
    per_process = DEFAULT_HOST_MEMORY_GiB_PER_CPU_PROCESS if gpu == "cpu" else DEFAULT_HOST_MEMORY_GiB_PER_GPU
    return float(per_process * gpus_per_node)


def spec_to_data(spec: Spec) -> dict:
    """The spec as plain data (every default expanded), as written to spec.resolved.yaml."""
    return dump(spec)


def spec_sha256(spec: Spec) -> str:
    """Content hash of the resolved spec (stable across key order and formatting)."""
    blob = json.dumps(spec_to_data(spec), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()
