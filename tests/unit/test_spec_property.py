"""Property: whatever the input, orch answers with a Spec or a clean SpecError, never a crash."""
from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.layout import Layout
from orchestrator.rules import check_layout
from orchestrator.spec_loader import parse_spec
from tests.conftest import TINY_SPEC

PATHS = [
    "name", "model.preset", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
    "model.num_query_groups", "model.ffn_hidden_size", "model.vocab_size", "model.seq_length", "model.gated_mlp",
    "cluster.gpu", "cluster.num_nodes", "cluster.gpus_per_node", "cluster.inter_node_bandwidth_GBps",
    "training.global_batch_size", "training.precision", "training.optimizer.lr", "training.optimizer.betas",
    "training.lr_schedule.decay", "training.checkpoint.interval", "data.synthetic", "data.path",
    "parallelism.tensor", "parallelism.pipeline", "parallelism.virtual_pipeline", "parallelism.data",
    "parallelism.zero_stage", "parallelism.micro_batch_size", "parallelism.sequence_parallel",
    "parallelism.recompute", "parallelism.offload", "launch.backend", "launch.slurm.time",
    "launch.pdsh.hosts", "tracking.wandb.mode", "model", "parallelism", "training", "bogus.key",
]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-4, max_value=4096), st.sampled_from([0, 1, 2, 3, 8, 128, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["tiny-gpt", "llama3-8b", "cpu", "h100-sxm", "bf16", "fp16", "full", "optimizer", "slurm"]),
    st.lists(st.integers(min_value=-2, max_value=3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                    max_size=2),
)


def _set(data: dict, dotted: str, value) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=6))
def test_random_specs_never_crash(mutations):
    data = copy.deepcopy(TINY_SPEC)
    for path, value in mutations:
        _set(data, path, value)
    try:
        spec = parse_spec(data)
    except SpecError as e:
        assert e.problems and all(p.path and p.message for p in e.problems)
    else:
        assert spec.model.num_layers >= 1 and spec.world_size >= 1


DEGREES = st.one_of(st.none(), st.integers(min_value=1, max_value=64))


@settings(max_examples=300, deadline=None)
@given(tp=DEGREES, pp=DEGREES, vpp=DEGREES, dp=DEGREES, mb=DEGREES, zero=st.one_of(st.none(), st.integers(0, 3)),
       sp=st.one_of(st.none(), st.booleans()), offload=st.sampled_from([None, "none", "optimizer", "optimizer+params"]))
def test_random_layouts_are_judged_without_crashing(tp, pp, vpp, dp, mb, zero, sp, offload):
    spec = parse_spec(TINY_SPEC)
    layout = Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, zero_stage=zero, micro_batch_size=mb, sequence_parallel=sp,
                    recompute="none", offload=offload)
    for problem in check_layout(spec, layout):
        assert problem.path.startswith(("parallelism.", "training.")) and problem.hint
