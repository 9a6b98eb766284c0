"""Host overheads of DeepSpeed's engine, measured: per ZeRO-3 module fetch and per pipeline micro-batch.

    torchrun --nproc_per_node 2 benchmarks/ds_host_overhead.py MODE K GAS   (MODE: torch | z0 | z2 | z3 | z3p | z3off | pipe)

A model of K Linear(8, 8) modules does next to no arithmetic, so a step's time is the engine's own work.
ZeRO-3 fetches every module's parameters in the forward and again in the backward (persistence threshold
0): (t(z3, K=32) - t(z0, K=32) - (t(z3, K=2) - t(z0, K=2))) / (2 * 30) is the host time of one module
fetch (CostModel.zero3_fetch_host_s). DeepSpeed's pipeline engine with 2 stages: (t(gas=9) - t(gas=1)) / 8
is the host time of one micro-batch's instructions (CostModel.pipeline_microbatch_host_s). z3off is z3 with
the optimizer offloaded to the CPU (offload_optimizer device cpu): (t(z3off, K=32) - t(z3, K=32) - (t(z3off,
K=2) - t(z3, K=2))) / (2 * 30) is the offload path's host time per parameter tensor and step (K Linear
modules hold 2K tensors: weight and bias; CostModel.offload_tensor_host_s). z3p persists every parameter
(ZeRO-3's module hooks run but gather nothing): (t(z3p, K=32) - t(z0, K=32) - (t(z3p, K=2) - t(z0, K=2))) /
(2 * 30) is the host time of one hook pass over a module whose parameters stay resident (norms, biases).
torch runs the same step in plain PyTorch (flat all_reduce, clip, AdamW), the baseline of what DeepSpeed adds:
at 04:10 UTC (load ~1.4, nice -19, minimum) torch K=2 1.06, K=32 3.25; z2 K=2 2.61, K=32 5.53; z0 K=2 1.59,
K=32 4.20 -> DeepSpeed adds ~1.5 ms per step and ~13 us per parameter tensor over plain PyTorch (medians: ~3.3 ms,
~24 us): within CostModel.ds_step_host_s for orch's CPU models (60 tensors); not a separate term.
(t(z2, K=32) - t(z0, K=32) - (t(z2, K=2) - t(z0, K=2))) / (2 * 30) is ZeRO-1/2's host time per parameter tensor
and micro-batch (its gradient hook, the bucket copy, the partitioned step). At 02:42 UTC (load < 1, minimum):
z2 K=2 2.57, K=32 4.91; z0 K=2 1.95, K=32 4.18 -> 0.002 ms per tensor: negligible, no cost-model term. Prints the
minimum, first quartile and median of 30 steps after 10 warm-up steps; take the minimum on a busy machine.
Measured on the CPU target (2 cores, others working, 2026-12-01): z0 K=32 6.6 ms, z3 K=32 47.8 ms, z0 K=2
1.9 ms, z3 K=2 4.6 ms -> 0.64 ms per fetch; pipe gas=1 2.8 ms, gas=9 11.4 ms -> 1.08 ms per micro-batch.
Again at 02:30 UTC (load average ~3, minimum): z0 K=2 2.21, K=32 4.15; z3 K=2 5.73, K=32 42.64 (0.58 ms per
fetch); z3off K=2 5.16, K=32 45.91 -> 0.064 ms per parameter tensor; pipe gas=1 2.35, gas=9 8.50 (0.77 ms).
"""
import os, sys, time, statistics, torch, deepspeed
import torch.distributed as dist
from deepspeed.pipe import PipelineModule
torch.set_num_threads(1)
mode, K, gas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deepspeed.init_distributed(dist_backend="gloo")
layers = [torch.nn.Linear(8, 8) for _ in range(K)]
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas, "steps_per_print": 10**9,
       "gradient_clipping": 1.0,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
       "zero_optimization": {"stage": 3 if mode == "z3" else 0, "stage3_param_persistence_threshold": 0,
                             "stage3_prefetch_bucket_size": 1, "overlap_comm": True}}
if mode == "z2":      # ZeRO-2: a gradient hook per parameter tensor copies it into the reduce bucket
    cfg["zero_optimization"].update(stage=2)
if mode == "z3p":     # every parameter persistent: ZeRO-3's hooks run, but gather nothing
    cfg["zero_optimization"].update(stage=3, stage3_param_persistence_threshold=10**9)
if mode == "z3off":
    cfg["zero_optimization"]["stage"] = 3
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
if mode == "pipe":
    cfg["zero_optimization"] = {"stage": 0}
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    cfg["train_batch_size"] = gas
else:
    model = torch.nn.Sequential(*layers)
    cfg["train_batch_size"] = 2 * gas
x, t = torch.randn(1, 8), torch.randn(1, 8)
if mode == "torch":  # the same step in plain PyTorch: no engine (flat gradient all_reduce, clip, AdamW)
    class _Plain:
        def __init__(self, module):
            self.module, self.params = module, list(module.parameters())
            self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        def __call__(self, inp):
            return self.module(inp)
        def backward(self, loss):
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in self.params]); dist.all_reduce(flat)
            torch._utils._unflatten_dense_tensors(flat, [p.grad for p in self.params])
        def step(self):
            torch.nn.utils.clip_grad_norm_(self.params, 1.0); self.opt.step(); self.opt.zero_grad()
    engine = _Plain(model)
else:
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()], config=cfg)
times = []
for step in range(40):
    dist.barrier(); t0 = time.perf_counter()
    if mode == "pipe":
        engine.train_batch(data_iter=iter([(x, t)] * gas))
    else:
        for _ in range(gas):
            loss = ((engine(x) - t) ** 2).mean(); engine.backward(loss); engine.step()
    dist.barrier(); times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    times = sorted(times[10:])
    print(f"RESULT {mode} K={K} gas={gas} min={times[0]*1e3:.2f}ms p25={times[len(times)//4]*1e3:.2f}ms median={statistics.median(times)*1e3:.2f}ms")
dist.barrier(); engine.destroy() if hasattr(engine, "destroy") else None; dist.destroy_process_group()
