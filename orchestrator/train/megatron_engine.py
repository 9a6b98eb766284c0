"""The Megatron-Core engine: the same GPT built with ``megatron.core`` (GPTModel, TP/PP/VPP), on GPUs.

``python -m orchestrator.train RUN_DIR --engine megatron`` reads the run dir's ``megatron_config.json``
(TransformerConfig + parallel kwargs, rendered by orchestrator/render/megatron.py) and the resolved spec,
then trains with Megatron-Core's own pieces: ``parallel_state``, ``GPTModel`` with the local (no
Transformer Engine) layer spec, its ``DistributedDataParallel`` (ZeRO-0) or distributed optimizer
(ZeRO-1), ``get_forward_backward_func`` (1F1B, interleaved with vpp > 1), and ``OptimizerParamScheduler``.
Telemetry, checkpoints (per-rank files + the same ``latest`` pointer), signals and exit codes are the
DeepSpeed path's (trainer.train_loop; trainer._run_megatron wires them to this engine).

On CPU only parts of Megatron-Core run (ENV-NOTES: its GPT forward, RNG tracker and schedules call CUDA):
``--engine megatron`` then exits 2 with the reason, and :func:`check_megatron_on_cpu` exercises what does
run (``python -m orchestrator.train.megatron_engine --check RUN_DIR`` under torchrun): parallel state on
gloo, GPTModel construction from megatron_config.json (same parameter count as the DeepSpeed model), and
a tensor-parallel MLP (ColumnParallelLinear -> RowParallelLinear) that must equal model.py's MLP.

Not supported here (exit 2, use Megatron-LM's pretrain_gpt.py with megatron_args.txt): ZeRO-2/3 (Megatron
FSDP) and offload. The GPU training path has not been run on a GPU by its author (no GPU was available);
the CPU check and the DeepSpeed path are tested.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..errors import OrchError
from ..estimate.engines import resolved_grad_reduce_dtype
from . import checkpoint
from .engine import StepResult

CONFIG_FILE = "megatron_config.json"


class MegatronUnavailable(OrchError):
    """The Megatron-Core engine cannot run this run dir on this machine."""

    exit_code = 2


def load_megatron_config(run_dir_path: Path) -> dict:
    path = Path(run_dir_path) / CONFIG_FILE
    if not path.is_file():
        raise MegatronUnavailable(f"{path} is missing (regenerate the run dir with `orch generate`)")
    return json.loads(path.read_text())


def transformer_config(config: dict, **overrides):
    """megatron_config.json -> megatron.core TransformerConfig (dotted object names resolved)."""
    from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: PLC0415

    from ..validate.megatron_core import resolve_config  # noqa: PLC0415

    kwargs = resolve_config(dict(config))
    # The local layer spec (no Transformer Engine) runs Megatron's own attention.
    from megatron.core.transformer.enums import AttnBackend  # noqa: PLC0415

    kwargs["attention_backend"] = AttnBackend.local
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def init_parallel_state(config: dict) -> None:
    from megatron.core import parallel_state  # noqa: PLC0415

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config["tensor_model_parallel_size"],
        pipeline_model_parallel_size=config["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=config.get("virtual_pipeline_model_parallel_size"))


def build_gpt_chunks(spec, tconfig, vocab_size: int) -> list:
    """This rank's GPTModel chunk(s): one per virtual pipeline stage."""
    from megatron.core import parallel_state as ps  # noqa: PLC0415
    from megatron.core.models.gpt import GPTModel  # noqa: PLC0415
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: PLC0415

    m = spec.model
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm")
    chunks = []
    for vp_stage in range(vpp):
        vp = vp_stage if vpp > 1 else None
        chunks.append(GPTModel(
            config=tconfig, transformer_layer_spec=layer_spec, vocab_size=vocab_size,
            max_sequence_length=m.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=vp is None, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=vp is None, vp_stage=vp),
            share_embeddings_and_output_weights=m.tie_embeddings,
            position_embedding_type="rope" if m.position_embedding == "rope" else "learned_absolute",
            vp_stage=vp))
    return chunks


def sharded_param_count(chunks) -> tuple[int, int]:
    """(tensor-parallel-sharded, replicated) parameter counts of this rank's chunks."""
    sharded = replicated = 0
    for chunk in chunks:
        for p in chunk.parameters():
            if getattr(p, "tensor_model_parallel", False):
                sharded += p.numel()
            else:
                replicated += p.numel()
    return sharded, replicated


class TensorParallelMLP(torch.nn.Module):
    """model.py's MLP in Megatron-Core tensor-parallel layers: fc1 column-parallel, fc2 row-parallel."""

    def __init__(self, spec, tconfig):
        super().__init__()
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: PLC0415

        m = spec.model
        self.gated = m.gated_mlp
        width = (2 if self.gated else 1) * m.ffn_hidden_size
        init = torch.nn.init.zeros_
        self.fc1 = ColumnParallelLinear(m.hidden_size, width, config=tconfig, init_method=init,
                                        bias=m.add_bias_linear, gather_output=False)
        self.fc2 = RowParallelLinear(m.ffn_hidden_size, m.hidden_size, config=tconfig, init_method=init,
                                     bias=m.add_bias_linear, input_is_parallel=True, skip_bias_add=False)

    def load_full(self, mlp, tp_rank: int, tp_size: int) -> None:
        """Copy this rank's shards of a full (model.py) MLP's weights."""
        with torch.no_grad():
            w1, b1 = mlp.fc1.weight, mlp.fc1.bias
            if self.gated:   # model.py fuses [gate; up]: shard each half so that gate and up stay paired
                rows = [t.chunk(tp_size, dim=0)[tp_rank] for t in w1.chunk(2, dim=0)]
                self.fc1.weight.copy_(torch.cat(rows))
                if b1 is not None:
                    self.fc1.bias.copy_(torch.cat([t.chunk(tp_size)[tp_rank] for t in b1.chunk(2)]))
            else:
                self.fc1.weight.copy_(w1.chunk(tp_size, dim=0)[tp_rank])
                if b1 is not None:
                    self.fc1.bias.copy_(b1.chunk(tp_size)[tp_rank])
            self.fc2.weight.copy_(mlp.fc2.weight.chunk(tp_size, dim=1)[tp_rank])
            if mlp.fc2.bias is not None:
                self.fc2.bias.copy_(mlp.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F  # noqa: PLC0415

        y, _ = self.fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        out, _ = self.fc2(y)
        return out


def check_megatron_on_cpu(run_dir) -> dict:
    """What Megatron-Core can do on CPU for this run dir (call on every rank of a gloo job)."""
    import torch.distributed as dist  # noqa: PLC0415
    from megatron.core import parallel_state as ps  # noqa: PLC0415

    from .mlp import MLP  # noqa: PLC0415
    from .model import GPT, count_parameters  # noqa: PLC0415

    spec, config = run_dir.spec, load_megatron_config(run_dir.path)
    init_parallel_state(config)
    tconfig = transformer_config(config, use_cpu_initialization=True)
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    result = {"tp": tp, "pp": ps.get_pipeline_model_parallel_world_size(), "dp": ps.get_data_parallel_world_size(),
              "tp_rank": tp_rank, "pp_rank": ps.get_pipeline_model_parallel_rank(),
              "dp_rank": ps.get_data_parallel_rank()}
    # The whole model: TP-sharded parameters summed over the TP group, replicated ones once.
    from ..layout import padded_vocab_size  # noqa: PLC0415

    chunks = build_gpt_chunks(spec, tconfig, padded_vocab_size(spec.model.vocab_size, tp))
    sharded, replicated = sharded_param_count(chunks)
    counts = torch.tensor([float(sharded), float(replicated)], dtype=torch.float64)
    dist.all_reduce(counts[:1], group=ps.get_tensor_model_parallel_group())
    result["megatron_stage_params"] = int(counts[0].item() + counts[1].item())
    result["megatron_local_params"] = sharded + replicated
    torch.manual_seed(spec.training.seed)
    result["deepspeed_model_params"] = count_parameters(GPT(spec.model))
    # A tensor-parallel MLP forward equals the full MLP's.
    torch.manual_seed(spec.training.seed)
    full = MLP(spec.model)
    tp_mlp = TensorParallelMLP(spec, tconfig)
    tp_mlp.load_full(full, tp_rank, tp)
    x = torch.randn(2, 8, spec.model.hidden_size)   # same on every rank: same seed
    with torch.no_grad():
        result["tp_mlp_max_abs_diff"] = float((tp_mlp(x) - full(x)).abs().max())
    ps.destroy_model_parallel()
    return result


# --- the GPU training path -------------------------------------------------------------------------

class MegatronEngine:
    """Megatron-Core training of the spec's GPT; the trainer's engine interface (train_step, save, ...)."""

    def __init__(self, run_dir, dataset, busy):
        import torch.distributed as dist  # noqa: PLC0415
        from megatron.core import parallel_state as ps  # noqa: PLC0415
        from megatron.core import tensor_parallel  # noqa: PLC0415
        from megatron.core.distributed import (DistributedDataParallel,  # noqa: PLC0415
                                               DistributedDataParallelConfig, finalize_model_grads)
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: PLC0415
        from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: PLC0415

        from ..layout import padded_vocab_size  # noqa: PLC0415

        spec, config = run_dir.spec, load_megatron_config(run_dir.path)
        self.spec, self.dataset, self.rank = spec, dataset, dist.get_rank()
        zero = spec.parallelism.zero_stage
        init_parallel_state(config)
        tensor_parallel.model_parallel_cuda_manual_seed(spec.training.seed)
        tconfig = transformer_config(config)
        vocab = padded_vocab_size(spec.model.vocab_size, config["tensor_model_parallel_size"])
        chunks = [c.cuda() for c in build_gpt_chunks(spec, tconfig, vocab)]
        if tconfig.bf16 or tconfig.fp16:      # as Megatron-LM: half-precision inputs, fp32 outputs
            from megatron.core.transformer.module import Float16Module  # noqa: PLC0415

            chunks = [Float16Module(tconfig, c) for c in chunks]
        dp_size = ps.get_data_parallel_world_size()
        # The gradient buffer and its reduction in training.grad_reduce_dtype, resolved as Megatron-LM resolves
        # --bf16 / --fp16 (estimate/engines.py default_grad_reduce_dtype: fp32 with bf16, fp16 with fp16).
        reduce_dtype = resolved_grad_reduce_dtype("megatron", spec.training.precision, spec.training.grad_reduce_dtype)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=reduce_dtype == "fp32",
                                                   overlap_grad_reduce=False, use_distributed_optimizer=zero == 1)
        self.model = [DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=c,
                                              disable_bucketing=i > 0) for i, c in enumerate(chunks)]
        t, o = spec.training, spec.training.optimizer
        opt_config = OptimizerConfig(optimizer="sgd" if o.type == "sgd" else "adam", lr=o.lr,
                                     min_lr=t.lr_schedule.min_lr, weight_decay=o.weight_decay,
                                     adam_beta1=o.betas[0], adam_beta2=o.betas[1], adam_eps=o.eps,
                                     sgd_momentum=o.betas[0], clip_grad=t.gradient_clipping,
                                     bf16=t.precision == "bf16", fp16=t.precision == "fp16",
                                     params_dtype=tconfig.params_dtype, use_distributed_optimizer=zero == 1)
        self.optimizer = get_megatron_optimizer(opt_config, self.model)
        self.scheduler = _scheduler(self.optimizer, spec)
        tconfig.no_sync_func = [m.no_sync for m in self.model] if len(self.model) > 1 else self.model[0].no_sync
        tconfig.finalize_model_grads_func = finalize_model_grads
        tconfig.grad_scale_func = self.optimizer.scale_loss
        self.forward_backward = get_forward_backward_func()
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_ranks = dist.get_process_group_ranks(ps.get_data_parallel_group())
        self.stage_id = ps.get_pipeline_model_parallel_rank()
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.micro_batch_size = spec.parallelism.micro_batch_size or config.get("micro_batch_size", 1)
        self.grad_accum = t.global_batch_size // (self.micro_batch_size * dp_size)
        self.dp_size = dp_size
        self._timed_step = busy.wrap(self.optimizer.step)
        _time_schedule(busy)

    def _forward_step(self, data_iterator, model):
        tokens, labels = next(data_iterator)
        tokens, labels = tokens.to(self.device), labels.to(self.device)
        positions = torch.arange(tokens.shape[1], device=self.device).unsqueeze(0).expand_as(tokens)
        output = model(tokens, positions, None, labels=labels)

        def loss_func(per_token_loss):
            loss = per_token_loss.float().mean()
            return loss, {"lm loss": loss.detach()}

        return output, loss_func

    def _batches(self, step: int):
        for j in range(self.grad_accum):
            yield self.dataset.micro_batch(step, self.dp_rank, j, self.micro_batch_size, dp_size=self.dp_size)

    def train_step(self, step: int) -> StepResult:
        import torch.distributed as dist  # noqa: PLC0415
        from megatron.core import parallel_state as ps  # noqa: PLC0415

        lr = float(self.optimizer.param_groups[0]["lr"])
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        iterators = [self._batches(step) for _ in self.model]
        outputs = self.forward_backward(
            forward_step_func=self._forward_step, data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.model if len(self.model) > 1 else self.model[0], num_microbatches=self.grad_accum,
            seq_length=self.spec.model.seq_length, micro_batch_size=self.micro_batch_size, forward_only=False)
        _, grad_norm, _ = self._timed_step()
        self.scheduler.step(increment=1)
        loss = torch.zeros(1, device=self.device)
        if ps.is_pipeline_last_stage(ignore_virtual=True) and outputs:
            loss[0] = torch.stack([o["lm loss"] for o in outputs]).mean()
            dist.all_reduce(loss, group=ps.get_data_parallel_group())
            loss /= ps.get_data_parallel_world_size()
        last = ps.get_pipeline_model_parallel_last_rank()
        dist.broadcast(loss, src=last, group=ps.get_pipeline_model_parallel_group())
        return StepResult(loss=float(loss.item()), lr=lr, grad_norm=None if grad_norm is None else float(grad_norm))

    def _state_file(self, ckpt_dir: Path, step: int) -> Path:
        return Path(ckpt_dir) / checkpoint.tag_for(step) / f"megatron_rank{self.rank:05d}.pt"

    def save(self, ckpt_dir: Path, step: int) -> None:
        path = self._state_file(ckpt_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": [m.state_dict() for m in self.model], "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "orch_step": step}, path)
        if getattr(self.optimizer, "save_parameter_state", None) and self.spec.parallelism.zero_stage == 1:
            self.optimizer.save_parameter_state(str(path.with_suffix(".optim_params.pt")))
        checkpoint.publish(ckpt_dir, step, rank=self.rank)

    def load(self, ckpt_dir: Path, step: int) -> int:
        path = self._state_file(ckpt_dir, step)
        state = torch.load(path, map_location=self.device, weights_only=True)   # tensors and plain data only
        checkpoint.checked_step(state.get("orch_step"), path.parent, step)
        for m, sd in zip(self.model, state["model"]):
            m.load_state_dict(sd)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.spec.parallelism.zero_stage == 1:
            self.optimizer.load_parameter_state(str(path.with_suffix(".optim_params.pt")))
        self.scheduler.load_state_dict(state["scheduler"])
        return step

    def info(self) -> dict:
        sharded, replicated = sharded_param_count(self.model)
        return {"stage_id": self.stage_id, "dp_rank": self.dp_rank, "param_count": None,
                "full_param_numel": sharded + replicated, "local_param_numel": sharded + replicated,
                "param_shard_fraction": 1.0, "layers": None}

    def close(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415
        from megatron.core import parallel_state as ps  # noqa: PLC0415

        dist.barrier()
        ps.destroy_model_parallel()


def _scheduler(optimizer, spec):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: PLC0415

    t, s = spec.training, spec.training.lr_schedule
    warmup = min(s.warmup_iters, t.train_iters - 1)
    return OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=t.optimizer.lr, min_lr=min(s.min_lr, t.optimizer.lr),
                                   lr_warmup_steps=warmup, lr_decay_steps=t.train_iters, lr_decay_style=s.decay,
                                   start_wd=t.optimizer.weight_decay, end_wd=t.optimizer.weight_decay,
                                   wd_incr_steps=t.train_iters, wd_incr_style="constant")


def _time_schedule(busy) -> None:
    """Charge Megatron's per-micro-batch forward_step / backward_step to the BusyTimer (the schedules
    call them through their module's globals)."""
    from megatron.core.pipeline_parallel import schedules  # noqa: PLC0415

    for name in ("forward_step", "backward_step"):
        fn = getattr(schedules, name)
        if not getattr(fn, "_orch_busy", False):
            timed = busy.wrap(fn)
            timed._orch_busy = True
            setattr(schedules, name, timed)


def unsupported_reason(spec) -> str | None:
    p = spec.parallelism
    if (p.zero_stage or 0) >= 2:
        return (f"zero_stage {p.zero_stage} maps to Megatron FSDP, which this reference engine does not run; "
                "use Megatron-LM's pretrain_gpt.py with the run dir's megatron_args.txt, or --engine deepspeed")
    if p.offload not in (None, "none"):
        return "offload is not supported by the Megatron-Core reference engine; use --engine deepspeed"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.train.megatron_engine --check RUN_DIR [--out FILE]`` (under torchrun)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m orchestrator.train.megatron_engine")
    parser.add_argument("--check", type=Path, required=True, metavar="RUN_DIR",
                        help="check Megatron-Core's CPU-runnable parts against RUN_DIR (gloo)")
    parser.add_argument("--out", type=Path, help="write rank 0's result as JSON here")
    args = parser.parse_args(argv)
    import torch.distributed as dist  # noqa: PLC0415

    from ..rundir import read_run_dir  # noqa: PLC0415

    run_dir = read_run_dir(args.check)
    dist.init_process_group("gloo")
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, check_megatron_on_cpu(run_dir))
    if dist.get_rank() == 0:
        text = json.dumps({"ranks": results}, indent=2, sort_keys=True)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
