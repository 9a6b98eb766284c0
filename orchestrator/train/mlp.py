"""The feed-forward of a dense block and of each MoE expert (GeLU or SwiGLU), in plain PyTorch."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """GeLU MLP (2 matrices) or SwiGLU (3 matrices: gate and up fused in fc1). The dense model's MLP by
    default; the MoE experts and the shared expert pass their own ``ffn_hidden_size``."""

    def __init__(self, m, ffn_hidden_size: int | None = None):
        super().__init__()
        ffn = ffn_hidden_size or m.ffn_hidden_size
        self.gated = m.gated_mlp
        self.fc1 = nn.Linear(m.hidden_size, (2 if self.gated else 1) * ffn, bias=m.add_bias_linear)
        self.fc2 = nn.Linear(ffn, m.hidden_size, bias=m.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        return self.fc2(y)
