"""`orch validate`: check specs, DeepSpeed configs, Megatron arguments and run dirs.

Every check returns a list of :class:`~orchestrator.errors.Problem` (all problems at once, each with
``file:dotted.path``, the rule and a fix). orch's own static checks run first — they catch what the
libraries let through silently — then, when they pass, the real libraries (DeepSpeed's config classes,
Megatron-Core's TransformerConfig, and Megatron-LM's validate_args when ORCH_MEGATRON_LM is set) are
asked in a subprocess, as the final authority.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import OrchError, Problem, SpecError

KINDS = ("rundir", "spec", "ds_config", "megatron_args", "megatron_config")
_DS_MARKERS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
               "zero_optimization", "fp16", "bf16", "optimizer", "scheduler"}


def detect_kind(path: Path) -> str:
    """What a path holds, from its name first and its content second."""
    if path.is_dir():
        return "rundir"
    name = path.name
    if name.endswith((".yaml", ".yml")):
        return "spec"
    if name.endswith(".json"):
        if "megatron" in name:
            return "megatron_config"
        try:
            from ..userfiles import parse_json, read_user_text  # noqa: PLC0415

            data = parse_json(read_user_text(path), str(path), duplicates=[])
        except SpecError:
            return "ds_config" if "ds" in name or "deepspeed" in name else "spec"
        if isinstance(data, dict) and {"name", "model"} <= data.keys():
            return "spec"
        if isinstance(data, dict) and data.keys() & _DS_MARKERS:
            return "ds_config"
        if isinstance(data, dict) and "num_attention_heads" in data:
            return "megatron_config"
        return "ds_config"
    return "megatron_args"


def validate_path(path: str | Path, *, world_size: int | None = None, model_parallel_size: int = 1,
                  deep: bool = True, notes: list[str] | None = None) -> list[Problem]:
    """Every problem in one spec, ds_config.json, Megatron args file or run dir.

    ``notes`` collects sentences for people that are not problems (a check skipped, an assumption made).
    A path that cannot be read (permissions, a name too long) is a problem of its own: the other paths are
    still checked.
    """
    path = Path(path)
    try:
        return _validate_one(path, world_size=world_size, model_parallel_size=model_parallel_size, deep=deep,
                             notes=notes)
    except OSError as e:
        return [Problem(str(path), f"cannot read: {e.strerror or e.__class__.__name__}",
                        "check the path and its permissions")]
    except OrchError as e:
        return [Problem(str(path), str(e))]


def _validate_one(path: Path, *, world_size, model_parallel_size, deep, notes) -> list[Problem]:
    if not path.exists():
        return [Problem(str(path), "no such file or directory", "check the path")]
    kind = detect_kind(path)
    if kind == "rundir":
        from .rundir import validate_run_dir  # noqa: PLC0415

        return validate_run_dir(path, deep=deep, notes=notes)
    if kind == "spec":
        return validate_spec_file(path)
    if kind == "ds_config":
        from .deepspeed import validate_ds_config_file  # noqa: PLC0415

        return validate_ds_config_file(path, world_size=world_size, model_parallel_size=model_parallel_size,
                                       deep=deep, notes=notes)
    if kind == "megatron_config":
        from .megatron import validate_megatron_config_file  # noqa: PLC0415

        return validate_megatron_config_file(path, deep=deep)
    from .megatron import validate_megatron_args_file  # noqa: PLC0415

    return validate_megatron_args_file(path, world_size=world_size, deep=deep)


def validate_spec_file(path: Path) -> list[Problem]:
    from ..spec_loader import load_spec  # noqa: PLC0415

    from ..generate_rules import generate_problems  # noqa: PLC0415

    try:
        spec = load_spec(path)
    except SpecError as e:
        return e.problems
    return [dataclasses.replace(p, path=f"{path}:{p.path}") for p in generate_problems(spec)]
