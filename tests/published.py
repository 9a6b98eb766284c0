"""Published training runs: their sources, figures and evidence, and the orch spec each one is.

A reference file (``tests/data/published-cases.json``, a copy of the shared references) lists cases with
a model shape, a cluster, a global batch and the published layout and figures. :func:`throughput_spec_data`
writes a throughput case as orch spec data, every property of its run in a spec field (what follows says
which, and why); with ``published_layout=True`` the spec fixes what the paper fixed, and leaves open what it
did not publish (micro-batch size and the interleaving degree), for the planner to choose.
tests/tools/published_specs.py writes those specs to tests/data/published-specs/, which benchmarks/accuracy.py
plans as ``orch plan`` does (docs/published-specs.md).

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

Runs on PyTorch FSDP (OPT-175B's FairScale FSDP, torchtitan's FSDP2, llm-foundry's Composer FSDP) are modelled
on Megatron FSDP, the orch engine whose sharding matches (one gather per transformer layer and pass,
overlapped): FULL_SHARD as ZeRO-3, OPT's --no-reshard-after-forward as ZeRO-2. A case keeps its source's own
figure: ``published.flops_per_token`` where its TFLOP/s count their own FLOPs, ``published.tokens_per_s_per_gpu``
where it measured tokens (:func:`published_step_s`), ``published.vpp`` where its software could not interleave,
``published.distribute_saved_activations`` where it kept full-recompute checkpoints split over the tp ranks, and
``model`` fields of :data:`MODEL_SPEC_KEYS` beyond the GPT-3 shape.

Dropout (:func:`case_dropout`, the cost model's ``ModelShape.dropout``: 1-byte masks in the activations and their
memory traffic, none at p = 0) is what each run trained with: ``published.dropout`` where its source states it, with
the evidence in ``published.dropout_source``; otherwise the default of the software it ran, Megatron-LM's
--hidden-dropout / --attention-dropout 0.1 (:data:`MEGATRON_DEFAULT_DROPOUT`), which Megatron-DeepSpeed and
GPT-NeoX's fork inherit. By family: the January 2021 GPT-3 example sets no dropout flag (0.1); BLOOM inherits
the default and says so (0.1); OPT sets 0.1 (no embedding dropout); GPT-NeoX-20B sets 0; torchtitan's Llama has no
dropout module (0); llm-foundry's MPT defaults to 0. Narayanan et al. 2021 (Table 1, Table 2's ZeRO-3 rows), MT-NLG
and GLM-130B are taken at the default 0.1: no source of theirs read here states a dropout.

The loss (:func:`case_loss`, the cost model's ``ModelShape.loss``: what the cross entropy keeps of the logits,
estimate/activations.py LOSS_IMPLS) is ``published.loss`` where the source states it, with the evidence in
``published.loss_source``; otherwise Megatron-LM's vocab-parallel cross entropy, which Megatron-LM,
Megatron-DeepSpeed, GPT-NeoX and metaseq's model-parallel OPT all call. torchtitan calls torch's cross entropy on
an fp32 copy of the logits; llm-foundry's MPT flash-attn's fused xentropy (its ``loss_fn`` default).

The fused attention kernel (:func:`case_attention`, the cost model's ``ModelShape.attention``: its measured rate by
head dimension and sequence length, estimate/attention.py ATTENTION_IMPLS) is ``published.attention`` where the
source's code names it, with the evidence in ``published.attention_source``: llm-foundry's MPT runs flash-attn 1.x's
Triton kernel (``attn_impl: triton``), torchtitan PyTorch SDPA's FlashAttention-2. Otherwise the GPU's catalog
figure: the Megatron-LM / NeMo runs on Transformer Engine, and the runs without fused attention (which do not read it).

Layer code in eager PyTorch (:func:`case_shape_fields`, the cost model's ``ModelShape.layer_impl`` and
``eager_norm``, estimate/eager_ops.py) is ``published.layer_impl`` / ``published.eager_norm`` where the run's model
code is read, with the evidence in ``published.layer_impl_source``: torchtitan's Llama layer, with its eager RMSNorm
where the train config's ``norm_type`` is "rmsnorm" (the 70B rows), the Triton ``fused_rmsnorm`` otherwise (Llama 2
13B; the table's local batches and 1D FSDP differ from those configs' batch_size and tensor_parallel_degree, so
its runs overrode some fields: norm_type is taken as configured). Every other case runs the fused kernels orch
charges. llm-foundry's MPT states none: its layer (torch 1.13,
LPLayerNorm as one native layer_norm kernel, views of the fused QKV output fed to the Triton flash kernel) moves
no more than orch charges; the one extra pass, native layer_norm's separate gamma/beta backward kernel (2 e per
element), is outweighed by the QKV and context copies it does not make.
"""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.spec import Spec
from orchestrator.spec_loader import parse_spec
from orchestrator.stages import balanced_split

GPU_KEYS = {"A100-SXM4-80GB": "a100-80gb", "A100-SXM4-40GB": "a100-40gb", "H100-SXM5-80GB": "h100-sxm"}

# ModelSpec fields a case's "model" may state beyond its shape (defaults: GPT-2/3 style, as Table 1).
MODEL_SPEC_KEYS = ("tie_embeddings", "position_embedding", "ffn_hidden_size", "gated_mlp", "num_query_groups",
                   "normalization", "add_bias_linear", "flash_attention")


# Megatron-LM's --hidden-dropout and --attention-dropout default (megatron/arguments.py _add_regularization_args at
# 152aab304d, 2021-01-11; TransformerConfig.hidden_dropout / attention_dropout at core_v0.16.1): what a run that
# states no dropout trained with.
MEGATRON_DEFAULT_DROPOUT = 0.1


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
                      "(orchestrator/estimate/engines.py ds_bf16_optimizer)"),
                  "dropout": 0.1, "dropout_source": (
                      "bigscience train/tr11-176B-ml/README.md: 'The default Megatron-LM dropout settings are "
                      "inherited' (--attention-dropout 0.1, --hidden-dropout 0.1); tr11-176B-ml.slurm sets neither")},
    "notes": "Megatron-DeepSpeed; ALiBi positions (modelled as learned: s*h parameters, no FLOPs); the 70 "
             "layers on 12 stages are not even: the embedding and the tied output layer each count as one "
             "layer in its partition (5 + 10 x 6 + 5). Not modelled: the launch script's CUDA_LAUNCH_BLOCKING=1 "
             "(tr11-176B-ml.slurm, the workaround for hangs at 40+ nodes), which BigScience measured at no cost "
             "at this scale (train/tr11-176B-ml/chronicles-prequel.md: 84.59 vs 84.44 and 90.29 vs 90.25 TFLOP/s "
             "on 160 GPUs, blocking vs not; README: 'a tiny impact or no impact at all'); the config's "
             "wall_clock_breakdown is false and --deepspeed-activation-checkpointing sets no partition, "
             "contiguous-memory or synchronize flag",
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
# memory model puts 560 GPUs at 75.4 GiB and 640 at 73.7 GiB (76.0 within the headroom, 79.2 the A100-80GB holds):
# it cannot yet tell the two apart (what DeepSpeed 0.4 held beyond the terms of estimate/memory.py is not known here).


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


# GPT-NeoX-20B: its TFLOP/s count FLOPs its own way (published.flops_per_token, see published_step_s).
NEOX_20B_PARAMS = 20_556_201_984     # the released model's parameter count (model card, 20B.yml model)


def neox_flops_per_token(params: int, seq: int, hidden: int, layers: int) -> float:
    """FLOPs per token that GPT-NeoX's own throughput log counts (megatron/logging.py get_flops at the 20B
    release, commit c560814b: 6 x the model's total parameters + 60 s h l), the figure its paper reports."""
    return 6 * params + 60 * seq * hidden * layers


NEOX_20B = {
    "id": "neox_20b", "kind": "throughput",
    "source": "Black et al. 2022, GPT-NeoX-20B (arXiv 2204.06745; ACL BigScience workshop 2022.bigscience-1.9), "
              "sections 2.2-3 (12 nodes of 8 A100-SXM4-40GB, four ConnectX-6 HCAs per node; tensor parallel 2, "
              "pipeline parallel 4, ZeRO; 117 teraFLOPS per GPU); the 20B config as trained, "
              "EleutherAI/gpt-neox configs/20B.yml at the 20B release (commit c560814b, 2022-02-10: 44 layers, "
              "h 6144, 64 heads, seq 2048, micro-batch 4, 32 gradient accumulation steps, ZeRO stage 1, fp16, "
              "checkpoint-activations, no weight tying, rotary)",
    "model": {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048,
              # 50257 tokens padded to 50432 (make_vocab_size_divisible_by 128 x tp 2; model card)
              "vocab": 50432, "tie_embeddings": False, "position_embedding": "rope"},
    "cluster": {"gpus": 96, "gpu_type": "A100-SXM4-40GB", "gpus_per_node": 8,
                # four ConnectX-6 HCAs per node on HDR switches (MQM8700-HS2R: 200 Gb/s ports)
                "nic_Gbps_per_node": 800},
    "global_batch": 1536,    # micro-batch 4 x 32 accumulation steps x dp 12 (the paper's "~3.15M tokens")
    "published": {"tp": 2, "pp": 4, "dp": 12, "micro_batch": 4, "zero_stage": 1, "recompute": "full",
                  "precision": "fp16", "tflops_per_gpu": 117, "engine": "deepspeed",
                  "flops_per_token": neox_flops_per_token(NEOX_20B_PARAMS, 2048, 6144, 44),
                  "engine_version": "0.3.15", "engine_version_source": (
                      "requirements/requirements.txt at the 20B release (c560814b) pins EleutherAI's DeepSpeed fork "
                      "DeeperSpeed at eb7f5cff (2021-09-20), whose version.txt reads 0.3.15; its pipeline engine "
                      "partitions activations but not gradients (pipe/engine.py: is_grad_partitioned = False), the "
                      "pre-0.5.4 hand-overs of estimate/engines.py ds_pipe_hand_overs, and its ZeRO-1 is "
                      "runtime/zero/stage1.py (reduce-scatter of the gradients, reduce_scatter: true)"),
                  "dropout": 0.0, "dropout_source": "configs/20B.yml: \"hidden-dropout\": 0, \"attention-dropout\": 0"},
    "notes": "DeepSpeed pipeline engine (DeeperSpeed) with Megatron tensor parallelism. The 117 TFLOP/s count "
             "6N + 60shl FLOPs per token (GPT-NeoX's get_flops), not eq. 3: 43.85 s per step. Not modelled: the "
             "parallel attention + MLP residual (gpt_j_residual: one tensor-parallel all-reduce per layer and "
             "pass instead of two) and synchronize-each-layer (deepspeed.checkpointing synchronizes the device at the "
             "start and end of each checkpointed layer's forward and backward, v0.3.15 checkpointing.py: two "
             "relaunch gaps per layer and micro-batch, 11 x 2 x 35 on the critical path, 0.2-0.5% of the step "
             "at an assumed 0.1-0.3 ms each); the config's partition-activations is false, as the memory model assumes",
    "verification": "layout, batch, precision, ZeRO stage and model from the official 20B.yml at the release commit "
                    "(read in the EleutherAI/gpt-neox git history); 117 TFLOP/s and tp 2 / pp 4 from a public "
                    "section-by-section transcription of the ACL paper (section 3); checked against the paper's "
                    "training time as transcribed by nl2code.github.io (1,830 hours for 150,000 steps = 43.92 s "
                    "per step): 117 TFLOP/s by the release's own FLOPs formula at batch 1536 x 2048 is 43.85 s "
                    "per step (0.2% apart; eq. 3 would give 47.6 s)",
}


OPT_175B = {
    "id": "opt_175b", "kind": "throughput",
    "source": "Zhang et al. 2022, OPT (arXiv 2205.01068), section 2.4 ('We trained OPT-175B on 992 80GB A100 GPUs, "
              "by utilizing Fully Sharded Data Parallel with Megatron-LM Tensor Parallelism. We achieve utilization "
              "of up to 147 TFLOP/s per GPU'; FP16 weights, FP32 Adam states sharded) and Table 1 (96 layers, 96 "
              "heads, h 12288, batch 2M tokens); facebookresearch/metaseq metaseq/launcher/opt_job_constants.py "
              "(175b: model_parallel 8, batch 2 x 1024^2 tokens) and opt_baselines.py (per-GPU batch (2^21 // dp) "
              "// 2048 = 8 at dp 124, update-freq 1, fully_sharded with --no-reshard-after-forward, "
              "--checkpoint-activations --distribute-checkpointed-activations, --memory-efficient-fp16)",
    "model": {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048,
              "vocab": 50272},   # GPT-2 BPE with OPT's special tokens, as the released models' embeddings
    "cluster": {"gpus": 992, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8},
    "global_batch": 992,     # 8 sequences x 124 data-parallel ranks (2,031,616 tokens: the '2M')
    "published": {"tp": 8, "pp": 1, "dp": 124, "micro_batch": 8, "zero_stage": 2, "recompute": "full",
                  "precision": "fp16", "tflops_per_gpu": 147, "engine": "megatron",
                  "distribute_saved_activations": True, "dropout": 0.1, "dropout_source": (
                      "metaseq/launcher/opt_baselines.py: --dropout 0.1 --attention-dropout 0.1 --no-emb-dropout (the "
                      "embedding's one mask per micro-batch, which the model counts, is the only difference)")},
    "notes": "FairScale FSDP wrapping each transformer layer (metaseq transformer_decoder.py: FSDP always wraps the "
             "checkpointed layer) with Megatron tensor parallelism 8. Modelled as Megatron FSDP, the orch engine "
             "whose sharding matches (estimate/engines.py: one all-gather per layer and pass, one reduce-scatter per "
             "layer, overlapped), at ZeRO-2: --no-reshard-after-forward keeps each layer's gathered parameters from "
             "its forward to its backward, so the parameters are gathered once per step and the gradients "
             "reduce-scattered, ZeRO-2's traffic and memory (the gathered fp16 parameters of the whole tp shard). "
             "'Up to' 147: the best sustained rate, not the run's mean (hardware failures and restarts excluded); "
             "its FLOPs are eq. 3's: metaseq's final note counts 4.30E+23 FLOPs for 300B tokens (eq. 3 gives "
             "4.30e23) and ~33 days on 1024 A100s, i.e. 147 TFLOP/s per GPU. ReLU MLP (GeLU's FLOPs counted), "
             "learned positions, tied embeddings. Not stated: the network (the catalog's DGX-class 8 x 200 Gb/s "
             "per node is assumed)",
    "verification": "section 2.4 read in a full-text conversion of the paper; layout from the released checkpoint "
                    "(projects/OPT/assets/opt175b_md5sum_shards.csv: model parts 0-7 x FSDP shards 0-123 = tp 8 x "
                    "dp 124 = 992 GPUs) and the launcher of the metaseq git history; FLOPs convention checked "
                    "against projects/OPT/chronicles/final_update.md",
}


MEGATRON_GPT3_175B = {
    "id": "megatron_lm_gpt3_175b_1024gpu", "kind": "throughput",
    "source": "NVIDIA Megatron-LM README, 'GPT-3 Example' (commit 152aab304d, 2021-01-11: 'With full global batch size "
              "of 1536 on 1024 A100 GPUs, each iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU'); "
              "examples/pretrain_gpt3_175B.sh at that commit (tp 8, pp 16, 96 layers, h 12288, 96 heads, seq 2048, "
              "micro-batch 1, global batch 1536, fp16, --checkpoint-activations; GPT-2 vocabulary)",
    "model": {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048,
              "vocab": 51200},   # 50257 padded to a multiple of 128 x tp 8 (--make-vocab-size-divisible-by 128)
    "cluster": {"gpus": 1024, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8},
    "global_batch": 1536,
    "published": {"tp": 8, "pp": 16, "dp": 8, "micro_batch": 1, "vpp": 1, "zero_stage": 0, "recompute": "full",
                  "precision": "fp16", "tflops_per_gpu": 138, "iteration_s": 32},
    "notes": "Megatron-LM of January 2021: no interleaved schedule yet (--num-layers-per-virtual-pipeline-stage "
             "arrived 2021-02-13, dcef906978), so vpp 1; no scatter/gather of the pipeline hand-overs either (each "
             "tp rank sends the whole activation; the cost model prices the scattered transfer); plain data "
             "parallelism (--DDP-impl local). The README's 138 TFLOP/s are eq. 3's FLOPs in 32 s (137.7)",
    "verification": "README and example script read in the NVIDIA/Megatron-LM git history (mirror); eq. 3 at batch "
                    "1536 x 2048 in 32 s on 1024 GPUs gives 137.7 TFLOP/s, the README's 138",
}


def glm_flops_per_token() -> float:
    """FLOPs per token behind GLM-130B's MFU, 'following the calculation in (Chowdhery et al., 2022)': PaLM's
    6N + 12 L H Q T (L layers, H heads, Q head size, T sequence), N the model's parameters counted here from
    its shape (70 layers of QKV + output 4h^2, GeGLU 3 h f and their biases and norms; the 150,528 x h tied
    embedding): 128.7e9 ('130B')."""
    h, f, layers, vocab = 12288, 32768, 70, 150528
    n = layers * (4 * h * h + 3 * h * f + 9 * h + 2 * f) + vocab * h + 2 * h
    return 6 * n + 12 * layers * h * 2048


GLM_130B = {
    "id": "glm_130b", "kind": "throughput",
    "source": "Zeng et al. 2022, GLM-130B (arXiv 2210.02414, ICLR 2023), section 2.3 (96 DGX-A100 40G nodes; "
              "DeepSpeed's PipeDream-Flush pipeline, 4-way tensor and 8-way pipeline parallelism, global batch "
              "4,224; HFU 43.3% and MFU 32.5% by Chowdhery et al.'s calculation; 9 x 8 - 2 = 70 layers, the "
              "first and last stage one layer lighter), Appendix B.4 (m = 176 micro-batches, p = 8) and Table 11 "
              "(full training configuration: micro_batch_size 1, data_parallel_size 24, zero_stage 1, fp16, "
              "checkpoint_activations, partition_activations, hidden 12288, ffn 32768 GeGLU, 96 heads, rotary, "
              "seq 2048, make_vocab_size_divisible_by 768, zero_contigious_gradients False)",
    "model": {"layers": 70, "hidden": 12288, "heads": 96, "seq_len": 2048,
              "vocab": 150528,   # icetk's 150,000 padded to a multiple of 768 (the released model's 150528)
              "ffn_hidden_size": 32768, "gated_mlp": True, "position_embedding": "rope"},
    "cluster": {"gpus": 768, "gpu_type": "A100-SXM4-40GB", "gpus_per_node": 8},
    "global_batch": 4224,
    "published": {"tp": 4, "pp": 8, "dp": 24, "micro_batch": 1, "zero_stage": 1, "recompute": "full",
                  "precision": "fp16", "tflops_per_gpu": round(0.325 * 312, 1), "engine": "deepspeed",
                  "flops_per_token": glm_flops_per_token(), "distribute_saved_activations": True,
                  "engine_version": "0.6", "engine_version_source": (
                      "not stated in the paper (the released code asks for 'DeepSpeed 0.6+'); trained until "
                      "2022-07-03 (README: 'As of July 3rd, 2022, GLM-130B has been trained on over 400 billion "
                      "text tokens'), before v0.6.6 (tag 2022-07-13), so at most v0.6.5; every release from "
                      "v0.5.4 to v0.9.x shares the paths the cost model distinguishes for an fp16 ZeRO-1 pipeline "
                      "run (estimate/engines.py: ZeRO-1 bucket all-reduce since v0.4.4, partitioned gradient "
                      "hand-overs since v0.5.4)")},
    "notes": "DeepSpeed pipeline engine with Megatron tensor parallelism (tp 4 inside a node); the DeepSpeed "
             "activation checkpointing's partition_activations keeps 1/tp of each checkpointed input (as "
             "distribute_saved_activations). The split 8 + 6 x 9 + 8 is the balanced uneven split. GLM's "
             "bidirectional context attention and DeepNorm post-LN cost what causal pre-LN layers cost here. The "
             "MFU is the reference (32.5% of 312 TFLOP/s, PaLM's FLOPs); its HFU (43.3%) with full recompute, "
             "8N + 16LHQT, implies the same step (88 s). Not stated: the network (the catalog's DGX A100 figures)",
    "verification": "section 2.3, Appendix B.4 and Table 11 read in two full-text conversions of arXiv 2210.02414 "
                    "(HTML and PDF); padded vocabulary 150528 in the THUDM/GLM-130B evaluation logs",
}


# Llama shapes at torchtitan commit 1ea476e9f (torchtitan/models/llama/__init__.py; SwiGLU width from model.py's
# FeedForward: int(2 * 4h / 3), times ffn_dim_multiplier, rounded up to multiple_of)
LLAMA_COMMON = {"gated_mlp": True, "normalization": "rmsnorm", "position_embedding": "rope", "tie_embeddings": False,
                "add_bias_linear": False, "flash_attention": True}
TORCHTITAN_MODELS = {
    "llama3_70b": {"layers": 80, "hidden": 8192, "heads": 64, "num_query_groups": 8, "ffn_hidden_size": 28672,
                   "vocab": 128256, "seq_len": 8192},
    "llama2_70b": {"layers": 80, "hidden": 8192, "heads": 64, "num_query_groups": 8, "ffn_hidden_size": 28672,
                   "vocab": 32000, "seq_len": 4096},
    "llama2_13b": {"layers": 40, "hidden": 5120, "heads": 40, "ffn_hidden_size": 13824, "vocab": 32000,
                   "seq_len": 4096},
}


# train_configs/<model>.toml [model] norm_type at commit 1ea476e9f (the same since c7d586592, before the table's
# first version 395a52627): "rmsnorm" is norms.py's eager RMSNorm, "fused_rmsnorm" its Triton kernel
TORCHTITAN_NORM_TYPE = {"llama3_70b": "rmsnorm", "llama2_70b": "rmsnorm", "llama2_13b": "fused_rmsnorm"}


def torchtitan_case(model: str, micro_batch: int, recompute: str, wps: float, mfu: float) -> dict:
    """A row of torchtitan's 'performance numbers' (docs/performance.md at commit 1ea476e9f, 2024-04-24): FSDP2 on
    64 A100 (80GB), local batch ``micro_batch`` (global 64 x it), ``wps`` tokens per second per GPU."""
    return {
        "id": f"torchtitan_{model}_fsdp_64gpu", "kind": "throughput",
        "source": "pytorch/torchtitan docs/performance.md (commit 1ea476e9f, 2024-04-24), FSDP2 on 64 A100 (80GB): "
                  f"{model}, local batch size {micro_batch}, activation checkpointing "
                  f"{'full' if recompute == 'full' else 'no'}, {wps} WPS (tokens per second per GPU: train.py "
                  f"divides by the model-parallel size, 1 here), MFU {mfu:.1%}; train_configs (seq_len, compile "
                  "false) and torchtitan/models/llama at that commit",
        "model": {**TORCHTITAN_MODELS[model], **LLAMA_COMMON},
        "cluster": {"gpus": 64, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8},
        "global_batch": 64 * micro_batch,
        "published": {"tp": 1, "pp": 1, "dp": 64, "micro_batch": micro_batch, "zero_stage": 3, "recompute": recompute,
                      "precision": "bf16", "tokens_per_s_per_gpu": wps,
                      "tflops_per_gpu": round(mfu * 312, 1),   # its MFU (6N + 12 l h q t FLOPs) of 312 TFLOP/s
                      "engine": "megatron", "dropout": 0.0,
                      "dropout_source": "torchtitan/models/llama/model.py at that commit has no dropout module",
                      "attention": "fa2",
                      "attention_source": "torchtitan/models/llama/model.py at that commit: "
                                          "F.scaled_dot_product_attention(xq, xk, xv, is_causal=True) on bf16, head "
                                          "dim 128, no mask (SDPA's flash backend); README: tested with "
                                          "torch-2.4.0.dev20240412; PyTorch v2.2.0 release notes: SDPA 'now supports "
                                          "FlashAttention-2'",
                      "layer_impl": "torchtitan_llama", "eager_norm": TORCHTITAN_NORM_TYPE[model] == "rmsnorm",
                      "layer_impl_source": "torchtitan/models/llama/model.py and models/norms.py at that commit, run "
                                           "eagerly (train_configs: compile = false; FSDP2 bf16 parameters): RoPE as "
                                           "an fp32 complex multiply, silu(w1 x) * w3 x, separate wq/wk/wv and w1/w3, "
                                           f"repeat_kv for GQA; train_configs/{model}.toml norm_type "
                                           f"{TORCHTITAN_NORM_TYPE[model]!r}"},
        "notes": "PyTorch FSDP2 (parallelize_llama.py at that commit: fully_shard per transformer block, "
                 "reshard_after_forward except the last block, bf16 parameters, fp32 gradient reduction, "
                 "checkpoint_wrapper per block under full AC) modelled as Megatron FSDP at ZeRO-3, the orch engine "
                 "whose sharding matches (one all-gather per layer and pass, one reduce-scatter per layer, "
                 "overlapped; gradients reduced in fp32 as Megatron's bf16 runs do). SDPA attention (flash). Not "
                 "stated: the network; the catalog's 8 x 200 Gb/s per node is assumed (Llama 3 70B: at a quarter "
                 "of it, cluster.inter_node_bandwidth_GBps 5.6, the prediction drops by 10%, 351 -> 317 tokens/s "
                 "per GPU). The Llama 3 8B and Llama 2 13B rows with torchtitan's selective AC are left out: its "
                 "per-op and per-layer policies are not Megatron's selective recompute",
        "verification": "docs/performance.md, the train configs, model arguments, FSDP wrapping and the WPS/MFU code "
                        "read at commit 1ea476e9f in the pytorch/torchtitan git history; the MFU checks with "
                        "torchtitan's 6N + 12 l h q t per token, N = all parameters (utils.get_num_params; Llama 3 "
                        "70B: 70.55e9 at 331 WPS gives 51.74%)",
    }


TORCHTITAN_FSDP = (torchtitan_case("llama3_70b", 1, "full", 331, 0.517),
                   torchtitan_case("llama2_70b", 2, "full", 353, 0.505),
                   torchtitan_case("llama2_13b", 2, "none", 2162, 0.611))

# MPT shapes of llm-foundry's scripts/train/yamls/mpt/*.yaml at commit 5f43bf160 (2023-05-03): (d_model, n_heads,
# n_layers); expansion_ratio 4, vocab 50368, learned positions, biases, LayerNorm, tied embeddings, triton flash
# attention, no dropout (configuration_mpt.py defaults at that commit)
MPT_SHAPES = {"70b": (8192, 64, 80), "30b": (7168, 56, 48), "13b": (5120, 40, 40), "7b": (4096, 32, 32),
              "3b": (2560, 20, 32), "1b": (2048, 16, 24), "760m": (1536, 12, 24), "350m": (1024, 16, 24),
              "125m": (768, 12, 12)}


def mpt_case(model: str, micro_batch: int, grad_accum: int, recompute: str, tokens_per_s_per_gpu: float,
             mfu: float) -> dict:
    """A 64-GPU A100-80GB row of llm-foundry's MPT training benchmarks (scripts/train/benchmarking/README.md)."""
    h, heads, layers = MPT_SHAPES[model]
    return {
        "id": f"llmfoundry_mpt_{model}_fsdp_64gpu", "kind": "throughput",
        "source": "mosaicml/llm-foundry scripts/train/benchmarking/README.md, 'A100 80GB' table (commit 5f43bf160, "
                  "2023-05-03; the heading 'with 1600 Gbps node-node interconnect (RoCE)' added by ef350d9e6, "
                  f"2023-07-05, rows unchanged): MPT-{model}, seq 2048, 64 a100_80gb, micro-batch {micro_batch}, "
                  f"grad accum {grad_accum}, {tokens_per_s_per_gpu} tokens/s per GPU, MFU {mfu:.2%}, bf16 PURE, "
                  f"FULL_SHARD, activation checkpointing {recompute == 'full'}; model from yamls/mpt/{model}.yaml",
        "model": {"layers": layers, "hidden": h, "heads": heads, "seq_len": 2048, "vocab": 50368,
                  "flash_attention": True},
        "cluster": {"gpus": 64, "gpu_type": "A100-SXM4-80GB", "gpus_per_node": 8, "nic_Gbps_per_node": 1600},
        "global_batch": 64 * micro_batch * grad_accum,
        "published": {"tp": 1, "pp": 1, "dp": 64, "micro_batch": micro_batch, "zero_stage": 3, "recompute": recompute,
                      "precision": "bf16", "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
                      "tflops_per_gpu": round(mfu * 312, 1), "engine": "megatron", "dropout": 0.0,
                      "grad_reduce_dtype": "bf16",
                      "grad_reduce_source": "the table's 'bf16 PURE': Composer's FSDP mixed precision PURE sets "
                                            "MixedPrecision's param, reduce and buffer dtypes all to the run's "
                                            "precision (bf16), so FSDP reduce-scatters bf16 gradients",
                      "dropout_source": "configuration_mpt.py defaults at that commit (emb_pdrop 0, resid_pdrop 0, "
                                        "attn_config attn_pdrop 0); the model yamls set none",
                      "loss": "xentropy",
                      "loss_source": "modeling_mpt.py ComposerMPTCausalLM at that commit: loss_fn defaults to "
                                     "fused_crossentropy, flash_attn.losses.cross_entropy.CrossEntropyLoss (setup.py: "
                                     "flash-attn v1.0.3.post0, xentropy-cuda-lib of flash-attention v0.2.8); neither "
                                     "the model yamls nor submit_benchmarks.py set loss_fn",
                      "attention": "flash_attn_triton",
                      "attention_source": "yamls/mpt/*.yaml and submit_benchmarks.py (--attn_impl default 'triton') "
                                          "at that commit: attn_impl triton; llmfoundry/models/layers/attention.py "
                                          "triton_flash_attn_fn calls flash_attn.flash_attn_triton.flash_attn_func "
                                          "(setup.py: flash-attn v1.0.3.post0); head dim d_model / n_heads: 64 for "
                                          "125m and 350m, 128 for the others ('Modified ... so that d_head == 128' "
                                          "in 760m.yaml and 3b.yaml)"},
        "notes": "Composer's PyTorch FSDP (torch 1.13.1 image of submit_benchmarks.py; modeling_mpt.py fsdp_wrap_fn "
                 "and activation_checkpointing_fn: each MPTBlock, limit_all_gathers) modelled as Megatron FSDP at "
                 "ZeRO-3, the orch engine whose sharding matches (per-layer gathers, overlapped). PURE mixed "
                 "precision reduces gradients in bf16 (training.grad_reduce_dtype bf16, ``grad_reduce_source``). "
                 "The loss is flash-attn's fused xentropy: it keeps the bf16 logits and "
                 "writes a bf16 gradient, no fp32 softmax (estimate/activations.py LOSS_IMPLS). The MPT-1b row "
                 "without activation checkpointing (micro-batch 20) is modelled at 77.0 GiB: inside the planner's "
                 "5% headroom (76.0 GiB on A100-80GB) but within the 79.2 GiB the GPU holds (activations 67.9 GiB: "
                 "24 layers x 2.5 GiB stored and the loss's bf16 logits and gradient 7.7 GiB; other 8.8 GiB, of "
                 "which allocator fragmentation 6.8 GiB, 10% of the activations); the planner takes it with a "
                 "warning, as no layout of the row stays within the headroom",
        "verification": "README table, model yamls, MPT config defaults and the benchmark submit script read at "
                        "commit 5f43bf160 in the mosaicml/llm-foundry git history; the parameter count of the shape "
                        "(12h^2 + 13h per layer, tied 50368 x h, 2048 x h positions) equals the table's NumParams",
    }


MPT_FSDP = (mpt_case("70b", 8, 4, "full", 410, 0.5333), mpt_case("30b", 16, 3, "full", 876, 0.5293),
            mpt_case("13b", 32, 1, "full", 1994, 0.5251), mpt_case("7b", 32, 1, "full", 3670, 0.5080),
            mpt_case("3b", 12, 3, "none", 10158, 0.5836), mpt_case("1b", 20, 1, "none", 19423, 0.5667),
            mpt_case("760m", 24, 1, "none", 29565, 0.5182), mpt_case("350m", 32, 1, "none", 54384, 0.4776),
            mpt_case("125m", 32, 1, "none", 130026, 0.4077))

ZERO3_530B = (zero3_530b_case(640, 2560, 4, 138), zero3_530b_case(1120, 2240, 2, 98), zero3_530b_case(2240, 2240, 1, 48))
MT_NLG_530B = (_mt_nlg(280, 60.1, 126), _mt_nlg(350, 50.2, 121), _mt_nlg(420, 44.4, 113))
EXTRA_CASES = (BLOOM_176B, *MT_NLG_530B, *ZERO3_530B, NEOX_20B, OPT_175B, MEGATRON_GPT3_175B, GLM_130B,
               *TORCHTITAN_FSDP, *MPT_FSDP)


def load_cases(path: str | Path, kind: str | None = None) -> list[dict]:
    """The cases of a references file, optionally only those of one ``kind``."""
    cases = json.loads(Path(path).read_text())
    return [c for c in cases if kind is None or c["kind"] == kind]


def throughput_spec(case: dict, *, published_layout: bool = True) -> Spec:
    """A spec for a throughput case; the published layout fixed, or every parallelism field open."""
    return parse_spec(throughput_spec_data(case, published_layout=published_layout))


# training.attention_impl / cross_entropy_impl as a spec names the kernels a case's evidence names
SPEC_ATTENTION = {"fa2": "flash_attn_2", "flash_attn_triton": "flash_attn_triton"}
SPEC_LOSS = {"vocab_parallel": "vocab_parallel", "torch": "torch", "xentropy": "flash_attn_xentropy"}
ENGINE_LOSS = {"megatron": "vocab_parallel", "deepspeed": "torch"}


def throughput_spec_data(case: dict, *, published_layout: bool = True) -> dict:
    """The spec of a throughput case as data: its shape, cluster and batch, the software it ran (release,
    dropout, loss, attention kernel, layer code: the case's evidence, module doc) and, with
    ``published_layout``, the layout its source fixed (micro-batch and interleaving where it states them)."""
    m, c, pub = case["model"], case["cluster"], case["published"]
    gpn = c["gpus_per_node"]
    engine = case_engine(case)
    data = {
        "name": case["id"].replace(".", "_")[:64],
        "model": {"num_layers": m["layers"], "hidden_size": m["hidden"], "num_attention_heads": m["heads"],
                  "vocab_size": m["vocab"], "seq_length": m["seq_len"], "flash_attention": False,
                  **{k: m[k] for k in MODEL_SPEC_KEYS if k in m}},
        "cluster": {"gpu": GPU_KEYS[c["gpu_type"]], "num_nodes": c["gpus"] // gpn, "gpus_per_node": gpn},
        "training": {"global_batch_size": case["global_batch"], "precision": pub.get("precision", "fp16"),
                     "engine": engine},
    }
    if case_dropout(case):
        data["model"].update(hidden_dropout=case_dropout(case), attention_dropout=case_dropout(case))
    if case_engine_version(case):
        data["training"]["engine_version"] = case_engine_version(case)
    if case_loss(case) != ENGINE_LOSS[engine]:
        data["training"]["cross_entropy_impl"] = SPEC_LOSS[case_loss(case)]
    if case_attention(case) != "catalog":
        data["training"]["attention_impl"] = SPEC_ATTENTION[case_attention(case)]
    if pub.get("grad_reduce_dtype"):   # the gradient reduction dtype the source states (``grad_reduce_source``)
        data["training"]["grad_reduce_dtype"] = pub["grad_reduce_dtype"]
    if pub.get("layer_impl"):
        data["training"]["layer_impl"] = pub["layer_impl"]
    if pub.get("eager_norm"):
        data["training"]["eager_norm"] = True
    if c.get("nic_Gbps_per_node"):
        data["cluster"]["inter_node_bandwidth_GBps"] = nic_share_GBps(c["nic_Gbps_per_node"], gpn)
    if published_layout:
        data["parallelism"] = {"tensor": pub["tp"], "pipeline": pub["pp"], "data": pub["dp"],
                               "zero_stage": pub["zero_stage"], "recompute": case_recompute(case),
                               "sequence_parallel": False, "offload": "none"}
        if pub.get("micro_batch"):
            data["parallelism"]["micro_batch_size"] = pub["micro_batch"]
        if pub.get("vpp"):         # software without interleaving (Megatron-LM before 2021-02) states vpp 1
            data["parallelism"]["virtual_pipeline"] = pub["vpp"]
        if pub.get("distribute_saved_activations"):
            data["parallelism"]["distribute_saved_activations"] = True
        if engine == "megatron" and pub["pp"] > 1 and not case_p2p_overlap(case):
            data["parallelism"]["overlap_p2p_comm"] = False
        # DeepSpeed places the balanced uneven split; Megatron's planner also weighs counting the embedding
        # and the loss in the split (which allows interleaving), so the split is left to it.
        split = (balanced_split(m["layers"], pub["pp"]) if m["layers"] % pub["pp"] and engine == "deepspeed"
                 else None)
        if split is not None:
            data["parallelism"].update(first_stage_layers=split[0], last_stage_layers=split[1])
    return data


def nic_share_GBps(nic_Gbps_per_node: float, gpus_per_node: int) -> float:
    """What one GPU gets across nodes from a node's stated NIC line rate: its share, at the efficiency the
    catalog's line rates get (CostModel.inter_node_efficiency)."""
    from orchestrator.estimate.cost import CostModel  # noqa: PLC0415

    return nic_Gbps_per_node / 8 / gpus_per_node * CostModel().inter_node_efficiency


def published_step_s(case: dict) -> float:
    """The step time a case's published figure implies: its tokens over ``published.tokens_per_s_per_gpu`` x GPUs
    where the source measured tokens (torchtitan), else its FLOPs per step over the aggregate rate of its TFLOP/s
    per GPU. The FLOPs are eq. 3 of Narayanan et al. (recompute included, as Table 1 and most papers count), or
    ``published.flops_per_token`` x tokens where the source counts its own way (GPT-NeoX)."""
    from orchestrator.estimate.flops import narayanan_flops  # noqa: PLC0415

    m, pub = case["model"], case["published"]
    tokens = case["global_batch"] * m["seq_len"]
    if pub.get("tokens_per_s_per_gpu"):
        return tokens / (pub["tokens_per_s_per_gpu"] * case["cluster"]["gpus"])
    flops = (pub["flops_per_token"] * tokens if pub.get("flops_per_token")
             else narayanan_flops(case["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"]))
    return flops / (pub["tflops_per_gpu"] * 1e12 * case["cluster"]["gpus"])


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


def case_dropout(case: dict) -> float:
    """The dropout probability a case trained with: ``published.dropout`` where its source states it, else
    Megatron-LM's default (:data:`MEGATRON_DEFAULT_DROPOUT`; module doc)."""
    return float(case["published"].get("dropout", MEGATRON_DEFAULT_DROPOUT))


def case_loss(case: dict) -> str:
    """The cross entropy implementation a case ran: ``published.loss`` where its source states it, else
    Megatron-LM's vocab-parallel cross entropy (module doc)."""
    return str(case["published"].get("loss", "vocab_parallel"))


def case_attention(case: dict) -> str:
    """The fused attention kernel a case ran: ``published.attention`` where its source's code names it, else the
    GPU's catalog figure (module doc)."""
    return str(case["published"].get("attention", "catalog"))


def case_shape_fields(case: dict) -> dict:
    """The ModelShape fields a case's run states beyond its spec: its attention kernel (:func:`case_attention`)
    and its eager layer code (``published.layer_impl``, ``published.eager_norm``; module doc); none for a run on
    the kernels orch charges."""
    keys = ("attention", "layer_impl", "eager_norm")
    return {key: case["published"][key] for key in keys if key in case["published"]}


def case_p2p_overlap(case: dict) -> bool:
    """Whether a case's Megatron overlapped its interleaved schedule's pipeline exchanges
    (``published.p2p_overlap``; parallelism.overlap_p2p_comm). Default False: every run of the references file
    predates the option (Megatron-LM f9283c5a8a, 2023-05-31, "Add option to overlap p2p communication")."""
    return bool(case["published"].get("p2p_overlap", False))


def case_recompute(case: dict) -> str:
    """The recompute mode of a case ("full (assumed, eq.3 convention)" reads as "full")."""
    return str(case["published"]["recompute"]).split()[0]


def published_estimate(case: dict, cost=None):
    """The case's spec (:func:`throughput_spec`) planned as ``orch plan`` plans it: the published layout fixed,
    what the source does not state (micro-batch, interleaving) chosen by the planner. Returns the chosen
    LayoutEstimate (NoFitError if nothing fits)."""
    from orchestrator.planner import search  # noqa: PLC0415

    return search(throughput_spec(case), top_k=1, cost=cost).chosen
