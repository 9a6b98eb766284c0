"""Communication volumes and times: data-parallel, tensor-parallel and pipeline p2p.

Rank order (our assumption, Megatron-LM's default "tp-cp-ep-dp-pp" with cp = ep = 1, which is also
DeepSpeed's PipeModelDataParallelTopology): tensor-parallel ranks are adjacent (inside a node when
tp <= gpus_per_node), data-parallel ranks have stride tp, pipeline ranks stride tp*dp. A group therefore
has ``per_node`` members on each of ``num_nodes`` nodes.

Collective costs follow the ring algorithms of nccl-tests (docs: PERFORMANCE.md): an all-reduce moves
2(n-1)/n of the buffer per GPU, a reduce-scatter or all-gather (n-1)/n, and ``busbw`` is what a link
sustains under that accounting. A group that spans nodes is costed hierarchically: the intra-node part
over NVLink (the node's measured busbw), then the inter-node part on 1/per_node of the buffer over each
GPU's own share of the NICs; an all-reduce is a reduce-scatter followed by an all-gather. Each call also
pays a fixed latency (more with more nodes, as NCCL's trees grow with log2 of the node count).

What is sent:
* DP (per step): stage 0 all-reduces the gradients; stage 1 (and Megatron's distributed optimizer)
  reduce-scatters gradients and all-gathers updated parameters; DeepSpeed's stage 2 reduce-scatters into
  the owner's partition at every micro-batch (a rank keeps no full gradient buffer to accumulate in) and
  all-gathers parameters once; stage 3 all-gathers parameters for every forward and backward (and for the
  recomputed forward) and reduce-scatters gradients, every micro-batch (ZeRO paper, section 7: 1.5x the
  all-reduce volume per pass). Gradients travel in the training dtype.
* TP (per layer, per micro-batch): two all-reduces of s*b*h in the forward and two in the backward
  (Shoeybi et al. 2019), two more when the forward is recomputed; sequence parallelism swaps each for a
  reduce-scatter + all-gather pair of the same volume (Korthikanti et al. 2022, section 4.2.2).
* PP (per micro-batch, per chunk boundary): the activation forward and its gradient backward, s*b*h,
  sent as 1/tp slices by each TP rank and re-assembled by an intra-node all-gather (Narayanan et al. 2021,
  section 4.1 scatter/gather; already sharded with sequence parallelism). Tied embeddings with pp > 1 add
  one all-reduce of the embedding gradient between the first and last stage per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil, log2

from .hardware import Hardware


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


def _latency_s(pl: Placement, hw: Hardware) -> float:
    return hw.latency_s * (1 + log2(pl.num_nodes))


def reduce_scatter_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """Time of a reduce-scatter (or all-gather) of an ``nbytes`` buffer over group ``pl``."""
    if pl.size <= 1:
        return 0.0
    k, n = pl.per_node, pl.num_nodes
    t = _latency_s(pl, hw)
    if k > 1:
        t += (k - 1) / k * nbytes / hw.intra_Bps
    if n > 1:
        t += (n - 1) / n * nbytes / k / hw.inter_Bps
    return t


all_gather_s = reduce_scatter_s


def all_reduce_s(nbytes: float, pl: Placement, hw: Hardware) -> float:
    """All-reduce = reduce-scatter + all-gather (ring and hierarchical alike)."""
    return 2 * reduce_scatter_s(nbytes, pl, hw)


def ring_bytes(nbytes: float, n: int, kind: str = "reduce_scatter") -> float:
    """Bytes one GPU sends for a collective on an ``nbytes`` buffer among ``n`` ranks."""
    if n <= 1:
        return 0.0
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return factor * nbytes


def p2p_s(nbytes: float, inter_node: bool, hw: Hardware) -> float:
    """One point-to-point transfer of ``nbytes``."""
    return hw.latency_s + nbytes / (hw.inter_Bps if inter_node else hw.intra_Bps)


@dataclass(frozen=True)
class DataParallelComm:
    """DP communication of one step, split by what compute can hide it behind."""

    bytes: float            # sent per GPU per step
    time_s: float           # total time of the collectives
    exposed_s: float        # not hidden behind compute
    reduce_s: float = 0.0   # the gradient reductions alone (all-reduce / reduce-scatter), no param gathers


def data_parallel_comm(*, param_bytes: float, pl: Placement, zero_stage: int, num_microbatches: int,
                       full_recompute: bool, forward_window_s: float, backward_window_s: float,
                       overlap: float, hw: Hardware) -> DataParallelComm:
    """DP traffic for ``param_bytes`` (the 16-bit size of the GPU's parameters, before ZeRO sharding).

    ``forward_window_s``/``backward_window_s``: compute of one micro-batch's forward/backward on this
    stage, behind which bucketed collectives can run (``overlap`` of it is usable).
    """
    if pl.size <= 1:
        return DataParallelComm(0.0, 0.0, 0.0)
    n, m = pl.size, num_microbatches
    rs = reduce_scatter_s(param_bytes, pl, hw)
    one = ring_bytes(param_bytes, n)
    hide_b, hide_f = overlap * backward_window_s, overlap * forward_window_s
    if zero_stage == 0:
        return DataParallelComm(2 * one, 2 * rs, max(0.0, 2 * rs - hide_b), reduce_s=2 * rs)
    if zero_stage == 1:
        return DataParallelComm(2 * one, 2 * rs, max(0.0, rs - hide_b) + rs, reduce_s=rs)
    if zero_stage == 2:
        return DataParallelComm((m + 1) * one, (m + 1) * rs, m * max(0.0, rs - hide_b) + rs, reduce_s=m * rs)
    gathers_fwd = 2 if full_recompute else 1
    per_mb_exposed = max(0.0, rs - hide_f) + max(0.0, gathers_fwd * rs + rs - hide_b)
    return DataParallelComm(m * (gathers_fwd + 2) * one, m * (gathers_fwd + 2) * rs, m * per_mb_exposed,
                            reduce_s=m * rs)


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

    @property
    def exposed_s(self) -> float:
        return self.dp_exposed_s + self.tp_exposed_s + self.pp_exposed_s

    def to_dict(self) -> dict:
        d = {k: float(getattr(self, k)) for k in ("dp_bytes", "tp_bytes", "pp_bytes", "dp_s", "tp_s", "pp_s",
                                                   "dp_exposed_s", "tp_exposed_s", "pp_exposed_s",
                                                   "dp_reduce_s")}
        d["exposed_s"] = float(self.exposed_s)
        return d
