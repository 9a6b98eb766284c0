"""Launch a run dir: local (torchrun), SLURM (sbatch/srun) or pdsh; status and cancel.

Each backend module offers ``build(run, ...) -> LaunchPlan`` (pure), ``submit(plan, runner)``,
``status(record, runner) -> JobState`` and ``cancel(record, runner)``.
"""
from __future__ import annotations

import importlib

from ..errors import SpecError

BACKENDS = ("local", "slurm", "pdsh")


def backend_module(name: str):
    if name not in BACKENDS:
        raise SpecError(f"unknown backend {name!r} (choose one of {', '.join(BACKENDS)})", path="--backend")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            raise SpecError(f"the {name} backend is not available in this version", path="--backend") from None
        raise
