"""Training data: deterministic, seeded, and a pure function of (step, sample index within the step).

Each sample of a step's global batch has an index k in [0, global_batch_size); micro-batch j of
data-parallel rank r holds the samples k = (j * dp + r) * micro_batch_size + i (Megatron-LM's sampler
order). Nothing here has state to checkpoint: a resumed run asks for step s+1 and gets exactly the batch
an uninterrupted run would have seen, under any layout (another dp size, micro-batch or accumulation
count gives each rank other samples, but every step still holds the same global batch).

- :class:`MarkovTokens` (``data.synthetic: true``): sequences drawn from a fixed random Markov chain
  over the vocabulary. Each token has 4 possible successors with fixed probabilities (0.5, 0.25, 0.15,
  0.1); the successors are drawn from a Zipf distribution over a random order of the vocabulary, so
  some tokens are far more frequent than others. A model learns the frequencies within a few steps and
  the transitions after that: the loss falls quickly from ln(V) towards the chain's entropy (~1.2 nats).
- :class:`ByteTextTokens` (``data.synthetic: false`` and ``data.path`` a text file): the file's bytes
  as tokens (vocabulary >= 256), windows at seeded random offsets.
"""
from __future__ import annotations

from pathlib import Path

import torch

SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.1)
_MASK = (1 << 63) - 1


def sample_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit seed unique to sample ``index`` of the global batch of ``step``."""
    value = seed
    for part in (step, index):
        value = (value * 1_000_003 + part + 1) * 6364136223846793005 & _MASK
    return value


def first_sample(dp_rank: int, micro_index: int, batch_size: int, dp_size: int) -> int:
    """Index in its step's global batch of the first sample of micro-batch ``micro_index`` of ``dp_rank``."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} is not in [0, dp_size {dp_size})")
    return (micro_index * dp_size + dp_rank) * batch_size


class _Samples:
    """micro_batch() from per-sample draws: subclasses define sample(step, index) -> 1-D int64 of seq + 1."""

    def micro_batch(self, step: int, dp_rank: int, micro_index: int, batch_size: int, *, dp_size: int):
        """(tokens, labels), each [batch_size, seq_length] int64; labels are tokens shifted by one."""
        first = first_sample(dp_rank, micro_index, batch_size, dp_size)
        seq = torch.stack([self.sample(step, first + i) for i in range(batch_size)])
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class MarkovTokens(_Samples):
    """Sequences from a fixed random Markov chain (the chain itself is drawn from ``seed``)."""

    def __init__(self, vocab_size: int, seq_length: int, seed: int, probs: tuple = SUCCESSOR_PROBS):
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed
        g = torch.Generator().manual_seed(seed)
        zipf = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
        order = torch.randperm(vocab_size, generator=g)
        picks = torch.multinomial(zipf, vocab_size * len(probs), replacement=True, generator=g)
        self.successors = order[picks].view(vocab_size, len(probs))
        self._successors = self.successors.tolist()      # the walk below indexes plain lists: ~10x faster
        self.probs = torch.tensor(probs, dtype=torch.float64)

    def sample(self, step: int, index: int):
        """seq_length + 1 tokens: a walk of the chain from a seeded random first token."""
        g = torch.Generator().manual_seed(sample_seed(self.seed, step, index))
        token = int(torch.randint(self.vocab_size, (1,), generator=g))
        picks = torch.multinomial(self.probs, self.seq_length, replacement=True, generator=g).tolist()
        # The chain is sequential: a per-token torch indexing op would cost ~6 us of dispatch per position
        # (0.8 ms per tiny-gpt micro-batch, on the CPU target's critical path); plain ints cost ~0.1 us.
        successors, row = self._successors, [token]
        for pick in picks:
            token = successors[token][pick]
            row.append(token)
        return torch.tensor(row, dtype=torch.long)


class ByteTextTokens(_Samples):
    """A text file's bytes as tokens; each sequence starts at a seeded random offset."""

    def __init__(self, path: str | Path, seq_length: int, seed: int):
        data = Path(path).read_bytes()
        if len(data) < seq_length + 2:
            raise ValueError(f"{path}: {len(data)} bytes, need at least seq_length + 2 = {seq_length + 2}")
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.seq_length, self.seed = seq_length, seed

    def sample(self, step: int, index: int):
        g = torch.Generator().manual_seed(sample_seed(self.seed, step, index))
        start = int(torch.randint(len(self.tokens) - self.seq_length - 1, (1,), generator=g))
        return self.tokens[start:start + self.seq_length + 1]


def build_dataset(spec, run_dir: Path | None = None):
    """The dataset a spec asks for (a relative data.path is looked up in the run dir, then the cwd)."""
    m = spec.model
    if spec.data.synthetic:
        return MarkovTokens(m.vocab_size, m.seq_length, spec.training.seed)
    path = Path(spec.data.path)
    if not path.is_absolute() and run_dir is not None and (run_dir / path).exists():
        path = run_dir / path
    if m.vocab_size < 256:
        raise ValueError(f"byte-level text data needs model.vocab_size >= 256, got {m.vocab_size}")
    return ByteTextTokens(path, m.seq_length, spec.training.seed)
