"""Published MoE, context-parallel, FP8 and BF16 dense runs (tests/data/published-moe-cp-fp8.json) as specs.

Each case names a model preset, the cluster (DGX-H100: 8 GPUs per node), the batch and the layout as
published (tp, pp, cp, virtual stages, ep, micro-batch; FSDP = 1 -> ZeRO-3, 0 -> Megatron's distributed
optimizer, ZeRO-1), and the tokens/s per GPU reported. What the tables do not publish (recompute, expert
tensor parallelism; micro-batch and virtual stages where a case has them null) stays open for the planner.
A case with no preset names its shape in ``model`` (spec model fields; the BF16 runs of Megatron-LM's README). Sources are in each case's ``source``; a case whose
recipe ran without Megatron's EP all-to-all overlap (which orch generates wherever it can) says so
(``ep_a2a_overlap: false``; its spec: parallelism.overlap_moe_expert_parallel_comm false); so does a MoE case whose
recipe used another FP8 scaling recipe than the delayed scaling orch writes (``fp8_recipe: "tensorwise"``,
NVIDIA's "FP8-CS"; training.fp8_recipe), which the model reads for the experts' host launches. A case whose recipe
reduces gradients in another dtype than Megatron-LM's default (fp32 with --bf16) says so (``grad_reduce_dtype``,
evidence in ``grad_reduce_source``; training.grad_reduce_dtype): Megatron-Bridge's performance configs and NeMo's
GPT-3 175B FP8 config reduce in bf16.

The loss (``loss``, spec field training.cross_entropy_impl) is Megatron-LM's default, the eager vocab-parallel cross
entropy, unless a case's recipe fuses it (``vocab_parallel_fused``: NeMo's and Megatron-Bridge's default
cross_entropy_loss_fusion, evidence in ``loss_source``).

Dropout (``dropout``, the cost model's ``ModelShape.dropout``): 0 unless a case states otherwise with its evidence
in ``dropout_source``. The Llama, Qwen3 and gpt-oss model providers of NeMo and Megatron-Bridge set
hidden_dropout and attention_dropout 0.0 (Megatron-Bridge src/megatron/bridge/models/llama/llama_provider.py
LlamaModelProvider, qwen_provider.py Qwen3MoEModelProvider, gpt_oss/gpt_oss_provider.py GPTOSSProvider; NeMo
Framework Launcher llama/llama2_7b.yaml); NeMo's GPT-3 175B config and the GPT rows of Megatron-LM's README keep
0.1, and say so.

Model features (``fused_rope``, ``glu_clamp``, ``recompute_modules``: spec fields model.rope_fusion,
model.activation_func_clamp_value and parallelism.recompute_modules with recompute selective) are case keys, for gpt-oss-120b: its YaRN RoPE (factor 32,
so an attention factor 1.35) runs unfused in Megatron-Core (``fused_rope`` false), its experts' activation clamps
at 7.0 (``glu_clamp``; Megatron-Bridge: position_embedding_type yarn, yarn_rotary_scaling_factor 32, yarn_mscale
None, activation_func_clamp_value 7.0, add_bias_linear, in gpt_oss_provider.py GPTOSSProvider at the 25.11 commit
97ad8cc6f, in gpt_oss_bridge.py provider_bridge at v0.4.1 and 21d102f5e), and the H100 recipe recomputes
``["layernorm", "moe_act"]`` (scripts/performance/configs/gpt_oss/workload_base_configs.py
GPT_OSS_120B_H100_BF16_BASE_CONFIG at v0.2.0, gpt_oss_workload_base_configs.py
GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V1 at v0.4.1 and 21d102f5e). Its biased experts need no key
(``add_bias_linear`` in the case's model).
``router_force_balance`` (ModelShape field of that name, estimate/moe.py random_routing_imbalance) marks the
dropless runs of NVIDIA's performance tables, which route on random logits (the Megatron-Bridge
performance-summary page: its MoE runs are "dropless with force-balanced routing"; the recipes set
moe_router_force_load_balancing True); the token-drop rows route on their trained router (capacity factor 1.0), and
so do the dropless Mixtral rows of Megatron-Core's MoE README and its benchmarking configs (Megatron-MoE-ModelZoo)
that do not pass --moe-router-force-load-balancing (their sources say "not force-balanced").

The MoE token dispatcher (``dispatcher``, spec field model.moe.token_dispatcher) is stated where a case's source
names it, with the evidence at the end of its ``source``: HybridEP (``flex_hybridep``) for the Qwen3-30B-A3B pp 1 / ep 16
recipe, ``alltoall`` where the source says so; a case without it is written as orch writes it (alltoall).

Llama 3.1 405B (126 layers) on pp 8 with 8 virtual stages ran with Megatron's
--account-for-embedding/loss-in-pipeline-split (128 "layers"): its spec sets
parallelism.account_for_embedding_loss where that split exists for the published pp and virtual stages, and
otherwise takes the balanced uneven split with the largest virtual-stage count that split allows.
"""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.estimate.params import ModelShape, MoEShape
from orchestrator.spec import Spec
from orchestrator.spec_loader import parse_spec
from orchestrator.stages import accounted_split, balanced_split

GPUS_PER_NODE = 8


def load_layout_cases(path: str | Path) -> list[dict]:
    return json.loads(Path(path).read_text())


def layout_case_spec(case: dict, *, published_layout: bool = True) -> Spec:
    """The case as a spec on h100-sxm with the Megatron engine; its published layout fixed (or all open)."""
    return parse_spec(layout_case_spec_data(case, published_layout=published_layout))


def layout_case_spec_data(case: dict, *, published_layout: bool = True) -> dict:
    """The case's spec as data: its model, cluster, batch and precision, the software its recipe set (dropout,
    FP8 recipe, EP overlap, RoPE fusion, GLU clamp, forced balance, token dispatcher, recompute modules: module
    doc) and, with
    ``published_layout``, its published layout."""
    model = ({"preset": case["preset"]} if case.get("preset") else dict(case["model"])) | {"seq_length": case["seq"]}
    moe: dict = {}
    if case.get("capacity_factor") is not None:
        moe["capacity_factor"] = case["capacity_factor"]
    if case.get("router_force_balance"):
        moe["router_force_load_balancing"] = True
    if case.get("dispatcher"):      # the recipe's token dispatcher (evidence in ``source``)
        moe["token_dispatcher"] = case["dispatcher"]
    if moe:
        model["moe"] = {**model.get("moe", {}), **moe}
    if layout_case_dropout(case):
        model.update(hidden_dropout=layout_case_dropout(case), attention_dropout=layout_case_dropout(case))
    if case.get("fused_rope") is False:
        model["rope_fusion"] = False
    if case.get("glu_clamp") is not None:
        model["activation_func_clamp_value"] = case["glu_clamp"]
    training = {"global_batch_size": case["gbs"], "precision": case["precision"], "engine": "megatron"}
    if case.get("loss"):        # the recipe's cross entropy, where it is not Megatron-LM's default (``loss_source``)
        training["cross_entropy_impl"] = case["loss"]
    if case.get("fp8_recipe"):
        training["fp8_recipe"] = case["fp8_recipe"]
    if case.get("grad_reduce_dtype"):   # the recipe's gradient reduction dtype (``grad_reduce_source``)
        training["grad_reduce_dtype"] = case["grad_reduce_dtype"]
    data = {"name": case["id"][:64], "model": model,
            "cluster": {"gpu": "h100-sxm", "num_nodes": case["gpus"] // GPUS_PER_NODE,
                        "gpus_per_node": GPUS_PER_NODE}, "training": training}
    if published_layout:
        data["parallelism"] = _published_parallelism(case)
        if case.get("ep_a2a_overlap") is False:
            data["parallelism"]["overlap_moe_expert_parallel_comm"] = False
        if case.get("recompute_modules"):     # the recipe's selective recompute
            data["parallelism"].update(recompute="selective", recompute_modules=list(case["recompute_modules"]))
    return data


def predicted_layout(case: dict) -> dict:
    """The cost model's LAYOUT record for a case's spec (:func:`layout_case_spec`), planned as ``orch plan``
    plans it."""
    from orchestrator.planner import search  # noqa: PLC0415
    return search(layout_case_spec(case), top_k=1).chosen.to_dict()


FEATURE_KEYS = ("fused_rope", "glu_clamp", "recompute_modules", "router_force_balance")


def layout_case_shape_fields(case: dict) -> dict:
    """The model features a case states (module doc) under the cost model's ModelShape names; its spec carries
    them as spec fields (:func:`layout_case_spec_data`)."""
    fields = {key: case[key] for key in FEATURE_KEYS if key in case}
    if "recompute_modules" in fields:
        fields["recompute_modules"] = tuple(fields["recompute_modules"])
    return fields


def layout_case_dropout(case: dict) -> float:
    """The dropout probability a case's recipe trained with (``dropout``; default 0, module doc)."""
    return float(case.get("dropout", 0.0))


def _published_parallelism(case: dict) -> dict:
    par = {"tensor": case["tp"], "pipeline": case["pp"], "context": case["cp"], "virtual_pipeline": case["vp"],
           "micro_batch_size": case["mbs"], "zero_stage": 3 if case["fsdp"] else 1,
           "sequence_parallel": case["tp"] > 1, "offload": "none"}
    par = {k: v for k, v in par.items() if v is not None}     # unpublished: the planner picks
    if case.get("ep"):
        par["expert"] = case["ep"]
    from orchestrator.catalog.models import preset_fields  # noqa: PLC0415
    layers = preset_fields(case["preset"])["num_layers"] if case.get("preset") else case["model"]["num_layers"]
    accounted = accounted_split(layers, case["pp"])
    if layers % case["pp"] and accounted is not None and ((layers + 2) // case["pp"]) % case["vp"] == 0:
        par["account_for_embedding_loss"] = True
    elif layers % case["pp"]:
        vp = next(v for v in range(case["vp"], 0, -1) if balanced_split(layers, case["pp"], v) is not None)
        first, last = balanced_split(layers, case["pp"], vp)
        par.update(first_stage_layers=first, last_stage_layers=last, virtual_pipeline=vp)
    return par


def moe_layer_case_shape(case: dict) -> ModelShape:
    """A measured single-MoE-layer case (tests/data/megatron-moe-perf-h100.json) as the shape the cost model
    reads. Only the MoE block is timed there: the attention fields are placeholders. Its routing is
    force-balanced, which the model reads as load imbalance 1 (capacity factor 1.0 bounds it)."""
    moe = MoEShape(case["experts"], case["topk"], case["expert_ffn"], shared_ffn=case["shared_ffn"],
                   capacity_factor=1.0)
    return ModelShape(num_layers=1, hidden_size=case["hidden"], num_attention_heads=8, num_query_groups=8,
                      ffn_hidden_size=case["expert_ffn"], vocab_size=32000, seq_length=case["seq"],
                      gated_mlp=case["gated"], bias=False, rmsnorm=True, learned_positions=False, moe=moe)
