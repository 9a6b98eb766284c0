"""``python -m orchestrator.doctor.probe RUN_DIR``: one rank's share of ``orch doctor``.

Started on every rank by the run dir's own launch script (``ORCH_ENTRY=orchestrator.doctor.probe``), so it
meets the same rendezvous, on the same nodes, with the same process-group backend the training would use
(NCCL on GPUs, gloo on CPUs). It reads ``RUN_DIR/doctor/request-<token>.json`` (what to measure, how long
to wait for the rendezvous), and rank 0 writes every rank's results to ``RUN_DIR/doctor/result-<token>.json``.

What each rank measures (the sizes are in :data:`SIZES`; ``quick`` is the preflight's short set):
- facts: host, node rank, device kind, name and count, free memory, the plan's per-rank peak;
- GEMM rate: square matmuls in the run's precision (on CPU also fp32, the core's speed) for a fixed time, in windows longer than a CPU-quota
  period (so a throttled node cannot hide between periods); the best window's rate: what the rank can
  sustain, which a node held back (a CPU quota, a clocked-down GPU) cannot reach in any window, while a
  healthy rank slowed for a moment by a neighbour's burst still does;
- CPU: the trainer's own kernels: forward, backward and optimizer step of the spec's model at the plan's
  micro-batch, on every rank at once with the trainer's threads (:func:`measure_model_step`);
- collectives (nccl-tests conventions: busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather,
  reduce-scatter and all-to-all): over all ranks, inside each node, and across nodes (one rank per node),
  plus the latency of an 8-byte all-reduce;
- pairwise: for each pair of nodes, p2p bandwidth (ping-pong) and small-message latency between their first
  ranks, one pair at a time, so a slow link or node shows in the pairs it belongs to.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from ..node import host_name, mem_available_bytes
from ..train.trainer import write_json

REQUEST_DIR = "doctor"
# (cpu, gpu) per mode: GEMM side, GEMM seconds, windows, collective bytes, iterations, latency iterations.
SIZES = {
    "quick": {"cpu": dict(gemm_n=256, gemm_s=0.6, model_s=2.0, windows=4, nbytes=1 << 20, iters=7, lat_iters=5),
              "gpu": dict(gemm_n=4096, gemm_s=0.5, windows=3, nbytes=32 << 20, iters=5, lat_iters=10)},
    "full": {"cpu": dict(gemm_n=384, gemm_s=1.5, model_s=2.5, windows=5, nbytes=4 << 20, iters=5, lat_iters=20),
             "gpu": dict(gemm_n=8192, gemm_s=2.0, windows=5, nbytes=256 << 20, iters=10, lat_iters=50)},
}
DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}


def request_path(run_dir: Path, token: str) -> Path:
    return Path(run_dir) / REQUEST_DIR / f"request-{token}.json"


def result_path(run_dir: Path, token: str) -> Path:
    return Path(run_dir) / REQUEST_DIR / f"result-{token}.json"


# --- measurements ---------------------------------------------------------------------------------------

def measure_gemm(torch, device, dtype, n: int, seconds: float, windows: int, sync) -> dict:
    """FLOP/s of n x n matmuls: the best of ``windows`` windows of seconds/windows each."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b)
    sync()
    rates = []
    for _ in range(windows):
        count, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            count += 1
            if count % 4 == 0:
                sync()
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds / windows:
                    break
        rates.append(2.0 * n ** 3 * count / elapsed)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "flops": max(rates),
            "window_flops": rates}


MODEL_PROBE_MAX_PARAMS = 50_000_000   # the whole model on one CPU rank: tiny models only (a few s at most)


def model_probe_fits(spec) -> bool:
    """The kernel-mix probe runs the whole dense model on each CPU rank: only where that is small."""
    m = spec.model
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    approx = m.num_layers * (4 * m.hidden_size ** 2 + 3 * m.hidden_size * ffn) + 2 * m.vocab_size * m.hidden_size
    return spec.cluster.gpu == "cpu" and m.moe is None and approx <= MODEL_PROBE_MAX_PARAMS


def measure_model_step(torch, model_spec, micro_batch: int, seconds: float, windows: int, barrier) -> dict:
    """Seconds of one training micro-batch of the whole model on this rank: forward, backward and the optimizer
    step (PyTorch's single-tensor AdamW, as DeepSpeed's ``torch_adam`` on CPU runs it), in ``windows`` windows
    started together (``barrier``); each window's median step, and the median of its two parts (forward +
    backward, then the optimizer step with its zero_grad). What the trainer's kernels achieve here: its small
    GEMMs, its memory-bound passes and autograd's per-op dispatch, at the trainer's thread count, while the
    other ranks run theirs on the same cores (a lone GEMM of the GEMM probe is none of these). The parts are
    kept apart because they scale differently with the layout: a pipeline stage runs part of the forward and
    backward per micro-batch but steps its own parameters once per step (doctor/measured.py)."""
    from ..train.model import GPT  # noqa: PLC0415

    torch.manual_seed(0)
    model = GPT(model_spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    tokens = torch.randint(0, model_spec.vocab_size, (micro_batch, model_spec.seq_length))

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        model(tokens, tokens).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return t1 - t0, time.perf_counter() - t1

    step()
    step()
    out, fwd_bwd, optim = [], [], []
    for _ in range(windows):
        barrier()
        times, t0 = [], time.perf_counter()
        while not times or time.perf_counter() - t0 < seconds / windows:
            times.append(step())
        out.append(statistics.median(a + b for a, b in times))   # the typical step, as cpu_rate and compare read a run
        fwd_bwd.append(statistics.median(a for a, _ in times))
        optim.append(statistics.median(b for _, b in times))
    return {"micro_batch": micro_batch, "window_s": out, "step_s": min(out), "fwd_bwd_window_s": fwd_bwd,
            "optimizer_window_s": optim, "optimizer_params": sum(p.numel() for p in model.parameters())}


def micro_batch_of(chosen: dict, spec) -> int:
    """The micro-batch the trainer runs: the plan's, else the spec's (a run dir written without estimates)."""
    return int(chosen.get("micro_batch_size") or spec.parallelism.micro_batch_size or 1)


CPU_BUCKET_MAX_BYTES = 64 << 20   # a probe of a few seconds at the ~0.1-1 GB/s gloo reaches on a loaded core


def gradient_bucket_bytes(chosen: dict, default: int) -> int:
    """CPU: the bytes of the trainer's gradient reduction (the plan's per-rank gradients; DeepSpeed reduces
    them in buckets of 5e8 elements, estimate/engines.py DS_REDUCE_BUCKET_ELEMENTS, so a CPU-sized model's is
    one call of them all), so gloo is measured at the message size the step pays for; ``default`` without a
    plan."""
    memory = chosen.get("memory") or {}
    grads = max(int(memory.get("params_bytes") or 0), int(memory.get("grads_bytes") or 0))
    return min(grads, CPU_BUCKET_MAX_BYTES) if grads >= 1024 else default


def _all_gather(dist):
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # newer name first


def _reduce_scatter(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _timed(dist, fn, iters: int, sync, group) -> float:
    """Median seconds of fn() over iters runs, each started together (barrier) and synchronised."""
    fn()
    sync()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_collectives(torch, dist, group, n: int, device, nbytes: int, iters: int, lat_iters: int, sync,
                        full: bool) -> dict:
    """Bus bandwidth (GB/s) of each collective over ``group`` (n ranks) and the 8-byte all-reduce latency."""
    numel = max(n, nbytes // 4 // n * n)
    x = torch.ones(numel, device=device)
    out = {"ranks": n, "bytes": numel * 4}
    t = _timed(dist, lambda: dist.all_reduce(x, group=group), iters, sync, group)
    out["all_reduce"] = {"time_s": t, "busbw_GBps": numel * 4 / t * 2 * (n - 1) / n / 1e9}
    tiny = torch.ones(2, device=device)
    out["latency_s"] = _timed(dist, lambda: dist.all_reduce(tiny, group=group), lat_iters, sync, group)
    if not full:
        return out
    shard, whole = torch.ones(numel // n, device=device), torch.empty(numel, device=device)
    for name, fn in (("all_gather", lambda: _all_gather(dist)(whole, shard, group=group)),
                     ("reduce_scatter", lambda: _reduce_scatter(dist)(shard, x, group=group)),
                     ("all_to_all", lambda: dist.all_to_all_single(whole, x, group=group))):
        t = _timed(dist, fn, iters, sync, group)
        out[name] = {"time_s": t, "busbw_GBps": numel * 4 / t * (n - 1) / n / 1e9}
    return out


def measure_pair(torch, dist, me: int, peer: int, first: bool, device, nbytes: int, iters: int,
                 lat_iters: int, sync) -> dict:
    """Ping-pong between two ranks: one-way bandwidth (GB/s) and one-way latency of an 8-byte message."""
    def pingpong(buf):
        def go():
            if first:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
        return go

    big, tiny = torch.ones(nbytes // 4, device=device), torch.ones(2, device=device)
    pingpong(big)()
    sync()
    def one_way_s(buf, n: int) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            pingpong(buf)()
            sync()
            times.append((time.perf_counter() - t0) / 2)
        return statistics.median(times)

    t = one_way_s(big, iters)
    return {"bytes": nbytes, "p2p_GBps": nbytes / t / 1e9, "latency_s": one_way_s(tiny, lat_iters)}


# --- one rank --------------------------------------------------------------------------------------------

def rank_facts(torch, spec, chosen: dict, on_gpu: bool, local_world: int) -> dict:
    """What this rank sees: device kind/name/count, free memory, and what the plan needs per rank."""
    need = int((chosen.get("memory") or {}).get("total_bytes") or 0)
    facts = {"host": host_name(), "python": sys.executable, "pid": os.getpid(),
             "mem_needed_bytes": need, "cpu_count": os.cpu_count() or 1, "local_world_size": local_world}
    if on_gpu:
        free, total = torch.cuda.mem_get_info()
        facts.update(device="cuda", device_name=torch.cuda.get_device_name(), device_count=torch.cuda.device_count(),
                     mem_available_bytes=int(free), mem_total_bytes=int(total))
    else:
        facts.update(device="cpu", device_name="cpu", device_count=0, mem_available_bytes=mem_available_bytes())
    return facts


def probe(run_dir: Path, request: dict) -> dict | None:
    """Measure on this rank; returns every rank's results on rank 0 (None elsewhere)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from ..rundir import read_run_dir  # noqa: PLC0415

    run = read_run_dir(run_dir)
    spec = run.spec
    on_gpu = spec.cluster.gpu != "cpu" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if on_gpu:
        torch.cuda.set_device(local_rank)
        device, sync = torch.device("cuda", local_rank), torch.cuda.synchronize
    else:
        device, sync = torch.device("cpu"), (lambda: None)
        # One thread: the catalog's CPU "device" is one core per process, and several BLAS threads per rank on a
        # shared or oversubscribed node stall on each other (one descheduled thread holds up the GEMM).
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if on_gpu else "gloo",
                            timeout=timedelta(seconds=float(request.get("rendezvous_timeout_s", 60))))
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", "0"))
    size = SIZES[request.get("mode", "full")]["gpu" if on_gpu else "cpu"]
    full = request.get("mode", "full") == "full"
    facts = rank_facts(torch, spec, run.plan.get("chosen") or {}, on_gpu, local_world)
    placement = [None] * world
    dist.all_gather_object(placement, (rank, node, local_rank, facts["host"]))
    result = {"rank": rank, "node_rank": node, "local_rank": local_rank, **facts}
    dtype = getattr(torch, DTYPES.get(spec.training.precision, "float32"))   # the spec's, as the trainer's GEMMs
    dist.barrier()
    result["gemm"] = measure_gemm(torch, device, dtype, size["gemm_n"], size["gemm_s"], size["windows"], sync)
    if not on_gpu and dtype != torch.float32:   # the core's speed: the catalog's CPU figures are fp32 measurements
        result["gemm_fp32"] = measure_gemm(torch, device, torch.float32, size["gemm_n"], size["gemm_s"],
                                           size["windows"], sync)
    chosen = run.plan.get("chosen") or {}
    if not on_gpu and model_probe_fits(spec):
        result["model_step"] = measure_model_step(torch, spec.model, micro_batch_of(chosen, spec),
                                                  size["model_s"], size["windows"], dist.barrier)
    if not on_gpu:
        size = {**size, "nbytes": gradient_bucket_bytes(chosen, size["nbytes"])}
    comm, pairs = _comm(torch, dist, placement, rank, device, size, sync, full)
    result["comm"] = comm
    gathered = [None] * world
    dist.gather_object({**result, "pairs": pairs}, gathered if rank == 0 else None, dst=0)
    dist.barrier()
    dist.destroy_process_group()
    rendezvous = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    return ({"world_size": world, "backend": "nccl" if on_gpu else "gloo", "rendezvous": rendezvous, "ranks": gathered}
            if rank == 0 else None)


def _comm(torch, dist, placement, rank: int, device, size: dict, sync, full: bool) -> tuple[dict, list]:
    """Collectives (world, this node, across nodes) and the pairwise node tests this rank took part in."""
    world = len(placement)
    nodes = sorted({p[1] for p in placement})
    by_node = {n: [p[0] for p in placement if p[1] == n] for n in nodes}
    firsts = [by_node[n][0] for n in nodes]
    args = dict(nbytes=size["nbytes"], iters=size["iters"], lat_iters=size["lat_iters"], sync=sync)
    comm: dict = {}
    if world > 1:
        comm["world"] = measure_collectives(torch, dist, None, world, device, full=full, **args)
    intra_groups = {n: dist.new_group(r) for n, r in by_node.items()}   # every rank creates every group
    inter = dist.new_group(firsts) if len(nodes) > 1 else None
    mine = placement[rank][1]
    if len(by_node[mine]) > 1:
        comm["intra_node"] = measure_collectives(torch, dist, intra_groups[mine], len(by_node[mine]), device,
                                                 full=full, **args)
    dist.barrier()
    if inter is not None and rank in firsts:
        comm["inter_node"] = measure_collectives(torch, dist, inter, len(firsts), device, full=full, **args)
    dist.barrier()
    pairs = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            ra, rb = by_node[a][0], by_node[b][0]
            if rank in (ra, rb):
                peer = rb if rank == ra else ra
                pair = measure_pair(torch, dist, rank, peer, rank == ra, device, **args)
                if rank == ra:
                    pairs.append({"nodes": [a, b], "ranks": [ra, rb], **pair})
            dist.barrier()
    return comm, pairs


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestrator.doctor.probe RUN_DIR (started by `orch doctor`)", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    token = os.environ.get("ORCH_DOCTOR_TOKEN") or _newest_request(run_dir)
    request = json.loads(request_path(run_dir, token).read_text())
    started = time.time()
    out = probe(run_dir, request)
    if out is not None:
        write_json(result_path(run_dir, token), {**out, "token": token, "started_unix": started,
                                                  "seconds": time.time() - started})
    return 0


def _newest_request(run_dir: Path) -> str:
    """The token of the newest request file (pdsh does not forward ORCH_DOCTOR_TOKEN to the hosts)."""
    found = sorted((Path(run_dir) / REQUEST_DIR).glob("request-*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"orch doctor probe: no {REQUEST_DIR}/request-*.json in {run_dir}: run `orch doctor`")
    return found[-1].name[len("request-"):-len(".json")]


if __name__ == "__main__":
    sys.exit(main())
