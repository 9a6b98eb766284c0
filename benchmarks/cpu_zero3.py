"""Where a DeepSpeed ZeRO-3 step of orch's trainer goes on the CPU target, and what gloo's collectives cost.

    torchrun --nproc_per_node 2 benchmarks/cpu_zero3.py RUN_DIR MODE [STEPS]
    torchrun --nproc_per_node 2 benchmarks/cpu_zero3.py --collectives

RUN_DIR: an `orch generate` run dir of a dp = 2 tiny-gpt spec (its spec.resolved.yaml and ds_config.json; the
scheduler is dropped). MODE: as-is (the run's ds_config), z3 (without offload_optimizer), z3p (z3 with every
parameter persistent: the hooks run, nothing is gathered), z0 (ZeRO-0). Prints, for rank 0, the forward, backward
and step phases' wall time and the rank's thread CPU time (time.thread_time: what the rank itself computed, which
a loaded machine inflates far less than the wall time), the deepspeed.comm calls of each phase, and how many
times ZeRO-3's module hooks ran in one step (DeepSpeedZeRoOffload.pre/post_sub_module_*_function).
--collectives times gloo's reduce_scatter_tensor against all_reduce and all_gather_into_tensor of the same
3.5 MB (tiny-gpt's gradients), and the 8-byte all-reduce and 512-byte all-gather latencies (docs/cost-model.md,
"CPU ranks: DeepSpeed ZeRO-3 (and offload) on gloo"). Take minimums; run with `nice` on a shared machine.
"""
import collections
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)


def _summary(name, values):
    return f"{name} min {min(values) * 1e3:.2f} med {statistics.median(values) * 1e3:.2f}"


def collectives(reps: int = 60) -> None:
    dist.init_process_group("gloo")
    big, half, full = torch.ones(875_000), torch.zeros(437_500), torch.zeros(875_000)
    x8, small_in, small_out = torch.zeros(2), torch.zeros(64), torch.zeros(128)
    ops = {"reduce_scatter_tensor 3.5MB": lambda: dist.reduce_scatter_tensor(half, big),
           "all_reduce 3.5MB": lambda: dist.all_reduce(big),
           "all_gather_into_tensor 3.5MB": lambda: dist.all_gather_into_tensor(full, half),
           "all_reduce 8B": lambda: dist.all_reduce(x8),
           "all_gather_into_tensor 512B": lambda: dist.all_gather_into_tensor(small_out, small_in)}
    times = {k: [] for k in ops}
    for _ in range(reps):
        for name, op in ops.items():            # interleaved: each sees the same load
            dist.barrier()
            t0 = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        for name, values in times.items():
            print(_summary(name, values[5:]), "ms")
    dist.destroy_process_group()


def phases(run_dir: str, mode: str, steps: int) -> None:
    import deepspeed  # noqa: PLC0415
    import deepspeed.comm as dscomm  # noqa: PLC0415
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload  # noqa: PLC0415

    from orchestrator.spec_loader import load_spec  # noqa: PLC0415
    from orchestrator.train.model import GPT  # noqa: PLC0415

    deepspeed.init_distributed(dist_backend="gloo")
    spec = load_spec(os.path.join(run_dir, "spec.resolved.yaml"))
    cfg = json.load(open(os.path.join(run_dir, "ds_config.json")))
    cfg.pop("scheduler", None)
    zero = cfg["zero_optimization"]
    if mode in ("z3", "z3p"):
        zero.pop("offload_optimizer", None)
    if mode == "z3p":
        zero["stage3_param_persistence_threshold"] = 10**9
    if mode == "z0":
        cfg["zero_optimization"] = {"stage": 0}
    phase, calls, hooks = ["init"], collections.Counter(), collections.Counter()

    def count_calls(name):
        fn = getattr(dscomm, name)

        def counted(*args, **kwargs):
            calls[(phase[0], name)] += 1
            return fn(*args, **kwargs)
        setattr(dscomm, name, counted)

    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "allgather_fn", "reduce_scatter_fn"):
        count_calls(name)

    def count_hooks(name):
        fn = getattr(DeepSpeedZeRoOffload, name)

        def counted(self, module):
            hooks[name] += phase[0] != "warm"
            return fn(self, module)
        setattr(DeepSpeedZeRoOffload, name, counted)

    for name in ("pre_sub_module_forward_function", "pre_sub_module_backward_function"):
        count_hooks(name)
    torch.manual_seed(0)
    model = GPT(spec.model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    mb, seq, vocab = cfg["train_micro_batch_size_per_gpu"], spec.model.seq_length, spec.model.vocab_size
    tokens = torch.randint(0, vocab, (mb, seq), generator=torch.Generator().manual_seed(dist.get_rank()))
    wall, cpu = collections.defaultdict(list), collections.defaultdict(list)
    for i in range(steps + 5):
        warm = i < 5
        marks = []
        dist.barrier()
        for name, run in (("fwd", lambda: engine(tokens, tokens)), ("bwd", lambda: engine.backward(loss)),
                          ("step", engine.step)):
            phase[0] = "warm" if warm else name
            t0, c0 = time.perf_counter(), time.thread_time()
            out = run()
            marks.append((name, time.perf_counter() - t0, time.thread_time() - c0))
            if name == "fwd":
                loss = out
        if not warm:
            for name, w, c in marks:
                wall[name].append(w)
                cpu[name].append(c)
    if dist.get_rank() == 0:
        print(f"{mode}: optimizer {type(engine.optimizer).__name__} "
              f"over {type(getattr(engine.optimizer, 'optimizer', None)).__name__}")
        print("wall ", ", ".join(_summary(k, v) for k, v in wall.items()), "ms")
        print("cpu  ", ", ".join(_summary(k, v) for k, v in cpu.items()), "ms")
        for (ph, name), n in sorted(calls.items()):
            if ph in wall:
                print(f"  {ph} {name}: {n / steps:.1f} a step")
        for name, n in sorted(hooks.items()):
            print(f"  {name}: {n / steps:.1f} a step")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--collectives":
        collectives()
    else:
        phases(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)
