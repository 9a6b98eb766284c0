"""Ask DeepSpeed's own config classes about ds_config dicts, in a process of its own: both ends.

The caller's end (:func:`probe_ds_configs`) imports nothing heavy. The subprocess end runs as
``python -m orchestrator.validate._ds_probe``: it reads one JSON request from stdin,
``{"requests": [{"config": {...}, "data_parallel_size": N, "path": "ds_config.json"}, ...]}``, and writes
``{"results": [{"problems": [...], "resolved": {...} | null, "warnings": [...]}, ...]}`` to stdout.

Why a subprocess: ``import deepspeed`` costs ~1.5 s and the check needs a process group; neither belongs
in the caller (``orch validate`` itself imports no torch or deepspeed).

Why a process group: ``DeepSpeedConfig`` takes its data-parallel size from an ``mpu`` object, but only
once ``deepspeed.comm`` is initialised; without it DeepSpeed silently assumes a world size of 1. So we
start a 1-process gloo group on an in-memory store (no network) and hand DeepSpeed an mpu that reports
the TARGET data-parallel size: DeepSpeed then does its own batch arithmetic for that size. DeepSpeed's
CPU backend would JIT-compile a shared-memory op (~30 s, g++) when it starts; a config check never
communicates, so :func:`start_single_process_group` skips that build.

Only this module (inside functions that run in the subprocess) and
:mod:`orchestrator.validate.deepspeed_keys` import deepspeed.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from ..errors import OrchError, Problem

CANARY_KEY = "orch_canary_key"
PROBE_TIMEOUT_S = 180

# ----------------------------------------------------------------------------------------------------------
# The caller's end
# ----------------------------------------------------------------------------------------------------------

class DeepSpeedProbeError(OrchError):
    """The DeepSpeed subprocess itself failed (crash, timeout, unreadable answer): a runtime failure."""

    exit_code = 1


class DeepSpeedUnavailable(OrchError):
    """deepspeed is not installed (the ``[train]`` extra), so only orch's static checks can run."""

    exit_code = 1


@dataclass(frozen=True)
class ProbeRequest:
    """One config to hand DeepSpeedConfig, for one data-parallel size."""

    config: dict
    data_parallel_size: int
    path: str = "ds_config.json"


@dataclass(frozen=True)
class ProbeResult:
    """DeepSpeed's verdict: problems (empty = accepted), what it resolved, and the warnings it logged."""

    problems: list[Problem]
    resolved: dict | None = None
    warnings: list[str] = field(default_factory=list)


def deepspeed_installed() -> bool:
    """Whether deepspeed can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec("deepspeed") is not None
    except (ImportError, ValueError):  # a broken install, or sys.modules["deepspeed"] = None
        return False


# DeepSpeed's answers by (config, dp) while a validate.prefetch.shared_answers() block runs (None: no reuse):
# a config checked once is not asked again, whichever path it came from or whether prefetch asked it ahead.
_ANSWERS: dict[tuple[str, int], tuple[str, dict]] | None = None


def _key(request: ProbeRequest) -> tuple[str, int]:
    return json.dumps(request.config, sort_keys=True, default=str), request.data_parallel_size


def probe_ds_configs(requests: list[ProbeRequest], *, timeout_s: float = PROBE_TIMEOUT_S) -> list[ProbeResult]:
    """Ask DeepSpeedConfig about each request in ONE subprocess (one import, one process group); configs
    already answered in this process are not asked again."""
    if not deepspeed_installed():
        raise DeepSpeedUnavailable("deepspeed is not installed: only orch's static ds_config checks ran "
                                   "(install the training stack with: pip install 'orch[train]')")
    answers = {} if _ANSWERS is None else _ANSWERS
    new = list({_key(r): r for r in requests if _key(r) not in answers}.values())
    if new:
        payload = {"requests": [{"config": r.config, "data_parallel_size": r.data_parallel_size, "path": r.path}
                                for r in new]}
        for request, item in zip(new, _run_probe(json.dumps(payload), timeout_s)["results"]):
            answers[_key(request)] = (request.path, item)
    return [_result(*answers[_key(r)], r.path) for r in requests]


def _result(asked_path: str, item: dict, path: str) -> ProbeResult:
    """An answer for ``path`` (problems name the path they were asked for: rename it)."""
    def renamed(text: str) -> str:
        return path + text[len(asked_path):] if text.startswith(asked_path) else text

    problems = [Problem(**{**p, "path": renamed(p["path"])}) for p in item["problems"]]
    return ProbeResult(problems, item["resolved"], item["warnings"])


def _probe_env() -> dict[str, str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def _run_probe(payload: str, timeout_s: float) -> dict:
    argv = [sys.executable, "-m", "orchestrator.validate._ds_probe"]
    try:
        done = subprocess.run(argv, input=payload, capture_output=True, text=True, timeout=timeout_s,
                              env=_probe_env(), check=False)
    except subprocess.TimeoutExpired as error:
        raise DeepSpeedProbeError(f"the DeepSpeed config check took longer than {timeout_s:g} s") from error
    try:
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or "results" not in answer:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise DeepSpeedProbeError(f"the DeepSpeed config check failed (exit {done.returncode}):\n{tail}")
    return answer


# ----------------------------------------------------------------------------------------------------------
# The subprocess end
# ----------------------------------------------------------------------------------------------------------



@dataclass(frozen=True)
class TargetMpu:
    """The slice of Megatron's mpu interface DeepSpeedConfig reads: it reports the target dp size."""

    data_parallel_size: int

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def start_single_process_group() -> None:
    """A 1-process gloo group on a HashStore, registered with deepspeed.comm (idempotent).

    DeepSpeed's CPU backend JIT-compiles a shared-memory allreduce op (~30 s with g++) when its
    communication backend starts; a config check never communicates, so that build is skipped.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch.distributed as torch_dist  # noqa: PLC0415

    import deepspeed.comm  # noqa: PLC0415
    import deepspeed.comm.torch  # noqa: PLC0415,F401 - the attribute deepspeed.comm.torch is shadowed by torch

    backend_module = sys.modules["deepspeed.comm.torch"]
    if hasattr(backend_module, "build_shm_op"):
        backend_module.build_shm_op = lambda: None
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    deepspeed.comm.init_distributed("gloo", verbose=False)


def build_config(config: dict, data_parallel_size: int) -> Any:
    """DeepSpeed's DeepSpeedConfig for ``config`` at ``data_parallel_size`` (raises what DeepSpeed raises)."""
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

    return DeepSpeedConfig(config, mpu=TargetMpu(data_parallel_size))


def resolved_summary(ds_config: Any) -> dict:
    """What DeepSpeed made of the config: the values orch's checks care about."""
    clipping = ds_config.gradient_clipping
    return {
        "train_batch_size": ds_config.train_batch_size,
        "train_micro_batch_size_per_gpu": ds_config.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": ds_config.gradient_accumulation_steps,
        "world_size": ds_config.world_size,
        "zero_stage": int(ds_config.zero_optimization_stage),
        "offload_optimizer_device": _offload_device(ds_config.zero_config.offload_optimizer),
        "offload_param_device": _offload_device(ds_config.zero_config.offload_param),
        "bf16_enabled": bool(ds_config.bfloat16_config.enabled),
        "fp16_enabled": bool(ds_config.float16_config.enabled),
        "optimizer_name": ds_config.optimizer_name,
        "scheduler_name": ds_config.scheduler_name,
        "gradient_clipping": clipping if isinstance(clipping, (int, float, str, type(None))) else repr(clipping),
        "pipeline": {k: v for k, v in ds_config.pipeline.items() if isinstance(v, (int, float, str, bool))},
    }


def _offload_device(offload: Any) -> str | None:
    if offload is None:
        return None
    device = offload.device
    return getattr(device, "value", device)


class _WarningCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_one(request: dict) -> dict:
    """Build DeepSpeedConfig for one request; DeepSpeed's exception, if any, becomes problems."""
    from deepspeed.utils import logger  # noqa: PLC0415

    collector = _WarningCollector()
    logger.addHandler(collector)
    try:
        ds_config = build_config(request["config"], request["data_parallel_size"])
    except Exception as error:  # noqa: BLE001 - every DeepSpeed failure is reported, none is fatal
        problems = problems_from_exception(error, request["config"], request.get("path", "ds_config.json"))
        return {"problems": problems, "resolved": None, "warnings": collector.messages}
    finally:
        logger.removeHandler(collector)
    return {"problems": [], "resolved": resolved_summary(ds_config), "warnings": collector.messages}


def problems_from_exception(error: BaseException, config: dict, path: str) -> list[dict]:
    """Problems (as dicts) quoting DeepSpeed's own words, located in the file where we can tell."""
    from pydantic import ValidationError  # noqa: PLC0415

    if isinstance(error, ValidationError):
        return [_pydantic_problem(error.title, item, config, path) for item in error.errors()]
    words = " ".join(str(error).split()) or "(no message)"
    location = _key_named_in(words, config)
    return [{
        "path": f"{path}:{location}" if location else path,
        "message": f"DeepSpeed's DeepSpeedConfig rejects the config with {type(error).__name__}: {words!r}",
        "hint": f"change '{location}' as DeepSpeed's message says" if location else
                "read DeepSpeed's message: orch's static checks have no rule for this case",
    }]


def _pydantic_problem(model_name: str, item: dict, config: dict, path: str) -> dict:
    section = _section_of_model(model_name, config)
    location = ".".join([section, *(str(part) for part in item["loc"])]) if section else \
        ".".join(str(part) for part in item["loc"])
    shown = item.get("input")
    shown = shown if isinstance(shown, (str, int, float, bool, type(None))) else type(shown).__name__
    message = f"DeepSpeed's {model_name} rejects {json.dumps(shown)}: {item['msg']!r}"
    hint = "remove the key or fix its spelling" if item["type"] == "extra_forbidden" else \
        f"give a value {model_name} accepts"
    return {"path": f"{path}:{location}" if location else path, "message": message, "hint": hint}


def _section_of_model(model_name: str, config: dict) -> str:
    """The top-level key (present in ``config``) that DeepSpeed parses with ``model_name``."""
    from . import _deepspeed_keys_data as data  # noqa: PLC0415

    for section, spec in data.SECTIONS.items():
        if spec["model"] == model_name and "." not in section and section in config:
            return section
    return ""


def _key_named_in(words: str, config: dict) -> str:
    """The config key that DeepSpeed's message names first, if any."""
    found = [(words.find(key), -len(key), key) for key in config if isinstance(key, str) and key in words]
    return min(found)[2] if found else ""


def main() -> int:
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever DeepSpeed prints goes to stderr; stdout carries only our JSON
    sys.stdout = sys.stderr
    request = json.load(sys.stdin)
    start_single_process_group()
    results = [check_one(item) for item in request["requests"]]
    json.dump({"results": results}, real_stdout)
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
