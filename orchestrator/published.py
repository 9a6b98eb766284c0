"""Published training runs as specs the cost model can be checked (and later calibrated) against.

A reference file (``tests/data/published-cases.json``, a copy of the shared references) lists cases with
a model shape, a cluster, a global batch and the published layout and figures. :func:`throughput_spec`
turns a throughput case into a :class:`~orchestrator.spec.Spec`; with ``published_layout=True`` the
spec fixes what the paper fixed, and leaves open what it did not publish (micro-batch size and the
interleaving degree), for the planner to choose.

Narayanan et al. 2021, Table 1 runs are modelled as the software of the time ran them: Megatron-LM with
fp16 mixed precision, no fused (flash) attention, no sequence parallelism, full activation recomputation,
no ZeRO (plain data parallelism). A case may say ``"precision"`` in its published layout (default fp16).

DeepSpeed runs are modelled on the DeepSpeed they ran (:func:`case_engine_version`): a case states its release
in ``published.engine_version``, with the evidence in ``published.engine_version_source`` (a paper rarely
names it; the release history and the paper's date bound it). A DeepSpeed case without one is predicted as the
DeepSpeed orch writes configs for. The ZeRO-3 rows of Narayanan et al. 2021, Table 2 (175B in the reference
file, 530B in :data:`EXTRA_CASES`) ran a 0.3.x release (per-parameter, host-synchronous collectives on tensor
lists: estimate/engines.py).

Where a case's layer count does not divide its pipeline degree, a DeepSpeed case gets the balanced uneven
split (:func:`orchestrator.stages.balanced_split`: first and last stage lighter, middle stages equal), which
is what such runs used (BLOOM-176B: 70 layers on 12 stages as 5 + 10 x 6 + 5); a Megatron case leaves the
split to the planner, which also weighs counting the embedding and the loss as layers (Megatron's
--account-for-embedding/loss-in-pipeline-split, which lets such pipelines interleave).
"""
from __future__ import annotations

import json
from pathlib import Path

from .spec import Spec, parse_spec
from .stages import balanced_split

# Micro-batch sizes tried for a published layout that does not state one: the powers of two the paper's
# own micro-batch study explores (Narayanan et al. 2021, section 5.4.2).
PLAUSIBLE_MICRO_BATCHES = (1, 2, 4, 8)

GPU_KEYS = {"A100-SXM4-80GB": "a100-80gb", "A100-SXM4-40GB": "a100-40gb", "H100-SXM5-80GB": "h100-sxm"}


# Published runs that are not in the reference file, in its format. Printed beside Table 1 by
# benchmarks/accuracy.py; no tolerance is attached to them.
BLOOM_176B = {
    "id": "bloom_176b", "kind": "throughput",
    "source": "BigScience Workshop 2022, BLOOM (arXiv 2211.05100), section 3.4 (training setup: 48 nodes of "
              "8 A100-80GB, tp 4, pp 12, dp 8, ZeRO-1, bf16, ~150 TFLOP/s per GPU); model card (70 layers, "
              "h 14336, 112 heads, vocab 250880, seq 2048, global batch 2048)",
    "model": {"layers": 70, "hidden": 14336, "heads": 112, "seq_len": 2048, "vocab": 250880},
    "cluster": {"gpus": 384, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8,
                # section 3.4.1: each node has four Omni-Path 100 Gbps links (a DGX A100 has eight 200 Gb/s)
                "nic_Gbps_per_node": 400},
    "global_batch": 2048,
    "published": {"tp": 4, "pp": 12, "dp": 8, "micro_batch": 2, "zero_stage": 1, "recompute": "full",
                  "precision": "bf16", "tflops_per_gpu": 150, "engine": "deepspeed",
                  "engine_version": "0.6.2", "engine_version_source": (
                      "not stated in the paper; trained 2022-03-11 to 07 on DeepSpeed's big-science branch, whose "
                      "bf16 pipeline work landed as PR #1801 (2022-04-19) in v0.6.2; the launch script runs bf16 "
                      "with ZeRO stage 0 ('bf16 must use z0! it implements its own zero stage 1 equivalent', "
                      "bigscience tr11-176B-ml.slurm): DeepSpeed's BF16_Optimizer, which every release from "
                      "v0.6.2 to v0.9.0 also requires for bf16 ZeRO-1 on the pipeline engine "
                      "(orchestrator/estimate/engines.py ds_bf16_optimizer)")},
    "notes": "Megatron-DeepSpeed; ALiBi positions (modelled as learned: s*h parameters, no FLOPs); the 70 "
             "layers on 12 stages are not even: the embedding and the tied output layer each count as one "
             "layer in its partition (5 + 10 x 6 + 5)",
}


# Why Table 2's ZeRO-3 rows ran DeepSpeed 0.3.x (tests/data/published-cases.json says the same for the 175B rows).
TABLE2_DEEPSPEED_SOURCE = (
    "not stated in the paper (section 5.2: ZeRO integrated 'using the DeepSpeed Python library'); ZeRO-3 first "
    "shipped in DeepSpeed v0.3.12 (git tag 2021-03-12) and arXiv 2104.04473v1 is dated 2021-04-09, so one of "
    "v0.3.12-v0.3.14 (tags 2021-03-12, 03-16, 04-08), which share the ZeRO-3 code paths the cost model "
    "distinguishes (orchestrator/estimate/engines.py)")


def zero3_530b_case(gpus: int, batch: int, micro_batch: int, tflops: float) -> dict:
    """Narayanan et al. 2021, Table 2's 529.6B model under ZeRO-3 without model parallelism, on ``gpus``."""
    return {
        "id": f"narayanan2021_t2_zero3_529.6B_{gpus}gpu", "kind": "throughput",
        "source": "Narayanan et al. 2021 (SC21), arXiv 2104.04473, Table 2 (ZeRO-3 without model parallelism, "
                  "529.6B: 640 GPUs at batch 2560 with micro-batch 4 - it 'did not fit' on 560 -, 1120 and 2240 "
                  "GPUs at batch 2240 with micro-batch 2 and 1; 138 / 98 / 48 TFLOP/s per GPU, 169 / 137 / 140 "
                  "days for 300B tokens)",
        "model": {"layers": 105, "hidden": 20480, "heads": 128, "seq_len": 2048, "vocab": 51200},
        "cluster": {"gpus": gpus, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8},
        "global_batch": batch,
        "published": {"tp": 1, "pp": 1, "dp": gpus, "micro_batch": micro_batch, "zero_stage": 3, "recompute": "full",
                      "precision": "fp16", "tflops_per_gpu": tflops, "engine": "deepspeed",
                      "engine_version": "0.3", "engine_version_source": TABLE2_DEEPSPEED_SOURCE},
        "notes": "the 529.6B model of Table 1 (105 layers, h 20480, 128 heads); DeepSpeed ZeRO-3 of 2021",
        "verification": "two independent transcriptions of Table 2 (a markdown copy of the table and a description of "
                        "its image, both in public paper notes) agree on GPUs, batch, micro-batch and TFLOP/s; the "
                        "rows' own training days check them: 8TP/(nX) (eq. 4) gives 167 / 134 / 137 days for the "
                        "published 169 / 137 / 140, the same 1-2% as the 175B rows (88 / 72 / 72 for 90 / 74 / 74)",
    }


# Table 2's footnote says that with micro-batch 4 the 530B model did not fit on 560 GPUs under ZeRO-3. The
# memory model puts 560 GPUs at 75.4 GiB and 640 at 73.7 GiB (76.0 usable on A100-80GB): it cannot yet tell
# the two apart (what DeepSpeed 0.4 held beyond the terms of estimate/memory.py is not known here).


# Why the MT-NLG rows ran DeepSpeed 0.5.x.
MT_NLG_DEEPSPEED_SOURCE = (
    "not stated in the paper; the model was announced 2021-10-11 (Microsoft Research blog) after training on "
    "Selene, so a release no later than v0.5.4 (tag 2021-10-06); v0.4.4-v0.5.4 share the ZeRO-1 path the cost "
    "model distinguishes (engine.py forces contiguous_gradients off for stage 1, so runtime/zero/stage2.py "
    "reduce_ipg_grads takes buffered_reduce_fallback: an all-reduce of each gradient bucket; estimate/engines.py "
    "ds_bucket_all_reduce), and v0.5.0-v0.5.3 (tagged 2021-08-16 to 09-16, while the model was trained; '0.5' "
    "reads as these) the pipeline hand-overs: activations in 1/tp slices, gradients whole (PR #1407, merged "
    "2021-09-29 into v0.5.4, partitions the gradients too: estimate/engines.py ds_pipe_hand_overs). "
    "No DeepSpeed release up to v0.5.4 knows bf16 (deepspeed/runtime has no bf16 code; v0.5.8 added it for ZeRO-2 "
    "only: 'bfloat16 mode is only enabled for Zero2 currently'), so the bf16 ZeRO-1 pipeline ran an unreleased "
    "build; the cost model prices its fp16 and bf16 paths alike here")


def _mt_nlg(nodes: int, iteration_s: float, tflops: float) -> dict:
    return {
        "id": f"mtnlg_530b_{nodes}nodes", "kind": "throughput",
        "source": "Smith et al. 2022, Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B (arXiv "
                  "2201.11990), section 2.4 (system performance: global batch 1920 on 280, 350 and 420 DGX A100 "
                  "80GB nodes, 60.1 / 50.2 / 44.4 s per iteration, 126 / 121 / 113 TFLOP/s per GPU; 8-way "
                  "tensor and 35-way pipeline parallelism, data parallelism across the rest); model: 105 "
                  "layers, h 20480, 128 heads, seq 2048, GPT-2 vocabulary",
        "model": {"layers": 105, "hidden": 20480, "heads": 128, "seq_len": 2048, "vocab": 50257},
        "cluster": {"gpus": nodes * 8, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8},
        "global_batch": 1920,
        "published": {"tp": 8, "pp": 35, "dp": nodes * 8 // 280, "micro_batch": 1, "zero_stage": 1,
                      "recompute": "full", "precision": "bf16", "tflops_per_gpu": tflops, "engine": "deepspeed",
                      "iteration_s": iteration_s, "engine_version": "0.5",
                      "engine_version_source": MT_NLG_DEEPSPEED_SOURCE},
        "notes": "Megatron-DeepSpeed 3D parallelism: DeepSpeed's pipeline engine with ZeRO-1, activation "
                 "checkpointing; the TFLOP/s count the recompute pass as eq. 3 of Narayanan et al. does "
                 "(1920 x 2048 tokens in 60.1 s on 2240 GPUs is 125.7 TFLOP/s by eq. 3)",
    }


ZERO3_530B = (zero3_530b_case(640, 2560, 4, 138), zero3_530b_case(1120, 2240, 2, 98), zero3_530b_case(2240, 2240, 1, 48))
MT_NLG_530B = (_mt_nlg(280, 60.1, 126), _mt_nlg(350, 50.2, 121), _mt_nlg(420, 44.4, 113))
EXTRA_CASES = (BLOOM_176B, *MT_NLG_530B, *ZERO3_530B)


def load_cases(path: str | Path, kind: str | None = None) -> list[dict]:
    """The cases of a references file, optionally only those of one ``kind``."""
    cases = json.loads(Path(path).read_text())
    return [c for c in cases if kind is None or c["kind"] == kind]


def throughput_spec(case: dict, *, published_layout: bool = True) -> Spec:
    """A spec for a throughput case; the published layout fixed, or every parallelism field open."""
    m, c, pub = case["model"], case["cluster"], case["published"]
    gpn = c["gpus_per_node"]
    data = {
        "name": case["id"].replace(".", "_")[:64],
        "model": {"num_layers": m["layers"], "hidden_size": m["hidden"], "num_attention_heads": m["heads"],
                  "vocab_size": m["vocab"], "seq_length": m["seq_len"], "flash_attention": False},
        "cluster": {"gpu": GPU_KEYS[c["gpu_type"]], "num_nodes": c["gpus"] // gpn, "gpus_per_node": gpn},
        "training": {"global_batch_size": case["global_batch"], "precision": pub.get("precision", "fp16"),
                     "engine": case_engine(case)},
    }
    if c.get("nic_Gbps_per_node"):
        data["cluster"]["inter_node_bandwidth_GBps"] = nic_share_GBps(c["nic_Gbps_per_node"], gpn)
    if published_layout:
        data["parallelism"] = {"tensor": pub["tp"], "pipeline": pub["pp"], "data": pub["dp"],
                               "zero_stage": pub["zero_stage"], "recompute": case_recompute(case),
                               "sequence_parallel": False, "offload": "none"}
        if pub.get("micro_batch"):
            data["parallelism"]["micro_batch_size"] = pub["micro_batch"]
        # DeepSpeed places the balanced uneven split; Megatron's planner also weighs counting the embedding
        # and the loss in the split (which allows interleaving), so the split is left to it.
        split = (balanced_split(m["layers"], pub["pp"]) if m["layers"] % pub["pp"] and case_engine(case) == "deepspeed"
                 else None)
        if split is not None:
            data["parallelism"].update(first_stage_layers=split[0], last_stage_layers=split[1])
    return parse_spec(data)


def nic_share_GBps(nic_Gbps_per_node: float, gpus_per_node: int) -> float:
    """What one GPU gets across nodes from a node's stated NIC line rate: its share, at the efficiency the
    catalog's line rates get (CostModel.inter_node_efficiency)."""
    from .estimate.cost import CostModel  # noqa: PLC0415

    return nic_Gbps_per_node / 8 / gpus_per_node * CostModel().inter_node_efficiency


def case_engine(case: dict) -> str:
    """The runtime a case trained on: ``published.engine`` (default: Megatron-LM, Table 1's software)."""
    return case["published"].get("engine", "megatron")


def case_engine_version(case: dict) -> str | None:
    """The DeepSpeed release a DeepSpeed case ran (``published.engine_version``); None: not stated, predicted
    as the DeepSpeed orch writes configs for. Megatron cases: None."""
    if case_engine(case) != "deepspeed":
        return None
    version = case["published"].get("engine_version")
    return str(version) if version else None


def case_recompute(case: dict) -> str:
    """The recompute mode of a case ("full (assumed, eq.3 convention)" reads as "full")."""
    return str(case["published"]["recompute"]).split()[0]


def case_regime(case: dict) -> str:
    """The accuracy regime a case belongs to (benchmarks/accuracy.py reports error per regime)."""
    from .estimate.uncertainty import regime_of  # noqa: PLC0415

    pub = case["published"]
    return regime_of(case_engine(case), GPU_KEYS.get(case["cluster"]["gpu_type"], "cpu"), pub["pp"], pub["zero_stage"])


def published_estimate(case: dict, cost=None):
    """The published layout with the most plausible unpublished fields: for each micro-batch size of
    PLAUSIBLE_MICRO_BATCHES that divides the batch (only the published one, when there is one), the
    planner picks the interleaving; the fastest layout that fits wins. Returns a LayoutEstimate
    (NoFitError if none fits)."""
    from .errors import SpecError
    from .planner import search

    best, last_error = None, None
    for mb in [case["published"]["micro_batch"]] if case["published"].get("micro_batch") else PLAUSIBLE_MICRO_BATCHES:
        try:
            spec = throughput_spec({**case, "published": {**case["published"], "micro_batch": mb}})
            est = search(spec, top_k=1, cost=cost, engine_version=case_engine_version(case)).chosen
        except SpecError as e:   # batch not divisible, or nothing fits at this micro-batch
            last_error = e
            continue
        if best is None or est.step_time_s < best.step_time_s:
            best = est
    if best is None:
        raise last_error
    return best
