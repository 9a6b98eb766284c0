"""A minimal DeepSpeed training script, written the way DeepSpeed's tutorials write one: argparse,
deepspeed.add_config_arguments, deepspeed.initialize, its own loop. It imports nothing from orch; orch runs it
with `--deepspeed_config RUN_DIR/ds_config.json` (examples/ds-script-cpu.yaml).

    deepspeed ds_minimal.py --deepspeed_config ds_config.json      # or: torchrun --nproc_per_node 2 ...
"""
import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch import nn


def parse_args():
    parser = argparse.ArgumentParser(description="a small MLP regression trained with DeepSpeed")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: run for 20)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(args.hidden, 4 * args.hidden), nn.GELU(), nn.Linear(4 * args.hidden, args.hidden))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    micro = engine.train_micro_batch_size_per_gpu()
    target = nn.Linear(args.hidden, args.hidden)      # the function to learn, the same on every rank
    for step in range(args.steps or 20):
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(micro, args.hidden)
            loss = nn.functional.mse_loss(engine(x), target(x).detach())
            engine.backward(loss)
            engine.step()
        if engine.global_rank == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    engine.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
