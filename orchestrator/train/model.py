"""A GPT-style decoder sized by the spec's ``model:`` section, in plain PyTorch.

Pre-norm blocks (norm -> attention -> residual, norm -> MLP -> residual) honouring num_layers,
hidden_size, num_attention_heads, num_query_groups (GQA), ffn_hidden_size, gated_mlp (SwiGLU),
normalization (layernorm | rmsnorm), position_embedding (learned | rope), add_bias_linear,
tie_embeddings and kv_channels (a head dimension other than hidden / heads). The vocabulary is the
spec's vocab_size (no padding: this is not Megatron).

With ``model.moe`` the blocks after the first ``first_dense_layers`` have a Mixture-of-Experts
feed-forward (moe.py; experts spread over ``ep`` ranks), and the loss adds the routers' load-balancing
losses. With a :class:`~orchestrator.train.ulysses.ContextGroup` (context parallelism, Ulysses) each rank
holds a chunk of the positions and attention exchanges it for a share of the heads (ulysses.py).

The same pieces serve both engines of DeepSpeed: :class:`GPT` (one module, pp = 1) and
:func:`pipeline_specs` (a flat layer list for DeepSpeed's PipelineModule, pp > 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .mlp import MLP
from .ulysses import ContextGroup, heads_to_seq, seq_to_heads


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


def head_dim(m) -> int:
    """model.kv_channels when set, else hidden_size / num_attention_heads."""
    return getattr(m, "kv_channels", None) or m.hidden_size // m.num_attention_heads


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads; the core runs in scaled_dot_product_attention.

    With ``cp`` (Ulysses) the input holds this rank's chunk of the positions; q, k and v go to
    [all positions, heads / cp] before rotary embedding and the core, and the result comes back."""

    def __init__(self, m, selective_recompute: bool = False, cp: ContextGroup | None = None):
        super().__init__()
        self.num_heads, self.num_groups = m.num_attention_heads, m.num_query_groups
        self.head_dim = head_dim(m)
        kv_width = self.head_dim * self.num_groups
        self.q = nn.Linear(m.hidden_size, self.head_dim * self.num_heads, bias=m.add_bias_linear)
        self.kv = nn.Linear(m.hidden_size, 2 * kv_width, bias=m.add_bias_linear)
        self.out = nn.Linear(self.head_dim * self.num_heads, m.hidden_size, bias=m.add_bias_linear)
        self.rope = m.position_embedding == "rope"
        self.selective_recompute = selective_recompute
        self.cp = cp if cp is not None and cp.size > 1 else None
        if self.rope:
            cos, sin = rope_tables(m.seq_length, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])

    def _to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Ulysses: [b, s/cp, heads, d] -> [b, s, heads/cp, d] (KV groups not divisible by cp repeated)."""
        if self.num_groups % self.cp.size:
            repeat = self.num_heads // self.num_groups
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        return seq_to_heads(q, self.cp), seq_to_heads(k, self.cp), seq_to_heads(v, self.cp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.num_heads, self.head_dim)
        k, v = self.kv(x).view(b, s, 2, self.num_groups, self.head_dim).unbind(2)
        if self.cp is not None:
            q, k, v = self._to_heads(q, k, v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)       # [b, heads, s, d]
        if self.rope:
            q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        if self.selective_recompute and self.training:
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        y = y.transpose(1, 2)                                                   # [b, s, heads, d]
        if self.cp is not None:
            y = heads_to_seq(y, self.cp)
        return self.out(y.reshape(b, s, self.num_heads * self.head_dim))


class Block(nn.Module):
    """One transformer layer. recompute: "none" | "selective" (attention core) | "full" (the layer).
    ``mlp``: the feed-forward (default: the dense MLP; an MoE layer for MoE blocks)."""

    def __init__(self, m, recompute: str = "none", *, mlp: nn.Module | None = None, cp: ContextGroup | None = None):
        super().__init__()
        self.norm1, self.norm2 = _norm(m), _norm(m)
        self.attn = Attention(m, selective_recompute=recompute == "selective", cp=cp)
        self.mlp = MLP(m) if mlp is None else mlp
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
    """Adds learned absolute positions (a no-op with rope, which rotates inside attention).
    ``offset``: the first position of this rank's chunk (context parallelism)."""

    def __init__(self, m, offset: int = 0):
        super().__init__()
        self.learned, self.offset = m.position_embedding == "learned", offset
        if self.learned:
            self.weight = nn.Parameter(torch.empty(m.seq_length, m.hidden_size))
            nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[self.offset: self.offset + x.shape[1]] if self.learned else x


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


def residual_std(num_layers: int) -> float:
    return 0.02 / math.sqrt(2 * num_layers)


def _init_residual_projections(module: nn.Module, num_layers: int) -> None:
    """GPT-2 style: scale the projections that write into the residual stream by 1/sqrt(2L). Routed
    experts (``allreduce = False``, DeepSpeed's mark) are drawn by moe.py, the same for every ep."""
    for name, p in module.named_parameters():
        if getattr(p, "allreduce", True) is False:
            continue
        if name.endswith((".out.weight", ".fc2.weight")):
            nn.init.normal_(p, std=residual_std(num_layers))
        elif name.endswith((".q.weight", ".kv.weight", ".fc1.weight")):
            nn.init.normal_(p, std=0.02)


class GPT(nn.Module):
    """The whole decoder as one module: forward(tokens, labels) -> mean loss (LM loss + MoE aux losses).

    ``cp``: this rank's context-parallel group (tokens and labels are then its chunk of the positions);
    ``ep_size``: expert-parallel size of the MoE layers; ``seed``: draws the experts (moe.py).
    ``last_lm_loss`` keeps the last forward's LM loss alone, ``moe_stats`` the routing statistics."""

    def __init__(self, m, recompute: str = "none", *, cp: ContextGroup | None = None, ep_size: int = 1,
                 seed: int = 0):
        super().__init__()
        self.embed = WordEmbedding(m)
        self.pos = PositionEmbedding(m, offset=cp.rank * (m.seq_length // cp.size) if cp else 0)
        moe_layers = moe_block_indices(m)
        self.moe_stats = None
        if moe_layers:
            from .moe import MoEStats  # noqa: PLC0415  (imports deepspeed)

            self.moe_stats = MoEStats(len(moe_layers), m.moe.num_experts)
        self.blocks = nn.ModuleList(
            Block(m, recompute, cp=cp, mlp=_moe_mlp(m, moe_layers.index(i), ep_size, seed, self.moe_stats)
                  if i in moe_layers else None)
            for i in range(m.num_layers))
        self.moe_layers = [self.blocks[i].mlp for i in moe_layers]
        self.final_norm = FinalNorm(m)
        self.output = None if m.tie_embeddings else OutputLayer(m)
        self.last_lm_loss: torch.Tensor | None = None
        _init_residual_projections(self, m.num_layers)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.pos(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        out = logits(self.embed, x) if self.output is None else self.output(x)
        loss = self.last_lm_loss = lm_loss(out, labels)
        for layer in self.moe_layers:
            loss = loss + layer.aux_loss
        return loss


def moe_block_indices(m) -> list[int]:
    """The blocks with an MoE feed-forward: all after model.moe.first_dense_layers (none when dense)."""
    moe = getattr(m, "moe", None)
    if moe is None:
        return []
    return list(range(moe.first_dense_layers or 0, m.num_layers))


def _moe_mlp(m, index: int, ep_size: int, seed: int, stats) -> nn.Module:
    from .moe import ExpertParallelMoE  # noqa: PLC0415

    return ExpertParallelMoE(m, ep_size=ep_size, layer_index=index, seed=seed,
                             residual_std=residual_std(m.num_layers), stats=stats)


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


def pipeline_param_name(name: str, m) -> str:
    """The name :func:`pipeline_specs`' PipelineModule gives the :class:`GPT` parameter ``name`` (DeepSpeed
    names a LayerSpec's module by its index in the flat list, a TiedLayerSpec's under ``tied_modules.<key>``)."""
    head, _, rest = name.partition(".")
    if head == "blocks":
        index, _, rest = rest.partition(".")
        return f"{PIPELINE_LEAD_SPECS + int(index)}.{rest}"
    if head == "embed" and m.tie_embeddings:
        return f"tied_modules.embed.{rest}"
    lead, tail = PIPELINE_LEAD_SPECS + m.num_layers, ("final_norm", "output")
    index = {"embed": 0, "pos": 1, tail[0]: lead, tail[1]: lead + 1}.get(head)
    if index is None or not rest:
        raise ValueError(f"{name!r} is not a parameter name of the reference trainer's GPT")
    return f"{index}.{rest}"


def gpt_param_name(name: str, m) -> str:
    """The :class:`GPT` name of the PipelineModule parameter ``name`` (the inverse of pipeline_param_name)."""
    head, _, rest = name.partition(".")
    if head == "tied_modules" and rest.startswith("embed."):
        return rest
    lead = PIPELINE_LEAD_SPECS + m.num_layers
    if head.isdigit() and rest:
        index = int(head)
        if PIPELINE_LEAD_SPECS <= index < lead:
            return f"blocks.{index - PIPELINE_LEAD_SPECS}.{rest}"
        named = {0: "embed", 1: "pos", lead: "final_norm", lead + 1: "output"}.get(index)
        if named is not None:
            return f"{named}.{rest}"
    raise ValueError(f"{name!r} is not a parameter name of the reference trainer's PipelineModule")
