"""Validate a DeepSpeed config (user-written or generated): orch's static checks, then DeepSpeed itself.

Two layers, because DeepSpeed lets much through silently (a misspelled top-level key is ignored, so
``zero_optimisation`` trains at ZeRO stage 0; ``bf16.enabled: "yes"`` becomes true; an unknown optimizer
type passes until ``deepspeed.initialize``; a leftover HF ``"auto"`` is dropped for the default):

* :func:`check_ds_config` — pure and fast, imports neither deepspeed nor torch. The keys and types it
  knows come from ``_deepspeed_keys_data``, GENERATED from the installed DeepSpeed by
  ``python -m orchestrator.validate.deepspeed_keys --regenerate`` (an integration test fails when stale).
* :func:`check_ds_config_with_deepspeed` — the final authority: DeepSpeed's own ``DeepSpeedConfig`` (and
  its pydantic ZeRO/offload/precision models) built for the target data-parallel size in a subprocess
  (:mod:`orchestrator.validate._ds_probe`); DeepSpeed's exceptions come back as Problems quoting its words.

Without deepspeed installed (no ``[train]`` extra) the second layer raises :class:`DeepSpeedUnavailable`;
:func:`validate_ds_config_file` turns that into a note and still returns the static problems.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from ..errors import Problem, SpecError
from ..typed import article, describe_value, did_you_mean
from . import _deepspeed_keys_data as KEYS
from .deepspeed_values import check_comms_logger, check_finite, check_optimizer_values
from ._ds_probe import (DeepSpeedProbeError, DeepSpeedUnavailable, ProbeRequest, ProbeResult,  # noqa: F401
                        deepspeed_installed, probe_ds_configs)

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_TRUE_WORDS = {"true", "yes", "on", "1", "y", "t"}
_FALSE_WORDS = {"false", "no", "off", "0", "n", "f"}
_OFFLOADING = ("cpu", "nvme")
_OFFLOAD_RULES = (("offload_optimizer", 1, "at stage 0 there is no ZeRO optimizer to offload the optimizer states"),
                  ("offload_param", 3, "only the ZeRO-3 engine reads offload_param, so no parameter is offloaded"))
_CHOICE_HINTS = {"zero_optimization.stage": "use 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)"}
_KEYS_LISTED = "delete it; the keys DeepSpeed reads are in orchestrator/validate/_deepspeed_keys_data.py"
DS = f"DeepSpeed {KEYS.DEEPSPEED_VERSION}"


class DeepSpeedCheckSkipped(UserWarning):
    """Warned by :func:`validate_ds_config_file` when it cannot ask DeepSpeed and no ``notes`` list is given."""


def _at(path: str, where: str) -> str:
    return f"{path}:{where}" if where else path


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


# ----------------------------------------------------------------------------------------------------------
# Layer 1: static checks
# ----------------------------------------------------------------------------------------------------------

def check_ds_config(config: dict, *, world_size: int | None = None, model_parallel_size: int = 1,
                    path: str = "ds_config.json") -> list[Problem]:
    """Every problem orch can see in a ds_config dict without importing DeepSpeed.

    ``world_size`` (all GPUs) and ``model_parallel_size`` (tp * pp) give the data-parallel size
    dp = world_size / model_parallel_size used for the batch arithmetic; without ``world_size`` only the
    divisibility that any dp needs is checked.
    """
    if not isinstance(config, dict):
        return [Problem(path, f"must be a JSON object of DeepSpeed settings, got {_describe_json(config)}",
                        'write {"train_batch_size": ..., ...}')]
    problems = check_top_level_keys(config, path) + check_section_keys(config, path)
    problems += check_value_types(config, path) + check_auto_leftovers(config, path)
    problems += check_precision(config, path) + check_zero(config, path) + check_pipeline(config, path)
    problems += check_optimizer(config, path) + check_scheduler(config, path)
    problems += check_finite(config, path) + check_optimizer_values(config, path) + check_comms_logger(config, path)
    problems += check_batch(config, world_size=world_size, model_parallel_size=model_parallel_size, path=path)
    return problems


def check_top_level_keys(config: dict, path: str) -> list[Problem]:
    """Keys DeepSpeed never reads (it ignores them silently) and keys it refuses as removed features."""
    problems = []
    for key in config:
        if key in KEYS.REMOVED_TOP_LEVEL:
            problems.append(Problem(_at(path, key), f"'{key}' was removed from DeepSpeed; {DS} refuses any "
                                    "config that contains it", "delete the key"))
        elif key not in KEYS.TOP_LEVEL:
            problems.append(Problem(_at(path, key), f"unknown key: {DS} never reads '{key}' and ignores it "
                                    "silently", _key_hint(str(key), list(KEYS.TOP_LEVEL))))
    return problems


def _key_hint(key: str, choices: list[str], fallback: str = _KEYS_LISTED) -> str:
    """did_you_mean, except that a long "allowed: ..." list is replaced by ``fallback``."""
    hint = did_you_mean(key, choices)
    return fallback if hint.startswith("allowed:") and len(choices) > 12 else hint


def _get(config: dict, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def check_section_keys(config: dict, path: str) -> list[Problem]:
    """Unknown keys inside the sections whose keys DeepSpeed defines (its pydantic models, optimizer,
    scheduler, pipeline), and sections that are not mappings."""
    problems = []
    for section, spec in sorted(KEYS.SECTIONS.items()):
        value = _get(config, section)
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append(Problem(_at(path, section), f"must be a mapping, got {_describe_json(value)}",
                                    f'write "{section.rsplit(".", 1)[-1]}": {{...}}'))
            continue
        problems += _unknown_in_section(value, section, spec, path)
    return problems


def _unknown_in_section(value: dict, section: str, spec: dict, path: str) -> list[Problem]:
    removed = KEYS.REMOVED_IN_SECTION.get(section, [])
    fate = f"{DS} refuses it ({spec['model']} forbids unknown keys)" if spec["rejects_unknown"] else \
        f"{DS} ignores it silently"
    problems = []
    for key in value:
        where = _join(section, key)
        if key in removed:
            problems.append(Problem(_at(path, where), f"'{key}' was removed from DeepSpeed; {DS} refuses it",
                                    "delete the key"))
        elif key not in spec["keys"]:
            problems.append(Problem(_at(path, where), f"unknown key in {section}: {fate}",
                                    _section_key_hint(str(key), section, list(spec["keys"]))))
    return problems


def _section_key_hint(key: str, section: str, keys: list[str]) -> str:
    hint = _key_hint(key, keys)
    if hint.startswith("allowed:") and "params" in keys:
        return f"move it into {section}.params ({DS} reads only {', '.join(sorted(keys))} here)"
    return hint


def check_value_types(config: dict, path: str) -> list[Problem]:
    """Quoted booleans and numbers, wrong types and out-of-choice values, where DeepSpeed defines the type.

    DeepSpeed's pydantic models coerce ``"yes"`` to true and ``"2"`` to 2, and top-level scalars are used
    as given (``gradient_clipping: "x"`` is stored as the string): orch asks for the real JSON type.
    """
    problems = []
    for key, info in KEYS.TOP_LEVEL.items():
        if key in config and key not in KEYS.SECTIONS:
            problems += _typed_value(config[key], info, key, path)
    for section, spec in sorted(KEYS.SECTIONS.items()):
        value = _get(config, section)
        if isinstance(value, dict):
            for key, info in spec["keys"].items():
                if key in value and _join(section, key) not in KEYS.SECTIONS:
                    problems += _typed_value(value[key], info, _join(section, key), path)
    for section in ("optimizer.params", "scheduler.params"):
        problems += _quoted_scalars(_get(config, section), section, path)
    return problems


def _typed_value(value: Any, info: dict, where: str, path: str) -> list[Problem]:
    if _is_auto(value) or (value is None and info.get("nullable", True)):
        return []
    expected = info["type"]
    problem = _type_mismatch(value, expected, where, path)
    if problem is None and "choices" in info and value not in info["choices"]:
        shown = ", ".join(json.dumps(c) for c in info["choices"])
        problem = Problem(_at(path, where), f"{json.dumps(value)} is not allowed: {DS} accepts {shown}",
                          _CHOICE_HINTS.get(where, f"use one of {shown}"))
    return [problem] if problem else []


def _type_mismatch(value: Any, expected: str, where: str, path: str) -> Problem | None:
    ok = {"boolean": lambda v: isinstance(v, bool),
          "integer": lambda v: _is_whole(v),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str),
          "mapping": lambda v: isinstance(v, dict),
          "list": lambda v: isinstance(v, list)}.get(expected)
    if ok is None or (value is not None and ok(value)):
        return None
    if value is None:
        return Problem(_at(path, where), f"must be {article(expected)}, got null", "give a value or delete the key")
    return Problem(_at(path, where), f"must be {article(expected)}, got {_describe_json(value)}{_quoted_note(value)}",
                   _type_hint(value, expected))


def _is_whole(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def _quoted_note(value: Any) -> str:
    if isinstance(value, str) and (value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS or _numeric(value)):
        return " (quoted)"
    return ""


def _type_hint(value: Any, expected: str) -> str:
    if expected == "boolean" and isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
        return f"write {'true' if value.strip().lower() in _TRUE_WORDS else 'false'} without quotes"
    if expected in ("integer", "number") and isinstance(value, str) and _numeric(value):
        return f"write {value.strip()} without quotes"
    return {"boolean": "write true or false, unquoted", "integer": "write a whole number, unquoted",
            "number": "write a number such as 1.0, unquoted", "string": "quote the value",
            "mapping": "write {...}", "list": "write [...]"}[expected]


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _quoted_scalars(params: Any, section: str, path: str) -> list[Problem]:
    if not isinstance(params, dict):
        return []
    return [Problem(_at(path, _join(section, key)), f"quoted number {json.dumps(value)}: the optimizer / "
                    "scheduler receives a string where it computes with a number", f"write {value.strip()} "
                    "without quotes") for key, value in params.items() if isinstance(value, str) and _numeric(value)]


def check_auto_leftovers(config: Any, path: str, where: str = "") -> list[Problem]:
    """``"auto"`` anywhere DeepSpeed's own default is not "auto": a Hugging Face Trainer placeholder that
    only the HF integration fills in; DeepSpeed alone drops it for the default or fails on it."""
    if isinstance(config, dict):
        return [p for key, value in config.items() for p in check_auto_leftovers(value, path, _join(where, key))]
    if isinstance(config, list):
        return [p for i, value in enumerate(config) for p in check_auto_leftovers(value, path, f"{where}[{i}]")]
    if _is_auto(config) and where not in KEYS.AUTO_IS_DEEPSPEED_DEFAULT:
        return [Problem(_at(path, where), 'leftover "auto": a Hugging Face Trainer placeholder; DeepSpeed '
                        "without the HF integration silently uses its default here or fails",
                        "write the resolved value (orch generate writes every value resolved)")]
    return []


def _enabled(section: Any) -> bool:
    if not isinstance(section, dict):
        return False
    value = section.get("enabled")
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE_WORDS)


# The dtypes DeepSpeed 0.19.8 reduces gradients in (runtime/config.py get_communication_data_type, lower-cased).
COMM_DTYPE_KEYS = ("communication_data_type", "seq_parallel_communication_data_type")
COMM_DTYPES = ("fp32", "bf16", "fp16")


def check_precision(config: dict, path: str) -> list[Problem]:
    """fp16 and bf16 are exclusive; the legacy "bfloat16" section is ignored when "bf16" is present."""
    problems = []
    bf16 = config.get("bf16") if "bf16" in config else config.get("bfloat16")
    if _enabled(bf16) and _enabled(config.get("fp16")):
        problems.append(Problem(_at(path, "fp16.enabled"), "fp16 and bf16 are both enabled; DeepSpeed trains in one "
                                "half-precision format", "set one of fp16.enabled / bf16.enabled to false"))
    if "bf16" in config and "bfloat16" in config:
        problems.append(Problem(_at(path, "bfloat16"), f"ignored: {DS} reads the legacy 'bfloat16' section only "
                                "when 'bf16' is absent", "merge it into 'bf16' and delete 'bfloat16'"))
    for key in COMM_DTYPE_KEYS:
        value = config.get(key)
        if value is not None and not (isinstance(value, str) and value.lower() in COMM_DTYPES):
            problems.append(Problem(_at(path, key), f"{value!r} is not a gradient reduction dtype {DS} knows "
                                    "(runtime/config.py get_communication_data_type raises ValueError)",
                                    f"use one of {', '.join(COMM_DTYPES)} (orch: training.grad_reduce_dtype), or "
                                    "remove it"))
    return problems


def _zero_stage(config: dict) -> int | None:
    """The ZeRO stage DeepSpeed will use (0 when absent), or None when the value is itself invalid."""
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return None
    stage = zero.get("stage", 0)
    choices = KEYS.SECTIONS["zero_optimization"]["keys"]["stage"]["choices"]
    return stage if isinstance(stage, int) and not isinstance(stage, bool) and stage in choices else None


def check_zero(config: dict, path: str) -> list[Problem]:
    """Offload settings DeepSpeed's config accepts but its ZeRO stage cannot use."""
    stage = _zero_stage(config)
    zero = config.get("zero_optimization")
    if stage is None or not isinstance(zero, dict):
        return []
    problems = []
    for name, needs, consequence in _OFFLOAD_RULES:
        offload = zero.get(name)
        device = offload.get("device") if isinstance(offload, dict) else None
        where = f"zero_optimization.{name}.device"
        if device in _OFFLOADING and stage < needs:
            problems.append(Problem(_at(path, where), f"{name} to {device!r} with ZeRO stage {stage}: it needs stage "
                                    f">= {needs}; {DS}'s config accepts this, but {consequence}",
                                    f"set zero_optimization.stage to {needs}{'' if needs == 3 else ' or higher'}, "
                                    f"or delete {name}"))
        if device == "nvme" and not offload.get("nvme_path"):
            problems.append(Problem(_at(path, f"zero_optimization.{name}.nvme_path"), "device 'nvme' needs an "
                                    "nvme_path (the swap directory); DeepSpeed fails when it starts swapping",
                                    "add \"nvme_path\": \"/local_nvme\" or use device 'cpu'"))
    return problems


def check_pipeline(config: dict, path: str) -> list[Problem]:
    """DeepSpeed's pipeline engine refuses ZeRO-2/3; its config classes do not notice."""
    stage = _zero_stage(config)
    if "pipeline" in config and stage is not None and stage >= 2:
        return [Problem(_at(path, "zero_optimization.stage"), f"ZeRO stage {stage} with a 'pipeline' section: "
                        "DeepSpeed's pipeline engine supports only stages 0 and 1 (the config classes accept this; "
                        "deepspeed.initialize fails)", "use zero_optimization.stage 0 or 1 with pipeline "
                        "parallelism, or delete 'pipeline' if the model is not a PipelineModule")]
    return []


def check_optimizer(config: dict, path: str) -> list[Problem]:
    """The optimizer type must name one DeepSpeed builds (its own, case-insensitive, or torch.optim's)."""
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, dict):
        return []
    name = optimizer.get("type")
    known = list(KEYS.DEEPSPEED_OPTIMIZERS) + list(KEYS.TORCH_OPTIMIZERS)
    problems = _section_type(optimizer, "optimizer", name, path,
                             isinstance(name, str) and (name.lower() in KEYS.DEEPSPEED_OPTIMIZERS
                                                        or name in KEYS.TORCH_OPTIMIZERS), known)
    params = optimizer.get("params")
    if isinstance(params, dict) and "max_grad_norm" in params:
        problems.append(Problem(_at(path, "optimizer.params.max_grad_norm"), "max_grad_norm as an optimizer "
                                "parameter: DeepSpeed's config only warns, deepspeed.initialize then refuses it",
                                "delete it and set the top-level \"gradient_clipping\" instead"))
    return problems


def check_scheduler(config: dict, path: str) -> list[Problem]:
    """The scheduler type must name a DeepSpeed LR schedule or a torch.optim.lr_scheduler class (exact)."""
    scheduler = config.get("scheduler")
    if not isinstance(scheduler, dict):
        return []
    name = scheduler.get("type")
    known = list(KEYS.DEEPSPEED_SCHEDULERS) + list(KEYS.TORCH_SCHEDULERS)
    return _section_type(scheduler, "scheduler", name, path,
                         isinstance(name, str) and name in known, known)


def _section_type(section: dict, label: str, name: Any, path: str, known_ok: bool,
                  known: list[str]) -> list[Problem]:
    if "type" not in section:
        return [Problem(_at(path, f"{label}.type"), f"missing: without a type {DS} ignores the whole "
                        f"'{label}' section silently", f"add \"type\": one of {', '.join(known[:9])}, ...")]
    if _is_auto(name) or known_ok:
        return []
    return [Problem(_at(path, f"{label}.type"), f"unknown {label} type {json.dumps(name)}: {DS}'s config "
                    "accepts it and deepspeed.initialize fails on it",
                    _key_hint(str(name), known, f"use one of {', '.join(known[:9])}, ... (see {label} types in "
                              "orchestrator/validate/_deepspeed_keys_data.py)"))]


# ----------------------------------------------------------------------------------------------------------
# Batch arithmetic: train_batch_size = micro * accum * dp, never by silent floor division
# ----------------------------------------------------------------------------------------------------------

def check_batch(config: dict, *, world_size: int | None, model_parallel_size: int = 1,
                path: str = "ds_config.json") -> list[Problem]:
    """The three batch keys agree with each other and with dp = world_size / model_parallel_size (and / the
    config's sequence_parallel_size, the Ulysses degree, as DeepSpeed's own batch check divides)."""
    problems, dp = _data_parallel_size(world_size, model_parallel_size * _sequence_parallel_size(config), path)
    values: dict[str, int] = {}
    for key in BATCH_KEYS:
        value = config.get(key)
        if value is None or _is_auto(value):
            continue
        if not _is_whole(value) or isinstance(value, float) or value < 1:
            problems.append(Problem(_at(path, key), f"must be a positive whole number, got {_describe_json(value)}"
                                    f"{_quoted_note(value)}", _type_hint(value, "integer") if isinstance(value, str)
                                    else "write a whole number >= 1, unquoted"))
        else:
            values[key] = value
    if problems or any(_is_auto(config.get(k)) for k in BATCH_KEYS):
        return problems
    problems = _batch_rule(values, dp, path)
    if problems and dp is not None and model_parallel_size == 1 and world_size > 1:
        problems = [_with_model_parallel_hint(p, world_size) for p in problems]
    return problems


def _with_model_parallel_hint(problem: Problem, world_size: int) -> Problem:
    """A batch mismatch checked with dp = world size: say that tensor/pipeline ranks change dp."""
    extra = (f"dp({world_size}) assumes every GPU is data parallel; if the run uses tensor or pipeline "
             f"parallelism, pass --model-parallel-size (tp * pp), e.g. tp 2 gives dp = {world_size} / 2")
    return Problem(problem.path, problem.message, f"{problem.hint}; {extra}" if problem.hint else extra)


def _sequence_parallel_size(config: dict) -> int:
    """DeepSpeed-Ulysses' degree when the config gives a whole one (other values are reported elsewhere)."""
    value = config.get("sequence_parallel_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _data_parallel_size(world_size: int | None, model_parallel_size: int,
                        path: str) -> tuple[list[Problem], int | None]:
    if world_size is None:
        return [], None
    if world_size < 1 or model_parallel_size < 1 or world_size % model_parallel_size:
        return [Problem(path, f"world_size({world_size}) is not a positive multiple of "
                        f"model_parallel_size({model_parallel_size}), so there is no whole data-parallel size",
                        "check --world-size and --model-parallel-size (tp * pp)")], None
    return [], world_size // model_parallel_size


def _batch_rule(values: dict[str, int], dp: int | None, path: str) -> list[Problem]:
    given = tuple(key in values for key in BATCH_KEYS)
    if not given[0] and not given[1]:
        return [Problem(_at(path, "train_batch_size"), "neither train_batch_size nor train_micro_batch_size_per_gpu"
                        " is given; DeepSpeed needs at least one", "add train_micro_batch_size_per_gpu and "
                        "gradient_accumulation_steps (and train_batch_size = their product * dp)")]
    if given[0] and (given[1] or given[2] or dp is not None):
        return _derive_or_compare(values, dp, path)
    return []


def _derive_or_compare(values: dict[str, int], dp: int | None, path: str) -> list[Problem]:
    total = values["train_batch_size"]
    known = {k: values[k] for k in BATCH_KEYS[1:] if k in values}
    factors = [f"{k}({v})" for k, v in known.items()] + ([f"dp({dp})"] if dp is not None else [])
    product = math.prod(known.values()) * (dp or 1)
    operands = " * ".join(factors) + (f" = {product}" if len(factors) > 1 else "")
    if total % product == 0 and (len(known) < 2 or dp is None):
        return []
    if len(known) == 2 and dp is not None:
        return [] if total == product else [Problem(_at(path, "train_batch_size"), f"train_batch_size({total}) != "
                                                    f"{operands}", _fix_hint(values, dp))]
    if dp is None:
        return [Problem(_at(path, "train_batch_size"), f"train_batch_size({total}) is not a multiple of {operands}, "
                        "so no data-parallel size makes the batch whole", f"make train_batch_size a multiple of "
                        f"{product}")]
    missing = [k for k in BATCH_KEYS[1:] if k not in known]
    derived = f"derive {missing[0]}" if len(missing) == 1 else \
        "set gradient_accumulation_steps = 1 and derive train_micro_batch_size_per_gpu"
    floor = total // product
    return [Problem(_at(path, "train_batch_size"), f"DeepSpeed would {derived} = train_batch_size({total}) // "
                    f"({operands}) = {floor} by floor division, but {total} / {product} = {total / product:g} is "
                    "not whole, so DeepSpeed's own batch check then fails",
                    f"make train_batch_size a multiple of {product} (e.g. {max(floor, 1) * product}), or give "
                    f"{' and '.join(missing)} explicitly")]


def _fix_hint(values: dict[str, int], dp: int) -> str:
    total, micro, accum = (values[k] for k in BATCH_KEYS)
    options = [f"train_batch_size = {micro * accum * dp}"]
    if total % (micro * dp) == 0:
        options.append(f"gradient_accumulation_steps = {total // (micro * dp)}")
    if total % (accum * dp) == 0:
        options.append(f"train_micro_batch_size_per_gpu = {total // (accum * dp)}")
    return "set " + ", or ".join(options)


def _describe_json(value: Any) -> str:
    return describe_value(value, quote=json.dumps)


# ----------------------------------------------------------------------------------------------------------
# Layer 2: DeepSpeed's own config classes, in a subprocess
# ----------------------------------------------------------------------------------------------------------

def check_ds_config_with_deepspeed(config: dict, *, world_size: int, model_parallel_size: int = 1,
                                   path: str = "ds_config.json") -> list[Problem]:
    """DeepSpeed's own verdict on ``config`` at dp = world_size / model_parallel_size.

    Raises :class:`DeepSpeedUnavailable` without deepspeed, :class:`DeepSpeedProbeError` if the subprocess
    fails. Takes ~2 s (the import), so run the static :func:`check_ds_config` first.
    """
    if world_size is None:
        raise TypeError("check_ds_config_with_deepspeed needs a world_size (validate_ds_config_file infers one)")
    problems, dp = _data_parallel_size(world_size, model_parallel_size * _sequence_parallel_size(config), path)
    if problems:
        return problems
    return probe_ds_configs([ProbeRequest(config, dp, path)])[0].problems


def _implied_world_size(config: dict, model_parallel_size: int) -> int:
    """The world size the three batch keys imply (dp = total / (micro * accum)), else one dp rank."""
    total, micro, accum = (config.get(k) for k in BATCH_KEYS)
    if all(isinstance(v, int) and v > 0 for v in (total, micro, accum)) and total % (micro * accum) == 0:
        return total // (micro * accum) * model_parallel_size
    return model_parallel_size


def load_ds_config_text(text: str, path: str) -> tuple[Any, list[Problem]]:
    """Parse JSON (within orchestrator.userfiles' limits); bad JSON and duplicate keys (DeepSpeed's own
    loader refuses those) become problems."""
    from ..userfiles import parse_json  # noqa: PLC0415

    duplicates: list[str] = []
    try:
        data = parse_json(text, path, duplicates=duplicates)
    except SpecError as error:
        return None, error.problems
    return data, [Problem(path, f"duplicate key '{key}': json keeps the last value, DeepSpeed's loader refuses "
                          "the file", "keep one of them") for key in duplicates]


def validate_ds_config_file(path: str | os.PathLike, *, world_size: int | None, model_parallel_size: int = 1,
                            deep: bool = True, notes: list[str] | None = None) -> list[Problem]:
    """Every problem in a ds_config.json: JSON syntax, the static checks, then (when those pass and
    ``deep``) DeepSpeed's own config classes.

    Things that are not problems — the DeepSpeed check was skipped (no deepspeed installed), the batch was
    checked only for the dp its keys imply (no ``world_size``), warnings DeepSpeed logged — go to ``notes``
    when a list is given, else the skip is warned as :class:`DeepSpeedCheckSkipped`.
    """
    where = str(path)
    from ..userfiles import read_user_text  # noqa: PLC0415

    try:
        text = read_user_text(path)
    except SpecError as error:
        return error.problems
    config, problems = load_ds_config_text(text, where)
    if problems:
        return problems
    problems = check_ds_config(config, world_size=world_size, model_parallel_size=model_parallel_size, path=where)
    if problems or not deep:
        return problems
    return _deep_check(config, world_size, model_parallel_size, where, notes)


def deep_check_sizes(config: dict, world_size: int | None, model_parallel_size: int) -> tuple[int, int]:
    """(world size, dp) the deep check asks DeepSpeed about; prefetch.py asks the same (its answers are
    cached by config and dp)."""
    model_parallel_size *= _sequence_parallel_size(config)   # Ulysses ranks share the data-parallel batch
    target = world_size if world_size is not None else _implied_world_size(config, model_parallel_size)
    return target, target // model_parallel_size


def _deep_check(config: dict, world_size: int | None, model_parallel_size: int, path: str,
                notes: list[str] | None) -> list[Problem]:
    target, dp = deep_check_sizes(config, world_size, model_parallel_size)
    try:
        result = probe_ds_configs([ProbeRequest(config, dp, path)])[0]
    except DeepSpeedUnavailable as error:
        _note(notes, f"{path}: {error}")
        return []
    if world_size is None:
        _note(notes, f"{path}: DeepSpeed checked the batch for world size {target} (what its batch keys imply); "
                     "pass --world-size to check it for your cluster", warn=False)
    for message in result.warnings:
        _note(notes, f"{path}: DeepSpeed warns: {message}", warn=False)
    return result.problems


def _note(notes: list[str] | None, text: str, *, warn: bool = True) -> None:
    if notes is not None:
        notes.append(text)
    elif warn:
        warnings.warn(text, DeepSpeedCheckSkipped, stacklevel=4)
