"""Activation memory per GPU (Korthikanti et al. 2022, arXiv 2205.05198, section 4 and Table 2), generalised to
GQA, any MLP width, fused attention, training without dropout and the loss implementation; what each pipeline
stage holds in flight under 1F1B and the interleaved schedule, with an even or uneven split.

The formulas, their derivation and sources: docs/cost-model.md, "estimate/activations.py".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..stages import StageSplit, stage_split
from .params import ModelShape

MASK_BYTES = 1
LSE_BYTES = 4      # fused attention keeps its log-sum-exp in fp32
LOGIT_FP32_BYTES = 4
LOSS_IMPLS = ("vocab_parallel", "vocab_parallel_fused", "xentropy", "torch")


@dataclass(frozen=True)
class ActivationsEstimate:
    """Activation bytes on one GPU of the first, the last and (pp > 2) the first middle pipeline stage."""

    per_layer_bytes: int        # one layer, one micro-batch (the Korthikanti figure)
    first_stage_layers_in_flight: float
    last_stage_layers_in_flight: float
    first_stage_bytes: int      # stored layers + embedding output + recompute working set
    last_stage_bytes: int       # stored layers + logits / loss buffers + recompute working set
    working_bytes: int          # transient: one layer recomputed during backward
    logits_bytes: int           # last stage: what the loss holds of one micro-batch's logits (peak)
    middle_stage_layers_in_flight: float = 0.0   # stage 1 when pp > 2 (the busiest middle stage)
    middle_stage_bytes: int = 0                  # its stored layers + recompute working set; 0 if none


def mask_bytes(shape: ModelShape) -> int:
    """Bytes per element of a dropout mask: MASK_BYTES with dropout, 0 without (docs/cost-model.md)."""
    return MASK_BYTES if shape.dropout > 0 else 0


def attention_probs_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes per attention-score element an unfused attention stores: softmax output, dropout mask and output
    with dropout; the softmax output alone without."""
    return 2 * dtype_bytes + MASK_BYTES if shape.attention_dropout_p > 0 else dtype_bytes


def layer_activation_bytes(shape: ModelShape, tp: int, sp: bool, recompute: str, micro_batch: int,
                           dtype_bytes: int = 2) -> int:
    """Bytes one layer stores for one micro-batch on one tensor-parallel rank."""
    s, b, h, e = shape.seq_length, micro_batch, shape.hidden_size, dtype_bytes
    sbh = s * b * h
    rep_div = tp if sp else 1
    if recompute == "full":
        return e * sbh // rep_div
    replicated = (4 * e + 2 * mask_bytes(shape)) * sbh           # norm inputs, QKV/fc1 inputs, masks
    mlp = (3 if shape.gated_mlp else 2) * shape.ffn_hidden_size
    parallel = e * s * b * (2 * h + 2 * shape.kv_size + mlp)     # Q, K, V, proj input, MLP activations
    a = shape.num_attention_heads
    if shape.flash_attention:
        attention = LSE_BYTES * a * s * b
    elif recompute == "selective" and shape.recompute_core_attn:
        attention = 0
    else:
        attention = attention_probs_bytes(shape, e) * a * s * s * b   # softmax out (dropout mask and out)
    return replicated // rep_div + (parallel + attention) // tp


def attention_scores_bytes(shape: ModelShape, tp: int, micro_batch: int, dtype_bytes: int = 2) -> int:
    """The s^2 tensors of one layer (recomputed by selective recompute; none with flash attention)."""
    if shape.flash_attention:
        return 0
    s = shape.seq_length
    return attention_probs_bytes(shape, dtype_bytes) * shape.num_attention_heads * s * s * micro_batch // tp


def partial_full_recompute_bytes(input_bytes: int, layer_bytes: int, chunk_layers: float, method: str,
                                 num_layers: int) -> tuple[float, int]:
    """(mean bytes stored per layer, transient working bytes) of a full recompute over a model chunk of
    ``chunk_layers`` layers (Megatron-Core transformer_block.py ``_checkpointed_forward``): ``uniform``
    checkpoints groups of ``num_layers`` layers (one input stored per group, a whole group recomputed at once
    in the backward); ``block`` checkpoints the first ``num_layers`` layers one by one and stores every
    activation of the rest (``layer_bytes`` each)."""
    c = max(1, round(chunk_layers))
    if method == "uniform":
        groups = -(-c // num_layers)
        return groups * input_bytes / c, min(num_layers, c) * layer_bytes
    k = min(num_layers, c)
    return (k * input_bytes + (c - k) * layer_bytes) / c, layer_bytes


def in_flight_chunks(stage: int, pp: int, vpp: int, num_microbatches: int) -> int:
    """Chunk micro-batches whose activations stage ``stage`` holds at its peak (1F1B / interleaved)."""
    if vpp == 1:
        return min(num_microbatches, pp - stage)
    return min(num_microbatches * vpp, (pp - stage - 1) * 2 + (vpp - 1) * pp + 1)


def loss_bytes_per_logit(loss: str, dtype_bytes: int) -> int:
    """Peak bytes per logit element the loss holds (what it keeps for its backward and the logits' gradient;
    docs/cost-model.md, one case per :data:`LOSS_IMPLS`)."""
    e = dtype_bytes
    if loss in ("vocab_parallel", "vocab_parallel_fused"):   # both keep the fp32 softmax (the same buffers)
        return LOGIT_FP32_BYTES + (e if e != LOGIT_FP32_BYTES else 0)
    if loss == "xentropy":
        return 2 * e
    if loss == "torch":
        return 2 * e + LOGIT_FP32_BYTES
    raise ValueError(f"unknown loss implementation {loss!r} (one of {', '.join(LOSS_IMPLS)})")


def logits_bytes(shape: ModelShape, padded_vocab: int, tp: int, micro_batch: int, dtype_bytes: int = 2) -> int:
    """What the loss holds of one micro-batch's logits at its peak (``shape.loss``; docs/cost-model.md)."""
    tokens = shape.seq_length * micro_batch
    return tokens * padded_vocab // tp * loss_bytes_per_logit(shape.loss, dtype_bytes)


@lru_cache(maxsize=65536)
def estimate_activations(shape: ModelShape, tp: int, pp: int, vpp: int, sp: bool, recompute: str,
                         micro_batch: int, num_microbatches: int, padded_vocab: int,
                         dtype_bytes: int = 2, split: StageSplit | None = None,
                         distributed_input: bool = False) -> ActivationsEstimate:
    """Activation memory of the first, last and first middle pipeline stage for one layout.
    ``distributed_input``: full recompute keeps 1/tp of each layer's input per rank (step.py
    distributed_saved_input); the working set is the full layer's, as without it."""
    split = split or stage_split(shape.num_layers, pp)
    per_layer = layer_activation_bytes(shape, tp, sp, recompute, micro_batch, dtype_bytes)
    if distributed_input and recompute == "full":
        per_layer //= tp
    first_layers = in_flight_chunks(0, pp, vpp, num_microbatches) * (split.first / vpp)
    last_layers = in_flight_chunks(pp - 1, pp, vpp, num_microbatches) * (split.last / vpp)
    middle_layers = in_flight_chunks(1, pp, vpp, num_microbatches) * (split.middle / vpp) if pp > 2 else 0.0
    if recompute == "full":
        working = layer_activation_bytes(shape, tp, sp, "none", micro_batch, dtype_bytes)
    elif recompute == "selective" and shape.recompute_core_attn:
        working = attention_scores_bytes(shape, tp, micro_batch, dtype_bytes)
    else:
        working = 0
    stage_layer = {"first": (per_layer, working), "last": (per_layer, working), "middle": (per_layer, working)}
    if recompute == "full" and (shape.recompute_method, shape.recompute_num_layers) != ("uniform", 1):
        for name, layers in (("first", split.first), ("last", split.last), ("middle", split.middle)):
            stage_layer[name] = partial_full_recompute_bytes(per_layer, working, layers / vpp,
                                                             shape.recompute_method, shape.recompute_num_layers)
    sbh = shape.seq_length * micro_batch * shape.hidden_size
    # The embedding's output is the first layer's input (counted there); its dropout adds only the mask.
    embedding_out = mask_bytes(shape) * sbh // (tp if sp else 1)
    first_chunks = in_flight_chunks(0, pp, vpp, num_microbatches) // vpp or 1
    logits = logits_bytes(shape, padded_vocab, tp, micro_batch, dtype_bytes)
    # The logits buffers and the recompute working set are never live together: the loss and the output
    # layer run their backward (and free what the loss kept and the logits' gradient) before the last layer's
    # backward recomputes it, so the transient peak is the larger of the two, not their sum.
    (first_pl, first_w), (last_pl, last_w), (middle_pl, middle_w) = (stage_layer[k] for k in ("first", "last", "middle"))
    first = int(first_pl * first_layers) + embedding_out * first_chunks + first_w
    last = int(last_pl * last_layers) + max(logits, last_w)
    middle = int(middle_pl * middle_layers) + middle_w if pp > 2 else 0
    if pp == 1:   # one stage holds the embedding and the logits
        first = last = int(first_pl * first_layers) + embedding_out * first_chunks + max(logits, first_w)
    return ActivationsEstimate(per_layer_bytes=per_layer, first_stage_layers_in_flight=first_layers,
                               last_stage_layers_in_flight=last_layers, first_stage_bytes=first,
                               last_stage_bytes=last, working_bytes=max(first_w, last_w), logits_bytes=logits,
                               middle_stage_layers_in_flight=middle_layers, middle_stage_bytes=middle)
