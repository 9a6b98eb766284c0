"""Fixed layouts the Megatron renderer and checks are exercised on (spec_data overrides), shared by the
unit tests (tests/unit/test_render_megatron.py) and the real-consumer checks (tests/integration/test_megatron_real.py)."""

GPU8 = {"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8, "training.precision": "bf16"}
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
    "zero3-offload": {**GPU8, "model.preset": "gpt3-1.7b", "parallelism.zero_stage": 3,
                      "parallelism.offload": "optimizer+params", "training.global_batch_size": 64},
    "fp16-tp2-pp2-zero0": {**GPU8, "model.preset": "gpt3-1.7b", "training.precision": "fp16",
                           "parallelism.tensor": 2, "parallelism.pipeline": 2, "parallelism.zero_stage": 0,
                           "training.global_batch_size": 16},
    # Megatron-LM core_v0.16.1 interleaves from pp = 2 (its default p2p overlap on).
    "pp2-vpp2": {**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 4, "parallelism.pipeline": 2,
                 "parallelism.virtual_pipeline": 2, "parallelism.zero_stage": 1, "parallelism.micro_batch_size": 1,
                 "training.global_batch_size": 16},
    "uneven-pp4-vpp2": {**GPU8, "model.preset": "gpt3-1.7b", "cluster.num_nodes": 2, "parallelism.tensor": 2,
                        "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 2, "parallelism.zero_stage": 1,
                        "parallelism.micro_batch_size": 1, "training.global_batch_size": 32,
                        "parallelism.first_stage_layers": 4, "parallelism.last_stage_layers": 4},
}
