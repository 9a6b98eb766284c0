"""Checks for Megatron-LM argument files (megatron_args.txt) and megatron_config.json.

Layer 1 (pure, no torch): the tokens are parsed against Megatron-LM core_v0.16.1's own flag table
(:mod:`.megatron_args`: unknown flags with "did you mean", arity, types, choices, duplicates, deprecated
flags). Then the rules Megatron lets through silently or only fails on at run time: hidden % heads, layers % pp
(or, with --decoder-first/last-pipeline-num-layers, the uneven split's rules of :mod:`orchestrator.stages`,
and the flags Megatron refuses beside them), impossible virtual pipelines, sizes
<= 0, query groups vs tp, --num-query-groups without --group-query-attention, seq % tp with sequence
parallelism, batch arithmetic for a world size, missing --eval-interval / tokenizer inputs, warm-up >=
decay, optimizer flag combinations Megatron-Core asserts on only when the optimizer is built.

Layer 2 (``deep``): when layer 1 passes and megatron-core is installed, a real ``TransformerConfig`` is
built from the arguments in a subprocess (:mod:`.megatron_core`); with ORCH_MEGATRON_LM set, Megatron-LM's
own parse_args + validate_args run too (:mod:`.megatron_lm`).

The file format is described in :mod:`.megatron_args`.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import Problem, SpecError
from ..render.megatron import OBJECT_FIELDS
from ..stages import SplitNames, even_split_issue, split_issues
from ..typed import did_you_mean
from .megatron_args import MegatronArgs, Token, dest_to_flag, parse_tokens, tokens_from_text

# Tokenizer type -> flags its constructor reads (pretrain_gpt.py defaults the type to GPT2BPETokenizer).
TOKENIZER_INPUTS = {"NullTokenizer": ("vocab_size",), "GPT2BPETokenizer": ("vocab_file", "merge_file"),
                    "HuggingFaceTokenizer": ("tokenizer_model",), "SentencePieceTokenizer": ("tokenizer_model",),
                    "GPTSentencePieceTokenizer": ("tokenizer_model",), "Llama2Tokenizer": ("tokenizer_model",),
                    "TikTokenizer": ("tokenizer_model",)}


# --- the rules Megatron lets through -------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    """The parallel and model sizes as Megatron derives them from the arguments."""

    tp: Any
    pp: Any
    cp: Any
    vpp: Any
    layers: Any
    hidden: Any
    heads: Any
    groups: Any
    first: Any = None        # uneven split: layers on the first / last pipeline stage (None: not given)
    last: Any = None
    accounted: int = 0       # embedding and/or loss counted as layers (--account-for-*-in-pipeline-split)
    custom_layout: bool = False   # --pipeline-model-parallel-layout places the layers itself

    @property
    def uneven(self) -> bool:
        return self.first is not None or self.last is not None


ARGS_SPLIT_NAMES = SplitNames("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                              "num_virtual_stages_per_pipeline_rank", "--decoder-first-pipeline-num-layers",
                              "--decoder-last-pipeline-num-layers", "no --num-virtual-stages-per-pipeline-rank",
                              assign=" ")
CONFIG_SPLIT_NAMES = SplitNames("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                                "virtual_pipeline_model_parallel_size", "num_layers_in_first_pipeline_stage",
                                "num_layers_in_last_pipeline_stage", "virtual_pipeline_model_parallel_size null")


def sizes_of(a: MegatronArgs) -> Sizes:
    tp, pp = a.get("tensor_model_parallel_size"), a.get("pipeline_model_parallel_size")
    layers = a.get("num_layers")
    first, last = a.get("decoder_first_pipeline_num_layers"), a.get("decoder_last_pipeline_num_layers")
    accounted = int(bool(a.get("account_for_embedding_in_pipeline_split"))) + \
        int(bool(a.get("account_for_loss_in_pipeline_split")))
    vpp = a.get("num_virtual_stages_per_pipeline_rank")
    per_stage = a.get("num_layers_per_virtual_pipeline_stage")
    if vpp is None and per_stage and first is None and last is None and _ints_positive(layers, pp) \
            and (layers + accounted) % pp == 0:
        per_rank = (layers + accounted) // pp
        vpp = per_rank // per_stage if per_rank % per_stage == 0 else None
    groups = a.get("num_query_groups") if a.get("group_query_attention") else a.get("num_attention_heads")
    return Sizes(tp=tp, pp=pp, cp=a.get("context_parallel_size") or 1, vpp=vpp or 1, layers=layers,
                 hidden=a.get("hidden_size"), heads=a.get("num_attention_heads"), groups=groups, first=first,
                 last=last, accounted=accounted, custom_layout=a.get("pipeline_model_parallel_layout") is not None)


def _ints_positive(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
            "micro_batch_size", "lr")
POSITIVE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage", "num_layers",
            "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
            "max_position_embeddings", "micro_batch_size", "global_batch_size", "train_iters", "save_interval",
            "eval_interval", "log_interval", "recompute_num_layers")


def rule_required(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    problems = [Problem(a.at(d), f"{dest_to_flag(d)} is required for pretrain_gpt.py", f"add {dest_to_flag(d)} N")
                for d in REQUIRED if a.get(d) is None]
    if a.get("train_iters") is None and a.get("train_samples") is None:
        problems.append(Problem(a.at("train_iters"), "neither --train-iters nor --train-samples is set",
                                "add --train-iters N"))
    return problems


def rule_positive(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    return [Problem(a.at(d), f"{dest_to_flag(d)} must be >= 1, got {a.values[d]}", "use a positive integer")
            for d in POSITIVE if a.given(d) and isinstance(a.values[d], int) and a.values[d] <= 0]


def shape_problems(s: Sizes, where: Callable[[str], str], names: SplitNames = ARGS_SPLIT_NAMES) -> list[Problem]:
    """Model/parallel shape rules shared by args files and megatron_config.json (``where`` names a field:
    tp, pp, vpp, groups, first, last)."""
    if not _ints_positive(s.tp, s.pp, s.layers, s.hidden, s.heads):
        return []
    problems = []
    if s.heads % s.tp:
        problems.append(Problem(where("tp"), f"num_attention_heads({s.heads}) % tp({s.tp}) = {s.heads % s.tp}, "
                                "must be 0", "use a tensor-parallel size that divides the head count"))
    if _ints_positive(s.groups):
        problems += _group_problems(s, where)
    return problems + _layer_split_problems(s, where, names)


def _layer_split_problems(s: Sizes, where: Callable[[str], str], names: SplitNames) -> list[Problem]:
    """How the layers split over the pipeline: uneven (first/last given), accounted, or even."""
    if s.custom_layout:
        return []   # the layout string places every layer; Megatron-Core validates it
    vpp = s.vpp if _ints_positive(s.vpp) else 1
    if s.uneven:
        if not all(v is None or isinstance(v, int) for v in (s.first, s.last)):
            return []
        issues = split_issues(s.layers, s.pp, vpp, s.first, s.last, names)
        return [Problem(where(i.field), i.message + " (Megatron-Core's TransformerConfig raises)", i.hint)
                for i in issues]
    if s.accounted:
        return _accounted_problems(s, where, vpp)
    issue = even_split_issue(s.layers, s.pp, names)
    if issue is not None:
        return [Problem(where("pp"), issue.message, issue.hint)]
    return _vpp_problems(s, where) if vpp > 1 else []


def _accounted_problems(s: Sizes, where: Callable[[str], str], vpp: int) -> list[Problem]:
    total = s.layers + s.accounted
    if total % s.pp:
        return [Problem(where("pp"), f"num_layers({s.layers}) + {s.accounted} (embedding/loss counted as layers by "
                        f"--account-for-*-in-pipeline-split) = {total} % pp({s.pp}) = {total % s.pp}, must be 0",
                        "change the pipeline size or the --account-for-* flags")]
    if vpp > 1 and (total // s.pp) % vpp:
        return [Problem(where("vpp"), f"{total} layers (embedding/loss counted) / pp({s.pp}) = {total // s.pp} per "
                        f"stage, not divisible into vpp({vpp}) virtual stages", f"use a virtual pipeline size "
                        f"that divides {total // s.pp}")]
    return []


def _group_problems(s: Sizes, where: Callable[[str], str]) -> list[Problem]:
    problems = []
    if s.heads % s.groups:
        problems.append(Problem(where("groups"), f"num_attention_heads({s.heads}) % num_query_groups({s.groups}) "
                                f"= {s.heads % s.groups}, must be 0", "use a divisor of the head count"))
    if s.groups % s.tp and s.tp % s.groups:
        problems.append(Problem(where("groups"), f"num_query_groups({s.groups}) and tp({s.tp}): neither divides "
                                "the other", "use a tensor-parallel size that divides the KV-head count"))
    return problems


def _vpp_problems(s: Sizes, where: Callable[[str], str]) -> list[Problem]:
    per_rank = s.layers // s.pp
    if s.pp == 1:
        return [Problem(where("vpp"), f"virtual pipeline size {s.vpp} with pp(1): there is no pipeline to interleave",
                        "remove the virtual pipeline flag, or use pipeline size >= 2")]
    if per_rank % s.vpp:
        return [Problem(where("vpp"), f"num_layers({s.layers}) / pp({s.pp}) = {per_rank} layers per stage, "
                        f"not divisible into vpp({s.vpp}) virtual stages (Megatron-Core does not check this)",
                        f"use a virtual pipeline size that divides {per_rank}")]
    return []


def rule_shape(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    names = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
             "groups": "num_query_groups", "vpp": _vpp_dest(a), "first": "decoder_first_pipeline_num_layers",
             "last": "decoder_last_pipeline_num_layers"}
    problems = shape_problems(sizes_of(a), lambda key: a.at(names[key]))
    hidden, heads = a.get("hidden_size"), a.get("num_attention_heads")
    if _ints_positive(hidden, heads) and hidden % heads and a.get("kv_channels") is None:
        problems.append(Problem(a.at("hidden_size"), f"hidden_size({hidden}) % num_attention_heads({heads}) = "
                                f"{hidden % heads}, must be 0 (Megatron-Core's TransformerConfig accepts it)",
                                "pick a hidden size that is a multiple of the head count, or set --kv-channels"))
    return problems


def rule_uneven_split_flags(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    """Flags Megatron-LM refuses beside --decoder-first/last-pipeline-num-layers (validate_args asserts,
    TransformerConfig raises); the arithmetic of the split itself is rule_shape's."""
    uneven = [d for d in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers") if a.given(d)]
    if not uneven:
        return []
    given = dest_to_flag(uneven[0])
    refused = {"num_layers_per_virtual_pipeline_stage": "use --num-virtual-stages-per-pipeline-rank for the "
                                                        "virtual pipeline instead (Megatron-LM asserts)",
               "account_for_embedding_in_pipeline_split": "remove it: the uneven split already makes the first "
                                                          "stage lighter (TransformerConfig raises)",
               "account_for_loss_in_pipeline_split": "remove it: the uneven split already makes the last stage "
                                                     "lighter (TransformerConfig raises)",
               "pipeline_model_parallel_layout": "give either the layout string or the first/last counts "
                                                 "(TransformerConfig raises)"}
    return [Problem(a.at(dest), f"{dest_to_flag(dest)} cannot be combined with {given}", hint)
            for dest, hint in refused.items() if a.get(dest)]


def _vpp_dest(a: MegatronArgs) -> str:
    return ("num_layers_per_virtual_pipeline_stage" if a.given("num_layers_per_virtual_pipeline_stage")
            else "num_virtual_stages_per_pipeline_rank")


def rule_query_groups(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    if a.given("num_query_groups") and not a.get("group_query_attention"):
        return [Problem(a.at("num_query_groups"), "--num-query-groups is ignored without --group-query-attention "
                        "(Megatron-LM then uses one KV head per attention head)", "add --group-query-attention")]
    return []


def rule_sequence(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    problems, tp, seq = [], a.get("tensor_model_parallel_size"), a.get("seq_length")
    if a.get("sequence_parallel") and tp == 1:
        problems.append(Problem(a.at("sequence_parallel"), "--sequence-parallel with tp(1): Megatron-LM silently "
                                "turns it off", "remove --sequence-parallel or use tensor parallelism"))
    elif a.get("sequence_parallel") and _ints_positive(tp, seq) and seq % tp:
        problems.append(Problem(a.at("seq_length"), f"seq_length({seq}) % tp({tp}) = {seq % tp}, must be 0 with "
                                "--sequence-parallel", "use a sequence length divisible by tp"))
    positions = a.get("max_position_embeddings")
    if _ints_positive(seq, positions) and seq > positions:
        problems.append(Problem(a.at("max_position_embeddings"), f"max_position_embeddings({positions}) < "
                                f"seq_length({seq})", "set --max-position-embeddings >= --seq-length"))
    return problems


def rule_batch(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    s, mb, gb = sizes_of(a), a.get("micro_batch_size"), a.get("global_batch_size")
    if world_size is None or not _ints_positive(s.tp, s.pp, s.cp, mb):
        return []
    model = s.tp * s.pp * s.cp
    if world_size % model:
        return [Problem(a.at("pipeline_model_parallel_size"), f"world_size({world_size}) % (tp({s.tp}) * pp({s.pp})"
                        f" * cp({s.cp}) = {model}) = {world_size % model}, must be 0",
                        "make tp * pp * cp a divisor of the GPU count")]
    dp = world_size // model
    if not _ints_positive(gb):
        return []
    if gb % (mb * dp):
        return [Problem(a.at("global_batch_size"), f"global_batch_size({gb}) % (micro_batch_size({mb}) * dp({dp}) = "
                        f"{mb * dp}) = {gb % (mb * dp)}, must be 0 (dp = world_size({world_size}) / {model})",
                        f"use a multiple of {mb * dp}")]
    return _interleave_problems(a, s, gb // (mb * dp))


def _interleave_problems(a: MegatronArgs, s: Sizes, microbatches: int) -> list[Problem]:
    if not (_ints_positive(s.vpp) and s.vpp > 1):
        return []
    group = a.get("microbatch_group_size_per_vp_stage") or s.pp
    rest = microbatches % group
    if group > microbatches or group < s.pp or 0 < rest < s.pp:
        return [Problem(a.at(_vpp_dest(a)), f"the interleaved schedule needs num_microbatches({microbatches}) >= "
                        f"group({group}) >= pp({s.pp}) and num_microbatches % group = {rest} to be 0 or >= pp "
                        "(Megatron-Core fails at the first step otherwise)",
                        f"make the number of micro-batches a multiple of {s.pp}")]
    return []


def rule_schedule(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    problems = []
    lr, min_lr = a.get("lr"), a.get("min_lr")
    if isinstance(lr, float) and isinstance(min_lr, float) and min_lr > lr:
        problems.append(Problem(a.at("min_lr"), f"min_lr({min_lr}) > lr({lr})", "use --min-lr <= --lr"))
    iters = a.get("train_iters")
    decay = a.get("lr_decay_iters") or iters
    warmup = a.get("lr_warmup_iters")
    if _ints_positive(decay) and isinstance(warmup, int) and warmup >= decay:
        problems.append(Problem(a.at("lr_warmup_iters"), f"lr_warmup_iters({warmup}) >= lr_decay_iters({decay}): "
                                "Megatron-Core's scheduler asserts warm-up < decay when training starts",
                                "shorten the warm-up or lengthen --lr-decay-iters / --train-iters"))
    if iters and not a.get("skip_train") and not a.get("full_validation") and a.get("eval_interval") is None:
        problems.append(Problem(a.at("eval_interval"), "--eval-interval is not set: pretrain_gpt.py divides "
                                "train_iters by it and crashes (TypeError) before the first step",
                                "add --eval-interval N (e.g. the checkpoint interval)"))
    if a.get("save") is not None and a.get("save_interval") is None:
        problems.append(Problem(a.at("save_interval"), "--save without --save-interval", "add --save-interval N"))
    return problems


def rule_data(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    sources = [d for d in ("mock_data", "data_path", "train_data_path", "data_args_path") if a.get(d)]
    if len(sources) != 1:
        named = ", ".join(dest_to_flag(d) for d in sources) or "none"
        return [Problem(a.at("data_path"), f"pretrain_gpt.py needs exactly one data source, got {named}",
                        "give --mock-data or --data-path PREFIX")]
    kind = a.get("tokenizer_type") or "GPT2BPETokenizer"
    missing = [d for d in TOKENIZER_INPUTS.get(kind, ()) if a.get(d) is None]
    if missing:
        flags = " and ".join(dest_to_flag(d) for d in missing)
        implicit = "" if a.given("tokenizer_type") else " (pretrain_gpt.py's default tokenizer)"
        return [Problem(a.at("tokenizer_type"), f"tokenizer {kind}{implicit} needs {flags}",
                        f"add {flags}, or --tokenizer-type NullTokenizer --vocab-size N for pre-tokenized data")]
    return []


def rule_precision_and_recompute(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    problems = []
    if a.get("fp16") and a.get("bf16"):
        problems.append(Problem(a.at("bf16"), "--fp16 and --bf16 are exclusive", "keep one of them"))
    granularity, method = a.get("recompute_granularity"), a.get("recompute_method")
    if granularity == "full" and (method is None or a.get("recompute_num_layers") is None):
        problems.append(Problem(a.at("recompute_granularity"), "--recompute-granularity full needs "
                                "--recompute-method and --recompute-num-layers (TransformerConfig raises)",
                                "add --recompute-method uniform --recompute-num-layers 1"))
    if granularity == "selective" and method is not None:
        problems.append(Problem(a.at("recompute_method"), "--recompute-method applies to full recompute only",
                                "remove --recompute-method, or use --recompute-granularity full"))
    if granularity == "selective" and a.get("recompute_num_layers") is not None:
        problems.append(Problem(a.at("recompute_num_layers"), "--recompute-num-layers must be unset with "
                                "--recompute-granularity selective (TransformerConfig raises)",
                                "remove --recompute-num-layers, or use --recompute-granularity full"))
    return problems + _recompute_module_problems(a, granularity)


# Megatron-Core core_v0.16.1 TransformerConfig's recompute_modules choices.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


def _recompute_module_problems(a: MegatronArgs, granularity: Any) -> list[Problem]:
    modules = a.get("recompute_modules")
    if not isinstance(modules, list):
        return []
    where = a.at("recompute_modules")
    if granularity != "selective":
        return [Problem(where, "--recompute-modules takes effect with --recompute-granularity selective only "
                        f"(got {granularity or 'no recompute'})", "add --recompute-granularity selective, or "
                        "remove --recompute-modules")]
    problems = [Problem(where, f"unknown recompute module {m!r} (TransformerConfig asserts)",
                        did_you_mean(str(m), list(RECOMPUTE_MODULES)))
                for m in modules if m not in RECOMPUTE_MODULES]
    needs = {"moe_act": ("moe_grouped_gemm", "--moe-grouped-gemm"),
             "mla_up_proj": ("multi_latent_attention", "--multi-latent-attention")}
    for module, (dest, flag) in needs.items():
        if module in modules and not a.get(dest):
            problems.append(Problem(where, f"recompute module {module} needs {flag} (TransformerConfig raises)",
                                    f"add {flag}, or remove {module}"))
    if a.get("fp8_format") and (a.get("fp8_recipe") or "delayed") == "delayed" and \
            {"moe_act", "layernorm"} & set(modules):
        problems.append(Problem(where, "recompute modules moe_act and layernorm are refused with FP8 delayed "
                                "scaling (TransformerConfig raises)", "use another --fp8-recipe, or remove them"))
    return problems


def rule_optimizer(a: MegatronArgs, world_size: int | None) -> list[Problem]:
    problems, sharded = [], a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp")
    if a.get("overlap_param_gather") and not (sharded and a.get("overlap_grad_reduce")):
        problems.append(Problem(a.at("overlap_param_gather"), "--overlap-param-gather needs "
                                "--use-distributed-optimizer (or --use-megatron-fsdp) and --overlap-grad-reduce",
                                "add them, or remove --overlap-param-gather"))
    if a.get("use_precision_aware_optimizer") and not a.get("use_distributed_optimizer"):
        problems.append(Problem(a.at("use_precision_aware_optimizer"), "--use-precision-aware-optimizer needs "
                                "--use-distributed-optimizer (Megatron-Core asserts when building the optimizer)",
                                "add --use-distributed-optimizer"))
    if a.get("optimizer_cpu_offload") and (not a.get("use_precision_aware_optimizer") or a.get("optimizer") != "adam"):
        problems.append(Problem(a.at("optimizer_cpu_offload"), "--optimizer-cpu-offload needs "
                                "--use-precision-aware-optimizer and --optimizer adam",
                                "add --use-precision-aware-optimizer, with --optimizer adam"))
    if a.get("use_megatron_fsdp") and a.get("ckpt_format") != "fsdp_dtensor":
        problems.append(Problem(a.at("ckpt_format"), "Megatron FSDP saves only --ckpt-format fsdp_dtensor",
                                "add --ckpt-format fsdp_dtensor"))
    return problems + _grad_reduce_problems(a)


def _grad_reduce_problems(a: MegatronArgs) -> list[Problem]:
    """The gradient reduction dtype flags Megatron-LM core_v0.16.1 ignores without a word (arguments.py: only
    --bf16 reads --grad-reduce-in-bf16, which then turns --accumulate-allreduce-grads-in-fp32 off)."""
    if not a.get("grad_reduce_in_bf16"):
        return []
    where = a.at("grad_reduce_in_bf16")
    if not a.get("bf16"):
        return [Problem(where, "--grad-reduce-in-bf16 is ignored without --bf16 (Megatron-LM reads it only for bf16 "
                        "training)", "remove it (orch: training.grad_reduce_dtype bf16 needs precision bf16 or fp8)")]
    if a.get("accumulate_allreduce_grads_in_fp32"):
        return [Problem(where, "--grad-reduce-in-bf16 turns --accumulate-allreduce-grads-in-fp32 off: gradients are "
                        "reduced in bf16", "keep one of the two flags (orch: training.grad_reduce_dtype)")]
    return []


RULES = [rule_required, rule_positive, rule_shape, rule_uneven_split_flags,
         rule_query_groups, rule_sequence, rule_batch, rule_schedule,
         rule_data, rule_precision_and_recompute, rule_optimizer]


# --- entry points ---------------------------------------------------------------------------------

def check_megatron_tokens(tokens: list[Token], world_size: int | None = None,
                          path: str = "megatron_args") -> tuple[MegatronArgs, list[Problem]]:
    """Layer 1 on located tokens: the parsed arguments and every problem."""
    args, problems = parse_tokens(tokens, path)
    for rule in RULES:
        problems += rule(args, world_size)
    return args, problems


def check_megatron_args(tokens: list[str], world_size: int | None = None, path: str = "megatron_args", *,
                        deep: bool = True) -> list[Problem]:
    """Every problem in a token list (token i sits on line i + 1, as in megatron_args.txt)."""
    located = [Token(t, i + 1) for i, t in enumerate(tokens)]
    return _check_located(located, world_size, path, deep)


def _check_located(tokens: list[Token], world_size: int | None, path: str, deep: bool,
                   env: dict[str, str] | None = None) -> list[Problem]:
    args, problems = check_megatron_tokens(tokens, world_size, path)
    if problems or not deep:
        return problems
    from .megatron_core import check_transformer_config, megatron_core_available  # noqa: PLC0415

    if megatron_core_available():
        problems += check_transformer_config(config_from_args(args), path=path)
    if not problems:
        launch_env = expected_launch_env(args) if env is None else env
        problems += _megatron_lm_problems([t.text for t in tokens], args, world_size, path, launch_env)
    return problems


def _megatron_lm_problems(tokens: list[str], args: MegatronArgs, world_size: int | None, path: str,
                          env: dict[str, str]) -> list[Problem]:
    """Megatron-LM's own checks when ORCH_MEGATRON_LM is set (dp = 1 when no world size is given)."""
    from .megatron_lm import check_with_megatron_lm, megatron_lm_root  # noqa: PLC0415

    root = megatron_lm_root()
    if root is None:
        return []
    s = sizes_of(args)
    world = world_size or s.tp * s.pp * s.cp
    return check_with_megatron_lm(tokens, world_size=world, env=env, megatron_lm_root=root, path=path)


def expected_launch_env(args: MegatronArgs) -> dict[str, str]:
    """What orch's launch scripts export for these arguments (see render.megatron.megatron_env)."""
    fsdp = args.get("use_megatron_fsdp") or args.get("use_torch_fsdp2")
    model_parallel = max(args.get("tensor_model_parallel_size") or 1, args.get("context_parallel_size") or 1)
    if model_parallel > 1 and not fsdp:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "8" if args.get("overlap_moe_expert_parallel_comm") else "1"}
    return {}


def read_args_file(path: str | Path) -> tuple[list[Token], list[Problem]]:
    path = Path(path)
    from ..userfiles import read_user_text  # noqa: PLC0415

    try:
        return tokens_from_text(read_user_text(path)), []
    except SpecError as e:
        return [], e.problems


def validate_megatron_args_file(path: str | Path, *, world_size: int | None = None,
                                deep: bool = True) -> list[Problem]:
    """Every problem in a Megatron-LM arguments file (orch's megatron_args.txt or a user-written one)."""
    tokens, problems = read_args_file(path)
    if problems:
        return problems
    if not tokens:
        return [Problem(str(path), "no arguments in the file", "one token per line, as orch generate writes")]
    return _check_located(tokens, world_size, str(path), deep)


def config_from_args(args: MegatronArgs) -> dict:
    """TransformerConfig kwargs for the arguments, translated as Megatron-LM does (JSON, dotted objects)."""
    from .megatron_core import transformer_config_fields  # noqa: PLC0415

    fields = transformer_config_fields() or frozenset()
    config = {d: v for d, v in args.values.items() if d in fields}
    s = sizes_of(args)
    config["num_query_groups"] = s.groups if args.get("group_query_attention") else None
    if args.get("swiglu"):
        config.update(gated_linear_unit=True, activation_func="torch.nn.functional.silu")
    dtype = "torch.bfloat16" if args.get("bf16") else "torch.float16" if args.get("fp16") else "torch.float32"
    config.update(params_dtype=dtype, pipeline_dtype=dtype)
    if s.vpp > 1:
        config["virtual_pipeline_model_parallel_size"] = s.vpp
    if args.get("recompute_activations"):
        config["recompute_granularity"] = "selective"
    if "attention_backend" in config:
        config["attention_backend"] = "megatron.core.transformer.enums.AttnBackend." + config["attention_backend"]
    if isinstance(config.get("cp_comm_type"), list) and len(config["cp_comm_type"]) == 1:
        config["cp_comm_type"] = config["cp_comm_type"][0]   # as core_transformer_config_from_args does
    if isinstance(config.get("moe_layer_freq"), str):
        del config["moe_layer_freq"]   # a list expression: moe_config_from_args reads orch's form
    return config | moe_config_from_args(args)


def moe_config_from_args(args: MegatronArgs) -> dict:
    """The MoE fields whose TransformerConfig names differ from Megatron-LM's (core_transformer_config_from_args)."""
    if not args.get("num_experts"):
        return {}
    config = {"num_moe_experts": args.get("num_experts")}
    freq = args.get("moe_layer_freq")
    match = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", freq) if isinstance(freq, str) else None
    if match:   # the form orch writes: k dense layers, then MoE layers (others: Megatron-LM's check reads them)
        config["moe_layer_freq"] = [0] * int(match[1]) + [1] * int(match[2])
    return config


def check_megatron_config(config: Any, *, path: str = "megatron_config.json", deep: bool = True) -> list[Problem]:
    """Every problem in megatron_config.json content (TransformerConfig kwargs)."""
    if not isinstance(config, dict):
        return [Problem(path, "must be a JSON object of TransformerConfig keyword arguments",
                        "regenerate it with orch generate")]
    problems = _config_keys(config, path) + _config_values(config, path)
    if problems or not deep:
        return problems
    from .megatron_core import check_transformer_config, megatron_core_available  # noqa: PLC0415

    return check_transformer_config(config, path=path) if megatron_core_available() else []


def _config_keys(config: dict, path: str) -> list[Problem]:
    from .megatron_core import transformer_config_fields  # noqa: PLC0415

    fields = transformer_config_fields()
    if fields is None:
        return []
    return [Problem(f"{path}:{key}", f"{key!r} is not a TransformerConfig field (megatron-core would raise "
                    "TypeError)", _close(key, sorted(fields))) for key in config if key not in fields]


def _close(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "remove it"


_CONFIG_SIZES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
                 "vpp": "virtual_pipeline_model_parallel_size", "groups": "num_query_groups",
                 "first": "num_layers_in_first_pipeline_stage", "last": "num_layers_in_last_pipeline_stage"}
_CONFIG_POSITIVE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
                    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                    "num_attention_heads", "num_query_groups", "ffn_hidden_size", "kv_channels",
                    "virtual_pipeline_model_parallel_size", "context_parallel_size")


def _config_values(config: dict, path: str) -> list[Problem]:
    problems = []
    for key in _CONFIG_POSITIVE:
        value = config.get(key)
        if value is not None and not _ints_positive(value):
            problems.append(Problem(f"{path}:{key}", f"{key} must be an integer >= 1, got {value!r}",
                                    "use a positive integer"))
    for key in OBJECT_FIELDS:
        if key in config and not (isinstance(config[key], str) and "." in config[key]):
            problems.append(Problem(f"{path}:{key}", f"{key} must be the dotted name of a Python object, got "
                                    f"{config[key]!r}", 'e.g. "torch.bfloat16" (resolved when the config is built)'))
    if problems:
        return problems
    heads = config.get("num_attention_heads")
    s = Sizes(tp=config.get("tensor_model_parallel_size", 1), pp=config.get("pipeline_model_parallel_size", 1),
              cp=config.get("context_parallel_size", 1), vpp=config.get("virtual_pipeline_model_parallel_size") or 1,
              layers=config.get("num_layers"), hidden=config.get("hidden_size"), heads=heads,
              groups=config.get("num_query_groups") or heads, first=config.get("num_layers_in_first_pipeline_stage"),
              last=config.get("num_layers_in_last_pipeline_stage"),
              accounted=int(bool(config.get("account_for_embedding_in_pipeline_split")))
              + int(bool(config.get("account_for_loss_in_pipeline_split"))),
              custom_layout=config.get("pipeline_model_parallel_layout") is not None)
    problems = shape_problems(s, lambda key: f"{path}:{_CONFIG_SIZES[key]}", CONFIG_SPLIT_NAMES)
    hidden = config.get("hidden_size")
    if _ints_positive(hidden, heads) and hidden % heads and config.get("kv_channels") is None:
        problems.append(Problem(f"{path}:hidden_size", f"hidden_size({hidden}) % num_attention_heads({heads}) = "
                                f"{hidden % heads}, must be 0 (TransformerConfig accepts it)",
                                "use a multiple of the head count, or set kv_channels"))
    if config.get("sequence_parallel") and s.tp == 1:
        problems.append(Problem(f"{path}:sequence_parallel", "sequence_parallel needs tensor_model_parallel_size > 1",
                                "set sequence_parallel false"))
    return problems


def validate_megatron_config_file(path: str | Path, *, deep: bool = True) -> list[Problem]:
    path = Path(path)
    from ..userfiles import parse_json, read_user_text  # noqa: PLC0415

    try:     # the bounded reader: regular files only, size and nesting capped
        config = parse_json(read_user_text(path), str(path), duplicates=[])
    except SpecError as e:
        return e.problems
    return check_megatron_config(config, path=str(path), deep=deep)


# --- a run dir's Megatron files -------------------------------------------------------------------

# megatron_config.json key -> the parsed-args dest that must hold the same value.
AGREEING = {"tensor_model_parallel_size": "tensor_model_parallel_size",
            "pipeline_model_parallel_size": "pipeline_model_parallel_size", "num_layers": "num_layers",
            "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
            "ffn_hidden_size": "ffn_hidden_size", "normalization": "normalization",
            "add_bias_linear": "add_bias_linear", "sequence_parallel": "sequence_parallel",
            "bf16": "bf16", "fp16": "fp16"}


def validate_megatron_run_dir(run_dir: str | Path, *, world_size: int, deep: bool = True) -> list[Problem]:
    """megatron_args.txt and megatron_config.json of a run dir: each checked, and checked against each other.

    Megatron-LM's own check (ORCH_MEGATRON_LM) runs with the environment launch_local.sh exports.
    """
    from .megatron_lm import launch_script_env  # noqa: PLC0415

    root = Path(run_dir)
    args_path, config_path, script = root / "megatron_args.txt", root / "megatron_config.json", root / "launch_local.sh"
    env = launch_script_env(script.read_text()) if script.is_file() else None
    tokens, problems = read_args_file(args_path)
    if not problems:
        problems += _check_located(tokens, world_size, str(args_path), deep, env)
    problems += validate_megatron_config_file(config_path, deep=deep)
    if not problems:
        problems += _disagreements(parse_tokens(tokens, str(args_path))[0], json.loads(config_path.read_text()),
                                   str(config_path))
    return problems


# megatron_config.json key -> args dest, compared even when the key is absent from the config (None).
AGREEING_OPTIONAL = {"num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
                     "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers"}


def _disagreements(args: MegatronArgs, config: dict, path: str) -> list[Problem]:
    optional = [Problem(f"{path}:{key}", f"{key} is {config.get(key)!r} but megatron_args.txt gives "
                        f"{args.get(dest)!r}", "regenerate the run dir with orch generate (the two files come "
                        "from one plan)")
                for key, dest in AGREEING_OPTIONAL.items() if config.get(key) != args.get(dest)]
    return optional + _agreeing(args, config, path)


def _agreeing(args: MegatronArgs, config: dict, path: str) -> list[Problem]:
    expected = {**{key: args.get(dest) for key, dest in AGREEING.items()},
                "num_query_groups": sizes_of(args).groups, "gated_linear_unit": bool(args.get("swiglu")),
                "virtual_pipeline_model_parallel_size": sizes_of(args).vpp if sizes_of(args).vpp > 1 else None}
    return [Problem(f"{path}:{key}", f"{key} is {config.get(key)!r} but megatron_args.txt gives {value!r}",
                    "regenerate the run dir with orch generate (the two files come from one plan)")
            for key, value in expected.items() if key in config and config[key] != value]
