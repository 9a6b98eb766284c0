"""The trainer's pieces on one CPU process: model shape, data, checkpoint pointer, argument errors."""
from __future__ import annotations

import math

import pytest

from tests.conftest import fixed_plan, spec_data

torch = pytest.importorskip("torch")

from orchestrator.estimate.params import estimate_params, model_shape  # noqa: E402
from orchestrator.spec_loader import parse_spec  # noqa: E402
from orchestrator.train import checkpoint  # noqa: E402
from orchestrator.train.data import MarkovTokens, ByteTextTokens, sample_seed  # noqa: E402
from orchestrator.train.model import GPT, count_parameters  # noqa: E402

LLAMA_LIKE = {"model.gated_mlp": True, "model.num_query_groups": 2, "model.normalization": "rmsnorm",
              "model.position_embedding": "rope", "model.tie_embeddings": False, "model.add_bias_linear": False,
              "model.ffn_hidden_size": 352}


@pytest.mark.parametrize("overrides", [{}, LLAMA_LIKE], ids=["gpt", "llama-like"])
def test_model_has_the_cost_models_parameter_count(overrides):
    spec = parse_spec(spec_data(**overrides))
    assert count_parameters(GPT(spec.model)) == estimate_params(model_shape(spec)).total


@pytest.mark.parametrize("overrides", [{}, LLAMA_LIKE], ids=["gpt", "llama-like"])
def test_model_starts_near_uniform_and_learns(overrides):
    spec = parse_spec(spec_data(**overrides))
    torch.manual_seed(0)
    model = GPT(spec.model)
    data = MarkovTokens(spec.model.vocab_size, spec.model.seq_length, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(1, 9):
        tokens, labels = data.micro_batch(step, 0, 0, 4, dp_size=1)
        loss = model(tokens, labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(spec.model.vocab_size)) < 0.3
    assert losses[-1] < losses[0] - 0.5


def test_recompute_gives_the_same_gradients():
    spec = parse_spec(spec_data())
    data = MarkovTokens(512, 128, seed=1)
    tokens, labels = data.micro_batch(1, 0, 0, 2, dp_size=1)
    grads = []
    for recompute in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = GPT(spec.model, recompute=recompute)
        model(tokens, labels).backward()
        grads.append(model.blocks[0].mlp.fc1.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


def test_synthetic_data_is_a_pure_function_of_step_and_sample():
    a, b = MarkovTokens(512, 16, seed=7), MarkovTokens(512, 16, seed=7)
    t1, l1 = a.micro_batch(5, 1, 2, 3, dp_size=2)
    t2, l2 = b.micro_batch(5, 1, 2, 3, dp_size=2)
    assert torch.equal(t1, t2) and torch.equal(l1, l2)
    assert torch.equal(t1[:, 1:], l1[:, :-1]) and t1.shape == (3, 16)
    assert not torch.equal(t1, a.micro_batch(5, 0, 2, 3, dp_size=2)[0])
    assert not torch.equal(t1, a.micro_batch(6, 1, 2, 3, dp_size=2)[0])
    assert len({sample_seed(1, s, k) for s in range(20) for k in range(64)}) == 20 * 64
    assert int(t1.max()) < 512


@pytest.mark.parametrize("layout", [(1, 8, 2), (2, 4, 2), (4, 1, 4), (8, 2, 1)], ids=lambda t: "dp%d-ga%d-mb%d" % t)
def test_every_layout_sees_the_same_global_batch(layout):
    """A step's global batch (16 samples, in the order of their index) is the same under any dp x
    accumulation x micro-batch: what lets a resized run continue with the samples of the unresized one."""
    data = MarkovTokens(512, 8, seed=3)
    reference = data.micro_batch(4, 0, 0, 16, dp_size=1)[0]
    dp, ga, mb = layout
    parts = {(j * dp + r) * mb: data.micro_batch(4, r, j, mb, dp_size=dp)[0] for r in range(dp) for j in range(ga)}
    assert torch.equal(torch.cat([parts[k] for k in sorted(parts)]), reference)


def test_synthetic_data_follows_its_markov_chain():
    """Every transition is one of the token's 4 successors, and the chain's walk is the one the seed draws."""
    data = MarkovTokens(512, 64, seed=3)
    tokens, labels = data.micro_batch(2, 0, 1, 4, dp_size=1)
    for row_t, row_l in zip(tokens.tolist(), labels.tolist()):
        assert all(b in data.successors[a].tolist() for a, b in zip(row_t, row_l))
    g = torch.Generator().manual_seed(sample_seed(3, 2, 4))      # micro-batch 1 of 4 samples starts at sample 4
    first = torch.randint(512, (1,), generator=g)
    choice = torch.multinomial(data.probs, 64, replacement=True, generator=g)
    walk = [first]                                   # the chain walked with tensor indexing
    for t in range(64):
        walk.append(data.successors[walk[-1], choice[t]])
    walk = torch.cat(walk)
    assert torch.equal(tokens[0], walk[:-1]) and torch.equal(labels[0], walk[1:])


def test_byte_text_data(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 20)
    tokens, labels = ByteTextTokens(path, 32, seed=1).micro_batch(1, 0, 0, 2, dp_size=1)
    assert tokens.shape == (2, 32) and int(tokens.max()) < 256
    assert torch.equal(tokens[:, 1:], labels[:, :-1])


def test_latest_checkpoint_pointer(tmp_path):
    assert checkpoint.latest_step(tmp_path) is None
    (tmp_path / "global_step8").mkdir()
    checkpoint.write_latest(tmp_path, 8)
    assert checkpoint.latest_step(tmp_path) == 8
    checkpoint.write_latest(tmp_path, 12)                      # pointer to a missing dir: not usable
    assert checkpoint.latest_step(tmp_path) is None
    spec = parse_spec(spec_data())
    assert checkpoint.checkpoint_dir(tmp_path, spec) == tmp_path / "checkpoints"


def _run_dir(tmp_path, **overrides):
    from orchestrator.rundir import write_run_dir

    return write_run_dir(fixed_plan(spec_data(**overrides)), tmp_path / "run")


def test_trainer_refuses_a_world_size_mismatch(tmp_path, monkeypatch, capsys):
    from orchestrator.train.trainer import main

    run_dir = _run_dir(tmp_path)                                # 2 processes
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([str(run_dir)]) == 2
    assert "world_size(2)" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_megatron_engine_on_cpu_exits_2_with_the_reason(tmp_path, capsys):
    from orchestrator.train.trainer import main

    assert main([str(_run_dir(tmp_path)), "--engine", "megatron"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_missing_run_dir_exits_2(tmp_path, capsys):
    from orchestrator.train.trainer import main

    assert main([str(tmp_path / "nope")]) == 2


def test_stage_bounds_place_embeddings_first_and_head_last():
    """pipeline_specs = [embed, pos, block x L, final norm, output]; bounds index into it per stage."""
    from orchestrator.train.model import stage_bounds

    assert stage_bounds([2, 3]) == [0, 4, 9]                 # 5 layers as 2 + 3
    assert stage_bounds([2, 2]) == [0, 4, 8]                 # what DeepSpeed's "parameters" gives tiny-gpt pp2
    assert stage_bounds([7] + [8] * 14 + [7])[-1] == 126 + 4
    assert stage_bounds([4]) == [0, 8]
