"""What every rank runs: orch's reference trainer, a Megatron-LM entry script, or the user's own script.

``orch generate`` writes ``RUN_DIR/program.json`` (:mod:`.argv` builds it) for every kind but ``orch``; the
launch scripts then start each rank as ``python -m orchestrator.programs RUN_DIR``, which reads it back
(:func:`load_program`), puts the run dir in place of :data:`RUN_DIR_TOKEN` (:func:`substitute_run_dir`) and
runs ``argv[0]`` under orch's telemetry. This module stays import-light: no torch, no plan.
"""
from __future__ import annotations

import json
from pathlib import Path

PROGRAM_FILE = "program.json"
RUN_DIR_TOKEN = "{run_dir}"             # in an argv element: the run dir's absolute path, filled in at run time
ORCH_TRAINER = "orchestrator.train"     # the module the launch scripts start for kind orch
PROGRAM_RUNNER = "orchestrator.programs"  # ... and for every other kind
KINDS = ("orch", "megatron-lm", "script")
LOG_FORMATS = ("deepspeed", "hf", "megatron")


def entry_module(kind: str | None) -> str:
    """The module each rank starts with ``python -m`` (ORCH_ENTRY overrides it in the launch scripts)."""
    return ORCH_TRAINER if kind in (None, "orch") else PROGRAM_RUNNER


def substitute_run_dir(argv: list[str], run_dir: str | Path) -> list[str]:
    """argv with every :data:`RUN_DIR_TOKEN` replaced by the run dir's absolute path."""
    root = str(Path(run_dir).resolve())
    return [arg.replace(RUN_DIR_TOKEN, root) for arg in argv]


def load_program(run_dir: str | Path) -> dict:
    """RUN_DIR/program.json as orch generate wrote it (kind, argv, cwd, log_format, script_path, script_sha256)."""
    return json.loads((Path(run_dir) / PROGRAM_FILE).read_text())
