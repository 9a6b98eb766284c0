"""Ask DeepSpeed and Megatron-Core about every path of one `orch validate` call up front, in one subprocess
each, so that N paths cost one ~4 s DeepSpeed import and one ~4-9 s Megatron import instead of N of each.

:func:`prefetch_deep_checks` only warms the answer caches of :mod:`._ds_probe` and :mod:`.megatron_core`,
which exist inside a :func:`shared_answers` block; the per-path validation then finds its answers there
(or asks itself when a path was left out here). Any file it cannot read or parse is left to the per-path
checks, which report it properly.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import OrchError


@contextmanager
def shared_answers() -> Iterator[None]:
    """Within the block, DeepSpeed's and Megatron-Core's answers are kept and reused (by config)."""
    from . import _ds_probe, megatron_core  # noqa: PLC0415

    saved = _ds_probe._ANSWERS, megatron_core._VERDICTS
    _ds_probe._ANSWERS, megatron_core._VERDICTS = {}, {}
    try:
        yield
    finally:
        _ds_probe._ANSWERS, megatron_core._VERDICTS = saved


def prefetch_deep_checks(paths: list[str], *, world_size: int | None, model_parallel_size: int) -> int:
    """Warm the caches for these paths; returns how many configs were asked about (0: nothing to batch)."""
    from . import detect_kind  # noqa: PLC0415

    ds, core = [], []
    for raw in paths:
        path = Path(raw)
        try:
            if not path.exists():
                continue
            kind = detect_kind(path)
            if kind == "rundir":
                ds += _run_dir_ds(path)
                core += _run_dir_core(path)
            elif kind == "ds_config":
                ds += _ds_file(path, world_size, model_parallel_size)
            elif kind == "megatron_config":
                core.append(_read_json(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, OrchError):
            continue      # the per-path check reports what is wrong
    return _ask(ds, core)


def _ask(ds: list, core: list[dict]) -> int:
    """Both subprocesses at once (each is mostly one CPU-bound import)."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from ._ds_probe import probe_ds_configs  # noqa: PLC0415
    from .megatron_core import check_transformer_configs, megatron_core_available  # noqa: PLC0415

    calls = ([lambda: probe_ds_configs(ds)] if ds else []) + (
        [lambda: check_transformer_configs(core)] if core and megatron_core_available() else [])
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(call) for call in calls]:
            try:
                future.result()
            except Exception:  # noqa: BLE001  (the per-path check asks again and reports it properly)
                pass
    return len(ds) + len(core)


def _run_dir_ds(path: Path) -> list:
    from ..rundir import read_run_dir  # noqa: PLC0415
    from ._ds_probe import ProbeRequest  # noqa: PLC0415
    from .deepspeed import deep_check_sizes  # noqa: PLC0415

    run = read_run_dir(path)
    lay = run.spec.parallelism      # what validate/rundir.py passes to the per-path check
    _, dp = deep_check_sizes(run.ds_config, run.spec.world_size, lay.tensor * lay.pipeline)
    return [ProbeRequest(run.ds_config, dp, str(path / "ds_config.json"))]


def _run_dir_core(path: Path) -> list[dict]:
    from .megatron import config_from_args, read_args_file  # noqa: PLC0415
    from .megatron_args import parse_tokens  # noqa: PLC0415

    tokens, problems = read_args_file(path / "megatron_args.txt")
    args = parse_tokens(tokens, str(path / "megatron_args.txt"))[0] if not problems else None
    configs = [_read_json(path / "megatron_config.json")]
    return configs + ([config_from_args(args)] if args is not None else [])


def _ds_file(path: Path, world_size: int | None, model_parallel_size: int) -> list:
    from ._ds_probe import ProbeRequest  # noqa: PLC0415
    from .deepspeed import deep_check_sizes  # noqa: PLC0415

    config = _read_json(path)
    _, dp = deep_check_sizes(config, world_size, model_parallel_size)
    return [ProbeRequest(config, dp, str(path))]


def _read_json(path: Path):
    """A JSON file through the bounded reader (regular files only, size and depth capped): SpecError else."""
    from ..userfiles import parse_json, read_user_text  # noqa: PLC0415

    return parse_json(read_user_text(path), str(path), duplicates=[])
