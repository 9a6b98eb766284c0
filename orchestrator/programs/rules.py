"""The spec's ``program:`` section: defaults per kind, paths made absolute, the rules, and the files it names.

Pure helpers over a parsed ProgramSpec, called by orchestrator.spec (``resolve_program`` and
``program_problems`` while parsing; ``program_file_problems`` when a spec file is loaded).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..errors import Problem

DEFAULT_ENTRY = "pretrain_gpt.py"
DEFAULT_DS_CONFIG_ARG = "--deepspeed_config"   # deepspeed.add_config_arguments
HF_DS_CONFIG_ARG = "--deepspeed"               # transformers.TrainingArguments
KIND_FIELDS = {"megatron-lm": ("megatron_lm", "entry"), "script": ("path", "ds_config_arg", "save_arg", "load_arg"),
               "orch": ()}
_ENGINE = {"megatron-lm": "megatron", "script": "deepspeed"}
_KIND_LOG = {"megatron-lm": ("megatron",), "script": ("deepspeed", "hf"), "orch": ()}


def resolve_program(program, base_dir: Path | None, problems: list[Problem]):
    """Defaults per kind and absolute paths (relative = to ``base_dir``, the spec file's folder, else the working
    directory); kind orch with nothing else set is the default, so it resolves to None (the spec hash stays)."""
    if program is None or (program.kind == "orch" and program == type(program)()):
        return None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if program.kind == "megatron-lm":
        return dataclasses.replace(program, megatron_lm=_absolute(program.megatron_lm, base, "program.megatron_lm",
                                                                  problems),
                                   entry=program.entry or DEFAULT_ENTRY, log_format=program.log_format or "megatron")
    if program.kind == "script":
        flag = program.ds_config_arg or DEFAULT_DS_CONFIG_ARG
        return dataclasses.replace(program, path=_absolute(program.path, base, "program.path", problems),
                                   ds_config_arg=flag,
                                   log_format=program.log_format or ("hf" if flag == HF_DS_CONFIG_ARG else "deepspeed"))
    return program


def _absolute(value: str | None, base: Path, where: str, problems: list[Problem]) -> str | None:
    if value is None:
        return None
    expanded = os.path.expanduser(os.path.expandvars(value))
    if "$" in expanded:
        problems.append(Problem(where, f"{value!r} names an environment variable that is not set",
                                "export it, or write the path itself"))
        return value
    return os.path.normpath(base / expanded)


def program_problems(spec) -> list[Problem]:
    """The section's rules: the fields a kind needs, the fields it does not take, the engine it runs on."""
    program, engine = spec.program, spec.training.engine
    if program is None:
        return []
    kind = program.kind
    problems = []
    required = {"megatron-lm": "megatron_lm", "script": "path"}.get(kind)
    if required and getattr(program, required) is None:
        what = "the Megatron-LM checkout" if kind == "megatron-lm" else "your training script"
        problems.append(Problem(f"program.{required}", f"required with kind {kind}", f"set it to {what}"))
    for other, names in KIND_FIELDS.items():
        for name in names if other != kind else ():
            if getattr(program, name) not in (None, []):
                problems.append(Problem(f"program.{name}", f"only kind {other} takes it (kind is {kind})",
                                        f"remove it, or set program.kind: {other}"))
    if kind == "orch" and program.args:
        problems.append(Problem("program.args", "kind orch takes no arguments (orch's trainer reads the run dir)",
                                "remove it, or set program.kind: script or megatron-lm"))
    if kind == "megatron-lm":
        problems += _megatron_flag_problems(program.args)
    if program.log_format is not None and program.log_format not in _KIND_LOG[kind]:
        allowed = " or ".join(_KIND_LOG[kind]) or "nothing (leave it out)"
        problems.append(Problem("program.log_format", f"{program.log_format!r} does not go with kind {kind}",
                                f"use {allowed}"))
    if program.log_format == "hf":
        problems += _hf_trainer_problems(spec)
    problems += _checkpoint_flag_problems(program)
    want = _ENGINE.get(kind)
    if want and engine != want:
        runs = "Megatron-LM trains with Megatron-Core" if kind == "megatron-lm" else \
            "a script is handed ds_config.json, which DeepSpeed reads"
        problems.append(Problem("training.engine", f"program.kind {kind} needs engine {want}, not {engine} ({runs})",
                                f"set training.engine: {want}"))
    return problems


def _checkpoint_flag_problems(program) -> list[Problem]:
    """save_arg and load_arg: two different flags, neither the ds_config flag (each receives its own dir)."""
    flags = {"save_arg": program.save_arg, "load_arg": program.load_arg, "ds_config_arg": program.ds_config_arg}
    problems, seen = [], {}
    for name, flag in flags.items():
        if flag is not None and flag in seen:
            problems.append(Problem(f"program.{name}", f"{flag} is program.{seen[flag]} too",
                                    "each flag receives its own path: give them different names (e.g. --save_dir, "
                                    "--load_dir, --deepspeed_config)"))
        elif flag is not None:
            seen[flag] = name
    if program.load_arg is not None and program.save_arg is None:
        problems.append(Problem("program.load_arg", "set without program.save_arg",
                                "set program.save_arg too: orch resumes from the checkpoints the script saved where "
                                "orch told it to (RUN_DIR/training.checkpoint.dir)"))
    return problems


def _hf_trainer_problems(spec) -> list[Problem]:
    """What the Hugging Face Trainer with --deepspeed cannot run: model parallelism (it trains data-parallel only,
    ZeRO sharding within it)."""
    p = spec.parallelism
    return [Problem(f"parallelism.{name}", f"{value}, but the Hugging Face Trainer trains data-parallel only (ZeRO "
                    "shards within it)", f"set parallelism.{name}: 1")
            for name, value in (("tensor", p.tensor), ("pipeline", p.pipeline), ("context", p.context))
            if value is not None and value > 1]


def _megatron_flag_problems(args: list[str]) -> list[Problem]:
    """Flags of program.args that Megatron-LM's parser does not know (its flag table, schemas/megatron_lm_args.json)."""
    if not args:
        return []
    from ..validate.megatron_args import _flag_hint, flag_table  # noqa: PLC0415  (a JSON file, read once)

    known = flag_table()
    return [Problem(f"program.args[{i}]", f"Megatron-LM has no flag {arg.split('=', 1)[0]!r}", _flag_hint(arg))
            for i, arg in enumerate(args) if arg.startswith("--") and arg.split("=", 1)[0] not in known]


def program_file_problems(program) -> list[Problem]:
    """The files the section names exist: the script (a readable .py file), the checkout and its entry."""
    if program is None or program.kind == "orch":
        return []
    if program.kind == "script":
        return _script_problems(Path(program.path)) if program.path else []
    if not program.megatron_lm:
        return []
    root = Path(program.megatron_lm)
    if not root.is_dir():
        return [Problem("program.megatron_lm", f"{root} is not a directory",
                        "point it at a Megatron-LM checkout (git clone https://github.com/NVIDIA/Megatron-LM), at the "
                        "same path on every node")]
    entry = root / program.entry
    if not entry.is_file():
        present = sorted(p.name for p in root.glob("pretrain_*.py"))
        hint = f"entry scripts there: {', '.join(present)}" if present else "is it a Megatron-LM checkout?"
        return [Problem("program.entry", f"{entry} does not exist", f"set program.entry to a file in "
                        f"{root} ({hint})")]
    return []


def _script_problems(path: Path) -> list[Problem]:
    if not path.exists():
        return [Problem("program.path", f"{path} does not exist", "point it at your training script (relative "
                        "paths are relative to the spec file)")]
    if not path.is_file() or path.suffix != ".py":
        return [Problem("program.path", f"{path} is not a .py file", "point it at the Python file that trains "
                        "(orch runs it as __main__, as `python script.py` would)")]
    if not os.access(path, os.R_OK):
        return [Problem("program.path", f"{path} is not readable", f"chmod a+r {path}")]
    return []
