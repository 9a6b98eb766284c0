"""Values in a ds_config.json that DeepSpeed's config classes accept and training then breaks on: NaN and
Infinity (Python's json reads them), a negative learning rate, clip, eps or weight decay, betas that are
not two numbers in [0, 1). Pure functions of the config dict, each returning Problems."""
from __future__ import annotations

import json
import math
from typing import Any

from ..errors import Problem


def _at(path: str, where: str) -> str:
    return f"{path}:{where}" if where else path


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def check_finite(config: Any, path: str, where: str = "") -> list[Problem]:
    """NaN and Infinity: Python's json reads them, DeepSpeed trains with them (a NaN lr, an infinite clip)."""
    if isinstance(config, float) and not math.isfinite(config):
        return [Problem(_at(path, where), f"{config!r} is not a finite number (JSON has no NaN/Infinity)",
                        "write a finite number")]
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    return [p for key, value in items for p in check_finite(value, path, _join(where, key))]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_optimizer_values(config: dict, path: str) -> list[Problem]:
    """Values DeepSpeed's config classes accept and training then breaks on: a negative lr, clip, eps or
    weight decay, betas that are not two numbers in [0, 1)."""
    problems = []
    clip = config.get("gradient_clipping")
    if _is_number(clip) and clip < 0:
        problems.append(Problem(_at(path, "gradient_clipping"), f"{clip!r} is negative", "use 0 (off) or a positive "
                                "max gradient norm"))
    params = config.get("optimizer", {}).get("params") if isinstance(config.get("optimizer"), dict) else None
    if not isinstance(params, dict):
        return problems
    for key in ("lr", "eps", "weight_decay"):
        if _is_number(params.get(key)) and params[key] < 0:
            problems.append(Problem(_at(path, f"optimizer.params.{key}"), f"{params[key]!r} is negative",
                                    "use a value >= 0"))
    betas = params.get("betas")
    if "betas" in params and not (isinstance(betas, list) and len(betas) == 2
                                  and all(_is_number(b) and 0 <= b < 1 for b in betas)):
        problems.append(Problem(_at(path, "optimizer.params.betas"), f"{json.dumps(betas)} is not two numbers in "
                                "[0, 1)", "write [beta1, beta2], e.g. [0.9, 0.95]"))
    return problems


def check_comms_logger(config: dict, path: str) -> list[Problem]:
    """A ``comms_logger`` section that says ``"enabled": false``: DeepSpeed turns the logger on all the same
    (deepspeed/comm/config.py: ``comms_logger_enabled = 'comms_logger' in ds_config``, which
    utils/comms_logging.py CommsLogger.configure takes as ``enabled``; so in 0.19.8, reported as issue #2861).
    The logger then synchronizes the device after every collective (no overlap_comm) and, with prof_all,
    re-sums every timing it has recorded at each call, so steps slow down as the run goes on."""
    section = config.get("comms_logger")
    if isinstance(section, dict) and section.get("enabled") is False:
        return [Problem(_at(path, "comms_logger.enabled"), "false is ignored: DeepSpeed enables its comms logger "
                        "whenever the section exists, then synchronizes after every collective",
                        "delete the comms_logger section to turn the logger off (in a run dir orch wrote: regenerate it "
                        "with orch generate --force)")]
    return []
