"""Megatron-LM's own argument checks, run for real: ``parse_args`` + ``validate_args`` of core_v0.16.1.

Megatron-LM is not a pip package. Point ``ORCH_MEGATRON_LM`` at a tree holding the ``megatron/`` folder of
the tag that matches the installed megatron-core (``core_v0.16.1``)::

    tests/tools/prepare_megatron_lm.sh /tmp/megatron-lm-core_v0.16.1   # from a local mirror, or:
    git clone --depth 1 -b core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /tmp/megatron-lm-core_v0.16.1
    export ORCH_MEGATRON_LM=/tmp/megatron-lm-core_v0.16.1

Its ``megatron/training`` imports ``six`` and ``regex``; when the Python running orch lacks them, put them in
``$ORCH_MEGATRON_LM/_deps`` (``pip install --target``; the prepare script does). Without ORCH_MEGATRON_LM
callers skip this check (:func:`megatron_lm_root` returns None; :data:`HOW_TO_ENABLE` says how).

The check runs in a subprocess (:mod:`orchestrator.validate.megatron_child`) so Megatron's globals, its
monkey-patched ``get_device_arch_version`` and its prints stay there. Its failures come back as Problems
that quote Megatron's own words: the assertion or exception message, or, for a bare ``assert``, the
asserting source line.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrchError, Problem
from ..render.megatron import MEGATRON_LM_TAG

ENV_VAR = "ORCH_MEGATRON_LM"
TAG = MEGATRON_LM_TAG
HOW_TO_ENABLE = (f"set {ENV_VAR} to a tree holding Megatron-LM {TAG}'s megatron/ folder "
                 f"(in a checkout: make megatron-lm MEGATRON_LM_GIT=CLONE, or tests/tools/prepare_megatron_lm.sh "
                 f"DEST; then export {ENV_VAR}=DEST)")
TIMEOUT_S = 180
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class MegatronUnavailable(OrchError):
    """The real Megatron check could not run (missing package or tree): an environment problem."""


def megatron_lm_root() -> Path | None:
    """The Megatron-LM tree named by ORCH_MEGATRON_LM, or None when unset."""
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


def run_child(request: dict, *, env: dict[str, str] | None = None, extra_path: list[Path] = ()) -> dict:
    """Run one megatron_child request in a fresh interpreter; return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="orch-megatron-") as tmp:
        result_path = Path(tmp) / "result.json"
        child_env = _child_env(env or {}, extra_path)
        cmd = [sys.executable, "-W", "ignore", "-m", "orchestrator.validate.megatron_child"]
        try:
            proc = subprocess.run(cmd, input=json.dumps({**request, "result_path": str(result_path)}),
                                  capture_output=True, text=True, env=child_env, cwd=tmp, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise MegatronUnavailable(f"the Megatron check did not finish in {TIMEOUT_S} s") from None
        if not result_path.is_file():
            tail = (proc.stderr or proc.stdout)[-1500:]
            raise MegatronUnavailable(f"the Megatron check crashed (exit {proc.returncode}): {tail}")
        result = json.loads(result_path.read_text())
    if result.get("setup_failed"):
        err = result["error"]
        raise MegatronUnavailable(f"cannot load Megatron ({err['type']}: {err['message']}); "
                                  "install the [train] extra, and six + regex for Megatron-LM")
    return result


def _child_env(env: dict[str, str], extra_path: list[Path]) -> dict[str, str]:
    """The caller's environment without CUDA_DEVICE_MAX_CONNECTIONS, then ``env`` on top."""
    child = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    paths = [str(_PACKAGE_ROOT), *map(str, extra_path)]
    if child.get("PYTHONPATH"):
        paths.append(child["PYTHONPATH"])
    child["PYTHONPATH"] = os.pathsep.join(paths)
    return {**child, **env}


def _deps_path(root: Path) -> list[Path]:
    deps = root / "_deps"
    return [deps] if deps.is_dir() else []


def _check_root(root: Path) -> None:
    if not (root / "megatron" / "training" / "arguments.py").is_file():
        raise MegatronUnavailable(f"{ENV_VAR}={root} holds no megatron/training/arguments.py; {HOW_TO_ENABLE}")


def check_with_megatron_lm(args: list[str], *, world_size: int, env: dict[str, str], megatron_lm_root: Path,
                           device_arch: int = 9, path: str = "megatron_args") -> list[Problem]:
    """Problems Megatron-LM's parse_args + validate_args (and pretrain_gpt's next steps) find in ``args``.

    ``env`` is the launch environment (CUDA_DEVICE_MAX_CONNECTIONS as the launch script exports it);
    WORLD_SIZE and RANK come from ``world_size``. ``device_arch`` stands in for the GPU's compute
    capability major (9 = Hopper; 10 = Blackwell lifts the CUDA_DEVICE_MAX_CONNECTIONS rule).
    """
    return megatron_lm_report(args, world_size=world_size, env=env, megatron_lm_root=megatron_lm_root,
                              device_arch=device_arch, path=path)[0]


def megatron_lm_report(args: list[str], *, world_size: int, env: dict[str, str], megatron_lm_root: Path,
                       device_arch: int = 9, path: str = "megatron_args") -> tuple[list[Problem], dict]:
    """The problems, and what Megatron-LM derived from ``args`` (data_parallel_size, num_microbatches,
    padded_vocab_size, and ``skipped`` when a step needs a package this machine lacks)."""
    return megatron_lm_reports([LmRun(args, world_size, env, path)], megatron_lm_root=megatron_lm_root,
                               device_arch=device_arch)[0]


@dataclass(frozen=True)
class LmRun:
    """One argument list to check, with the world size and launch environment it runs under."""

    args: list[str]
    world_size: int
    env: dict[str, str]
    path: str = "megatron_args"


def megatron_lm_reports(runs: list[LmRun], *, megatron_lm_root: Path,
                        device_arch: int = 9) -> list[tuple[list[Problem], dict]]:
    """:func:`megatron_lm_report` for several runs in one subprocess (one ~4 s megatron import)."""
    root = Path(megatron_lm_root)
    _check_root(root)
    requests = [{"mode": "lm-check", "root": str(root), "args": list(run.args), "device_arch": device_arch,
                 "env": {**run.env, "WORLD_SIZE": str(run.world_size), "RANK": "0", "LOCAL_RANK": "0"}}
                for run in runs]
    results = run_child({"mode": "batch", "requests": requests}, extra_path=_deps_path(root))["results"]
    return [([] if r["ok"] else [_problem(r["error"], run.path)], r.get("facts", {}))
            for run, r in zip(runs, results)]


_STAGE_WORDS = {
    "parse_args": "Megatron-LM's argument parser rejects the arguments",
    "validate_args": "Megatron-LM's validate_args rejects the arguments",
    "num_microbatches": "Megatron-Core's micro-batch calculator rejects the batch sizes",
    "build_tokenizer": "Megatron-LM cannot build the tokenizer",
    "core_transformer_config_from_args": "Megatron-LM's core_transformer_config_from_args fails",
}


def _problem(error: dict, path: str) -> Problem:
    said = error["message"].strip() or error["source"].split(": ", 1)[-1]
    message = f"{_STAGE_WORDS.get(error['stage'], error['stage'])}: {error['type']}: {said}"
    hint = error["source"].replace("Megatron-LM ", f"Megatron-LM {TAG} ", 1) or f"Megatron-LM {TAG}"
    flags = _flags_named(f"{said} {error['source']}")
    if flags:
        hint += f"; check {', '.join(flags)}"
    return Problem(path, message, hint)


def _flags_named(text: str) -> list[str]:
    """Megatron-LM flags for the ``args.<dest>`` names and ``--flags`` a message mentions."""
    from .megatron_args import dest_to_flag  # noqa: PLC0415

    found = [dest_to_flag(d) for d in re.findall(r"args\.([a-z_0-9]+)", text)]
    found += re.findall(r"--[a-z0-9][a-z0-9-]*", text)
    return sorted({f for f in found if f})


def export_flag_table(megatron_lm_root: Path) -> dict:
    """The flag table of ``megatron_lm_root``'s arguments.py (schemas/megatron_lm_args.json's content)."""
    root = Path(megatron_lm_root)
    _check_root(root)
    # A fixed environment: a few argparse defaults read WORLD_SIZE / LOCAL_RANK.
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    result = run_child({"mode": "lm-flags", "root": str(root)}, env=env, extra_path=_deps_path(root))
    return {"megatron_lm_tag": TAG,
            "source": "megatron/training/arguments.py add_megatron_arguments(); generated by "
                      "tests/tools/export_megatron_lm_args.py, do not edit",
            "flags": result["flags"]}


def launch_script_env(text: str) -> dict[str, str]:
    """``export NAME=value`` assignments of a generated launch script, values unquoted."""
    env = {}
    for line in text.splitlines():
        match = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if match:
            words = shlex.split(match.group(2), comments=True)
            env[match.group(1)] = words[0] if words else ""
    return env
