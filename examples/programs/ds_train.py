"""Train a small GPT with DeepSpeed, written the way DeepSpeed's tutorials write a training script.

It knows nothing of orch: argparse, deepspeed.add_config_arguments, deepspeed.initialize, its own loop, on
synthetic tokens (a fixed random permutation: token t+1 follows from token t, so the loss falls).

    deepspeed ds_train.py --deepspeed_config ds_config.json --steps 20
    deepspeed ds_train.py --deepspeed_config ds_config.json --pipeline-parallel-size 2   # PipelineModule
    deepspeed ds_train.py --deepspeed_config ds_config.json --save_dir ckpt --save_interval 4
    deepspeed ds_train.py --deepspeed_config ds_config.json --save_dir ckpt --load_dir ckpt   # continue

Checkpoints as in DeepSpeed's tutorial: engine.save_checkpoint(save_dir, client_state={"step": step}) every
--save_interval steps and at the end, engine.load_checkpoint(load_dir) at the start (the tag its latest file
names); training continues after the loaded step. Step s trains on the same global batch whatever the number
of data-parallel ranks (sample i of step s is drawn from (seed, s, i)).

The ZeRO stage is the config's zero_optimization.stage; with stage 3 the model is built under
deepspeed.zero.Init, so each rank only ever holds its shard.
"""
import argparse
import contextlib
import json
import math
import os
import time

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    parser = argparse.ArgumentParser(description="small GPT on synthetic tokens")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--save_dir", default=None, help="save a checkpoint there every --save_interval steps and "
                        "at the end")
    parser.add_argument("--load_dir", default=None, help="continue from the checkpoint its latest file names")
    parser.add_argument("--save_interval", type=int, default=0, help="steps between checkpoints (0: only the last)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="record the run with torch.profiler (one 'train_step N' range per step) and write "
                             "each rank's Chrome trace to DIR/trace-rank<RANK>.json")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Embedding(nn.Module):
    def __init__(self, vocab, hidden, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)[None]


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


def lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = Embedding(args.vocab_size, args.hidden_size, args.seq_length)
        self.blocks = nn.ModuleList(Block(args.hidden_size, args.num_heads) for _ in range(args.num_layers))
        self.head = Head(args.hidden_size, args.vocab_size)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return lm_loss(self.head(x), labels)


def pipeline_model(args):
    from deepspeed.pipe import LayerSpec, PipelineModule

    layers = [LayerSpec(Embedding, args.vocab_size, args.hidden_size, args.seq_length)]
    layers += [LayerSpec(Block, args.hidden_size, args.num_heads) for _ in range(args.num_layers)]
    layers += [LayerSpec(Head, args.hidden_size, args.vocab_size)]
    return PipelineModule(layers=layers, num_stages=args.pipeline_parallel_size, loss_fn=lm_loss,
                          partition_method="uniform")


class SyntheticTokens:
    """Sequences of a fixed random permutation of the vocabulary, each from a random first token: the first
    tokens of step s's global batch come from (seed, s); data-parallel rank r's micro-batch j holds samples
    (j * dp + r) * micro + k of it."""

    def __init__(self, vocab, seq, seed, *, global_batch, dp, dp_rank):
        g = torch.Generator().manual_seed(seed)
        self.next_token = torch.randperm(vocab, generator=g)
        self.vocab, self.seq, self.seed = vocab, seq, seed
        self.global_batch, self.dp, self.dp_rank = global_batch, dp, dp_rank

    def step_batches(self, step, micro, accumulation):
        """This rank's ``accumulation`` micro-batches of step ``step``."""
        g = torch.Generator().manual_seed(self.seed * 100003 + step)
        first = torch.randint(self.vocab, (self.global_batch,), generator=g)
        return [self.batch(first[(j * self.dp + self.dp_rank) * micro:][:micro]) for j in range(accumulation)]

    def batch(self, first):
        tokens = torch.empty(len(first), self.seq + 1, dtype=torch.long)
        tokens[:, 0] = first
        for t in range(self.seq):
            tokens[:, t + 1] = self.next_token[tokens[:, t]]
        return tokens[:, :-1], tokens[:, 1:]


def main():
    args = parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(args.seed)
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if args.pipeline_parallel_size > 1:
        model = pipeline_model(args)
    else:
        with deepspeed.zero.Init(config_dict_or_path=config, enabled=stage == 3):
            model = GPT(args)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    micro, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    data = SyntheticTokens(args.vocab_size, args.seq_length, args.seed, global_batch=engine.train_batch_size(),
                           dp=engine.dp_world_size, dp_rank=torch.distributed.get_rank(engine.data_parallel_group))
    rank = torch.distributed.get_rank()
    start = 0
    if args.load_dir:
        load_path, client_state = engine.load_checkpoint(args.load_dir)
        if load_path is None:
            raise SystemExit(f"no checkpoint to load under {args.load_dir}")
        start = (client_state or {}).get("step", engine.global_steps)
        if rank == 0:
            print(f"loaded {load_path}: continuing after step {start}", flush=True)
    profiler = contextlib.nullcontext()
    if args.profile:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    began = time.perf_counter()
    with profiler as prof:
        for step in range(start + 1, args.steps + 1):
            with torch.profiler.record_function(f"train_step {step}") if args.profile else contextlib.nullcontext():
                loss = train_step(args, engine, data.step_batches(step, micro, accumulation))
            if rank == 0 and (step % args.log_interval == 0 or step == start + 1):
                print(f"step {step}/{args.steps} loss {float(loss):.4f} (ZeRO-{stage}, "
                      f"pp {args.pipeline_parallel_size}, ln(vocab) {math.log(args.vocab_size):.2f})", flush=True)
            if args.save_dir and (step == args.steps or args.save_interval and step % args.save_interval == 0):
                engine.save_checkpoint(args.save_dir, client_state={"step": step})
    elapsed = time.perf_counter() - began
    if rank == 0:
        print(f"trained {args.steps - start} steps in {elapsed:.3f} s", flush=True)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.profile, f"trace-rank{rank}.json"))
    torch.distributed.barrier()


def train_step(args, engine, batches):
    """One optimizer step: the pipeline's train_batch, or forward/backward/step per micro-batch."""
    if args.pipeline_parallel_size > 1:
        return engine.train_batch(data_iter=iter(batches))
    total = 0.0
    for tokens, labels in batches:
        loss = engine(tokens.to(engine.device), labels.to(engine.device))
        engine.backward(loss)
        engine.step()
        total += loss.item() / len(batches)
    return torch.tensor(total)


if __name__ == "__main__":
    main()
