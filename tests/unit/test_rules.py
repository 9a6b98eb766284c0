"""Cross-field rules: each one fires on its own, shows its operands, and says how to fix it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.errors import SpecError
from orchestrator.layout import Layout, padded_vocab_size, require_complete
from orchestrator.rules import check_layout
from orchestrator.spec_loader import parse_spec
from tests.conftest import spec_data

BIG = {"model.preset": "gpt3-7.5b", "cluster.gpu": "a100-80gb", "cluster.num_nodes": 8,
       "cluster.gpus_per_node": 8, "training.global_batch_size": 512, "training.precision": "bf16"}

L126 = {**BIG, "model.num_layers": 126, "parallelism.tensor": 1, "parallelism.zero_stage": 1}

CASES = [
    # (overrides, expected path, text that must appear in the message)
    ({**BIG, "parallelism.tensor": 8, "parallelism.pipeline": 4, "parallelism.data": 3},
     "parallelism.data", "tp(8) * pp(4) * dp(3) = 96 != world_size(64)"),
    ({**BIG, "parallelism.tensor": 3}, "parallelism.tensor", "tp(3)"),
    ({**BIG, "model.num_attention_heads": 24, "parallelism.tensor": 16, "cluster.gpus_per_node": 16},
     "parallelism.tensor", "num_attention_heads(24) % tp(16)"),
    ({**BIG, "model.num_query_groups": 2, "parallelism.tensor": 4}, "parallelism.tensor", "num_query_groups(2) % tp(4)"),
    ({**BIG, "parallelism.pipeline": 8, "model.num_layers": 36}, "parallelism.pipeline", "num_layers(36) % pp(8)"),
    ({**BIG, "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 2, "model.num_layers": 36},
     "parallelism.virtual_pipeline", "num_layers(36) % (pp(4) * vpp(2) = 8)"),
    ({**BIG, "parallelism.pipeline": 1, "parallelism.virtual_pipeline": 2}, "parallelism.virtual_pipeline",
     "needs pipeline >= 2"),
    ({**BIG, "training.engine": "deepspeed", "parallelism.pipeline": 4, "parallelism.virtual_pipeline": 2},
     "parallelism.virtual_pipeline", "needs training.engine megatron"),
    ({**BIG, "parallelism.tensor": 1, "parallelism.pipeline": 1, "parallelism.micro_batch_size": 3},
     "training.global_batch_size", "global_batch_size(512) % (micro_batch_size(3) * dp(64) = 192)"),
    ({**BIG, "parallelism.tensor": 1, "parallelism.sequence_parallel": True}, "parallelism.sequence_parallel",
     "needs tp > 1"),
    ({**BIG, "model.seq_length": 2050, "parallelism.tensor": 4, "parallelism.sequence_parallel": True},
     "parallelism.sequence_parallel", "seq_length(2050) % tp(4)"),
    ({**BIG, "parallelism.pipeline": 2, "parallelism.zero_stage": 2}, "parallelism.zero_stage",
     "ZeRO-2 with pp(2) > 1"),
    ({**BIG, "training.engine": "deepspeed", "parallelism.pipeline": 2, "parallelism.zero_stage": 3},
     "parallelism.zero_stage", "DeepSpeed's pipeline engine does not support ZeRO-3"),
    ({**BIG, "parallelism.zero_stage": 0, "parallelism.offload": "optimizer"}, "parallelism.offload",
     "needs zero_stage >= 1"),
    ({**BIG, "parallelism.zero_stage": 2, "parallelism.offload": "optimizer+params"}, "parallelism.offload",
     "needs zero_stage 3"),
    ({**BIG, "model.hidden_size": 4000, "model.num_attention_heads": 48}, "model.hidden_size",
     "hidden_size(4000) % num_attention_heads(48)"),
    ({**BIG, "model.num_query_groups": 5}, "model.num_query_groups", "num_attention_heads(32) % num_query_groups(5)"),
    ({"training.precision": "fp16"}, "training.precision", "fp16 does not run on CPU"),
    ({"data.synthetic": False}, "data.path", "no data.path"),
    ({"launch.backend": "pdsh", "launch.pdsh.hosts": ["a", "b"]}, "launch.pdsh.hosts", "2 host(s) listed (a, b) for cluster.num_nodes(1)"),
    ({"launch.pdsh.hosts": ["-oProxyCommand=x"]}, "launch.pdsh.hosts[0]", "not a host name"),
    ({**BIG, "parallelism.pipeline": 64, "cluster.num_nodes": 8, "model.num_layers": 36}, "parallelism.pipeline",
     "pp(64) > num_layers(36)"),
    # uneven pipeline splits (Megatron-LM's --decoder-first/last-pipeline-num-layers rules)
    ({**L126, "parallelism.pipeline": 16, "parallelism.account_for_embedding_loss": False}, "parallelism.pipeline",
     "num_layers(126) % pp(16) = 14"),
    ({**L126, "parallelism.pipeline": 12, "parallelism.account_for_embedding_loss": True},
     "parallelism.account_for_embedding_loss", "num_layers(126) + 2 (embedding and loss) = 128 % pp(12) = 8"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.virtual_pipeline": 3, "parallelism.account_for_embedding_loss": True},
     "parallelism.virtual_pipeline", "(num_layers(126) + 2) / pp(16) = 8 per stage % virtual_pipeline(3)"),
    ({**L126, "training.engine": "deepspeed", "parallelism.pipeline": 16, "parallelism.account_for_embedding_loss": True},
     "parallelism.account_for_embedding_loss", "needs training.engine megatron"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.first_stage_layers": 6, "parallelism.last_stage_layers": 7},
     "parallelism.first_stage_layers", "= 113 middle layers % 14 middle stages"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.first_stage_layers": 60, "parallelism.last_stage_layers": 60},
     "parallelism.first_stage_layers", "6 middle layers for 14 middle stage(s)"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.last_stage_layers": 7}, "parallelism.last_stage_layers",
     "= 119 middle layers % 15 middle stages"),
    ({"model.num_layers": 5, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
      "parallelism.first_stage_layers": 2, "parallelism.last_stage_layers": 2}, "parallelism.first_stage_layers",
     "+ last_stage_layers(2) = 4 != num_layers(5) with pp(2)"),
    ({"parallelism.first_stage_layers": 2}, "parallelism.first_stage_layers", "needs pp >= 2, got pp(1)"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.virtual_pipeline": 2, "parallelism.first_stage_layers": 7,
      "parallelism.last_stage_layers": 7}, "parallelism.first_stage_layers",
     "first_stage_layers(7) % virtual_pipeline(2) = 1"),
    ({**L126, "model.num_layers": 21, "parallelism.pipeline": 4, "cluster.num_nodes": 2, "cluster.gpus_per_node": 2,
      "parallelism.virtual_pipeline": 2, "parallelism.first_stage_layers": 4, "parallelism.last_stage_layers": 5},
     "parallelism.last_stage_layers", "last_stage_layers(5) % virtual_pipeline(2) = 1"),
    ({**L126, "parallelism.pipeline": 16, "parallelism.virtual_pipeline": 4, "parallelism.first_stage_layers": 12,
      "parallelism.last_stage_layers": 16}, "parallelism.virtual_pipeline", "= 7 layers each, % virtual_pipeline(4)"),
]


@pytest.mark.parametrize("overrides,path,text", CASES, ids=[c[1] + ":" + c[2][:20] for c in CASES])
def test_rule_fires_with_operands(overrides, path, text):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**overrides))
    matches = [p for p in info.value.problems if p.path == path and text in p.message]
    assert matches, [str(p) for p in info.value.problems]
    assert matches[0].hint  # every problem says how to fix it


def test_case_ids_are_distinct():
    ids = [c[1] + ":" + c[2][:20] for c in CASES]
    assert len(set(ids)) == len(ids)


def test_layers_not_divisible_hint_proposes_the_uneven_split():
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data(**{**L126, "parallelism.pipeline": 16, "training.engine": "deepspeed"}))
    [p] = [p for p in info.value.problems if p.path == "parallelism.pipeline"]
    assert p.hint == ("use a pipeline degree that divides the layer count, or split unevenly: set "
                      "parallelism.first_stage_layers: 7 and parallelism.last_stage_layers: 7 (14 middle stages of 8)")


@pytest.mark.parametrize("first,last", [(7, 7), (6, None), (None, 6)])
def test_valid_uneven_split_passes(first, last):
    split = {k: v for k, v in (("parallelism.first_stage_layers", first), ("parallelism.last_stage_layers", last))
             if v is not None}
    spec = parse_spec(spec_data(**{**L126, "parallelism.pipeline": 16, **split}))
    assert (spec.parallelism.first_stage_layers, spec.parallelism.last_stage_layers) == (first, last)


def test_uneven_split_is_not_an_open_field():
    spec = parse_spec(spec_data(**{**L126, "parallelism.pipeline": 16, "parallelism.first_stage_layers": 7,
                                   "parallelism.last_stage_layers": 7}))
    lay = require_complete(spec)
    assert (lay.first_stage_layers, lay.last_stage_layers) == (7, 7) and lay.tag() == "tp1-pp16-f7l7-dp4-z1-mb2"
    assert Layout(tp=1, pp=1, vpp=1, dp=1, zero_stage=0, micro_batch_size=1, sequence_parallel=False,
                  recompute="none", offload="none").is_complete    # None split = even, a complete value


def test_valid_big_layout_passes():
    spec = parse_spec(spec_data(**{**BIG, "parallelism.tensor": 4, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                   "parallelism.sequence_parallel": True}))
    assert spec.parallelism.tensor == 4


def test_dp_is_derived_never_floored():
    spec = parse_spec(spec_data(**{**BIG, "parallelism.tensor": 4, "parallelism.pipeline": 2,
                                   "parallelism.zero_stage": 1}))
    lay = Layout(tp=4, pp=2, dp=8, micro_batch_size=3, vpp=1, zero_stage=1)
    [p] = check_layout(spec, lay)  # 512 % (3*8) != 0: reported, not rounded down to 504
    assert "global_batch_size(512)" in p.message and "504" in p.hint


@pytest.mark.parametrize("vocab,tp,padded", [(51200, 1, 51200), (50257, 1, 50304), (50257, 8, 51200),
                                             (128256, 8, 129024), (32000, 4, 32256)])
def test_vocab_padding_matches_megatron(vocab, tp, padded):
    assert padded_vocab_size(vocab, tp) == padded
    assert padded % (128 * tp) == 0 and 0 <= padded - vocab < 128 * tp


def test_open_fields_are_a_clear_error_for_fixed_only_callers():
    spec = parse_spec(spec_data(**{"parallelism.zero_stage": None, "parallelism.recompute": None}))
    with pytest.raises(SpecError) as info:
        require_complete(spec)
    assert {p.path for p in info.value.problems} == {"parallelism.zero_stage", "parallelism.recompute"}


def test_batch_hint_names_two_different_multiples_or_one():
    from orchestrator.errors import SpecError
    from orchestrator.spec_loader import parse_spec

    for batch, hint in ((8, "e.g. 32"), (40, "e.g. 32 or 64")):     # before: "e.g. 32 or 32" for 8
        data = spec_data(**{"cluster.num_nodes": 8, "training.global_batch_size": batch})
        with pytest.raises(SpecError) as info:
            parse_spec(data)
        assert any(p.hint.endswith(hint) for p in info.value.problems), info.value.problems


def test_every_rule_module_is_in_the_rule_lists_whichever_is_imported_first():
    """rules.py joins layout.py's structural rules, parallel_rules.py's (MoE, CP, FP8) and recompute_rules.py's;
    in a fresh process any rule module may be imported first, and the joined lists hold every rule, once."""
    code = ("import orchestrator.parallel_rules as P, orchestrator.recompute_rules as C, orchestrator.layout as L, "
            "orchestrator.rules as R\n"
            "assert R.LAYOUT_RULES == L.LAYOUT_RULES + P.LAYOUT_RULES + C.LAYOUT_RULES and len(set(R.LAYOUT_RULES)) == "
            "len(R.LAYOUT_RULES)\n"
            "assert R.MODEL_RULES == L.MODEL_RULES + P.MODEL_RULES\n"
            "assert R.SPEC_RULES == L.SPEC_RULES + P.SPEC_RULES + C.SPEC_RULES\n"
            "assert P.rule_fp8_dims in R.LAYOUT_RULES and L.rule_world_size in R.LAYOUT_RULES\n"
            "assert C.rule_recompute_num_layers in R.LAYOUT_RULES and C.rule_recompute_engine in R.SPEC_RULES")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
