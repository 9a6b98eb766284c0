"""A GPT-style decoder sized by the spec's ``model:`` section, in plain PyTorch.

Pre-norm blocks (norm -> attention -> residual, norm -> MLP -> residual) honouring num_layers,
hidden_size, num_attention_heads, num_query_groups (GQA), ffn_hidden_size, gated_mlp (SwiGLU),
normalization (layernorm | rmsnorm), position_embedding (learned | rope), add_bias_linear and
tie_embeddings. The vocabulary is the spec's vocab_size (no padding: this is not Megatron).

The same pieces serve both engines of DeepSpeed: :class:`GPT` (one module, pp = 1) and
:func:`pipeline_specs` (a flat layer list for DeepSpeed's PipelineModule, pp > 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _norm(model_spec) -> nn.Module:
    if model_spec.normalization == "rmsnorm":
        return nn.RMSNorm(model_spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(model_spec.hidden_size, eps=1e-5)


def rope_tables(seq_length: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of rotary position embeddings, shape [seq, head_dim / 2]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the head dimension; x is [b, heads, s, d]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads; the core runs in scaled_dot_product_attention."""

    def __init__(self, m, selective_recompute: bool = False):
        super().__init__()
        self.num_heads, self.num_groups = m.num_attention_heads, m.num_query_groups
        self.head_dim = m.hidden_size // m.num_attention_heads
        kv_width = self.head_dim * self.num_groups
        self.q = nn.Linear(m.hidden_size, m.hidden_size, bias=m.add_bias_linear)
        self.kv = nn.Linear(m.hidden_size, 2 * kv_width, bias=m.add_bias_linear)
        self.out = nn.Linear(m.hidden_size, m.hidden_size, bias=m.add_bias_linear)
        self.rope = m.position_embedding == "rope"
        self.selective_recompute = selective_recompute
        if self.rope:
            cos, sin = rope_tables(m.seq_length, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=self.num_groups != self.num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.num_groups, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope:
            q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        if self.selective_recompute and self.training:
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """GeLU MLP (2 matrices) or SwiGLU (3 matrices: gate and up fused in fc1)."""

    def __init__(self, m):
        super().__init__()
        self.gated = m.gated_mlp
        width = 2 * m.ffn_hidden_size if self.gated else m.ffn_hidden_size
        self.fc1 = nn.Linear(m.hidden_size, width, bias=m.add_bias_linear)
        self.fc2 = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=m.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        return self.fc2(y)


class Block(nn.Module):
    """One transformer layer. recompute: "none" | "selective" (attention core) | "full" (the layer)."""

    def __init__(self, m, recompute: str = "none"):
        super().__init__()
        self.norm1, self.norm2 = _norm(m), _norm(m)
        self.attn = Attention(m, selective_recompute=recompute == "selective")
        self.mlp = MLP(m)
        self.full_recompute = recompute == "full"

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and self.training:
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class WordEmbedding(nn.Module):
    """Token embedding; with tied embeddings the output layer reuses ``weight`` (see :func:`logits`)."""

    def __init__(self, m):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(m.vocab_size, m.hidden_size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


def logits(embedding: WordEmbedding, x: torch.Tensor) -> torch.Tensor:
    """The tied output layer: hidden states times the embedding matrix transposed."""
    return F.linear(x, embedding.weight)


class PositionEmbedding(nn.Module):
    """Adds learned absolute positions (a no-op with rope, which rotates inside attention)."""

    def __init__(self, m):
        super().__init__()
        self.learned = m.position_embedding == "learned"
        if self.learned:
            self.weight = nn.Parameter(torch.empty(m.seq_length, m.hidden_size))
            nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[: x.shape[1]] if self.learned else x


class OutputLayer(nn.Module):
    """Untied output projection hidden -> vocabulary."""

    def __init__(self, m):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(m.vocab_size, m.hidden_size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class FinalNorm(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.norm = _norm(m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def lm_loss(logits_: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy (computed in fp32 whatever the training dtype)."""
    return F.cross_entropy(logits_.float().reshape(-1, logits_.shape[-1]), labels.reshape(-1))


def _init_residual_projections(module: nn.Module, num_layers: int) -> None:
    """GPT-2 style: scale the projections that write into the residual stream by 1/sqrt(2L)."""
    for name, p in module.named_parameters():
        if name.endswith((".out.weight", ".fc2.weight")):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * num_layers))
        elif name.endswith((".q.weight", ".kv.weight", ".fc1.weight")):
            nn.init.normal_(p, std=0.02)


class GPT(nn.Module):
    """The whole decoder as one module: forward(tokens, labels) -> mean loss."""

    def __init__(self, m, recompute: str = "none"):
        super().__init__()
        self.embed = WordEmbedding(m)
        self.pos = PositionEmbedding(m)
        self.blocks = nn.ModuleList(Block(m, recompute) for _ in range(m.num_layers))
        self.final_norm = FinalNorm(m)
        self.output = None if m.tie_embeddings else OutputLayer(m)
        _init_residual_projections(self, m.num_layers)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.pos(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        out = logits(self.embed, x) if self.output is None else self.output(x)
        return lm_loss(out, labels)


class BlockPipe(Block):
    """A Block for the pipeline (initialised like GPT's residual projections)."""

    def __init__(self, m, recompute: str = "none"):
        super().__init__(m, recompute)
        _init_residual_projections(self, m.num_layers)


PIPELINE_LEAD_SPECS = 2   # word embedding, position embedding: before the blocks, on the first stage
PIPELINE_TAIL_SPECS = 2   # final norm, output layer: after the blocks, on the last stage


def stage_bounds(stage_layers: tuple[int, ...] | list[int]) -> list[int]:
    """Indices into :func:`pipeline_specs` where each pipeline stage starts, plus the end: stage r holds
    ``stage_layers[r]`` blocks, the first stage also the embeddings, the last the final norm and output
    (where Megatron-LM puts them). DeepSpeed's ``PipelineModule.parts`` has this shape."""
    parts, last = [0], len(stage_layers) - 1
    for r, count in enumerate(stage_layers):
        parts.append(parts[-1] + count + (PIPELINE_LEAD_SPECS if r == 0 else 0)
                     + (PIPELINE_TAIL_SPECS if r == last else 0))
    return parts


def pipeline_specs(m, recompute: str = "none") -> list:
    """The decoder as a flat list of DeepSpeed LayerSpecs (embedding ... blocks ... output).

    With tied embeddings the first and last stage share the word embedding through a TiedLayerSpec,
    whose gradients DeepSpeed all-reduces between those stages every step.
    """
    from deepspeed.pipe import LayerSpec, TiedLayerSpec  # noqa: PLC0415

    tied = m.tie_embeddings
    first = TiedLayerSpec("embed", WordEmbedding, m) if tied else LayerSpec(WordEmbedding, m)
    last = TiedLayerSpec("embed", WordEmbedding, m, forward_fn=logits) if tied else LayerSpec(OutputLayer, m)
    # Pipeline recomputation is DeepSpeed's activation_checkpoint_interval, not the block's own.
    block_recompute = "selective" if recompute == "selective" else "none"
    return [first, LayerSpec(PositionEmbedding, m),
            *[LayerSpec(BlockPipe, m, block_recompute) for _ in range(m.num_layers)],
            LayerSpec(FinalNorm, m), last]


def count_parameters(module: nn.Module) -> int:
    """Parameters of a module (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
