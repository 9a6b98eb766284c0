"""Megatron-LM arguments and TransformerConfig fields for MoE, context parallelism, FP8 and kv_channels.

Pure functions of the Plan, composed by :mod:`orchestrator.render.megatron`, for Megatron-LM ``core_v0.16.1``.
Which flags, and why: docs/internals.md, "render/megatron_moe.py".
"""
from __future__ import annotations

from ..estimate.moe import uses_ep_a2a_overlap
from ..estimate.precision import FP8_RECIPE
from ..layout import engine_of
from ..plan import Plan

DISPATCHER = "alltoall"      # model.moe.token_dispatcher null
# model.moe.token_dispatcher -> (moe_token_dispatcher_type, moe_flex_dispatcher_backend or None)
DISPATCHERS = {"alltoall": ("alltoall", None), "allgather": ("allgather", None),
               "flex_deepep": ("flex", "deepep"), "flex_hybridep": ("flex", "hybridep")}
CP_COMM_TYPE = "p2p"
FP8_FORMAT, FP8_AMAX_HISTORY, FP8_AMAX_ALGO = "hybrid", 1024, "max"
LOAD_BALANCING = "aux_loss"
DROP_POLICY = "probs"


def moe_layer_freq(num_layers: int, first_dense: int) -> str:
    """Megatron's --moe-layer-freq list expression: 0 = dense layer, 1 = MoE layer."""
    return f"([0]*{first_dense}+[1]*{num_layers - first_dense})"


def moe_args(plan: Plan) -> list[str]:
    moe, lay = plan.spec.model.moe, plan.layout
    if moe is None:
        return []
    args = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.router_topk),
            "--moe-ffn-hidden-size", str(moe.ffn_hidden_size), "--expert-model-parallel-size", str(lay.ep),
            "--expert-tensor-parallel-size", str(lay.etp), *dispatcher_args(plan),
            "--moe-router-load-balancing-type", LOAD_BALANCING, "--moe-aux-loss-coeff", str(moe.aux_loss_coeff)]
    if plan.spec.cluster.gpu != "cpu":
        args.append("--moe-grouped-gemm")
    if moe.router_topk == 1:
        args.append("--moe-router-pre-softmax")
    if moe.capacity_factor is not None:     # padded to capacity, as the cost model counts it (estimate/moe.py)
        args += ["--moe-expert-capacity-factor", str(moe.capacity_factor), "--moe-token-drop-policy", DROP_POLICY,
                 "--moe-pad-expert-input-to-capacity"]
    if moe.shared_expert_ffn_hidden_size:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)]
    if moe.first_dense_layers:
        args += ["--moe-layer-freq", moe_layer_freq(plan.spec.model.num_layers, moe.first_dense_layers)]
    if ep_overlap(plan):
        args.append("--overlap-moe-expert-parallel-comm")   # what the cost model assumed (estimate/moe.py)
    if moe.router_force_load_balancing:
        args.append("--moe-router-force-load-balancing")
    return args


def dispatcher_of(plan: Plan) -> tuple[str, str | None]:
    """Megatron-Core's (moe_token_dispatcher_type, moe_flex_dispatcher_backend) of the spec's MoE."""
    moe = plan.spec.model.moe
    return DISPATCHERS[(moe and moe.token_dispatcher) or DISPATCHER]


def dispatcher_args(plan: Plan) -> list[str]:
    kind, backend = dispatcher_of(plan)
    return ["--moe-token-dispatcher-type", kind, *(["--moe-flex-dispatcher-backend", backend] if backend else [])]


def ep_overlap(plan: Plan) -> bool:
    """Megatron-Core overlaps the EP all-to-all only with the alltoall and flex dispatchers (TransformerConfig)."""
    lay = plan.layout
    asked = plan.spec.parallelism.overlap_moe_expert_parallel_comm is not False
    return asked and uses_ep_a2a_overlap(plan.spec.model.moe is not None, engine_of(plan.spec), plan.spec.cluster.gpu,
                                         lay.ep, lay.pp, lay.vpp, lay.recompute, dispatcher_of(plan)[0])


def context_args(plan: Plan) -> list[str]:
    cp = plan.layout.cp
    return ["--context-parallel-size", str(cp), "--cp-comm-type", CP_COMM_TYPE] if cp > 1 else []


def fp8_args(plan: Plan) -> list[str]:
    if plan.spec.training.precision != "fp8":
        return []
    return ["--bf16", "--fp8-format", FP8_FORMAT, "--fp8-recipe", plan.spec.training.fp8_recipe or FP8_RECIPE,
            "--fp8-amax-history-len", str(FP8_AMAX_HISTORY), "--fp8-amax-compute-algo", FP8_AMAX_ALGO]


def kv_channels_args(plan: Plan) -> list[str]:
    kv = plan.spec.model.kv_channels
    return ["--kv-channels", str(kv)] if kv is not None else []


def moe_config(plan: Plan) -> dict:
    """TransformerConfig fields of the MoE layers (none for a dense model)."""
    moe, lay = plan.spec.model.moe, plan.layout
    if moe is None:
        return {}
    kind, backend = dispatcher_of(plan)
    config = {"num_moe_experts": moe.num_experts, "moe_router_topk": moe.router_topk,
              "moe_ffn_hidden_size": moe.ffn_hidden_size, "expert_model_parallel_size": lay.ep,
              "expert_tensor_parallel_size": lay.etp, "moe_token_dispatcher_type": kind,
              "moe_grouped_gemm": plan.spec.cluster.gpu != "cpu",
              "moe_router_load_balancing_type": LOAD_BALANCING, "moe_aux_loss_coeff": moe.aux_loss_coeff,
              "moe_router_pre_softmax": moe.router_topk == 1, "overlap_moe_expert_parallel_comm": ep_overlap(plan)}
    if backend:
        config["moe_flex_dispatcher_backend"] = backend
    if moe.capacity_factor is not None:
        config |= {"moe_expert_capacity_factor": moe.capacity_factor, "moe_token_drop_policy": DROP_POLICY,
                   "moe_pad_expert_input_to_capacity": True}
    if moe.shared_expert_ffn_hidden_size:
        config["moe_shared_expert_intermediate_size"] = moe.shared_expert_ffn_hidden_size
    if moe.first_dense_layers:
        n = plan.spec.model.num_layers
        config["moe_layer_freq"] = [0] * moe.first_dense_layers + [1] * (n - moe.first_dense_layers)
    if moe.router_force_load_balancing:
        config["moe_router_force_load_balancing"] = True
    return config


def context_fp8_config(plan: Plan) -> dict:
    """TransformerConfig fields of context parallelism, FP8 and kv_channels (only those in use)."""
    config: dict = {}
    if plan.layout.cp > 1:
        config |= {"context_parallel_size": plan.layout.cp, "cp_comm_type": CP_COMM_TYPE}
    if plan.spec.training.precision == "fp8":
        config |= {"fp8": FP8_FORMAT, "fp8_recipe": plan.spec.training.fp8_recipe or FP8_RECIPE, "fp8_amax_history_len": FP8_AMAX_HISTORY,
                   "fp8_amax_compute_algo": FP8_AMAX_ALGO}
    if plan.spec.model.kv_channels is not None:
        config["kv_channels"] = plan.spec.model.kv_channels
    return config
