"""Starter specs for `orch init`: rendered from templates/spec.yaml.j2, checked before they are written."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .catalog.gpus import GPUS
from .catalog.models import MODELS, preset_fields
from .errors import Problem, SpecError
from .resources import data_dir
from .spec import NAME_PATTERN, default_engine, default_host_memory_GiB


def list_presets() -> str:
    rows = [f"{name:<12} {fields['num_layers']:>4} layers  h={fields['hidden_size']:<6} "
            f"heads={fields['num_attention_heads']:<4} seq={fields['seq_length']:<5}  {fields['_source']}"
            for name, fields in MODELS.items()]
    gpus = [f"{g.name:<10} {g.peak_for('bf16') / 1e12:7.1f} TFLOP/s bf16  {g.hbm_bytes / 2**30:6.1f} GiB"
            for g in GPUS.values()]
    return "Model presets:\n  " + "\n  ".join(rows) + "\n\nGPUs:\n  " + "\n  ".join(gpus)


def check_name(name: str | None) -> None:
    """SpecError naming --name unless it follows the spec's name rule (it goes into YAML and file names)."""
    if name is not None and (not re.fullmatch(NAME_PATTERN, name) or name.startswith("-")):
        raise SpecError(Problem("--name", f"{name[:80]!r} is not a run name",
                                f"use 1-64 letters, digits, '.', '_' or '-', not starting with '-': the spec's name rule "
                                f"{NAME_PATTERN}"))


def render_starter_spec(*, preset: str, gpu: str | None, num_nodes: int, gpus_per_node: int | None,
                        name: str | None, file_name: str) -> str:
    """A commented spec for ``preset``; raises SpecError if the result would not load."""
    import jinja2  # noqa: PLC0415

    check_name(name)
    tiny = preset == "tiny-gpt"
    gpu = gpu or ("cpu" if tiny else "h100-sxm")
    gpus_per_node = gpus_per_node or (2 if gpu == "cpu" else 8)
    fields = preset_fields(preset)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.get_template("spec.yaml.j2").render(
        schema_path=str(data_dir("schemas") / "spec.schema.json"), file_name=file_name,
        name=name or f"{preset}-pretrain", preset=preset, preset_source=MODELS[preset]["_source"],
        model_lines=[f"{k}: {_yaml_scalar(v)}" for k, v in fields.items()],
        gpu=gpu, gpu_choices=", ".join(GPUS), engine=default_engine(gpu),
        host_memory_GiB=f"{default_host_memory_GiB(gpu, gpus_per_node):g}", num_nodes=num_nodes, gpus_per_node=gpus_per_node,
        global_batch_size=8 if tiny else 256, precision="fp32" if gpu == "cpu" else "bf16",
        train_iters=20 if tiny else 1000, warmup_iters=2 if tiny else 100,
        checkpoint_interval=10 if tiny else 100)
    _check(text)
    return text


def _yaml_scalar(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check(text: str) -> None:
    import yaml  # noqa: PLC0415

    from .spec_loader import parse_spec  # noqa: PLC0415

    parse_spec(yaml.safe_load(text))


def write_new_file(path: str | os.PathLike, text: str, *, force: bool) -> None:
    """Write ``text`` atomically; refuse to overwrite unless ``force``, and refuse anything but a regular
    file always (see orchestrator.outfiles)."""
    from .outfiles import write_output_file  # noqa: PLC0415

    write_output_file(path, text, force=force, option="--output")
