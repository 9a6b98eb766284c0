"""Layout robustness sweep: does every realistic fixed layout plan (or get refused for a stated reason)?

An independent checker writes published runs as ordinary specs with the layout fixed and runs ``orch plan
SPEC``; a crash, or a refusal of a layout the engine accepts, is a failure. This builds many such specs from
the catalog's model presets (plus a few published shapes that are not presets: GPT-3 125M-2.7B, TinyLlama 1.1B,
OLMoE-style MoE) x GPUs x engines x layouts a real run would use:

    tp 1-8 (dividing the heads and query groups), pp 1-32 (even split, Megatron's uneven first/last stage, or
    account_for_embedding_loss), virtual_pipeline where the stage's layers divide, cp 1-8, ep 1-64 (dividing
    the experts) and etp, sequence parallel, zero stages 0-3, hybrid sharding (shard_degree), recompute none /
    selective (with recompute_modules) / full (uniform / block, recompute_num_layers), fp8 delayed /
    tensorwise, micro-batch 1-32, global batches real runs use, clusters of 1-288 nodes of 8 GPUs.

Each spec goes through the path of ``orch plan SPEC`` (spec_loader.parse_spec, then planner.search via
plan.build_plan) and is classified:

    planned      the layout planned;
    refused-mem  exit-2 SpecError saying no layout fits in memory (the figures are kept);
    refused      exit-2 SpecError for a rule (the first problem is kept, grouped by its text with the numbers
                 stripped);
    EXCEPTION    anything else (a traceback): always a bug.

A deterministic sample of the planned specs is also written as a run dir (rundir.write_run_dir, what ``orch
generate`` does) and checked by ``orch validate``'s run-dir check (static; ``--deep`` also asks DeepSpeed's
and Megatron-Core's own config classes, ~10 s a run dir).

    flock /work/wt/cpu.lock python benchmarks/layout_sweep.py [--n N] [--seed S] [--rundirs K] [--deep]
        [--only SUBSTRING] [--show-refusals] [--show-mem]

``cases(n, seed)`` is also what tests/unit/test_layout_sweep.py plans a small fixed subset of.
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.catalog.models import MODELS, preset_fields  # noqa: E402
from orchestrator.errors import SpecError  # noqa: E402
from orchestrator.plan import build_plan  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402

GPN = 8
NODES = (1, 2, 4, 8, 16, 32, 64, 128, 288)
GPUS_ = ("h100-sxm", "a100-80gb", "a100-40gb", "h200", "b200")
ALL_GPUS = ("h100-sxm", "a100-80gb", "a100-40gb", "h200", "b200", "h100-pcie", "mi300x", "l40s")
FP8_GPUS = ("h100-sxm", "h200", "b200", "h100-pcie", "l40s")
GBS = (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192)

_GPT = {"seq_length": 2048, "vocab_size": 50257, "gated_mlp": False, "tie_embeddings": True,
        "normalization": "layernorm", "position_embedding": "learned", "add_bias_linear": True}
# Published shapes that are not presets (Brown et al. 2020 Table 2.1; TinyLlama HF config; OLMoE HF config).
EXTRA_MODELS: dict[str, dict] = {
    "gpt3-125m": {**_GPT, "num_layers": 12, "hidden_size": 768, "num_attention_heads": 12},
    "gpt3-350m": {**_GPT, "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
    "gpt3-760m": {**_GPT, "num_layers": 24, "hidden_size": 1536, "num_attention_heads": 16},
    "gpt3-1.3b": {**_GPT, "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16},
    "gpt3-2.7b": {**_GPT, "num_layers": 32, "hidden_size": 2560, "num_attention_heads": 32},
    "tinyllama-1.1b": {"num_layers": 22, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 4,
                       "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_length": 2048, "gated_mlp": True,
                       "tie_embeddings": False, "normalization": "rmsnorm", "position_embedding": "rope",
                       "add_bias_linear": False},
    "olmoe-1b-7b": {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16, "ffn_hidden_size": 1024,
                    "vocab_size": 50304, "seq_length": 4096, "gated_mlp": True, "tie_embeddings": False,
                    "normalization": "rmsnorm", "position_embedding": "rope", "add_bias_linear": False,
                    "moe": {"num_experts": 64, "router_topk": 8, "ffn_hidden_size": 1024, "aux_loss_coeff": 0.01}},
}


def model_fields(name: str) -> dict:
    return dict(EXTRA_MODELS[name]) if name in EXTRA_MODELS else preset_fields(name)


def model_names() -> list[str]:
    return [m for m in MODELS if not m.startswith("tiny")] + list(EXTRA_MODELS)


def _divisors(n: int, choices) -> list[int]:
    return [c for c in choices if n % c == 0]


def _params_b(m: dict) -> float:
    """Rough parameter count in billions (to pick realistic GPU counts)."""
    h, L = m["hidden_size"], m["num_layers"]
    ffn = m.get("ffn_hidden_size") or 4 * h
    moe = m.get("moe")
    mlp = (3 if m.get("gated_mlp") else 2) * h * ((moe.get("ffn_hidden_size") or ffn) * moe["num_experts"]
                                                  if moe else ffn)
    return (L * (4 * h * h + mlp) + 2 * h * m["vocab_size"]) / 1e9


@dataclass
class Case:
    label: str
    data: dict


def _layout(rng: random.Random, m: dict, engine: str, gpu: str) -> tuple[dict, int, str]:
    """A realistic fixed layout for model fields m: (parallelism, num_nodes, precision)."""
    heads, groups = m["num_attention_heads"], m.get("num_query_groups") or m["num_attention_heads"]
    L, seq, moe = m["num_layers"], m["seq_length"], m.get("moe")
    size = _params_b(m)
    tp = rng.choice([t for t in (1, 2, 4, 8) if heads % t == 0 and groups % t == 0])
    if size > 60 and tp < 4 and rng.random() < 0.7:
        tp = max(t for t in (1, 2, 4, 8) if heads % t == 0 and groups % t == 0)
    par: dict = {"tensor": tp}
    # pipeline: even split, uneven first/last (Megatron), or embedding/loss accounted (Megatron)
    pp_choices = [p for p in (1, 2, 4, 8, 16, 32) if p <= L]
    pp = rng.choice(pp_choices if size > 20 else [p for p in pp_choices if p <= 4])
    split = "even"
    if pp > 1:
        if L % pp == 0:
            split = "even"
        elif engine == "megatron" and (L + 2) % pp == 0:
            split = "account"
        elif engine == "megatron" and pp > 2:
            split = "uneven"
        else:
            pp = max(p for p in pp_choices if L % p == 0 and p <= pp)
        if engine == "megatron" and split == "even" and (L + 2) % pp == 0 and rng.random() < 0.3:
            split = "account"
    par["pipeline"] = pp
    vpp = None
    if pp > 1 and engine == "megatron":
        if split == "even":
            per = L // pp
            v = [x for x in (2, 3, 4, 5, 6, 8) if per % x == 0]
            vpp = rng.choice(v) if v and rng.random() < 0.6 else None
        elif split == "account":
            par["account_for_embedding_loss"] = True
            per = (L + 2) // pp
            v = [x for x in (2, 3, 4, 5, 6, 8) if per % x == 0]
            vpp = rng.choice(v) if v and rng.random() < 0.6 else None
        elif split == "uneven":
            # the middle stages share the rest equally: first = last = f, (L - 2f) % (pp - 2) == 0
            fs = [f for f in range(1, L // pp + 2) if (L - 2 * f) > 0 and (L - 2 * f) % (pp - 2) == 0]
            f = rng.choice(fs) if fs else None
            if f is None:
                pp = max(p for p in pp_choices if L % p == 0)
                par["pipeline"] = pp
            else:
                par["first_stage_layers"] = par["last_stage_layers"] = f
    if vpp:
        par["virtual_pipeline"] = vpp
    # context parallelism (long sequences)
    cp = 1
    if seq >= 8192 and rng.random() < 0.7:
        cp = rng.choice([c for c in (2, 4, 8) if seq % (2 * c) == 0] or [1])
    elif rng.random() < 0.1:
        cp = 2 if seq % 4 == 0 else 1
    if engine == "deepspeed" and cp > 1 and (heads % cp or groups % cp):
        cp = 1
    if cp > 1:
        par["context"] = cp
    # experts
    if moe:
        e = moe["num_experts"]
        eps = [x for x in (1, 2, 4, 8, 16, 32, 64) if e % x == 0]
        ep = rng.choice(eps[1:] or eps)
        par["expert"] = ep
        if engine == "megatron" and rng.random() < 0.3 and tp > 1:
            par["expert_tensor"] = rng.choice([1, tp])
        elif engine == "deepspeed" and tp > 1:
            par["expert_tensor"] = rng.choice([1, tp])
    if tp > 1:
        par["sequence_parallel"] = True if moe else rng.random() < 0.7
    # world: enough nodes for tp*pp*cp (and ep), realistic for the size
    mp = tp * pp * cp
    need = max(mp, par.get("expert", 1) * par.get("expert_tensor", 1) * pp)
    nodes_ok = [n for n in NODES if (n * GPN) % mp == 0 and n * GPN >= need
                and (n * GPN) % (par.get("expert", 1) * par.get("expert_tensor", 1) * pp) == 0]
    big = [n for n in nodes_ok if n * GPN * 60 >= size * 4 ** (seq > 8192)]   # ~60 GiB a GPU of state at most
    nodes = rng.choice(big or nodes_ok or [288])
    dp = nodes * GPN // mp
    par["data"] = dp
    # ZeRO / sharding
    if engine == "megatron":
        zero = rng.choice([0, 1, 1, 1, 3] if pp == 1 else [0, 1, 1, 1])
    else:
        zero = rng.choice([0, 1, 2, 3] if pp == 1 else [0, 1])
    par["zero_stage"] = zero
    if engine == "megatron" and zero >= 1 and dp >= 4 and rng.random() < 0.3:
        sd = [s for s in (2, 4, 8, 16) if dp % s == 0 and s < dp]
        if sd:
            par["shard_degree"] = rng.choice(sd)
    # recompute
    rc = rng.choice(["none", "selective", "full"])
    par["recompute"] = rc
    if rc == "selective" and engine == "megatron" and rng.random() < 0.5:
        mods = ["core_attn", "mlp", "layernorm"] + (["moe", "moe_act", "shared_experts"] if moe else [])
        if moe:
            mods.remove("mlp")
        par["recompute_modules"] = sorted(rng.sample(mods, rng.randint(1, min(3, len(mods)))))
    if rc == "full" and engine == "megatron" and rng.random() < 0.5:
        par["recompute_method"] = rng.choice(["uniform", "block"])
        par["recompute_num_layers"] = rng.choice([1, 1, 2, 4])
    mb_max = 32 if size < 3 else 8 if size < 15 else 2
    par["micro_batch_size"] = rng.choice([x for x in (1, 2, 4, 8, 16, 32) if x <= mb_max])
    prec = "bf16"
    if gpu in FP8_GPUS and engine == "megatron" and rng.random() < 0.4:
        prec = "fp8"
    return par, nodes, prec


def _gbs(rng: random.Random, dp: int, mb: int, pp: int) -> int:
    """A batch real runs use that the data-parallel micro-batches divide (and, with a pipeline, that gives a
    multiple of pp micro-batches: the interleaved schedule needs it, and pipelines are run full)."""
    unit = dp * mb * pp
    ok = [g for g in GBS if g % unit == 0]
    return rng.choice(ok) if ok else unit * rng.choice([1, 2, 4])


def _extras(rng: random.Random, data: dict, m: dict, engine: str) -> None:
    """The software fields real specs also set, each now and then: offload, distributed saved activations, the
    pipeline / expert overlaps, MoE capacity, dispatcher and dense / shared layers, kernels, tokens to train."""
    par, training, model = data["parallelism"], data["training"], data["model"]
    r = rng.random
    if engine == "deepspeed" and par["zero_stage"] >= 2 and r() < 0.3:
        par["offload"] = rng.choice(["optimizer", "optimizer+params"] if par["zero_stage"] == 3 else ["optimizer"])
    if engine == "megatron" and par["recompute"] == "full" and par["tensor"] > 1 and r() < 0.4:
        par["sequence_parallel"] = False if not m.get("moe") else par.get("sequence_parallel")
        if not par["sequence_parallel"]:
            par["distribute_saved_activations"] = True
    if engine == "megatron" and par.get("virtual_pipeline", 1) > 1 and r() < 0.3:
        par["overlap_p2p_comm"] = False
    if m.get("moe") and engine == "megatron" and r() < 0.5:
        moe = dict(m["moe"])
        if r() < 0.3:
            moe["capacity_factor"] = rng.choice([1.0, 1.25, 2.0])
        if r() < 0.3:
            moe["token_dispatcher"] = rng.choice(["alltoall", "allgather", "flex_deepep", "flex_hybridep"])
        if r() < 0.2:
            moe["first_dense_layers"] = rng.choice([1, 3])
        if r() < 0.2:
            moe["shared_expert_ffn_hidden_size"] = rng.choice([1024, 2048])
        if r() < 0.2:
            moe["router_force_load_balancing"] = True
        if "preset" in model:
            model["moe"] = moe
        else:
            model["moe"] = {**model["moe"], **moe}
        if r() < 0.3:
            par["overlap_moe_expert_parallel_comm"] = rng.choice([True, False])
    if r() < 0.2:
        training["cross_entropy_impl"] = rng.choice(["vocab_parallel", "vocab_parallel_fused", "torch"])
    if r() < 0.1:
        training["attention_impl"] = rng.choice(["flash_attn_2", "flash_attn_triton"])
    if r() < 0.2:
        training["total_tokens"] = rng.choice([1e12, 15e12])
    if r() < 0.1:
        model["hidden_dropout"] = 0.1
        model["attention_dropout"] = 0.1


def make_case(rng: random.Random, name: str, gpu: str, engine: str, extras: bool = False) -> Case:
    m = model_fields(name)
    par, nodes, prec = _layout(rng, m, engine, gpu)
    model = {"preset": name} if name in MODELS else m
    training = {"global_batch_size": _gbs(rng, par["data"], par["micro_batch_size"],
                                                   par["pipeline"]), "precision": prec,
                "engine": engine}
    if prec == "fp8":
        training["fp8_recipe"] = rng.choice(["delayed", "tensorwise"])
    data = {"name": "sweep", "model": model, "cluster": {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": GPN},
            "training": training, "parallelism": par}
    if extras:
        _extras(rng, data, m, engine)
    label = f"{name}/{gpu}/{engine}/n{nodes}/" + tag(par) + f"/{prec}/gbs{training['global_batch_size']}"
    return Case(label, data)


def tag(p: dict) -> str:
    parts = [f"tp{p['tensor']}", f"pp{p['pipeline']}"]
    for key, short in (("virtual_pipeline", "vpp"), ("context", "cp"), ("expert", "ep"), ("expert_tensor", "etp"),
                       ("first_stage_layers", "first"), ("last_stage_layers", "last"),
                       ("shard_degree", "shard")):
        if key in p:
            parts.append(f"{short}{p[key]}")
    if p.get("account_for_embedding_loss"):
        parts.append("acct")
    parts += [f"dp{p['data']}", f"z{p['zero_stage']}", f"mb{p['micro_batch_size']}"]
    if p.get("sequence_parallel"):
        parts.append("sp")
    rc = p["recompute"]
    if rc != "none":
        detail = "+".join(p.get("recompute_modules", [])) or "/".join(
            str(p[k]) for k in ("recompute_method", "recompute_num_layers") if k in p)
        parts.append(f"rc-{rc}" + (f"({detail})" if detail else ""))
    return " ".join(parts)


def cases(n: int, seed: int = 0, extras: bool = False, gpus=GPUS_) -> list[Case]:
    """n deterministic cases, cycling over models x GPUs x engines; ``extras``: also the software fields."""
    rng = random.Random(seed)
    combos = [(m, g, e) for m in model_names() for g in gpus for e in ("megatron", "deepspeed")]
    out = []
    for i in range(n):
        m, g, e = combos[i % len(combos)]
        out.append(make_case(rng, m, g, e, extras))
    return out


# Layouts of the kinds the issue lists (NeMo / Megatron-Core DGX H100 recipes, PyTorch FSDP / HSDP, GPT-3
# small data-parallel, FSDP + EP MoE, FSDP 1.1B on A100-40GB), written as a checker would: (label, model,
# gpu, nodes, training extras, parallelism). FSDP is zero_stage 3 (engine megatron: Megatron FSDP; deepspeed:
# ZeRO-3), HSDP adds shard_degree.
RECIPES = [
    ("nemo-gpt3-175b-fp8", "gpt3-175b", "h100-sxm", 16, {"precision": "fp8", "global_batch_size": 2048},
     {"tensor": 4, "pipeline": 8, "virtual_pipeline": 6, "micro_batch_size": 1, "zero_stage": 1,
      "sequence_parallel": True}),
    ("nemo-llama3-70b-fp8-cp2", "llama3-70b", "h100-sxm", 8, {"precision": "fp8", "global_batch_size": 128,
     "fp8_recipe": "tensorwise"}, {"tensor": 4, "pipeline": 4, "context": 2, "virtual_pipeline": 5,
     "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True}),
    ("nemo-llama3-405b-512", "llama3-405b", "h100-sxm", 64, {"precision": "bf16", "global_batch_size": 256},
     {"tensor": 8, "pipeline": 8, "context": 2, "virtual_pipeline": 8, "micro_batch_size": 1, "zero_stage": 1,
      "sequence_parallel": True, "account_for_embedding_loss": True}),
    ("nemo-llama3-405b-2304", "llama3-405b", "h100-sxm", 288, {"precision": "fp8", "global_batch_size": 2304,
     "fp8_recipe": "tensorwise"}, {"tensor": 8, "pipeline": 8, "context": 2, "virtual_pipeline": 8,
     "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True, "account_for_embedding_loss": True}),
    ("mcore-llama3-405b-uneven", "llama3-405b", "h100-sxm", 64, {"precision": "bf16", "global_batch_size": 512},
     {"tensor": 8, "pipeline": 16, "virtual_pipeline": 2, "micro_batch_size": 1, "zero_stage": 1,
      "sequence_parallel": True, "first_stage_layers": 6, "last_stage_layers": 8, "recompute": "full",
      "recompute_method": "block", "recompute_num_layers": 4}),
    ("nemo-llama3-8b-8gpu", "llama3-8b", "h100-sxm", 1, {"precision": "fp8", "global_batch_size": 128},
     {"tensor": 1, "pipeline": 1, "context": 2, "micro_batch_size": 1, "zero_stage": 1}),
    ("nemo-mixtral-8x7b-64", "mixtral-8x7b", "h100-sxm", 8, {"precision": "bf16", "global_batch_size": 256},
     {"tensor": 1, "pipeline": 4, "virtual_pipeline": 8, "expert": 8, "micro_batch_size": 1, "zero_stage": 1}),
    ("nemo-mixtral-8x22b-256", "mixtral-8x22b", "h100-sxm", 32, {"precision": "bf16", "global_batch_size": 256},
     {"tensor": 2, "pipeline": 8, "virtual_pipeline": 7, "expert": 8, "expert_tensor": 1, "micro_batch_size": 1,
      "zero_stage": 1, "sequence_parallel": True}),
    ("nemo-qwen3-235b-ep32", "qwen3-235b-a22b", "h100-sxm", 32, {"precision": "fp8", "global_batch_size": 2048,
     "fp8_recipe": "tensorwise"}, {"tensor": 2, "pipeline": 8, "virtual_pipeline": 4, "expert": 32,
     "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True, "account_for_embedding_loss": True}),
    ("nemo-qwen3-30b-ep8", "qwen3-30b-a3b", "h100-sxm", 2, {"precision": "bf16", "global_batch_size": 512},
     {"tensor": 1, "pipeline": 2, "expert": 8, "micro_batch_size": 1, "zero_stage": 1,
      "recompute": "selective", "recompute_modules": ["moe_act"]}),
    ("mcore-gpt3-1t-3072", "gpt3-1t", "a100-80gb", 384, {"precision": "bf16", "global_batch_size": 3072},
     {"tensor": 8, "pipeline": 64 // 2, "virtual_pipeline": 2, "micro_batch_size": 1, "zero_stage": 1,
      "sequence_parallel": True, "recompute": "selective"}),
    ("fsdp-llama2-7b-a100", "llama2-7b", "a100-80gb", 4, {"precision": "bf16", "global_batch_size": 256},
     {"tensor": 1, "pipeline": 1, "micro_batch_size": 2, "zero_stage": 3, "recompute": "full"}),
    ("hsdp-llama2-13b-h100", "llama2-13b", "h100-sxm", 8, {"precision": "bf16", "global_batch_size": 512},
     {"tensor": 1, "pipeline": 1, "micro_batch_size": 2, "zero_stage": 3, "shard_degree": 8,
      "recompute": "selective"}),
    ("hsdp-llama2-70b-h100", "llama2-70b", "h100-sxm", 16, {"precision": "bf16", "global_batch_size": 1024},
     {"tensor": 1, "pipeline": 1, "micro_batch_size": 1, "zero_stage": 3, "shard_degree": 32, "recompute": "full"}),
    ("fsdp-llama2-70b-a100-ds", "llama2-70b", "a100-80gb", 16, {"precision": "bf16", "global_batch_size": 512,
     "engine": "deepspeed"}, {"tensor": 1, "pipeline": 1, "micro_batch_size": 1, "zero_stage": 3,
     "recompute": "full"}),
    ("ddp-gpt3-125m-8a100", "gpt3-125m", "a100-80gb", 1, {"precision": "bf16", "global_batch_size": 256},
     {"tensor": 1, "pipeline": 1, "micro_batch_size": 32, "zero_stage": 0}),
    ("ddp-gpt3-2.7b-8a100", "gpt3-2.7b", "a100-80gb", 1, {"precision": "bf16", "global_batch_size": 512},
     {"tensor": 1, "pipeline": 1, "micro_batch_size": 4, "zero_stage": 1, "recompute": "selective"}),
    ("ddp-gpt3-1.3b-8a100-ds", "gpt3-1.3b", "a100-40gb", 1, {"precision": "bf16", "global_batch_size": 512,
     "engine": "deepspeed"}, {"tensor": 1, "pipeline": 1, "micro_batch_size": 8, "zero_stage": 2}),
    ("fsdp-ep-olmoe-8h100", "olmoe-1b-7b", "h100-sxm", 1, {"precision": "bf16", "global_batch_size": 512},
     {"tensor": 1, "pipeline": 1, "expert": 8, "micro_batch_size": 4, "zero_stage": 3}),
    ("fsdp-ep-mixtral-8h100", "mixtral-8x7b", "h100-sxm", 1, {"precision": "bf16", "global_batch_size": 64},
     {"tensor": 1, "pipeline": 1, "expert": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}),
    ("fsdp-tinyllama-16a100-40", "tinyllama-1.1b", "a100-40gb", 2, {"precision": "bf16",
     "global_batch_size": 1024}, {"tensor": 1, "pipeline": 1, "micro_batch_size": 8, "zero_stage": 3}),
    ("fsdp-tinyllama-16a100-40-ds", "tinyllama-1.1b", "a100-40gb", 2, {"precision": "bf16",
     "global_batch_size": 1024, "engine": "deepspeed"}, {"tensor": 1, "pipeline": 1, "micro_batch_size": 8,
     "zero_stage": 3}),
]


def recipe_cases() -> list[Case]:
    out = []
    for label, name, gpu, nodes, training, par in RECIPES:
        model = {"preset": name} if name in MODELS else model_fields(name)
        data = {"name": label, "model": model, "cluster": {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": GPN},
                "training": {"engine": "megatron", **training}, "parallelism": dict(par)}
        out.append(Case(f"recipe:{label}", data))
    return out


# --- running -----------------------------------------------------------------------------------------

@dataclass
class Result:
    case: Case
    kind: str                      # planned | refused | refused-mem | EXCEPTION
    message: str = ""
    plan: object = None
    extra: dict = field(default_factory=dict)


MEM_WORDS = ("does not fit", "fits in the", "out of memory")


def run_case(case: Case) -> Result:
    try:
        spec = parse_spec(case.data)
        plan = build_plan(spec, top_k=1)
    except SpecError as e:
        p = e.problems[0]
        msg = f"{p.path}: {p.message}" + (f" ({p.hint})" if getattr(p, "hint", None) else "")
        kind = "refused-mem" if any(w in p.message for w in MEM_WORDS) else "refused"
        return Result(case, kind, msg)
    except Exception:  # noqa: BLE001  (the sweep's whole point: every other exception is a bug to report)
        return Result(case, "EXCEPTION", traceback.format_exc())
    return Result(case, "planned", plan=plan)


def check_rundir(res: Result, deep: bool) -> str | None:
    """Write the plan as a run dir (what `orch generate` does) and validate it; None when clean, else
    "generate-refused: ..." (a SpecError of orch generate's own rules: the fields docs/spec.md says orch plan
    predicts but orch generate refuses), "validate: ..." (problems in the run dir orch wrote: a bug) or
    "EXCEPTION ..." (a bug)."""
    from orchestrator.rundir import write_run_dir
    from orchestrator.validate import validate_path

    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            write_run_dir(res.plan, out)
            problems = validate_path(out, deep=deep)
            if problems:
                return "validate: " + "; ".join(str(p) for p in problems)[:600]
    except SpecError as e:
        return "generate-refused: " + "; ".join(f"{p.path}: {p.message}" for p in e.problems)[:600]
    except Exception:  # noqa: BLE001
        return "EXCEPTION " + traceback.format_exc()
    return None


def shape(msg: str) -> str:
    """A refusal's text with its numbers stripped: refusals of one kind group together."""
    return re.sub(r"\d+(\.\d+)?", "N", msg.split(" (")[0])[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rundirs", type=int, default=40, help="planned specs also generated + validated")
    ap.add_argument("--deep", action="store_true", help="run dirs also checked by DeepSpeed / Megatron-Core")
    ap.add_argument("--only", default="")
    ap.add_argument("--extras", action="store_true", help="also set the software fields (offload, overlaps, MoE "
                    "capacity / dispatcher, kernels, dropout, ...)")
    ap.add_argument("--all-gpus", action="store_true", help="every GPU of the catalog but cpu")
    ap.add_argument("--show-refusals", action="store_true", help="one example per refusal kind")
    ap.add_argument("--show-mem", action="store_true", help="every memory refusal")
    args = ap.parse_args(argv)
    t0 = time.time()
    results = [run_case(c) for c in recipe_cases() + cases(args.n, args.seed, args.extras, ALL_GPUS if args.all_gpus else GPUS_) if args.only in c.label]
    t_plan = time.time() - t0
    counts = collections.Counter(r.kind for r in results)
    planned = [r for r in results if r.kind == "planned"]
    step = max(1, len(planned) // max(1, args.rundirs))
    rd_fail = []
    for r in planned[::step][:args.rundirs]:
        problem = check_rundir(r, args.deep)
        if problem:
            rd_fail.append((r, problem))
    for r in results:
        if r.case.label.startswith("recipe:"):
            print(f"{r.kind:<12} {r.case.label}" + (f"\n  {r.message[:700]}" if r.message else ""))
    for r in results:
        if r.kind == "EXCEPTION":
            print(f"EXCEPTION {r.case.label}\n{r.message}")
    for r, problem in rd_fail:
        print(f"RUNDIR {r.case.label}\n  {problem}")
    rd_kinds = collections.Counter(p.split(":")[0].split(" ")[0] for _, p in rd_fail)
    refusals = collections.defaultdict(list)
    for r in results:
        if r.kind == "refused":
            refusals[shape(r.message)].append(r)
    if args.show_refusals:
        for _, rs in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
            print(f"REFUSED x{len(rs)}: {rs[0].case.label}\n  {rs[0].message[:500]}")
    if args.show_mem:
        for r in results:
            if r.kind == "refused-mem":
                print(f"MEM {r.case.label}\n  {r.message[:400]}")
    print(f"\n{'outcome':<14}{'count':>7}")
    for kind in ("planned", "refused", "refused-mem", "EXCEPTION"):
        print(f"{kind:<14}{counts.get(kind, 0):>7}")
    print(f"{'rundir checked':<14}{min(args.rundirs, len(planned[::step])):>7}  generate-refused "
          f"{rd_kinds.get('generate-refused', 0)}, validate problems {rd_kinds.get('validate', 0)}, "
          f"exceptions {rd_kinds.get('EXCEPTION', 0)}")
    print(f"\nrefusal kinds ({len(refusals)}):")
    for key, rs in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(rs):>5}  {key}")
    by_engine = collections.Counter((r.case.data["training"]["engine"], r.kind) for r in results)
    print("\nby engine: " + ", ".join(f"{e}/{k}={v}" for (e, k), v in sorted(by_engine.items())))
    print(f"\n{len(results)} specs planned in {t_plan:.1f} s; total {time.time() - t0:.1f} s")
    return 1 if counts.get("EXCEPTION") or rd_kinds.get("EXCEPTION") or rd_kinds.get("validate") else 0


if __name__ == "__main__":
    sys.exit(main())
