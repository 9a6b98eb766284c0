"""Communication volumes and times: data-parallel, tensor-parallel and pipeline p2p. Each collective is costed
as NCCL runs it (its choice of algorithm and protocol, ring and tree latencies, bus bandwidth inside and
across nodes) over the rank order Megatron-LM and DeepSpeed use.

The rank order, the NCCL model, what each parallelism sends and what overlaps: docs/cost-model.md,
"estimate/comm.py".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, log2
from typing import TYPE_CHECKING

from .hardware import Hardware

if TYPE_CHECKING:
    from ..layout import Layout
    from .engines import Zero3Runtime


@dataclass(frozen=True)
class Placement:
    """How a process group lies on the cluster."""

    size: int
    per_node: int
    num_nodes: int


def group_placement(size: int, stride: int, gpus_per_node: int) -> Placement:
    """Placement of a group of ``size`` ranks spaced ``stride`` apart (nodes hold consecutive ranks)."""
    if size <= 1:
        return Placement(1, 1, 1)
    per_node = 1 if stride >= gpus_per_node else max(1, min(size, gpus_per_node // stride))
    return Placement(size, per_node, ceil(size / per_node))


# NCCL src/graph/tuning.cc (2.8-2.10): latencies in microseconds. baseLat per (algorithm, protocol), and
# hwLat per link, algorithm and protocol (NVLink; PCI; NET = the network between nodes).
NCCL_BASE_US = {("ring", "LL"): 3.6, ("ring", "Simple"): 8.4, ("tree", "LL"): 4.4, ("tree", "Simple"): 0.0}
NCCL_HOP_US = {
    "nvlink": {("ring", "LL"): 0.47, ("ring", "Simple"): 3.4, ("tree", "LL"): 0.52, ("tree", "Simple"): 28.0},
    "pci": {("ring", "LL"): 1.0, ("ring", "Simple"): 5.7, ("tree", "LL"): 1.0, ("tree", "Simple"): 28.0},
    "net": {("ring", "LL"): 2.7, ("ring", "Simple"): 9.6, ("tree", "LL"): 5.0, ("tree", "Simple"): 50.0},
}
RING_PLATEAU = 1.9       # tuning.cc: large multi-node ring all-reduce latency factor
TREE_BW_FACTOR = 0.9     # tuning.cc: a tree reaches 0.9 of the ring's bus bandwidth ...
TREE_LL_BW_FACTOR = 1 / 3.8   # ... and LL a further 1/3.8 of it
US = 1e-6


@dataclass(frozen=True)
class CollectiveTime:
    """One collective call as NCCL would run it: algorithm, protocol, seconds."""

    algorithm: str
    protocol: str
    seconds: float


def bus_bandwidth_Bps(pl: Placement, hw: Hardware) -> float:
    """Bus bandwidth of a group: the node's busbw inside one node; across nodes each GPU of the group on a
    node drives its own NIC, so the node boundary carries per_node x the per-GPU network bandwidth."""
    if pl.num_nodes <= 1:
        return hw.intra_Bps
    return min(hw.intra_Bps, pl.per_node * hw.inter_Bps)


def nccl_collective(kind: str, nbytes: float, pl: Placement, hw: Hardware) -> CollectiveTime:
    """Fastest (algorithm, protocol) for one ``kind`` call ("all_reduce", "all_gather", "reduce_scatter")
    on an ``nbytes`` buffer (the full buffer: an all-gather's output), and its time."""
    if pl.size <= 1:
        return CollectiveTime("none", "none", 0.0)
    if hw.link == "loopback" and kind == "reduce_scatter":
        return _gloo_reduce_scatter(float(nbytes), pl, hw)
    return _nccl_collective(kind, float(nbytes), pl.size, pl.per_node, pl.num_nodes, bus_bandwidth_Bps(pl, hw),
                            hw.link, hw.latency_s)


def _gloo_reduce_scatter(nbytes: float, pl: Placement, hw: Hardware) -> CollectiveTime:
    """PyTorch's gloo backend has no reduce-scatter of its own: ProcessGroupGloo::reduce_scatter_tensor_coalesced
    (behind _reduce_scatter_base, torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) clones each input,
    all-reduces the clone and copies the rank's chunk out. So an all-reduce of the whole buffer, plus the
    clone (read and write) and the chunk copy, memory-bound (docs/cost-model.md, "Gloo reduce-scatter")."""
    ar = nccl_collective("all_reduce", nbytes, pl, hw)
    return CollectiveTime(ar.algorithm, ar.protocol, ar.seconds + 2 * nbytes * (1 + 1 / pl.size) / hw.hbm_Bps)


@lru_cache(maxsize=65536)
def _nccl_collective(kind: str, nbytes: float, n: int, k: int, nodes: int, busbw: float, link: str,
                     gloo_latency_s: float) -> CollectiveTime:
    all_reduce = kind == "all_reduce"
    steps, inter_steps = (2 * (n - 1), 2 * (nodes - 1)) if all_reduce else (n - 1, nodes - 1)
    if link == "loopback":     # gloo: one fixed latency per ring hop
        return CollectiveTime("ring", "gloo", (1 + steps) * gloo_latency_s + nbytes * steps / n / busbw)
    options = []
    for proto in ("LL", "Simple"):
        intra = NCCL_HOP_US[link][("ring", proto)] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
        lat = NCCL_BASE_US[("ring", proto)] + (steps - inter_steps) * intra + inter_steps * NCCL_HOP_US["net"][("ring", proto)]
        if all_reduce and proto == "Simple" and nodes > 1 and nbytes >= n / 16 * 65536:
            lat *= RING_PLATEAU
        bw = busbw / (4 if proto == "LL" and (nodes > 1 or all_reduce) else 3 if proto == "LL" else 1)
        options.append(CollectiveTime("ring", proto, lat * US + nbytes * steps / n / bw))
        if all_reduce:
            t_intra = NCCL_HOP_US[link][("tree", proto)]
            t_lat = NCCL_BASE_US[("tree", proto)] + 2 * ((k - 1) * t_intra + log2(nodes) * NCCL_HOP_US["net"][("tree", proto)])
            t_bw = busbw * TREE_BW_FACTOR * (TREE_LL_BW_FACTOR if proto == "LL" else 1) / 2
            options.append(CollectiveTime("tree", proto, t_lat * US + nbytes / t_bw))
    return min(options, key=lambda c: c.seconds)


def reduce_scatter_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """Time of one reduce-scatter of an ``nbytes`` buffer over group ``pl``."""
    return nccl_collective("reduce_scatter", nbytes, pl, hw).seconds


def all_gather_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """Time of one all-gather producing an ``nbytes`` buffer over group ``pl``."""
    return nccl_collective("all_gather", nbytes, pl, hw).seconds


def all_reduce_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """Time of one all-reduce of an ``nbytes`` buffer (ring or tree, whichever NCCL would pick)."""
    return nccl_collective("all_reduce", nbytes, pl, hw).seconds


def bucketed_s(kind: str, nbytes: float, bucket_bytes: float, pl: Placement, hw: Hardware) -> tuple[float, float, int]:
    """(total time, time of one bucket, number of calls) of ``nbytes`` sent as buckets of ``bucket_bytes``."""
    calls = max(1, ceil(nbytes / bucket_bytes))
    one = nccl_collective(kind, nbytes / calls, pl, hw).seconds
    return calls * one, one, calls


def ring_bytes(nbytes: float, n: int, kind: str = "reduce_scatter") -> float:
    """Bytes one GPU sends for a collective on an ``nbytes`` buffer among ``n`` ranks."""
    if n <= 1:
        return 0.0
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return factor * nbytes


def p2p_s(nbytes: float, inter_node: bool, hw: Hardware) -> float:
    """One point-to-point transfer of ``nbytes`` (NCCL send/recv: Simple protocol, one hop)."""
    if hw.link == "loopback":
        lat = 2 * hw.latency_s
    else:
        lat = (NCCL_BASE_US[("ring", "Simple")] + NCCL_HOP_US["net" if inter_node else hw.link][("ring", "Simple")]) * US
    return lat + nbytes / (hw.inter_Bps if inter_node else hw.intra_Bps)


@dataclass(frozen=True)
class DataParallelComm:
    """DP communication of one step, split by what compute can hide it behind."""

    bytes: float            # sent per GPU per step
    time_s: float           # total time of the collectives
    exposed_s: float        # not hidden behind compute
    reduce_s: float = 0.0   # the gradient reductions alone (all-reduce / reduce-scatter), no param gathers
    calls: int = 0          # collective calls per step


@dataclass(frozen=True)
class DataParallelWork:
    """What one data-parallel rank of a stage synchronises, and the compute windows it can hide behind."""

    engine: str                 # megatron | deepspeed (bucket sizes, gather units: estimate/engines.py)
    zero_stage: int
    param_elements: float       # this GPU's parameters before ZeRO sharding
    param_bytes: int            # bytes per parameter element on the wire (16-bit)
    grad_bytes: int             # bytes per gradient element on the wire
    layers: int                 # transformer layers on the stage (ZeRO-3 gather units)
    num_microbatches: int
    full_recompute: bool
    forward_window_s: float     # one micro-batch's forward on this stage
    backward_window_s: float    # one micro-batch's backward (and recompute) on this stage
    backward_gather_passes: float | None = None   # DeepSpeed ZeRO-3 backward all-gathers in passes of the
                                     # parameters (engines.ds_backward_regather_share); None: 2 with full
                                     # recompute, else 1 (nothing kept gathered from the forward)
    bucket_all_reduce: bool = False  # DeepSpeed >= 0.12.4 ZeRO-1/2 (ZeRO-1 >= 0.4.4): gradient buckets
                                     # all-reduced, not reduce-scattered (estimate/engines.py ds_bucket_all_reduce)
    zero3: Zero3Runtime | None = None   # DeepSpeed ZeRO-3: what its release does per collective
                                        # (estimate/engines.py ds_zero3_runtime); None: not DeepSpeed
                                        # ZeRO-3 (counted as the current release, all flags off)
    rank_host_s: float = 0.0            # host time per rank of a list collective's Python loop
                                        # (CostModel.ds_list_rank_host_s)
    modules: tuple[int, ...] = ()       # DeepSpeed ZeRO-3: one layer's gather units in forward order
                                        # (params.ds_layer_modules); (): 4 equal units a layer
    chunk_shares: tuple[float, ...] = ()  # Megatron's interleaved 1F1B (vpp > 1, DDP or distributed optimizer):
                                          # each model chunk's share of param_elements, chunk 0 first;
                                          # (): one pass syncs the whole stage (:func:`interleaved_reduce_exposed_s`)
    pp_size: int = 1                    # pipeline stages (the interleaved schedule's micro-batch group)
    stage_rank: int = 0                 # this stage's pipeline rank


def list_copies_s(nbytes: float, n: int, hw: Hardware) -> float:
    """The device copies PyTorch's ProcessGroupNCCL adds to an all-gather (reduce-scatter) on a list of ``n``
    tensors: the flat result is copied back to (the inputs are copied into) the n tensors one by one, n
    copy kernels of ``kernel_gap_s`` launch and tail each, reading and writing the ``nbytes`` buffer once."""
    return n * hw.kernel_gap_s + 2 * nbytes / hw.hbm_Bps


def data_parallel_comm(work: DataParallelWork, pl: Placement, overlap: float, hw: Hardware) -> DataParallelComm:
    """DP traffic of one step, counted call by call (docs/cost-model.md, and estimate/engines.py).

    Bucketed collectives run behind ``overlap`` of the compute window they can overlap; the last bucket of a
    backward (and the first gather of a pass) waits for, or is waited on by, compute and stays exposed.
    """
    if pl.size <= 1:
        return DataParallelComm(0.0, 0.0, 0.0)
    if work.zero_stage <= 2:
        return _replicated_params_comm(work, pl, overlap, hw)
    return _zero3_comm(work, pl, overlap, hw)


def _gradient_buckets(w: DataParallelWork, n: int) -> tuple[str, float]:
    """(collective, elements per call) of the gradient reduction: per layer for Megatron FSDP, else the
    engine's bucket; all-reduce without ZeRO and for DeepSpeed's bucket all-reduce (ZeRO-1/2)."""
    from .engines import reduce_bucket_elements  # noqa: PLC0415

    sharded_units = w.engine == "megatron" and w.zero_stage >= 2      # Megatron FSDP: one unit per layer
    bucket = w.param_elements / max(1, w.layers) if sharded_units else reduce_bucket_elements(w.engine, n)
    kind = "all_reduce" if w.zero_stage == 0 or (w.bucket_all_reduce and w.zero_stage <= 2) else "reduce_scatter"
    return kind, bucket


def _replicated_params_comm(w: DataParallelWork, pl: Placement, overlap: float, hw: Hardware) -> DataParallelComm:
    """ZeRO 0-2 (and Megatron's DDP / distributed optimizer): gradients reduced, updated parameters gathered."""
    from .engines import DS_REDUCE_BUCKET_ELEMENTS  # noqa: PLC0415

    n, m = pl.size, w.num_microbatches
    grads, params = w.param_elements * w.grad_bytes, w.param_elements * w.param_bytes
    hide_b, hide_f = overlap * w.backward_window_s, overlap * w.forward_window_s
    kind, bucket = _gradient_buckets(w, n)
    red_s, red_one, red_calls = bucketed_s(kind, grads, bucket * w.grad_bytes, pl, hw)
    per_step = 1 if w.zero_stage < 2 else m          # ZeRO-2 reduce-scatters every micro-batch
    interleaved = bool(w.chunk_shares)       # set only where Megatron syncs chunk by chunk (step.py)
    exposed = interleaved_reduce_exposed_s(w, red_s, overlap) if interleaved else \
        per_step * max(red_one, red_s - hide_b)
    time, nbytes, calls = per_step * red_s, per_step * ring_bytes(grads, n, kind), per_step * red_calls
    if w.zero_stage >= 1:                             # updated parameters gathered after the step
        gather_bucket = bucket if w.engine == "megatron" else DS_REDUCE_BUCKET_ELEMENTS
        ag_s, ag_one, ag_calls = bucketed_s("all_gather", params, gather_bucket * w.param_bytes, pl, hw)
        # Megatron's --overlap-param-gather hides it behind the next forward; DeepSpeed waits for it.
        if interleaved:
            exposed += interleaved_gather_exposed_s(w, ag_s, overlap)
        else:
            exposed += max(ag_one, ag_s - hide_f) if w.engine == "megatron" else ag_s
        time, nbytes, calls = time + ag_s, nbytes + ring_bytes(params, n), calls + ag_calls
    return DataParallelComm(nbytes, time, exposed, reduce_s=per_step * red_s, calls=calls)


def interleaved_reduce_exposed_s(w: DataParallelWork, reduce_s: float, overlap: float) -> float:
    """Exposed gradient reduction of a stage under Megatron-Core's interleaved 1F1B with overlap_grad_reduce
    and align_grad_reduce (the default: Megatron-LM ``--no-align-grad-reduce`` off; training.py sets
    ``config.grad_sync_func`` to each chunk's ``start_grad_sync``), core_v0.16.1
    pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving:

    * every backward runs under ``no_sync`` (``disable_grad_sync`` before the warmup and at the end of
      ``backward_step_helper_postprocess``; ``backward_step_helper_preprocess`` only enables it when
      ``grad_sync_func`` is None), so the per-bucket hooks (param_and_grad_buffer.py ``register_grad_ready``)
      launch nothing: a chunk's whole reduction starts at once, from ``grad_sync_func[chunk]``;
    * stage r launches chunk c after its backward of virtual micro-batch ``k + r``, k being chunk c's last
      backward (``grad_sync_virtual_microbatch_id = virtual_microbatch_id - pipeline_parallel_rank``): the
      moment stage 0 ends chunk c's last backward, the same on every stage. Backwards run chunk v-1 first
      (``get_model_chunk_id(forward=False)``) in groups of p micro-batches (``get_schedule_table``, group
      size pp by default), so chunk c's last backward is followed by c * p chunk backwards on stage 0, all
      in the cooldown, which has no forwards left (its 2(p-1-r) + (v-1)p warmup micro-batches,
      ``get_pp_rank_microbatches``);
    * chunks whose launch would come after the stage's last backward (chunk 0 on every stage, k + r past the
      table) start in the "Launch any remaining grad reductions" loop after the cooldown. Stage 0 ends the
      pipeline, so its chunk 0 reduction follows all its compute and is exposed whole; stage r ends its own
      cooldown r chunk backwards before stage 0 and has those to hide it behind.

    So chunk c of stage r has ``max(c * p, r)`` chunk backwards (``overlap`` of each) before the step's last
    backward ends; the chunks share the data-parallel communicator and run one after another. Returns how
    far the last one ends past that point."""
    v, p, r = len(w.chunk_shares), w.pp_size, w.stage_rank
    chunk_backward = overlap * w.backward_window_s / v
    free = float("-inf")
    for c in reversed(range(v)):
        launch = -max(c * p, r) * chunk_backward
        free = max(free, launch) + w.chunk_shares[c] * reduce_s
    return max(0.0, free)


def interleaved_gather_exposed_s(w: DataParallelWork, gather_s: float, overlap: float) -> float:
    """Forward time a stage waits for the updated parameters under Megatron-Core's interleaved 1F1B with
    overlap_param_gather and align_param_gather (core_v0.16.1 pipeline_parallel/schedules.py
    forward_backward_pipelining_with_interleaving; training.py sets ``param_sync_func`` to each chunk's
    ``start_param_sync``): chunks 0 and 1 are gathered before the first forward ("Synchronize params for
    first two model chunks"), chunk c >= 2 when stage 0 starts chunk c-1's first forward
    (``forward_step_helper_preprocess``: ``param_sync_virtual_microbatch_id = virtual_microbatch_id +
    pipeline_parallel_rank``, launching chunk id + 1). A chunk's all-gathers are launched bucket group by
    bucket group from the end of the chunk (distributed_data_parallel.py ``start_param_sync``; buckets are
    built from the parameters in reverse, param_and_grad_buffer.py), and the forward pre-hook of its first
    module waits for the group holding it (``finish_param_sync``), the last launched: a chunk's first
    forward waits for its whole gather. Forwards run chunk 0 first in groups of p micro-batches, all of the
    first group in the warmup: stage r starts chunk c's first forward (c * p + r) chunk forwards into the
    step. Stage 0 waits for chunk 0's gather whole."""
    v, p, r = len(w.chunk_shares), w.pp_size, w.stage_rank
    chunk_forward = overlap * w.forward_window_s / v
    done, start, waited = 0.0, r * chunk_forward, 0.0
    for c in range(v):
        if c:
            start += p * chunk_forward
        launch = 0.0 if c < 2 else max(0.0, start - p * chunk_forward - r * chunk_forward)
        done = max(done, launch) + w.chunk_shares[c] * gather_s
        if done > start:
            waited, start = waited + done - start, done
    return waited


def _zero3_comm(w: DataParallelWork, pl: Placement, overlap: float, hw: Hardware) -> DataParallelComm:
    """ZeRO-3 / FSDP: parameters gathered per unit for every forward and backward pass, gradients reduced
    every micro-batch; DeepSpeed releases before 0.6 module use by module use (:func:`_legacy_zero3_gathers`)."""
    from .engines import DS_REDUCE_BUCKET_ELEMENTS, gathers_per_layer  # noqa: PLC0415

    n, m = pl.size, w.num_microbatches
    grads, params = w.param_elements * w.grad_bytes, w.param_elements * w.param_bytes
    hide_b, hide_f = overlap * w.backward_window_s, overlap * w.forward_window_s
    kind, bucket = _gradient_buckets(w, n)
    red_s, red_one, red_calls = bucketed_s(kind, grads, bucket * w.grad_bytes, pl, hw)
    red_bytes = ring_bytes(grads, n, kind)
    units = w.layers * gathers_per_layer(w.engine) + 1                # + the embedding
    rt = w.zero3
    if rt is not None and rt.allreduce_gradients:                   # DeepSpeed < 0.4.3: full all-reduce per bucket
        red_s, red_one, red_calls = bucketed_s("all_reduce", grads, DS_REDUCE_BUCKET_ELEMENTS * w.grad_bytes, pl, hw)
        red_bytes = ring_bytes(grads, n, "all_reduce")
    elif rt is not None and rt.list_reduce_scatters:                # one per parameter, on n input views
        red_s, red_one, red_calls = bucketed_s(kind, grads, grads / units, pl, hw)
        red_one += list_copies_s(grads / units, n, hw) + n * w.rank_host_s
        red_s = red_calls * red_one
    if rt is not None and rt.synchronous_fetch:
        g = _legacy_zero3_gathers(w, pl, overlap, hw)
        # the reductions share the NCCL stream with the gathers: they hide in what the gathers left
        exposed_b = g.exposed_b + max(red_one, red_s - max(0.0, hide_b - g.hidden_b))
        return DataParallelComm(m * (g.bytes + red_bytes), m * (g.time_s + red_s), m * (g.exposed_f + exposed_b),
                                reduce_s=m * red_s, calls=m * (g.calls + red_calls))
    g_s, g_one, _ = bucketed_s("all_gather", params, params / units, pl, hw)
    passes_b = 2 if w.full_recompute else 1                          # backward re-gathers for the recompute too
    if w.backward_gather_passes is not None:                         # less what DeepSpeed keeps gathered
        passes_b = w.backward_gather_passes
    exposed_f = max(g_one, g_s - hide_f)
    exposed_b = max(g_one, passes_b * g_s + red_s - hide_b)
    per_mb_time = (1 + passes_b) * g_s + red_s
    per_mb_bytes = (1 + passes_b) * ring_bytes(params, n) + red_bytes
    return DataParallelComm(m * per_mb_bytes, m * per_mb_time, m * (exposed_f + exposed_b), reduce_s=m * red_s,
                            calls=m * (round((1 + passes_b) * units) + red_calls))


def hybrid_data_parallel_comm(work: DataParallelWork, shard_pl: Placement, replica_pl: Placement, overlap: float,
                              hw: Hardware) -> DataParallelComm:
    """Hybrid sharding (ZeRO-3 over a shard group, replicated across groups): the ZeRO-3 gathers and
    reduce-scatters of :func:`data_parallel_comm` inside the shard group ``shard_pl``, plus, once per step, an
    all-reduce of each rank's gradient shard (1/shard of the gradients, in the engine's reduction buckets)
    across the ``replica_pl`` ranks holding the same shard. Megatron FSDP launches it on the last micro-batch,
    bucket by bucket on its own stream (megatron_fsdp.py ``outer_fsdp_group_grad_reduce``): it hides behind
    that micro-batch's backward but its last bucket."""
    inner = data_parallel_comm(work, shard_pl, overlap, hw)
    if replica_pl.size <= 1:
        return inner
    _, bucket = _gradient_buckets(work, shard_pl.size)
    shard_grads = work.param_elements * work.grad_bytes / shard_pl.size
    ar_s, ar_one, ar_calls = bucketed_s("all_reduce", shard_grads, bucket * work.grad_bytes / shard_pl.size,
                                        replica_pl, hw)
    exposed = max(ar_one, ar_s - overlap * work.backward_window_s)
    return DataParallelComm(inner.bytes + ring_bytes(shard_grads, replica_pl.size, "all_reduce"),
                            inner.time_s + ar_s, inner.exposed_s + exposed, reduce_s=inner.reduce_s + ar_s,
                            calls=inner.calls + ar_calls)


@dataclass(frozen=True)
class LegacyGathers:
    """The parameter all-gathers of one micro-batch under DeepSpeed before 0.6 (:func:`_legacy_zero3_gathers`)."""

    bytes: float          # sent per GPU
    time_s: float         # the collectives and the host work around each
    exposed_f: float      # not hidden in the forward
    exposed_b: float      # not hidden in the recompute and backward (gathers only)
    hidden_b: float       # backward compute the hidden gathers ran behind (the reductions share the stream)
    calls: int


def _legacy_zero3_gathers(w: DataParallelWork, pl: Placement, overlap: float, hw: Hardware) -> LegacyGathers:
    """DeepSpeed ZeRO-3 before 0.6, module use by module use (engines.ds_zero3_fetch_schedule).

    A use's compute is its share (by parameters: its GEMMs) of its layer's forward, recompute or backward
    window, ``overlap`` of it available to hide behind. A synchronous fetch is exposed whole; a prefetch
    launched at a use runs behind the compute of the uses up to the one whose fetch waits for it, and all
    its gathers but the last wait in their own torch.cuda.synchronize() before the compute is launched
    (PR #1188: "the async version is not async at all"). Every gather pays the host work between the fetch's
    synchronize and the compute launch, exposed (:func:`zero3_gather_host_s`). The embedding (what the
    layers leave of the stage's parameters) is gathered once in the forward and once in the backward,
    exposed, as the first gather of each."""
    from .engines import DS_GATHERS_PER_LAYER, DS_MAX_REUSE_DISTANCE, ds_zero3_fetch_schedule  # noqa: PLC0415

    rt, layers, n = w.zero3, max(1, w.layers), pl.size
    if w.param_elements <= 0:
        return LegacyGathers(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    units = DS_GATHERS_PER_LAYER * layers + 1                          # without w.modules: equal units
    modules = w.modules or (round(w.param_elements / units),) * DS_GATHERS_PER_LAYER
    emb = max(0.0, w.param_elements - layers * sum(modules)) if w.modules else w.param_elements / units
    events = ds_zero3_fetch_schedule(modules, layers, w.full_recompute, DS_MAX_REUSE_DISTANCE,
                                     rt.max_live_elements, rt.prefetch_elements)
    recompute = w.forward_window_s / layers if w.full_recompute else 0.0
    share = {"f": w.forward_window_s / layers, "r": recompute, "b": w.backward_window_s / layers - recompute}
    per_layer = float(sum(modules)) or 1.0
    gathered: list[tuple[float, float, float]] = []                    # (elements, NCCL time, host time)

    def gather(elements: float) -> tuple[float, float]:
        """(NCCL time, host time) of one gather of ``elements``, recorded."""
        nbytes = elements * w.param_bytes
        ring, host = all_gather_s(nbytes, pl, hw), zero3_gather_host_s(w, nbytes, n, hw)
        gathered.append((elements, ring, host))
        return ring, host

    hidden_b = pending = behind = 0.0
    exposed = {"f": 0.0, "b": 0.0}
    pending_side = "f"
    for side, elements in (("f", emb), ("b", emb)):
        if elements:
            exposed[side] += sum(gather(elements))
    for ev in events:
        side = "f" if ev.phase == "f" else "b"
        if ev.waits and pending:
            exposed[pending_side] += max(0.0, pending - behind)
            hidden_b += min(pending, behind) if pending_side == "b" else 0.0
            pending = 0.0
        uses = ((ev.gathered,) if ev.gathered else ()) + ev.prefetched
        for i, elements in enumerate(uses):
            ring, host = gather(elements)
            last_prefetch = bool(ev.prefetched) and i == len(uses) - 1
            exposed[side] += host + (0.0 if last_prefetch else ring)
            if last_prefetch:
                pending, pending_side, behind = ring, side, 0.0
        behind += overlap * share[ev.phase] * ev.elements / per_layer
    if pending:
        exposed[pending_side] += max(0.0, pending - behind)
        hidden_b += min(pending, behind) if pending_side == "b" else 0.0
    ring_s, host_s = sum(g[1] for g in gathered), sum(g[2] for g in gathered)
    total = sum(g[0] for g in gathered) * w.param_bytes
    return LegacyGathers(ring_bytes(total, n), ring_s + host_s, exposed["f"], exposed["b"], hidden_b, len(gathered))


def zero3_gather_host_s(work: DataParallelWork, nbytes: float, n: int, hw: Hardware) -> float:
    """What DeepSpeed before 0.6 does per ZeRO-3 gather of ``nbytes`` between the fetch's device-wide
    synchronize and the launch of the module's compute (engines.Zero3Runtime), none of it hidden: zero the
    gather's buffer (torch.zeros, waited by torch.cuda.synchronize()) and, before 0.5.5, the per-rank loop that
    builds the list of n output views and ProcessGroupNCCL's n copies back into them."""
    rt = work.zero3
    if rt is None or not rt.synchronous_fetch:
        return 0.0
    host = nbytes / hw.hbm_Bps
    if rt.list_gathers:
        host += n * work.rank_host_s + list_copies_s(nbytes, n, hw)
    return host


def tensor_parallel_layer_comm(*, tokens: int, hidden: int, pl: Placement, sp: bool, full_recompute: bool,
                               hw: Hardware) -> tuple[float, float]:
    """(bytes sent, time) of one layer's TP collectives for one micro-batch on one rank."""
    if pl.size <= 1:
        return 0.0, 0.0
    nbytes = tokens * hidden * hw.dtype_bytes
    count = 6 if full_recompute else 4
    if sp:   # reduce-scatter + all-gather pairs: same volume, twice the calls
        t = 2 * count * reduce_scatter_s(nbytes, pl, hw)
    else:
        t = count * all_reduce_s(nbytes, pl, hw)
    return count * ring_bytes(nbytes, pl.size, "all_reduce"), t


def pipeline_transfer(*, tokens: int, hidden: int, tp_pl: Placement, sp: bool, inter_node: bool,
                      hw: Hardware) -> tuple[float, float]:
    """(bytes sent, time) of one activation (or gradient) hand-over between two pipeline stages."""
    nbytes = tokens * hidden * hw.dtype_bytes / tp_pl.size
    t = p2p_s(nbytes, inter_node, hw)
    if not sp and tp_pl.size > 1:     # re-assemble the full tensor from the tp slices
        t += all_gather_s(nbytes * tp_pl.size, tp_pl, hw)
    return nbytes, t


@dataclass(frozen=True)
class CommEstimate:
    """Communication of one step per GPU, by kind (SPEC.md LAYOUT.comm)."""

    dp_bytes: float
    tp_bytes: float
    pp_bytes: float
    dp_s: float
    tp_s: float
    pp_s: float
    dp_exposed_s: float
    tp_exposed_s: float
    pp_exposed_s: float
    dp_reduce_s: float = 0.0   # gradient reductions only: what telemetry's allreduce_time_s measures
    ep_bytes: float = 0.0      # expert all-to-all dispatch and combine (estimate/moe.py)
    ep_s: float = 0.0
    ep_exposed_s: float = 0.0  # not hidden by Megatron's EP all-to-all overlap
    cp_bytes: float = 0.0      # context-parallel K/V ring (estimate/context.py)
    cp_s: float = 0.0
    cp_exposed_s: float = 0.0

    @property
    def exposed_s(self) -> float:
        return self.dp_exposed_s + self.tp_exposed_s + self.pp_exposed_s + self.ep_exposed_s + self.cp_exposed_s

    def to_dict(self) -> dict:
        d = {k: float(getattr(self, k)) for k in ("dp_bytes", "tp_bytes", "pp_bytes", "dp_s", "tp_s", "pp_s",
                                                   "dp_exposed_s", "tp_exposed_s", "pp_exposed_s",
                                                   "dp_reduce_s", "ep_bytes", "ep_s", "ep_exposed_s", "cp_bytes", "cp_s",
                                                   "cp_exposed_s")}
        d["exposed_s"] = float(self.exposed_s)
        return d


def grad_sync_size(lay: Layout) -> int:
    """Ranks that hold the same dense weights and reduce their gradients: dp x cp (Megatron folds the
    context-parallel ranks into the data-parallel gradient group)."""
    return lay.dp * lay.cp


def shard_group_size(lay: Layout) -> int:
    """Ranks one copy of the dense model states is sharded over: dp x cp, or shard_degree x cp with hybrid
    sharding (Megatron's partial data-parallel group: (dp x cp) / num_distributed_optimizer_instances)."""
    return grad_sync_size(lay) // lay.replicas


def shard_placements(lay: Layout, gpus_per_node: int) -> tuple[Placement, Placement]:
    """(shard group, replica group) of the dense weights: the shard group is consecutive members of the
    dp x cp group (tp apart), the replica group one member of each shard group (tp x shard apart)."""
    shard = shard_group_size(lay)
    return (group_placement(shard, lay.tp, gpus_per_node),
            group_placement(lay.replicas, lay.tp * shard, gpus_per_node))
