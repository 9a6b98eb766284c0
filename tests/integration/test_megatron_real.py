"""Megatron for real: Megatron-LM core_v0.16.1's parse_args + validate_args accept every rendered argument
list (with the environment the generated launch script exports), Megatron-Core's TransformerConfig builds
every rendered megatron_config.json, the static checker catches what TransformerConfig lets through, and the
parts of Megatron-Core that run on CPU (parallel_state on gloo, tensor-parallel linears) run.

Megatron-LM is not a pip package: the validate_args tests skip unless ORCH_MEGATRON_LM names its megatron/
tree (tests/tools/prepare_megatron_lm.sh DEST; see orchestrator/validate/megatron_lm.py).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from functools import lru_cache

import pytest

from orchestrator.render.megatron import megatron_env, render_megatron_args, render_megatron_config
from orchestrator.rundir import write_run_dir
from orchestrator.validate.megatron import check_megatron_args, check_megatron_config, validate_megatron_args_file
from orchestrator.validate.megatron_core import check_transformer_configs, megatron_core_available
from orchestrator.validate.megatron_lm import (HOW_TO_ENABLE, LmRun, launch_script_env, megatron_lm_reports,
                                               megatron_lm_root)
from tests.conftest import EXAMPLES, ROOT, example_names, fixed_plan, spec_data
from tests.megatron_layouts import GPU8, MEGATRON_LAYOUTS
from tests.deadlines import scaled_s

pytestmark = pytest.mark.integration
needs_core = pytest.mark.skipif(not megatron_core_available(), reason="megatron-core (the [train] extra) is not installed")

FIXED = {
    **MEGATRON_LAYOUTS,
    "llama3-8b-dataset-hf-tokenizer": {**GPU8, "model.preset": "llama3-8b", "parallelism.tensor": 8,
                                       "parallelism.zero_stage": 1, "parallelism.micro_batch_size": 1,
                                       "training.global_batch_size": 8,
                                       "data": {"synthetic": False, "path": "/data/llama3_text_document",
                                                "tokenizer": "meta-llama/Meta-Llama-3-8B"}},
}
# training.grad_reduce_dtype: each precision's non-default reduction, and the defaults (Megatron-LM's verdict
# on the dtype: test_megatron_lm_reduces_gradients_in_the_spec_dtype).
GRAD_REDUCE = {
    "gpt-bf16-grad-reduce-default": ({**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 8,
                                      "training.global_batch_size": 8}, True),
    "gpt-bf16-grad-reduce-bf16": ({**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 8,
                                   "training.global_batch_size": 8, "training.grad_reduce_dtype": "bf16"}, False),
    "gpt-fp16-grad-reduce-default": ({**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 8,
                                      "training.global_batch_size": 8, "training.precision": "fp16"}, False),
    "gpt-fp16-grad-reduce-fp32": ({**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 8,
                                   "training.global_batch_size": 8, "training.precision": "fp16",
                                   "training.grad_reduce_dtype": "fp32"}, True),
}
FIXED |= {case: data for case, (data, _) in GRAD_REDUCE.items()}
# Uneven pipeline splits (Megatron's --decoder-first/last-pipeline-num-layers), on "cpu" so that Megatron-LM
# builds the TransformerConfig here and reports the layers it places on each pipeline rank.
CPU16 = {"cluster.gpus_per_node": 16, "training.precision": "bf16", "parallelism.zero_stage": 1, "training.engine": "megatron",
         "parallelism.micro_batch_size": 1, "training.global_batch_size": 16}
FIXED |= {
    "tiny-5l-pp2-first2-last3-cpu": {"model.num_layers": 5, "parallelism.pipeline": 2, "parallelism.zero_stage": 1,
                                     "parallelism.first_stage_layers": 2, "parallelism.last_stage_layers": 3},
    "126l-pp16-first7-last7-cpu": {**CPU16, "model.num_layers": 126, "parallelism.pipeline": 16,
                                   "parallelism.first_stage_layers": 7, "parallelism.last_stage_layers": 7},
    "126l-pp16-vpp2-first6-last8-cpu": {**CPU16, "model.num_layers": 126, "parallelism.pipeline": 16,
                                        "parallelism.virtual_pipeline": 2, "parallelism.first_stage_layers": 6,
                                        "parallelism.last_stage_layers": 8},
    "126l-pp16-first-only-cpu": {**CPU16, "model.num_layers": 126, "parallelism.pipeline": 16,
                                 "parallelism.first_stage_layers": 6},
}
# Megatron FSDP (ZeRO-2/3) with tp > 1: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS is NOT 1.
FSDP_TP = {**GPU8, "model.preset": "gpt3-1.7b", "parallelism.tensor": 2, "parallelism.zero_stage": 2,
           "training.global_batch_size": 32}
# Published MoE / context-parallel / FP8 H100 runs (issue 10), planned with their layouts fixed as published.
PUBLISHED = ROOT / "tests" / "data" / "published-moe-cp-fp8.json"
CASES = [f"example:{name}" for name in example_names()] + sorted(FIXED) + \
    [f"published:{c['id']}" for c in json.loads(PUBLISHED.read_text())]


@lru_cache(maxsize=None)
def plan_of(case: str):
    if case.startswith("published:"):
        from orchestrator.plan import build_plan
        from orchestrator.spec_loader import parse_spec
        from tests.published_layouts import layout_case_spec_data, load_layout_cases

        [pub] = [c for c in load_layout_cases(PUBLISHED) if c["id"] == case.split(":", 1)[1]]
        data = layout_case_spec_data(pub)
        if megatron_lm_root() is not None:   # NeMo / Megatron-Bridge ran Megatron-LM: a program (its fused loss is written)
            data["program"] = {"kind": "megatron-lm", "megatron_lm": str(megatron_lm_root())}
        return build_plan(parse_spec(data), top_k=1)
    if case.startswith("example:"):
        from orchestrator.plan import build_plan
        from orchestrator.spec_loader import load_spec

        return build_plan(load_spec(EXAMPLES / f"{case.split(':', 1)[1]}.yaml"))
    return fixed_plan(spec_data(**FIXED[case]))


def lm_root():
    root = megatron_lm_root()
    if root is None:
        pytest.skip(f"ORCH_MEGATRON_LM is not set: {HOW_TO_ENABLE}")
    return root


@pytest.fixture(scope="module")
def lm_reports(tmp_path_factory):
    """Megatron-LM's verdict on every case's run dir, in one subprocess: case -> (problems, facts)."""
    root = lm_root()
    runs, planned = [], [case for case in CASES if _plans(case)]
    for case in planned:
        plan = plan_of(case)
        run = write_run_dir(plan, tmp_path_factory.mktemp("run") / case.replace(":", "-"))
        tokens = (run / "megatron_args.txt").read_text().splitlines()
        env = launch_script_env((run / "launch_local.sh").read_text())  # CUDA_DEVICE_MAX_CONNECTIONS as exported
        runs.append(LmRun(tokens, plan.world_size, env, str(run / "megatron_args.txt")))
    return dict(zip(planned, megatron_lm_reports(runs, megatron_lm_root=root)))


def _plans(case: str) -> bool:
    try:
        plan_of(case)
    except Exception:  # noqa: BLE001  (the per-case test reports it)
        return False
    return True


@pytest.mark.parametrize("case", CASES)
def test_megatron_lm_validate_args_accepts_the_run_dirs_arguments(case, lm_reports):
    plan = plan_of(case)
    problems, facts = lm_reports[case]
    assert problems == [], [str(p) for p in problems]
    # What Megatron derived agrees with the plan.
    assert facts["data_parallel_size"] == plan.layout.dp
    assert facts["num_microbatches"] == plan.grad_accum_steps
    assert facts["virtual_pipeline_model_parallel_size"] == (plan.layout.vpp if plan.layout.vpp > 1 else None)
    if "padded_vocab_size" in facts:
        assert facts["padded_vocab_size"] == plan.padded_vocab_size
    assert "Transformer Engine" in facts.get("skipped", "Transformer Engine")
    if "layers_per_pipeline_rank" in facts:   # Megatron-Core places the layers the plan's split says
        assert tuple(facts["layers_per_pipeline_rank"]) == plan.stage_split.counts
    t = plan.spec.training
    if t.precision != "fp32":   # the reduce dtype the cost model charges is the one Megatron-LM resolves
        assert facts["grad_reduce_in_fp32"] is (ctx_grad_reduce_dtype(plan) == "fp32")


def ctx_grad_reduce_dtype(plan) -> str:
    from orchestrator.estimate.engines import resolved_grad_reduce_dtype

    t = plan.spec.training
    return resolved_grad_reduce_dtype("megatron", t.precision, t.grad_reduce_dtype, plan.layout.cp)


@pytest.mark.parametrize("case", sorted(GRAD_REDUCE))
def test_megatron_lm_reduces_gradients_in_the_spec_dtype(case, lm_reports):
    """Megatron-LM's own resolution of the flags orch writes (accumulate_allreduce_grads_in_fp32, which
    becomes DistributedDataParallelConfig.grad_reduce_in_fp32) is the dtype the cost model charges."""
    _, facts = lm_reports[case]
    assert facts["grad_reduce_in_fp32"] is GRAD_REDUCE[case][1]
    assert (ctx_grad_reduce_dtype(plan_of(case)) == "fp32") is facts["grad_reduce_in_fp32"]


UNEVEN = [case for case in FIXED if "first" in case]


@pytest.mark.parametrize("case", UNEVEN)
def test_megatron_places_the_uneven_split(case, lm_reports):
    _, facts = lm_reports[case]
    assert tuple(facts["layers_per_pipeline_rank"]) == plan_of(case).stage_split.counts
    assert not plan_of(case).stage_split.is_even


def test_megatron_lm_rejects_what_the_split_rules_reject():
    """Megatron-LM's own verdict on split arguments orch's rules refuse (each rule has a Megatron twin)."""
    root = lm_root()
    tokens = render_megatron_args(plan_of("126l-pp16-vpp2-first6-last8-cpu"))

    def with_flags(**flags):
        out = list(tokens)
        for flag, value in flags.items():
            out[out.index(flag) + 1] = value
        return LmRun(out, 16, {})

    runs = [with_flags(**{"--decoder-first-pipeline-num-layers": "5", "--decoder-last-pipeline-num-layers": "9"}),
            with_flags(**{"--decoder-first-pipeline-num-layers": "7"}),
            with_flags(**{"--decoder-first-pipeline-num-layers": "6", "--decoder-last-pipeline-num-layers": "6"})]
    verdicts = megatron_lm_reports(runs, megatron_lm_root=root)
    for run, (problems, _) in zip(runs, verdicts):
        ours = check_megatron_args(run.args, world_size=16, deep=False)
        assert problems, "Megatron-LM accepts it"
        assert ours, "orch's static check misses what Megatron-LM rejects"


def test_megatron_fsdp_with_tensor_parallelism_needs_its_own_launch_env_and_rejections_quote_megatron():
    root = lm_root()
    fsdp = fixed_plan(spec_data(**FSDP_TP))
    fsdp_tokens = render_megatron_args(fsdp)
    tiny = render_megatron_args(plan_of("tp2-sp-selective-cpu"))
    hidden = list(tiny)
    hidden[hidden.index("--hidden-size") + 1] = "130"
    cuda1 = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    reports = megatron_lm_reports([LmRun(fsdp_tokens, 8, megatron_env(fsdp)), LmRun(fsdp_tokens, 8, cuda1),
                                   LmRun(tiny, 2, {}), LmRun(hidden, 2, cuda1)], megatron_lm_root=root)
    (fsdp_ok, _), (fsdp_cuda1, _), (no_env, _), (bad_hidden, _) = reports
    assert fsdp_ok == []
    assert "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS" in fsdp_cuda1[0].message
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in no_env[0].message
    assert "Megatron-LM core_v0.16.1 arguments.py:" in no_env[0].hint
    assert "hidden_size % args.num_attention_heads" in bad_hidden[0].message and "--hidden-size" in bad_hidden[0].hint


@pytest.fixture(scope="module")
def config_verdicts():
    """TransformerConfig's verdict on every case's megatron_config.json, in one subprocess."""
    planned = [case for case in CASES if _plans(case)]
    configs = [render_megatron_config(plan_of(case)) for case in planned]
    return dict(zip(planned, check_transformer_configs(configs)))


@needs_core
@pytest.mark.parametrize("case", CASES)
def test_rendered_megatron_config_builds_a_transformer_config(case, config_verdicts):
    plan_of(case)  # a planning error fails here, for this case only
    assert check_megatron_config(render_megatron_config(plan_of(case)), deep=False) == []
    assert config_verdicts[case] == []


@needs_core
def test_validate_megatron_args_file_deep_builds_a_transformer_config(tmp_path):
    plan = plan_of("gqa-swiglu-tp4-pp2-full")
    path = tmp_path / "megatron_args.txt"
    path.write_text("\n".join(render_megatron_args(plan)) + "\n")
    assert validate_megatron_args_file(path, world_size=plan.world_size, deep=True) == []
    # A combination only TransformerConfig knows is wrong: distributed recompute with sequence parallelism.
    path.write_text(path.read_text() + "--distribute-saved-activations\n")
    problems = validate_megatron_args_file(path, world_size=plan.world_size, deep=True)
    assert len(problems) == 1 and "TransformerConfig rejects it" in problems[0].message, problems
    assert "distribute_saved_activations" in problems[0].message


ACCEPTED_DEFECTS = [
    ({"hidden_size": 130}, "hidden_size(130) % num_attention_heads(4)"),
    ({"pipeline_model_parallel_size": 3, "num_layers_in_first_pipeline_stage": 3,     # -2 middle layers % 1
      "num_layers_in_last_pipeline_stage": 3}, "every middle stage needs at least one layer"),
    ({"pipeline_model_parallel_size": 3}, "num_layers(4) % pp(3)"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4}, "not divisible into vpp(4)"),
    ({"tensor_model_parallel_size": -2}, "tensor_model_parallel_size must be an integer >= 1"),
]


@needs_core
def test_static_checker_catches_what_transformer_config_accepts():
    base = render_megatron_config(fixed_plan(spec_data(**{"parallelism.zero_stage": 1})))
    configs = [{**base, **change} for change, _ in ACCEPTED_DEFECTS]
    assert check_transformer_configs(configs) == [[]] * len(configs), "TransformerConfig itself accepts these"
    for config, (_, text) in zip(configs, ACCEPTED_DEFECTS):
        assert any(text in p.message for p in check_megatron_config(config, deep=False)), text


def test_flag_table_is_fresh():
    lm_root()
    out = subprocess.run([sys.executable, "tests/tools/export_megatron_lm_args.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --- what of Megatron-Core runs on CPU --------------------------------------------------------------

def _tp_worker(rank: int, world: int, port: int, queue) -> None:
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    config = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True)
    torch.manual_seed(0)
    column = ColumnParallelLinear(8, 16, config=config, init_method=torch.nn.init.xavier_normal_, bias=False,
                                  gather_output=False)
    row = RowParallelLinear(16, 8, config=config, init_method=torch.nn.init.xavier_normal_, bias=False,
                            input_is_parallel=True, skip_bias_add=False)
    x = torch.randn(4, 2, 8, generator=torch.Generator().manual_seed(1))
    hidden, _ = column(x)
    out, _ = row(hidden)
    full = [_gather(column.weight, 0, world), _gather(row.weight, 1, world)]
    reference = x @ full[0].t() @ full[1].t()
    queue.put((rank, parallel_state.get_tensor_model_parallel_world_size(), tuple(hidden.shape),
               float((out - reference).abs().max())))
    parallel_state.destroy_model_parallel()
    dist.barrier()
    dist.destroy_process_group()


def _gather(weight, dim: int, world: int):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(weight) for _ in range(world)]
    dist.all_gather(parts, weight.detach().contiguous())
    return torch.cat(parts, dim)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_core
def test_tensor_parallel_linears_run_on_gloo_with_two_processes():
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").Queue()
    mp.start_processes(_tp_worker, args=(2, _free_port(), queue), nprocs=2, start_method="spawn", join=True)
    results = sorted(queue.get(timeout=scaled_s(60)) for _ in range(2))
    assert [r[:3] for r in results] == [(0, 2, (4, 2, 8)), (1, 2, (4, 2, 8))]  # each rank holds half of 16
    assert max(r[3] for r in results) < 1e-5, "column->row parallel output equals the unsharded matmul"
