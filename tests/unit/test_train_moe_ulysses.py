"""Expert parallelism (ep = 2) and Ulysses context parallelism (cp = 2) on 2 real gloo processes.

Each (MoE also under full recomputation) is checked against the same model in one process: the loss and
every gradient match, so dispatch, combine and the sequence/head exchanges are right forward AND backward.
Then one step of DeepSpeed's engine on the ep = 2 model (plain SGD, so the update is -lr * gradient, ZeRO 0
and 2) must update the dense parameters as the reference does AND each rank's experts as the reference's
experts with the same global ids: the expert gradients were not all-reduced across the two ranks (edp = 1)
and were scaled as the dense ones.
"""
from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from tests.conftest import ROOT  # noqa: E402

WORLD = 2
BATCH, SEQ, VOCAB = 2, 16, 64


def model_spec(**moe) -> SimpleNamespace:
    m = SimpleNamespace(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=64,
                        gated_mlp=True, normalization="rmsnorm", position_embedding="rope", add_bias_linear=False,
                        tie_embeddings=True, vocab_size=VOCAB, seq_length=SEQ, kv_channels=None, moe=None)
    if moe:
        m.moe = SimpleNamespace(**{"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 16,
                                   "shared_expert_ffn_hidden_size": 0, "first_dense_layers": 1,
                                   "capacity_factor": None, "aux_loss_coeff": 0.01, **moe})
    return m


def batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def build(m, **kwargs):
    from orchestrator.train.model import GPT

    torch.manual_seed(0)
    return GPT(m, seed=7, **kwargs)


def expert_grads(model) -> dict:
    """{(moe layer, global expert id, param name): grad} of the experts this model holds."""
    out = {}
    for layer in model.moe_layers:
        first = layer.ep_rank * layer.num_local_experts
        for j, expert in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            for name, p in expert.named_parameters():
                out[(layer.layer_index, first + j, name)] = p.grad
    return out


def dense_grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters() if getattr(p, "allreduce", True)}


def reference_grads(m, chunks_of):
    """Loss and gradients of the mean over ranks of each rank's loss, all in this process."""
    ref = build(m)
    losses = [ref(*chunks_of(r)) for r in range(WORLD)]
    loss = torch.stack(losses).mean()
    loss.backward()
    return ref, loss.item()


def check_expert_parallel(rank: int, group, capacity_factor, recompute: str = "none") -> None:
    import torch.distributed as dist

    m = model_spec(capacity_factor=capacity_factor)
    ref, ref_loss = reference_grads(m, batch)
    model = build(m, ep_size=WORLD, recompute=recompute)
    for layer in model.moe_layers:
        layer.deepspeed_moe._set_ep_group(group)
        layer.set_ep_rank(rank)
    for a, b in zip(model.moe_layers, ref.moe_layers):   # same experts, ids rank*2 + j
        for j, expert in enumerate(a.deepspeed_moe.experts.deepspeed_experts):
            twin = b.deepspeed_moe.experts.deepspeed_experts[rank * 2 + j]
            assert torch.equal(expert.fc1.weight, twin.fc1.weight)
    loss = model(*batch(rank))
    model.moe_stats.recording = False              # as the engine does: a recomputed forward is not counted
    loss.backward()                                # (recompute "full": dispatch and combine run again here)
    model.moe_stats.recording = True
    total = loss.detach().clone()
    dist.all_reduce(total)
    assert total.item() / WORLD == pytest.approx(ref_loss, rel=1e-5)
    for name, grad in dense_grads(model).items():
        dist.all_reduce(grad)
        torch.testing.assert_close(grad / WORLD, dense_grads(ref)[name], rtol=1e-4, atol=1e-6, msg=name)
    ref_experts = expert_grads(ref)
    for key, grad in expert_grads(model).items():     # edp = 1: no reduction, the same 1/dp scale
        torch.testing.assert_close(grad / WORLD, ref_experts[key], rtol=1e-4, atol=1e-6, msg=str(key))
    stats = model.moe_stats.take()
    routed = torch.tensor(stats[:4])
    assert routed.sum() == BATCH * SEQ * 2                         # top-2 of this rank's tokens, one layer
    dropped = stats[4]
    assert (dropped > 0) == (capacity_factor is not None)


def check_ulysses(rank: int, group, **model_fields) -> None:
    import torch.distributed as dist

    from orchestrator.train.ulysses import ContextGroup, sequence_chunk

    m = model_spec()
    vars(m).update(model_fields)
    cp = ContextGroup(group=group, size=WORLD, rank=rank)

    def chunk(r):
        tokens, labels = batch(0)                                  # one sequence batch, split by position
        part = ContextGroup(group=None, size=WORLD, rank=r)
        return sequence_chunk(tokens, part), sequence_chunk(labels, part)

    ref = build(m)                                                 # attention over the whole sequence
    ref_loss = ref(*batch(0))
    ref_loss.backward()
    ref_loss = ref_loss.item()
    model = build(m, cp=cp)
    loss = model(*chunk(rank))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    assert total.item() / WORLD == pytest.approx(ref_loss, rel=1e-5)
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        torch.testing.assert_close(p.grad / WORLD, dict(ref.named_parameters())[name].grad, rtol=1e-4, atol=1e-6,
                                   msg=name)


def assert_update(before, after, expected, name) -> None:
    """before - after == expected up to float32 rounding of the update and of the parameter itself."""
    atol = 1e-4 * float(expected.abs().max()) + 1e-6 * float(before.abs().max())
    torch.testing.assert_close(before - after, expected, rtol=1e-4, atol=atol, msg=name)


def check_deepspeed_step(rank: int, zero_stage: int) -> None:
    """One DeepSpeed SGD step (lr 1, gradient clipping 1.0) on the ep = 2 model updates like the reference:
    -gradient * min(1, 1 / global norm), the global norm over the dense parameters and ALL experts."""
    import deepspeed

    m = model_spec()
    ref, _ = reference_grads(m, batch)
    ref_dense, ref_experts = dense_grads(ref), expert_grads(ref)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in [*ref_dense.values(), *ref_experts.values()]))
    scale = min(1.0, 1.0 / (float(norm) + 1e-6))
    assert scale < 0.999                                               # clipping is exercised
    model = build(m, ep_size=WORLD)
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "train_batch_size": BATCH * WORLD, "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
              "gradient_clipping": 1.0, "zero_optimization": {"stage": zero_stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = engine(*batch(rank))
    engine.backward(loss)
    engine.step()
    names = {id(p): n for n, p in model.named_parameters()}
    for name, p in model.named_parameters():
        if getattr(p, "allreduce", True):
            assert_update(before[name], p.detach(), scale * ref_dense[name], f"zero {zero_stage}: {name}")
    for layer in model.moe_layers:
        for j, expert in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            for name, p in expert.named_parameters():
                full = names[id(p)]
                assert_update(before[full], p.detach(), scale * ref_experts[(layer.layer_index, rank * 2 + j, name)],
                              f"zero {zero_stage}: {full}")
    engine.destroy()


def _worker(rank: int, port: int, queue) -> None:
    import traceback

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        group = dist.new_group(list(range(WORLD)))
        check_expert_parallel(rank, group, capacity_factor=None)
        check_expert_parallel(rank, group, capacity_factor=1.0, recompute="full")
        check_ulysses(rank, group)                                          # rope, MHA
        check_ulysses(rank, group, num_query_groups=1, position_embedding="learned")   # GQA repeat, offsets
        check_deepspeed_step(rank, zero_stage=0)
        check_deepspeed_step(rank, zero_stage=2)
        queue.put((rank, None))
    except BaseException:                                                   # noqa: BLE001
        queue.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_expert_and_context_parallel_match_one_process():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(port, queue), nprocs=WORLD, start_method="spawn", join=True)
    errors = [queue.get() for _ in range(WORLD)]
    failures = [f"rank {r}:\n{e}" for r, e in errors if e]
    assert not failures, "\n".join(failures)
