"""The per-step metrics record: one line of ``metrics.jsonl`` and the same names in W&B.

``schemas/metrics.schema.json`` is exported from :class:`MetricsRecord` (``make schemas``), never
written by hand. The SPEC.md names are the contract; the fields after them are additions.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..typed import spec_field


@dataclass(frozen=True, kw_only=True)
class MetricsRecord:
    """One optimizer step, from rank 0, aggregated over every rank of the job."""

    step: int = spec_field(doc="optimizer step, 1-based; each step appears once per run", minimum=1)
    time_unix: float = spec_field(doc="wall clock (seconds since the epoch) when the step finished")
    loss: Optional[float] = spec_field(doc="training loss of the step: mean over micro-batches and data-parallel "
                                           "ranks (null when the program does not expose it)")
    step_time_s: float = spec_field(doc="wall time of the step (data, forward, backward, optimizer), the "
                                        "slowest rank", minimum=0)
    tokens_per_s: float = spec_field(doc="global_batch_size * seq_length / step_time_s", minimum=0)
    tflops_per_gpu: float = spec_field(doc="model FLOPs of the step / (step_time_s * world_size) / 1e12",
                                       minimum=0)
    mfu: float = spec_field(doc="tflops_per_gpu / the catalog's dense peak for the run's precision", minimum=0)
    bubble_fraction: float = spec_field(doc="pipeline bubble of the worst rank: 1 - busy compute time (forward, "
                                            "backward, optimizer step) / step wall time; 0 when pp = 1",
                                        minimum=0, maximum=1)
    allreduce_time_s: float = spec_field(doc="time inside data-parallel gradient reductions (all-reduce, "
                                             "reduce-scatter, reduce), the slowest rank; 0 when dp = 1",
                                         minimum=0)
    allreduce_overhead: float = spec_field(doc="allreduce_time_s / step_time_s", minimum=0)
    comm_exposed_s: float = spec_field(doc="time the training thread was blocked in data-parallel "
                                           "collectives (not overlapped with compute), the slowest rank",
                                       minimum=0)
    mem_peak_bytes: int = spec_field(doc="peak memory, max over ranks: accelerator allocator peak, or the "
                                         "process's peak resident set size on CPU", minimum=0)
    lr: Optional[float] = spec_field(doc="learning rate used by this step's update (null when the program's "
                                         "optimizer is not seen)", minimum=0)
    grad_norm: Optional[float] = spec_field(doc="global gradient norm before clipping (null when the "
                                                "engine does not compute it)")
    # --- additions beyond SPEC.md -------------------------------------------------------------------
    bubble_fraction_mean: float = spec_field(0.0, doc="pipeline bubble averaged over ranks", minimum=0,
                                             maximum=1)
    hfu: float = spec_field(0.0, doc="hardware FLOPs utilisation (recomputation counted)", minimum=0)
    compute_time_s: float = spec_field(0.0, doc="busy compute time (forward, backward, optimizer step; "
                                                "collectives inside them excluded), the busiest rank", minimum=0)
    allgather_time_s: float = spec_field(0.0, doc="time in data-parallel parameter all-gathers (ZeRO), "
                                                  "the slowest rank", minimum=0)
    other_comm_time_s: float = spec_field(0.0, doc="time in other collectives (pipeline send/receive, "
                                                   "tied-weight and tensor-parallel reductions), the slowest "
                                                   "rank", minimum=0)
    comm_bytes: int = spec_field(0, doc="bytes handed to data-parallel gradient reductions by one rank "
                                        "this step", minimum=0)
    allreduce_busbw_GBps: float = spec_field(0.0, doc="achieved bus bandwidth of those reductions "
                                                      "(nccl-tests convention), GB/s", minimum=0)
    world_size: int = spec_field(1, doc="processes in the job", minimum=1)
    # --- MoE and context parallelism (issue 10) -----------------------------------------------------
    alltoall_time_s: float = spec_field(0.0, doc="time inside all-to-all exchanges (MoE token dispatch and "
                                                 "combine, Ulysses sequence/head exchange), forward and backward, "
                                                 "the slowest rank; 0 without them", minimum=0)
    expert_load_imbalance: Optional[float] = spec_field(
        None, doc="MoE: the most-loaded expert's routed token-slots over the mean per expert (over the step's "
                  "micro-batches and ranks), the worst MoE layer; 1 = balanced; null for a dense model", minimum=1)
    tokens_dropped_fraction: Optional[float] = spec_field(
        None, doc="MoE: token-slots dropped at expert capacity / token-slots routed; 0 when dropless; null for a "
                  "dense model", minimum=0, maximum=1)
    moe_aux_loss: Optional[float] = spec_field(
        None, doc="MoE: the routers' load-balancing loss added to the objective (aux_loss_coeff included, summed "
                  "over MoE layers), mean over micro-batches and ranks; ``loss`` is the language-model loss "
                  "without it; null for a dense model", minimum=0)
    # --- end of the MoE and context-parallelism block -----------------------------------------------
    # --- stragglers (issue 11; telemetry/straggler.py): per-rank compute time, waits in collectives excluded ---
    rank_step_time_spread: float = spec_field(1.0, doc="the slowest rank's compute time (forward, backward, "
                                                       "optimizer; its waits inside collectives excluded) over "
                                                       "the median rank's; 1.0 when all ranks are equal",
                                              minimum=0)
    slowest_rank: int = spec_field(0, doc="the rank with the longest compute time this step", minimum=0)
    slowest_host: str = spec_field("", doc="the node that rank runs on (SLURM node name, pdsh host or hostname)")
    # --- end stragglers ---
    # --- user programs (issue 17; telemetry/wrapper.py) ---
    telemetry_source: Optional[dict[str, str]] = spec_field(
        None, doc="where each figure came from, field name -> measurement (e.g. step_time_s: 'host wall clock "
                  "between optimizer steps', loss: 'deepspeed engine.backward'); null for orch's own trainer")
    # --- end user programs ---


def record_fields() -> list[str]:
    """Field names in record order."""
    return [f.name for f in dataclasses.fields(MetricsRecord)]


SPEC_FIELDS = ("step", "time_unix", "loss", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
               "bubble_fraction", "allreduce_time_s", "allreduce_overhead", "comm_exposed_s", "mem_peak_bytes",
               "lr", "grad_norm")
