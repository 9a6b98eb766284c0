"""DeepSpeed ZeRO-3's own memory at the activation peak, read in DeepSpeed 0.19.8's source (the release orch writes
ds_config.json for) and measured on the CPU target (benchmarks/zero3_memory_probe.py; docs/cost-model.md,
"estimate/memory.py", cites each line).

The gathered parameters the coordinator keeps from their forward use to their backward use
(partitioned_param_coordinator.py ``__params_to_release``: a module stays gathered while the trace uses it again
within stage3_max_reuse_distance elements), and the contiguous gradient bucket (stage3.py
``_setup_for_real_optimizer``: one ``torch.empty(reduce_bucket_size)``, into which ``__add_grad_to_ipg_bucket``
copies every full gradient). The fp32 master copy ``_create_fp32_partitions`` clones even in fp32 training is
counted with the model states (step.model_states).
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from .engines import DS_MAX_REUSE_DISTANCE, DS_REDUCE_BUCKET_ELEMENTS, ds_bf16_optimizer, ds_zero3_runtime
from .params import ds_layer_modules, largest_module_per_rank

if TYPE_CHECKING:
    from ..layout import Layout
    from .estimate_context import EstimateContext
    from .params import ParamsEstimate


@lru_cache(maxsize=1024)
def ds_zero3_gathered_at_peak(module_elements: tuple[int, ...], layers: int, first: int, last: int,
                              max_reuse: int) -> int:
    """Parameter elements DeepSpeed ZeRO-3 keeps gathered at the end of the forward (the activation peak) by the
    reuse rule. The trace is ``first`` (the input embedding), the layers' modules in forward order, ``last`` (the
    output layer, or the tied embedding's second use); the backward walks it back. A forward use stays gathered
    while the parameters of the uses between it and its own backward use number fewer than ``max_reuse``: the
    later modules', twice (their forward and their backward use). ``last`` is used again at once. A lower bound:
    the prefetch-skip rule of ``__params_to_release`` may keep more (measured: it keeps the whole small model
    even at distance 0)."""
    later = kept = last
    for e in reversed([e for _ in range(layers) for e in module_elements]):
        if 2 * later < max_reuse:
            kept += e
        later += e
    if first and 2 * later < max_reuse:
        kept += first
    return kept


def ds_zero3_live_bytes(ctx: EstimateContext, lay: Layout, params: ParamsEstimate) -> float | None:
    """Gathered parameters at the activation peak (:func:`ds_zero3_gathered_at_peak`) plus the largest module's
    full gradient (autograd's, until it is copied into the bucket), for a DeepSpeed ZeRO-3 rank of a dense model
    (None otherwise: the generic rule)."""
    if ctx.engine != "deepspeed" or lay.zero_stage != 3 or ctx.shape.moe is not None:
        return None
    shape, tp = ctx.shape, lay.tp
    word = params.padded_vocab_size * shape.hidden_size // tp
    positions = params.embedding - params.padded_vocab_size * shape.hidden_size
    first, last = (positions, word) if shape.tie_embeddings else (word + positions, params.output_layer // tp)
    kept = ds_zero3_gathered_at_peak(ds_layer_modules(shape, tp), shape.num_layers // lay.pp, first, last,
                                     DS_MAX_REUSE_DISTANCE)
    return (kept + largest_module_per_rank(shape, tp, params.padded_vocab_size)) * ctx.hw.dtype_bytes


def ds_zero3_bucket_bytes(psi: float, reduce_bucket_elements: int, grad_bytes: int, resident_on_write: bool) -> float:
    """The contiguous gradient bucket for ``psi`` unsharded parameters of a rank: all of it on a GPU (the caching
    allocator hands out the whole block), its written pages in host memory (``resident_on_write``, the CPU
    target). Not counted: the flattened copy a full bucket's reduce-scatter makes when a backward fills more than
    one bucket (reduce_scatter_coalesced's ``torch.cat``): it comes after that backward has freed the activations
    of the layers whose gradients filled the bucket, so whether it raises the peak depends on the two sizes."""
    return (min(psi, reduce_bucket_elements) if resident_on_write else reduce_bucket_elements) * grad_bytes


def ds_zero3_bucket(ctx: EstimateContext, lay: Layout, psi: float) -> float | None:
    """The contiguous gradient bucket of a DeepSpeed ZeRO-3 rank holding ``psi`` unsharded parameters (None: not
    DeepSpeed ZeRO-3, or a release before DS_ZERO3_CONTIGUOUS_GRADIENTS_SINCE, whose contiguous_gradients default
    is off: its gradients wait in the bucket as autograd left them while the backward frees activations, and the
    generic two-bucket rule stays)."""
    if ctx.engine != "deepspeed" or lay.zero_stage != 3 or ds_zero3_runtime(ctx.engine_version).allreduce_gradients:
        return None
    return ds_zero3_bucket_bytes(psi, DS_REDUCE_BUCKET_ELEMENTS, ctx.hw.dtype_bytes, ctx.hw.host_is_device)


def ds_zero12_bucket(ctx: EstimateContext, lay: Layout) -> float | None:
    """The gradient buckets of a DeepSpeed ZeRO-1/2 rank on a GPU at the release orch writes ds_config.json for
    (None: another engine, stage or release, DeepSpeed's BF16_Optimizer, or the CPU target, whose written pages the
    generic rule counts). DeepSpeed 0.19.8 allocates them whole, whatever the model's size: with the
    ``contiguous_gradients`` and ``overlap_comm`` orch writes, ``setup_buckets`` (stage_1_and_2.py) makes two
    ``torch.empty(reduce_bucket_size)`` per gradient dtype at every micro-step (double buffering); under the
    pipeline engine ``reduce_gradients`` makes one. Elements of the gradient's own dtype
    (``_gradient_reduction_buffer_dtype``: no separate fp32 accumulation at ZeRO-1/2 by default). At orch's
    reduce_bucket_size of 5e8 that is 1.86 GiB of bf16 per rank, where the generic rule counted at most 512 MiB."""
    if (ctx.engine != "deepspeed" or lay.zero_stage not in (1, 2) or ctx.engine_version is not None
            or ctx.hw.host_is_device or lay.dp <= 1
            or ds_bf16_optimizer(ctx.engine_version, ctx.precision, lay.zero_stage, lay.pp)):
        return None
    buffers = 1 if lay.pp > 1 else 2
    return buffers * DS_REDUCE_BUCKET_ELEMENTS * ctx.hw.dtype_bytes
