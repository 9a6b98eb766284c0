"""Train a small, randomly initialised GPT-2 with the Hugging Face Trainer (no download), e.g. under DeepSpeed:

    deepspeed hf_train.py --deepspeed ds_config.json --output_dir out --max_steps 20 ...

It knows nothing of orch: HfArgumentParser over its own model arguments and TrainingArguments, a synthetic
dataset (a fixed random permutation of the vocabulary: token t+1 follows from token t), Trainer.train().
"""
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    n_layer: int = field(default=4)
    n_embd: int = field(default=128)
    n_head: int = field(default=4)
    seq_length: int = field(default=128)
    vocab_size: int = field(default=512)
    num_samples: int = field(default=4096, metadata={"help": "synthetic sequences in the dataset"})


class PermutationDataset(torch.utils.data.Dataset):
    def __init__(self, vocab_size, seq_length, num_samples, seed=1234):
        g = torch.Generator().manual_seed(seed)
        next_token = torch.randperm(vocab_size, generator=g)
        tokens = torch.empty(num_samples, seq_length, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=g)
        for t in range(seq_length - 1):
            tokens[:, t + 1] = next_token[tokens[:, t]]
        self.tokens = tokens

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main():
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=model_args.n_head,
                        n_positions=model_args.seq_length, vocab_size=model_args.vocab_size)
    model = GPT2LMHeadModel(config)
    dataset = PermutationDataset(model_args.vocab_size, model_args.seq_length, model_args.num_samples,
                                 seed=training_args.seed)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    result = trainer.train()
    if trainer.is_world_process_zero():
        print(f"train_loss {result.training_loss:.4f} after {result.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
