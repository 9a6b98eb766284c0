"""Mixture-of-Experts feed-forward with expert parallelism, for the reference trainer: a top-k router with
Switch/GShard's load-balancing loss, an optional capacity, two all-to-alls (dispatch, combine) over ``ep``
ranks, laid out as a DeepSpeed MoE layer so that DeepSpeed builds the expert groups and reduces the experts'
gradients, and per-step routing statistics (:class:`MoEStats`).

The router, capacity, dispatch, DeepSpeed layout and initialisation: docs/internals.md, "train/moe.py".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from deepspeed.moe.experts import Experts
from deepspeed.moe.layer import MoE as DeepSpeedMoE
from torch import nn

from .alltoall import all_to_all, exchange
from .mlp import MLP


@dataclass(frozen=True)
class MoEShape:
    """What routing needs from the spec's ``model.moe``."""

    num_experts: int
    router_topk: int
    capacity_factor: float | None = None
    aux_loss_coeff: float = 0.0


def moe_shape(m) -> MoEShape:
    """The MoEShape of a spec's ``model`` section (which has ``moe`` set)."""
    e = m.moe
    return MoEShape(num_experts=e.num_experts, router_topk=e.router_topk, capacity_factor=e.capacity_factor,
                    aux_loss_coeff=e.aux_loss_coeff)


# --- statistics ------------------------------------------------------------------------------------------

class MoEStats:
    """One step's routing statistics of a model's MoE layers on this rank (sums over micro-batches).

    :meth:`take` returns them as one flat float64 vector (routed slots per layer and expert, then dropped
    slots, routed slots, aux-loss sum, aux-loss count) and starts the next step; summing the vectors of
    all ranks gives the step's totals (:func:`orchestrator.telemetry.moe.moe_metrics` reads them).
    """

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.recording = True
        self._reset()

    def _reset(self) -> None:
        self.routed = torch.zeros(self.num_layers, self.num_experts, dtype=torch.float64)
        self.dropped = self.slots = self.aux_sum = self.aux_count = 0.0

    def record(self, layer: int, routed: torch.Tensor, dropped: int, aux_loss: torch.Tensor) -> None:
        if not self.recording:                      # a recomputation in the backward pass
            return
        self.routed[layer] += routed.detach().to("cpu", torch.float64)
        self.dropped += dropped
        self.slots += float(routed.sum())
        if layer == 0:
            self.aux_count += 1
        self.aux_sum += float(aux_loss.detach())

    def take(self) -> list[float]:
        values = [*self.routed.flatten().tolist(), self.dropped, self.slots, self.aux_sum, self.aux_count]
        self._reset()
        return values


# --- routing ---------------------------------------------------------------------------------------------

@dataclass
class Routing:
    probs: torch.Tensor          # [T, k] routing weights (renormalised top-k probabilities)
    experts: torch.Tensor        # [T, k] expert ids
    aux_loss: torch.Tensor       # scalar, coefficient included
    routed: torch.Tensor         # [E] token-slots per expert (before capacity)


def load_balancing_loss(probs: torch.Tensor, routed: torch.Tensor, topk: int, coeff: float) -> torch.Tensor:
    """Switch/GShard aux loss: coeff * E * sum_e f_e * P_e (docs/internals.md)."""
    num_tokens, num_experts = probs.shape
    fraction = routed.to(probs.dtype) / (num_tokens * topk)
    return coeff * num_experts * torch.sum(fraction * probs.mean(dim=0))


class Router(nn.Module):
    def __init__(self, shape: MoEShape, hidden_size: int):
        super().__init__()
        self.topk, self.coeff = shape.router_topk, shape.aux_loss_coeff
        self.weight = nn.Parameter(torch.empty(shape.num_experts, hidden_size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> Routing:
        probs = torch.softmax(F.linear(x, self.weight).float(), dim=-1)
        top, experts = torch.topk(probs, self.topk, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        routed = torch.bincount(experts.flatten(), minlength=probs.shape[-1])
        aux = load_balancing_loss(probs, routed, self.topk, self.coeff)
        return Routing(probs=top.to(x.dtype), experts=experts, aux_loss=aux, routed=routed)


def capacity(num_tokens: int, shape: MoEShape) -> int | None:
    """Token-slots one expert accepts from this rank's micro-batch; None when dropless."""
    if shape.capacity_factor is None:
        return None
    return max(1, math.ceil(shape.capacity_factor * num_tokens * shape.router_topk / shape.num_experts))


def kept_slots(experts_sorted: torch.Tensor, routed: torch.Tensor, cap: int | None) -> torch.Tensor:
    """Mask over the expert-sorted token-slots: within capacity (the first ``cap`` of each expert)."""
    if cap is None:
        return torch.ones_like(experts_sorted, dtype=torch.bool)
    starts = torch.cumsum(routed, 0) - routed
    position = torch.arange(len(experts_sorted), device=experts_sorted.device) - starts[experts_sorted]
    return position < cap


def grouped_by_local_expert(counts: torch.Tensor) -> torch.Tensor:
    """Row order that regroups received tokens from [source rank][local expert] to [local expert][source].

    ``counts`` [ep, local_experts]: rows received from each source rank for each local expert."""
    ep, local = counts.shape
    starts = (torch.cumsum(counts.flatten(), 0) - counts.flatten()).view(ep, local).tolist()
    sizes = counts.tolist()
    return torch.cat([torch.arange(starts[s][j], starts[s][j] + sizes[s][j]) for j in range(local) for s in range(ep)]
                     or [torch.zeros(0, dtype=torch.long)])


# --- the layer -------------------------------------------------------------------------------------------

class TokenDispatcher(nn.Module):
    """Router + local experts + the exchange with the expert-parallel group (DeepSpeed's ``deepspeed_moe``)."""

    def __init__(self, shape: MoEShape, hidden_size: int, experts: Experts, ep_size: int):
        super().__init__()
        self.shape, self.ep_size = shape, ep_size
        self.num_local_experts = shape.num_experts // ep_size
        self.gate = Router(shape, hidden_size)
        self.experts = experts
        self.ep_group = None

    def _set_ep_group(self, group) -> None:
        """Called by DeepSpeed (``MoE.set_deepspeed_parallelism``) or by hand outside DeepSpeed."""
        self.ep_group = group

    def _run_local(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        chunks = torch.split(tokens, counts)
        return torch.cat([expert(chunk) for expert, chunk in zip(self.experts.deepspeed_experts, chunks)])

    def _run_remote(self, tokens: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """Send expert-sorted tokens to their experts' ranks, run, bring the outputs back in the same order."""
        if self.ep_size == 1:
            return self._run_local(tokens, per_expert.tolist())
        ep, local = self.ep_size, self.num_local_experts
        received = exchange(per_expert, None, None, self.ep_group).view(ep, local)
        in_splits, out_splits = per_expert.view(ep, local).sum(1).tolist(), received.sum(1).tolist()
        arrived = all_to_all(tokens, out_splits, in_splits, self.ep_group)
        order = grouped_by_local_expert(received)
        outputs = self._run_local(arrived[order], received.sum(0).tolist())
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order))
        return all_to_all(outputs[back], in_splits, out_splits, self.ep_group)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """x [T, h] -> (output [T, h], aux loss, routed slots per expert [E], dropped slots)."""
        route = self.gate(x)
        k = self.shape.router_topk
        slot_experts = route.experts.flatten()
        order = torch.argsort(slot_experts, stable=True)
        keep = kept_slots(slot_experts[order], route.routed, capacity(x.shape[0], self.shape))
        order = order[keep]
        per_expert = torch.bincount(slot_experts[order], minlength=self.shape.num_experts)
        token = order // k
        outputs = self._run_remote(x[token], per_expert)
        weighted = outputs * route.probs.flatten()[order].unsqueeze(-1)
        combined = torch.zeros_like(x).index_add(0, token, weighted)
        return combined, route.aux_loss, route.routed, int(len(keep) - len(order))


class ExpertParallelMoE(DeepSpeedMoE):
    """The MoE feed-forward of one layer, as a DeepSpeed MoE layer (docs/internals.md).

    ``DeepSpeedMoE.__init__`` is not called: it would build DeepSpeed's own gate and dispatcher. The
    attributes DeepSpeed's engine and checkpointing read are set here instead.
    """

    def __init__(self, m, *, ep_size: int = 1, layer_index: int = 0, seed: int = 0,
                 residual_std: float = 0.02, stats: MoEStats | None = None):
        """``m``: the spec's ``model`` section (with ``moe``)."""
        nn.Module.__init__(self)
        shape = moe_shape(m)
        if shape.num_experts % ep_size:
            raise ValueError(f"num_experts({shape.num_experts}) is not divisible by ep({ep_size})")
        self.num_experts, self.ep_size = shape.num_experts, ep_size
        self.num_local_experts = shape.num_experts // ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.enable_expert_tensor_parallelism = False
        self.use_residual = False
        self.layer_index, self.stats = layer_index, stats
        experts = Experts(MLP(m, m.moe.ffn_hidden_size), self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = TokenDispatcher(shape, m.hidden_size, experts, ep_size)
        shared = m.moe.shared_expert_ffn_hidden_size
        self.shared_mlp = MLP(m, shared) if shared else None
        self.aux_loss: torch.Tensor | None = None
        self._init = (seed, residual_std)
        self.set_ep_rank(0)

    def set_ep_rank(self, ep_rank: int) -> None:
        """Draw the local experts as the global ids ``ep_rank * local + j`` (again once the group is known):
        expert g of MoE layer l always from the generator (seed, l, g), so the model is the same for every ep."""
        seed, residual_std = self._init
        self.ep_rank = ep_rank
        for local_id, expert in enumerate(self.deepspeed_moe.experts.deepspeed_experts):
            global_id = ep_rank * self.num_local_experts + local_id
            _init_expert(expert, seed, self.layer_index, global_id, residual_std)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        super().set_deepspeed_parallelism(use_data_before_expert_parallel_)
        self.set_ep_rank(dist.get_rank(self.deepspeed_moe.ep_group) if self.ep_size > 1 else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        out, aux, routed, dropped = self.deepspeed_moe(flat)
        if self.shared_mlp is not None:
            out = out + self.shared_mlp(flat)
        self.aux_loss = aux
        if self.stats is not None:
            self.stats.record(self.layer_index, routed, dropped, aux)
        return out.view(shape)


def _init_expert(expert: nn.Module, seed: int, layer: int, global_id: int, residual_std: float) -> None:
    """Normal(0, 0.02) weights, fc2 (writes into the residual stream) with ``residual_std``; zero biases."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + layer) * 10_007 + global_id)
    with torch.no_grad():
        for name, p in expert.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            else:
                std = residual_std if name.startswith("fc2") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)
