"""Fixed layouts the Megatron renderer and checks are exercised on (spec_data overrides), shared by the
unit tests (tests/unit/test_render_megatron.py) and the real-consumer checks (tests/integration/test_megatron_real.py)."""

GPU8 = {"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8, "training.precision": "bf16"}
HYBRID_2X8 = {**GPU8, "model.preset": "gpt3-1.7b", "cluster.num_nodes": 2, "parallelism.tensor": 1,
              "parallelism.pipeline": 1, "parallelism.micro_batch_size": 1, "training.global_batch_size": 32}
MEGATRON_LAYOUTS = {
    "tiny-zero2-cpu": {},
    "tiny-zero0-cpu": {"parallelism.zero_stage": 0},
    "tp2-sp-selective-cpu": {"parallelism.tensor": 2, "parallelism.sequence_parallel": True,
                             "parallelism.zero_stage": 1, "parallelism.recompute": "selective",
                             "training.global_batch_size": 4},
    "gqa-swiglu-tp4-pp2-full": {**GPU8, "model.preset": "llama3-8b", "parallelism.tensor": 4,
                                "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                "parallelism.micro_batch_size": 1, "parallelism.sequence_parallel": True,
                                "parallelism.recompute": "full", "training.global_batch_size": 16},
    "pp4-vpp3": {**GPU8, "model.preset": "gpt3-1.7b", "cluster.num_nodes": 2, "parallelism.tensor": 2,
                 "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 3, "parallelism.zero_stage": 1,
                 "parallelism.micro_batch_size": 1, "training.global_batch_size": 32},
    # Hybrid sharding: ZeRO-3 (Megatron FSDP) sharded inside each node of 8, replicated across the 2 nodes;
    # the same at ZeRO-1 (distributed optimizer instances) and ZeRO-2 (Megatron FSDP, tp 2: 4 dp ranks a node).
    "zero3-hybrid-hs8": {**HYBRID_2X8, "parallelism.zero_stage": 3, "parallelism.shard_degree": 8},
    "zero1-hybrid-hs8": {**HYBRID_2X8, "parallelism.zero_stage": 1, "parallelism.shard_degree": 8},
    "zero2-hybrid-tp2-hs4": {**HYBRID_2X8, "parallelism.tensor": 2, "parallelism.zero_stage": 2,
                             "parallelism.shard_degree": 4},
    "zero3-offload": {**GPU8, "model.preset": "gpt3-1.7b", "parallelism.zero_stage": 3,
                      "parallelism.offload": "optimizer+params", "training.global_batch_size": 64},
    "fp16-tp2-pp2-zero0": {**GPU8, "model.preset": "gpt3-1.7b", "training.precision": "fp16",
                           "parallelism.tensor": 2, "parallelism.pipeline": 2, "parallelism.zero_stage": 0,
                           "training.global_batch_size": 16},
    # Megatron-LM core_v0.16.1 interleaves from pp = 2 (its default p2p overlap on).
    "pp2-vpp2": {**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 4, "parallelism.pipeline": 2,
                 "parallelism.virtual_pipeline": 2, "parallelism.zero_stage": 1, "parallelism.micro_batch_size": 1,
                 "training.global_batch_size": 16},
    # Embedding and loss counted as layers in the split (Llama 3 405B's recipe): (30 + 2) / 4 = 8 per stage.
    "accounted-pp4-vpp2": {**GPU8, "model.preset": "gpt3-1.7b", "model.num_layers": 30, "cluster.num_nodes": 2,
                           "parallelism.tensor": 2, "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 2,
                           "parallelism.account_for_embedding_loss": True, "parallelism.zero_stage": 1,
                           "parallelism.micro_batch_size": 1, "training.global_batch_size": 32},
    "uneven-pp4-vpp2": {**GPU8, "model.preset": "gpt3-1.7b", "cluster.num_nodes": 2, "parallelism.tensor": 2,
                        "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 2, "parallelism.zero_stage": 1,
                        "parallelism.micro_batch_size": 1, "training.global_batch_size": 32,
                        "parallelism.first_stage_layers": 4, "parallelism.last_stage_layers": 4},
}

# Mixture-of-Experts, context parallelism, FP8 and kv_channels (issue 10), Megatron engine on H100.
MOE_SMALL = {"num_experts": 8, "router_topk": 1, "ffn_hidden_size": 2048, "capacity_factor": 1.25,
             "shared_expert_ffn_hidden_size": 4096, "first_dense_layers": 2}
MEGATRON_LAYOUTS |= {
    "mixtral-tp2-ep8-sp": {**GPU8, "model.preset": "mixtral-8x7b", "cluster.num_nodes": 2, "parallelism.tensor": 2,
                           "parallelism.pipeline": 1, "parallelism.expert": 8, "parallelism.expert_tensor": 1,
                           "parallelism.sequence_parallel": True, "parallelism.zero_stage": 1,
                           "parallelism.micro_batch_size": 1, "training.global_batch_size": 16},
    "qwen3-kv128-ep8-pp2-fp8": {**GPU8, "model.preset": "qwen3-30b-a3b", "cluster.num_nodes": 2,
                                "training.precision": "fp8", "parallelism.tensor": 1, "parallelism.pipeline": 2,
                                "parallelism.expert": 8, "parallelism.expert_tensor": 1, "parallelism.zero_stage": 1,
                                "parallelism.micro_batch_size": 1, "training.global_batch_size": 16},
    "llama-128k-tp4-cp4-fp8": {**GPU8, "model.preset": "llama3-8b-128k", "cluster.num_nodes": 2,
                               "training.precision": "fp8", "parallelism.tensor": 4, "parallelism.pipeline": 1,
                               "parallelism.context": 4, "parallelism.sequence_parallel": True,
                               "parallelism.zero_stage": 1, "parallelism.micro_batch_size": 1,
                               "parallelism.recompute": "full", "training.global_batch_size": 8},
    "moe-top1-capacity-shared-dense-etp2": {**GPU8, "model.preset": "gpt3-1.7b", "model.moe": MOE_SMALL,
                                            "model.add_bias_linear": False,
                                            "parallelism.tensor": 2, "parallelism.pipeline": 1,
                                            "parallelism.expert": 4, "parallelism.expert_tensor": 2,
                                            "parallelism.sequence_parallel": True, "parallelism.zero_stage": 1,
                                            "training.global_batch_size": 16},
    "tiny-moe-ep2-cpu": {"model.preset": "tiny-moe", "parallelism.expert": 2, "parallelism.expert_tensor": 1,
                         "parallelism.zero_stage": 1},
}

# Per-module recompute, the full-recompute method and dropout (issue 18; docs/recompute-dropout.md).
MEGATRON_LAYOUTS |= {
    "mixtral-recompute-moe-layernorm": {**MEGATRON_LAYOUTS["mixtral-tp2-ep8-sp"], "parallelism.recompute": "selective",
                                        "parallelism.recompute_modules": ["moe", "layernorm"]},
    "moe-recompute-act-shared-mlp-dropout": {**MEGATRON_LAYOUTS["moe-top1-capacity-shared-dense-etp2"],
                                             "parallelism.recompute": "selective",
                                             "parallelism.recompute_modules": ["moe_act", "shared_experts", "mlp",
                                                                               "layernorm", "core_attn"],
                                             "model.hidden_dropout": 0.1, "model.attention_dropout": 0.05},
    "pp2-full-block3-dropout": {**MEGATRON_LAYOUTS["pp2-vpp2"], "parallelism.recompute": "full",
                                "parallelism.recompute_method": "block", "parallelism.recompute_num_layers": 3,
                                "model.hidden_dropout": 0.1, "model.attention_dropout": 0.1},
}

# What published runs set beyond orch's defaults (issue 18; docs/published-specs.md): Megatron options orch writes.
MEGATRON_LAYOUTS |= {
    "qwen3-fp8-tensorwise-forced-unfused-rope-clamp": {
        **MEGATRON_LAYOUTS["qwen3-kv128-ep8-pp2-fp8"], "parallelism.virtual_pipeline": 2,
        "training.fp8_recipe": "tensorwise", "model.moe.router_force_load_balancing": True,
        "model.rope_fusion": False, "model.activation_func_clamp_value": 7.0,
        "parallelism.overlap_moe_expert_parallel_comm": False},
    # (tensorwise with recompute_modules moe_act / layernorm: Megatron-Core also asks Transformer Engine >= 2.6,
    # which this machine does not have; tests/unit/test_published_specs.py checks orch's rule)
    "tp2-full-distributed-checkpoints": {
        **MEGATRON_LAYOUTS["fp16-tp2-pp2-zero0"], "parallelism.sequence_parallel": False,
        "parallelism.recompute": "full", "parallelism.distribute_saved_activations": True},
}

# The MoE token dispatcher (model.moe.token_dispatcher; Megatron-Core's flex dispatcher with its backends).
MEGATRON_LAYOUTS |= {
    "qwen3-ep8-flex-hybridep": {**MEGATRON_LAYOUTS["qwen3-kv128-ep8-pp2-fp8"], "parallelism.virtual_pipeline": 2,
                                "model.moe.token_dispatcher": "flex_hybridep"},
    "mixtral-ep8-flex-deepep": {**MEGATRON_LAYOUTS["mixtral-tp2-ep8-sp"], "model.moe.token_dispatcher": "flex_deepep"},
    "moe-capacity-allgather": {**MEGATRON_LAYOUTS["moe-top1-capacity-shared-dense-etp2"],
                               "model.moe": {**MOE_SMALL, "token_dispatcher": "allgather"}},
}
