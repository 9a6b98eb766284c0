"""Load a universal checkpoint into a fresh engine of another layout, parameter by parameter, verified.

For the changes DeepSpeed's own universal loader cannot make (a pp change: the PipelineModule names parameters
by layer index; ZeRO-1/2 <-> ZeRO-3: it looks for its own stage's model-state files), the reference trainer
builds its engine in the new layout and sets each parameter's fp32 weights and Adam moments from the
checkpoint's ``zero/<name>/`` files through DeepSpeed's tensor-fragment API (safe_set_full_fp32_param,
safe_set_full_optimizer_state: ZeRO-1/2/3 and the bf16 optimizer), the names mapped between GPT and its
PipelineModule (model.pipeline_param_name); then the optimizer's step count, the lr scheduler and the engine's
counters. Every value is read back and compared with the files before training (LoadFailed: exit 1).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..resize import UNIVERSAL_PARAMS as METHOD  # noqa: F401  (the conversion method this loads)
from . import checkpoint
from .model import gpt_param_name

MOMENTS = ("exp_avg", "exp_avg_sq")


class LoadFailed(RuntimeError):
    """The load failed or does not verify: raised on every rank at once (the job can end cleanly, exit 1)."""


def _gpt_name(name: str, m, pipelined: bool) -> str:
    return gpt_param_name(name, m) if pipelined else name


def _read(path: Path) -> torch.Tensor:
    data = torch.load(path, map_location="cpu", weights_only=False)     # in the verified step dir (manifest)
    return (data["param"] if isinstance(data, dict) else data).detach()


def _full_shape(param) -> torch.Size:
    return param.ds_shape if hasattr(param, "ds_id") else param.shape


def _params(ds_engine, step_dir: Path, m, *, source_pp: int, pipelined: bool) -> list[tuple[str, object, Path]]:
    """(name, parameter, its universal dir) for this rank's parameters; LoadFailed when a parameter has none,
    or when some parameter of the checkpoint is held by no rank."""
    import torch.distributed as dist  # noqa: PLC0415

    zero = step_dir / "zero"
    on_disk, problems = {}, []
    for folder in sorted(p for p in zero.iterdir() if p.is_dir()):
        try:
            on_disk[_gpt_name(folder.name, m, source_pp > 1)] = folder
        except ValueError as e:
            problems.append(f"{folder}: {e}")
    mine, missing = [], []
    for name, param in ds_engine.module.named_parameters():
        key = _gpt_name(name, m, pipelined)
        if key in on_disk:
            mine.append((name, param, on_disk[key]))
        else:
            missing.append(name)
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, [_gpt_name(name, m, pipelined) for name, _, _ in mine])
    unheld = sorted(set(on_disk) - {name for names in held for name in names})
    if missing:
        problems.append(f"{len(missing)} parameter(s) of this engine have no state under {zero}, e.g. {missing[0]}")
    if unheld:
        problems.append(f"{len(unheld)} parameter(s) of the checkpoint are held by no rank of this layout, e.g. "
                        f"{on_disk[unheld[0]].name}")
    _raise_on_any_rank(problems)
    return mine


def _raise_on_any_rank(problems: list[str]) -> None:
    """Every rank raises when any rank found a problem (none is left waiting in a collective)."""
    import torch.distributed as dist  # noqa: PLC0415

    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, problems)
    every = [f"rank {rank}: {p}" for rank, ps in enumerate(found) for p in ps]
    if every:
        more = f" (and {len(every) - 5} more)" if len(every) > 5 else ""
        raise LoadFailed(f"loading the universal checkpoint parameter by parameter failed: {'; '.join(every[:5])}"
                         f"{more}")


def _base_optimizer(ds_engine):
    optimizer = ds_engine.optimizer
    base = getattr(optimizer, "optimizer", None)
    if base is None or not hasattr(optimizer, "param_groups"):
        raise LoadFailed(f"{type(optimizer).__name__} is not a ZeRO or bf16 optimizer: its state cannot be set "
                           "parameter by parameter")
    return base


def _flats(optimizer, base) -> list[torch.Tensor]:
    """The fp32 partitions the wrapped optimizer steps (ZeRO-3 keeps them out of its param groups between steps)."""
    flats = getattr(optimizer, "fp32_partitioned_groups_flat", None)
    return list(flats) if flats is not None else [p for group in base.param_groups for p in group["params"]]


@torch.no_grad()
def _create_optimizer_state(ds_engine, base) -> None:
    """The wrapped optimizer keeps its state lazily (none before the first step): one step with zero gradients at
    learning rate and weight decay 0 creates it, in the optimizer's own layout, leaving the weights as they are
    (every value is then overwritten). ZeRO-3 puts its partitions into the param groups for the step, as its own
    step does (DeepSpeed 0.19.8's _set/_clear_fp32_optimizer_param_groups); the ZeRO-1/2 and bf16 fragments are
    linked to the new state, as DeepSpeed does after its first step."""
    optimizer = ds_engine.optimizer
    flats = _flats(optimizer, base)
    stage3 = hasattr(optimizer, "fp32_partitioned_groups_flat")
    kept = [{k: group[k] for k in ("lr", "weight_decay") if k in group} for group in base.param_groups]
    for group in base.param_groups:
        group.update({k: 0.0 for k in ("lr", "weight_decay") if k in group})
    for flat in flats:
        flat.grad = torch.zeros_like(flat)
    if stage3:
        optimizer._set_fp32_optimizer_param_groups()
    try:
        base.step()
    finally:
        if stage3:
            optimizer._clear_fp32_optimizer_param_groups()
        for flat in flats:
            flat.grad = None
        for group, values in zip(base.param_groups, kept):
            group.update(values)
    missing = [i for i, flat in enumerate(flats) if "exp_avg" not in base.state.get(flat, {})]
    if missing:
        raise LoadFailed(f"{type(base).__name__} created no Adam state for {len(missing)} of {len(flats)} "
                           "fp32 partitions")
    for _, param in ds_engine.module.named_parameters():
        mapping = getattr(param, "_hp_mapping", None)
        if mapping is not None:
            flat = base.param_groups[mapping.param_group_index]["params"][0]
            mapping.set_optim_state_fragment(flat, base.state[flat])


def _set_step(flats, base, adam_step: torch.Tensor) -> None:
    for group in base.param_groups:
        if "step" in group:
            group["step"] = int(adam_step)
    for flat in flats:
        state = base.state.get(flat, {})
        if torch.is_tensor(state.get("step")):
            state["step"] = adam_step.to(dtype=state["step"].dtype, device=state["step"].device).clone()
        elif "step" in state:
            state["step"] = int(adam_step)


def _adam_step(step_dir: Path, params) -> torch.Tensor:
    """The optimizer's step count: each parameter's step.pt (from a ZeRO-1/2 source), else the wrapped
    optimizer's state in zero/optimizer_state.pt (ds_to_universal keeps it there for a ZeRO-3 source)."""
    steps = {float(_read(folder / "step.pt")) for _, _, folder in params if (folder / "step.pt").is_file()}
    if not steps and (step_dir / "zero" / "optimizer_state.pt").is_file():
        saved = torch.load(step_dir / "zero" / "optimizer_state.pt", map_location="cpu", weights_only=False)
        states = ((saved.get("optimizer_state_dict") or {}).get("state") or {}).values()
        steps = {float(state["step"]) for state in states if "step" in state}
    if len(steps) != 1:
        raise LoadFailed(f"the universal checkpoint's optimizer step counts are not one value: {sorted(steps)}")
    return torch.tensor(steps.pop())


def load(ds_engine, ckpt_dir: Path, step: int, m, *, source_pp: int, pipelined: bool) -> int:
    """Set the fresh ``ds_engine`` (call on all ranks) from the universal checkpoint of ``step`` under
    ``ckpt_dir`` (written by ds_to_universal from a checkpoint of ``source_pp`` stages) and verify it; returns
    ``step``."""
    import deepspeed  # noqa: PLC0415
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state  # noqa: PLC0415

    step_dir = Path(ckpt_dir) / checkpoint.tag_for(step)
    params = _params(ds_engine, step_dir, m, source_pp=source_pp, pipelined=pipelined)
    values = {name: {key: _read(folder / f"{key}.pt") for key in ("fp32", *MOMENTS)} for name, _, folder in params}
    shapes = [f"{name} {key}: {tuple(tensor.shape)} in the checkpoint, {tuple(_full_shape(p))} here"
              for name, p, _ in params for key, tensor in values[name].items()
              if tensor.numel() != _full_shape(p).numel()]
    _raise_on_any_rank(shapes)
    for name, param, _ in params:         # a ZeRO-3 source's universal tensors are flat
        values[name] = {key: tensor.reshape(_full_shape(param)) for key, tensor in values[name].items()}
    base = _base_optimizer(ds_engine)
    _create_optimizer_state(ds_engine, base)
    for name, param, _ in params:
        safe_set_full_fp32_param(param, values[name]["fp32"])
        for key in MOMENTS:
            safe_set_full_optimizer_state(param, values[name][key], key)
    with deepspeed.zero.GatheredParameters([p for _, p, _ in params], modifier_rank=0), torch.no_grad():
        for name, param, _ in params:
            param.data.copy_(values[name]["fp32"].to(param.dtype))
    adam_step = _adam_step(step_dir, params)
    _set_step(_flats(ds_engine.optimizer, base), base, adam_step)
    state = _engine_state(step_dir)
    if ds_engine.lr_scheduler is not None and state.get("lr_scheduler") is not None:
        ds_engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    for key in ("global_steps", "global_samples", "skipped_steps"):
        if key in state:
            setattr(ds_engine, key, state[key])
    _raise_on_any_rank(mismatches(ds_engine, params, values, base, adam_step))
    try:
        return checkpoint.checked_step(state.get("orch_step"), step_dir, step)
    except RuntimeError as e:
        raise LoadFailed(str(e)) from None


def _engine_state(step_dir: Path) -> dict:
    """The source engine's own state (lr scheduler, step counters, client state): ds_to_universal copies the
    source's model-state files, every one holds it."""
    files = sorted(p for p in step_dir.glob("*model_states.pt") if not p.name.startswith("layer_"))
    if not files:
        raise LoadFailed(f"{step_dir} holds no model-state file of the source engine")
    state = torch.load(files[0], map_location="cpu", weights_only=False)
    return {k: state.get(k) for k in ("lr_scheduler", "global_steps", "global_samples", "skipped_steps", "orch_step")
            if k in state}


@torch.no_grad()
def mismatches(ds_engine, params, values, base, adam_step: torch.Tensor) -> list[str]:
    """What the engine holds now that differs from the universal files (empty: every full fp32 weight, both
    moments, the model's own copy of each weight and the step count are the files'). Collective."""
    import deepspeed  # noqa: PLC0415
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state  # noqa: PLC0415

    found = []
    for name, param, _ in params:
        held = {"fp32": safe_get_full_fp32_param(param),
                **{key: safe_get_full_optimizer_state(param, key) for key in MOMENTS}}
        for key, tensor in held.items():
            if tensor is None or not torch.equal(tensor.detach().cpu().float().reshape(-1),
                                                 values[name][key].float().reshape(-1)):
                found.append(f"{name} {key} differs from the checkpoint's")
    with deepspeed.zero.GatheredParameters([p for _, p, _ in params]):
        for name, param, _ in params:
            if not torch.equal(param.data.cpu(), values[name]["fp32"].to(param.dtype).view(param.shape)):
                found.append(f"{name}: the model's weights differ from the checkpoint's fp32 weights")
    for flat in _flats(ds_engine.optimizer, base):
        held = base.state.get(flat, {}).get("step")
        if held is None or float(held) != float(adam_step):
            found.append(f"the optimizer's step count is {held}, the checkpoint's {float(adam_step):g}")
            break
    return found

