"""The ZeRO-3 hook counts the CPU cost model charges (estimate/engines.py TrainerModules) are those of orch's
reference trainer: the modules its GPT calls in a forward, which of them hold a partitioned tensor, and the
resident tensors ZeRO-3 re-gathers after each step (DeepSpeed's rule: numel <= the persistence threshold)."""
import pytest
import torch
from torch import nn

from orchestrator.estimate.ds_runtime import trainer_modules
from orchestrator.estimate.engines import ds_param_persistence_threshold
from orchestrator.estimate.estimate_context import EstimateContext
from orchestrator.spec_loader import parse_spec
from orchestrator.train.model import GPT

BASE = {"name": "t", "model": {"preset": "tiny-gpt"}, "cluster": {"gpu": "cpu", "gpus_per_node": 2, "num_nodes": 1},
        "parallelism": {"data": 2, "zero_stage": 3}, "training": {"engine": "deepspeed", "global_batch_size": 8,
                                                                   "precision": "fp32"}}


def _called_modules(model: nn.Module) -> list[nn.Module]:
    """The modules a forward of ``model`` calls (forward pre-hooks fire), in order."""
    seen: list[nn.Module] = []
    handles = [m.register_forward_pre_hook(lambda mod, _args: seen.append(mod)) for m in model.modules()]
    tokens = torch.zeros(1, 8, dtype=torch.long)
    model(tokens, tokens)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("model", [{}, {"normalization": "rmsnorm", "add_bias_linear": False,
                                        "position_embedding": "rope", "tie_embeddings": False},
                                   {"num_query_groups": 2, "gated_mlp": True, "ffn_hidden_size": 384}])
def test_trainer_modules_are_the_reference_trainers(model):
    data = dict(BASE, model={"preset": "tiny-gpt", **model})
    spec = parse_spec(data)
    expected = trainer_modules(EstimateContext.of(spec))
    threshold = ds_param_persistence_threshold(spec.model.hidden_size)
    gpt = GPT(spec.model)
    layers = spec.model.num_layers
    called = _called_modules(gpt)
    gathered = [m for m in called if any(p.numel() > threshold for p in m.parameters(recurse=False))]
    resident = [p for p in gpt.parameters() if p.numel() <= threshold]
    assert len(gathered) == layers * expected.gathered_per_layer + expected.gathered_outside
    assert len(called) - len(gathered) == layers * expected.hooked_per_layer + expected.hooked_outside
    assert len(resident) == layers * expected.resident_per_layer + expected.resident_outside
    assert len(list(gpt.parameters())) == layers * expected.tensors_per_layer + expected.tensors_outside


def test_trainer_modules_only_where_orchs_trainer_runs():
    gpu = parse_spec(dict(BASE, cluster={"gpu": "h100-sxm", "gpus_per_node": 8, "num_nodes": 1}))
    assert trainer_modules(EstimateContext.of(gpu)) is None
