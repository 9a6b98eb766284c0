"""Parameter counts of a dense decoder-only transformer, whole and per GPU after TP/PP sharding.

Per layer (h hidden, a heads, g KV groups, d = h/a head dim, f MLP width):
  attention  h*(h + 2*g*d) (QKV, GQA) + h*h (output projection)
  MLP        2*h*f, or 3*h*f gated (SwiGLU: gate, up, down)
  norms      two per layer: 2*h each for LayerNorm (weight + bias), h for RMSNorm
  biases     (when add_bias_linear) h + 2*g*d, h, f (2f gated), h
Embeddings V*h (V padded to a multiple of 128*tp, as Megatron-LM pads), learned positions s*h, a final
norm, and an untied output layer V*h. Under tensor parallelism the weight matrices, the column-parallel
biases and the vocabulary are split tp ways; norms and row-parallel output biases are replicated.

Pipeline stages hold the layers of a :class:`~orchestrator.stages.StageSplit` (even: num_layers / pp each;
uneven: first, each middle, last), the first stage also the embeddings, the last the final norm and the
output layer (with tied embeddings and pp > 1, its own copy of the embedding matrix).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..layout import engine_of, padded_vocab_size
from ..spec import Spec
from ..stages import StageSplit, stage_split


@dataclass(frozen=True)
class MoEShape:
    """The MoE fields the cost model reads (model.moe)."""

    num_experts: int
    router_topk: int
    expert_ffn: int
    shared_ffn: int = 0
    first_dense_layers: int = 0
    capacity_factor: float | None = None
    dispatcher: str = "alltoall"     # model.moe.token_dispatcher (null: alltoall, what orch writes)


@dataclass(frozen=True)
class ModelShape:
    """The resolved model fields the cost model reads (hashable, for caching)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    gated_mlp: bool = False
    tie_embeddings: bool = True
    flash_attention: bool = True
    rmsnorm: bool = False
    learned_positions: bool = True
    bias: bool = True
    kv_channels: int | None = None      # head dimension when it is not hidden / heads (Qwen3)
    moe: MoEShape | None = None
    # Hidden and attention dropout probability. orch trains without dropout (render/megatron.py writes
    # --attention-dropout 0 --hidden-dropout 0; the reference trainer has none), so a spec's shape says 0; a
    # published run states its own (tests/published.py case_dropout). With 0 no mask is stored and no
    # dropout kernel runs (estimate/activations.py, estimate/compute.py).
    dropout: float = 0.0
    # model.hidden_dropout sets ``dropout``; ``attention_dropout`` is model.attention_dropout where it differs
    # (the unfused attention's probabilities; None: the same as ``dropout``). A fused (flash) attention
    # regenerates its mask in the backward and stores none (docs/recompute-dropout.md).
    attention_dropout: float | None = None
    # The cross-entropy implementation the run's loss goes through (estimate/activations.py LOSS_IMPLS: what it
    # keeps of the logits for the backward; estimate/compute.py head_time_s: its memory traffic). orch's
    # Megatron runs: Megatron-Core's vocab-parallel cross entropy; orch's DeepSpeed runs: the reference
    # trainer's torch cross entropy (default_loss); training.cross_entropy_impl names another.
    loss: str = "vocab_parallel"
    # The fused attention kernel (estimate/attention.py ATTENTION_IMPLS: its measured rate by head dimension and
    # sequence length, or the GPU's catalog figure). orch's own runs: "catalog"; training.attention_impl names
    # another.
    attention: str = "catalog"
    # Features Megatron-Core runs with extra eager kernels (estimate/eager_ops.py): model.rope_fusion,
    # model.activation_func_clamp_value, parallelism.recompute_modules. ``fused_rope`` False: RoPE with
    # a YaRN attention factor, which Megatron-Core applies unfused; ``glu_clamp``: the experts' gated activation
    # clamps its inputs at this value first; ``recompute_modules``: Megatron's --recompute-modules beyond core
    # attention ("layernorm", "moe_act"), recomputed on top of the layout's recompute unless that is full.
    fused_rope: bool = True
    glu_clamp: float | None = None
    recompute_modules: tuple[str, ...] = ()
    # A spec's parallelism.recompute_modules (estimate/recompute.py): ``recompute_modules`` holds its modules
    # but core_attn; ``recompute_core_attn`` False when a selective recompute leaves core attention out.
    # ``recompute_method`` / ``recompute_num_layers``: which layers a full recompute recomputes (Megatron's
    # --recompute-method / --recompute-num-layers; orch's default uniform, 1: every layer, one at a time).
    recompute_core_attn: bool = True
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # A benchmark run that forced balanced routing (Megatron's --moe-router-force-load-balancing: random router
    # logits; model.moe.router_force_load_balancing; estimate/moe.py random_routing_imbalance); orch's runs train
    # their router.
    router_force_balance: bool = False
    # Layer code in eager PyTorch instead of Megatron-Core's fused kernels (estimate/eager_ops.py; training.layer_impl
    # and training.eager_norm). ``layer_impl`` "torchtitan_llama":
    # torchtitan's Llama layer (complex RoPE, silu * mul, separate projections); ``eager_norm``: its norms are
    # torchtitan's eager RMSNorm (norm_type "rmsnorm") rather than a fused kernel.
    layer_impl: str = "megatron_core"
    eager_norm: bool = False

    @property
    def attention_dropout_p(self) -> float:
        """The attention probabilities' dropout (``attention_dropout``, else ``dropout``)."""
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """Width of Q and of the attention output: heads * head_dim (= hidden without kv_channels)."""
        return self.num_attention_heads * self.head_dim

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): num_query_groups * head_dim."""
        return self.num_query_groups * self.head_dim

    @property
    def mlp_in_width(self) -> int:
        """Output width of the first MLP matrix (gate and up fused when gated)."""
        return self.ffn_hidden_size * (2 if self.gated_mlp else 1)


def model_shape(spec: Spec) -> ModelShape:
    m = spec.model
    return ModelShape(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups, ffn_hidden_size=m.ffn_hidden_size, vocab_size=m.vocab_size,
        seq_length=m.seq_length, gated_mlp=m.gated_mlp, tie_embeddings=m.tie_embeddings,
        flash_attention=m.flash_attention, rmsnorm=m.normalization == "rmsnorm",
        learned_positions=m.position_embedding == "learned", bias=m.add_bias_linear, kv_channels=m.kv_channels,
        moe=None if m.moe is None else MoEShape(
            num_experts=m.moe.num_experts, router_topk=m.moe.router_topk, expert_ffn=m.moe.ffn_hidden_size,
            shared_ffn=m.moe.shared_expert_ffn_hidden_size, first_dense_layers=m.moe.first_dense_layers,
            capacity_factor=m.moe.capacity_factor, dispatcher=m.moe.token_dispatcher or "alltoall"),
        **_dropout_fields(spec), **_recompute_fields(spec), **_software_fields(spec))


# training.attention_impl / cross_entropy_impl as the cost model names them (attention.py ATTENTION_IMPLS,
# activations.py LOSS_IMPLS).
ATTENTION_IMPL_OF = {"flash_attn_2": "fa2", "flash_attn_triton": "flash_attn_triton"}
LOSS_IMPL_OF = {"vocab_parallel": "vocab_parallel", "vocab_parallel_fused": "vocab_parallel_fused", "torch": "torch",
                "flash_attn_xentropy": "xentropy"}


def default_loss(engine: str) -> str:
    """The cross entropy orch's runs train with: Megatron-Core's vocab-parallel cross entropy (render/megatron.py
    writes no --cross-entropy-loss-fusion; the native fusion keeps the same buffers), the reference trainer's
    torch cross entropy on DeepSpeed (train/model.py lm_loss). estimate/activations.py LOSS_IMPLS."""
    return "torch" if engine == "deepspeed" else "vocab_parallel"


def _software_fields(spec: Spec) -> dict:
    """What the run's software does that changes the cost (spec fields; null: what orch's engine writes)."""
    m, t = spec.model, spec.training
    return {"loss": LOSS_IMPL_OF[t.cross_entropy_impl] if t.cross_entropy_impl else default_loss(engine_of(spec)),
            "attention": ATTENTION_IMPL_OF[t.attention_impl] if t.attention_impl else "catalog",
            "fused_rope": m.rope_fusion is not False, "glu_clamp": m.activation_func_clamp_value,
            "router_force_balance": bool(m.moe and m.moe.router_force_load_balancing),
            "layer_impl": t.layer_impl or "megatron_core", "eager_norm": bool(t.eager_norm)}


def _dropout_fields(spec: Spec) -> dict:
    """model.hidden_dropout as ``dropout``; model.attention_dropout as ``attention_dropout`` where it differs
    (None: it follows ``dropout``, also when a published run's context sets that: step.py EstimateContext.of)."""
    hidden, attention = float(spec.model.hidden_dropout or 0.0), float(spec.model.attention_dropout or 0.0)
    return {"dropout": hidden, "attention_dropout": None if attention == hidden else attention}


def _recompute_fields(spec: Spec) -> dict:
    """The spec's recompute modules / method / layer count as ModelShape fields (defaults when unset)."""
    p = spec.parallelism
    fields: dict = {}
    if p.recompute_modules:
        fields["recompute_modules"] = tuple(sorted(set(p.recompute_modules) - {"core_attn"}))
        fields["recompute_core_attn"] = "core_attn" in p.recompute_modules
    if p.recompute_method:
        fields["recompute_method"] = p.recompute_method
    if p.recompute_num_layers:
        fields["recompute_num_layers"] = p.recompute_num_layers
    return fields


@dataclass(frozen=True)
class ParamsEstimate:
    """Parameter counts: the whole model and what the busiest GPU holds."""

    total: int                 # whole model (vocabulary padded for this tp)
    per_layer: int             # one transformer layer, unsharded
    embedding: int             # input embedding (+ learned positions), unsharded
    output_layer: int          # untied output matrix, 0 when tied
    padded_vocab_size: int
    first_stage_per_gpu: int   # held by one GPU of pipeline stage 0
    last_stage_per_gpu: int    # held by one GPU of the last stage
    largest_layer_per_gpu: int  # biggest single module a ZeRO-3 rank gathers at once
    middle_stage_per_gpu: int = 0  # held by one GPU of a middle stage (pp > 2), 0 when there is none

    @property
    def per_gpu(self) -> int:
        return max(self.first_stage_per_gpu, self.last_stage_per_gpu, self.middle_stage_per_gpu)


def _norm_params(shape: ModelShape) -> int:
    return shape.hidden_size * (1 if shape.rmsnorm else 2)


def attention_matrix_params(shape: ModelShape) -> int:
    """QKV (GQA) and output projection weights of one layer."""
    h = shape.hidden_size
    return h * (shape.q_size + 2 * shape.kv_size) + shape.q_size * h


def mlp_matrix_params(shape: ModelShape, ffn: int) -> int:
    return (3 if shape.gated_mlp else 2) * shape.hidden_size * ffn


def layer_matrix_params(shape: ModelShape) -> int:
    """Weights of the linear layers of one dense transformer layer (no biases, no norms)."""
    return attention_matrix_params(shape) + mlp_matrix_params(shape, shape.ffn_hidden_size)


def moe_layer_matrix_params(shape: ModelShape) -> tuple[int, int]:
    """(weights every rank of the tp group shares out: attention, router, shared expert; routed experts)
    of one MoE layer (Megatron-Core MoE: a router h x E, E expert MLPs, an optional shared expert)."""
    moe = shape.moe
    dense = attention_matrix_params(shape) + shape.hidden_size * moe.num_experts + \
        mlp_matrix_params(shape, moe.shared_ffn)
    return dense, moe.num_experts * mlp_matrix_params(shape, moe.expert_ffn)


def active_layer_matrix_params(shape: ModelShape) -> float:
    """Weights one token passes through per layer, averaged over the layers (MoE: top-k experts, the
    router and the shared expert; dense layers: their MLP). What model FLOPs count."""
    if shape.moe is None:
        return layer_matrix_params(shape)
    moe, n = shape.moe, shape.num_layers
    dense, _ = moe_layer_matrix_params(shape)
    active_moe = dense + moe.router_topk * mlp_matrix_params(shape, moe.expert_ffn)
    return (moe.first_dense_layers * layer_matrix_params(shape) + shape.num_moe_layers * active_moe) / n


def _bias_and_norms(shape: ModelShape, mlp_in_width: int) -> tuple[int, int]:
    """(column-parallel biases, replicated norms and row-parallel biases) of one layer."""
    h = shape.hidden_size
    sharded, replicated = 0, 2 * _norm_params(shape)
    if shape.bias:
        sharded += shape.q_size + 2 * shape.kv_size + mlp_in_width
        replicated += 2 * h
    return sharded, replicated


def layer_params_per_rank(shape: ModelShape, tp: int, ep: int = 1, etp: int = 1) -> int:
    """Parameters of one layer held by one rank (replicated parts counted in full); MoE models: the mean
    over their dense and MoE layers, routed experts sharded over ep x etp (MoE parallel folding)."""
    bias, replicated = _bias_and_norms(shape, shape.mlp_in_width)
    dense_layer = (layer_matrix_params(shape) + bias) // tp + replicated
    if shape.moe is None:
        return dense_layer
    return int((shape.moe.first_dense_layers * dense_layer + shape.num_moe_layers * moe_layer_params_per_rank(
        shape, tp, ep, etp)) / shape.num_layers)


def moe_layer_params_per_rank(shape: ModelShape, tp: int, ep: int, etp: int) -> int:
    dense, experts = moe_layer_matrix_params(shape)
    _, replicated = _bias_and_norms(shape, 0)
    return dense // tp + experts // (ep * etp) + replicated


def largest_module_per_rank(shape: ModelShape, tp: int, padded_vocab: int) -> int:
    """The largest single module one rank holds: DeepSpeed ZeRO-3's gather unit (a Linear's weight; its
    biases and the norms stay resident below stage3_param_persistence_threshold) and the "largest layer"
    of DeepSpeed's memory estimator (estimate_zero3_model_states_mem_needs: the most parameters any one
    module holds itself, not recursively). QKV, attention output, MLP in, MLP out, or the embedding. MoE
    models: the whole mean layer (the expert modules are not modelled one by one)."""
    h = shape.hidden_size
    if shape.moe is not None:
        return max(layer_params_per_rank(shape, tp), padded_vocab * h // tp)
    return max(max(ds_layer_modules(shape, tp)), padded_vocab * h // tp)


@lru_cache(maxsize=4096)
def ds_layer_modules(shape: ModelShape, tp: int) -> tuple[int, ...]:
    """One rank's weight modules of a transformer layer in forward order (QKV, attention output, MLP in,
    MLP out): DeepSpeed ZeRO-3's gather units (estimate/engines.py)."""
    h = shape.hidden_size
    gemms = (h * (shape.q_size + 2 * shape.kv_size), shape.q_size * h, h * shape.mlp_in_width, shape.ffn_hidden_size * h)
    return tuple(g // tp for g in gemms)


@lru_cache(maxsize=4096)
def expert_params_per_layer_per_rank(shape: ModelShape, ep: int, etp: int) -> float:
    """Routed-expert weights of one rank per layer (mean over the layers): what the expert-data-parallel
    group (not the data-parallel one) reduces and shards."""
    if shape.moe is None:
        return 0.0
    return moe_layer_matrix_params(shape)[1] / (ep * etp) * shape.num_moe_layers / shape.num_layers


@lru_cache(maxsize=4096)
def estimate_params(shape: ModelShape, tp: int = 1, pp: int = 1, split: StageSplit | None = None,
                    ep: int = 1, etp: int = 1) -> ParamsEstimate:
    """Parameter counts for a (tp, pp) split; ``split`` says how many layers each stage holds (None: even);
    routed experts are sharded over ep x etp."""
    split = split or stage_split(shape.num_layers, pp)
    h, v = shape.hidden_size, padded_vocab_size(shape.vocab_size, tp)
    positions = shape.seq_length * h if shape.learned_positions else 0
    per_layer = layer_params_per_rank(shape, 1)
    embedding = v * h + positions
    output = 0 if shape.tie_embeddings else v * h
    total = shape.num_layers * per_layer + embedding + _norm_params(shape) + output
    layer_tp = layer_params_per_rank(shape, tp, ep, etp)
    first = split.first * layer_tp + v * h // tp + positions
    # With pp > 1 a tied output layer keeps its own copy of the embedding on the last stage.
    head = v * h // tp if (not shape.tie_embeddings or pp > 1) else 0
    last = split.last * layer_tp + _norm_params(shape) + head
    middle = split.middle * layer_tp if pp > 2 else 0
    if pp == 1:
        first = last = split.first * layer_tp + v * h // tp + positions + _norm_params(shape) + (output // tp)
    largest = max(layer_tp, v * h // tp)
    return ParamsEstimate(total=total, per_layer=per_layer, embedding=embedding, output_layer=output,
                          padded_vocab_size=v, first_stage_per_gpu=first, last_stage_per_gpu=last,
                          largest_layer_per_gpu=largest, middle_stage_per_gpu=middle)
