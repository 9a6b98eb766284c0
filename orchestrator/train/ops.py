"""DeepSpeed's CPU communication op (``deepspeed_shm_comm``): whether it is built, and building it ahead.

On CPU, ``deepspeed.init_distributed`` compiles this op with g++ the first time it runs on a machine
(~30-60 s on 2 cores, measured), then loads it from torch's extension cache (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``). The trainer says so before it happens, so that a first launch is not
a silent wait; ``python -m orchestrator.train.ops`` (``make ops``) builds it ahead into the same cache.
Every rank builds with this interpreter's tools (:func:`use_interpreter_tools`), whichever launcher started it.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

OP_NAME = "deepspeed_shm_comm"


def op_build_dir() -> Path:
    """Where torch keeps (or will keep) the built op: honours TORCH_EXTENSIONS_DIR."""
    from torch.utils.cpp_extension import _get_build_directory  # noqa: PLC0415  (torch's own rule for the path)

    return Path(_get_build_directory(OP_NAME, verbose=False))


def op_is_built() -> bool:
    return any(op_build_dir().glob(f"{OP_NAME}*.so"))


def use_interpreter_tools() -> None:
    """Put this interpreter's bin directory first on PATH, as an activated virtual environment does.

    torch builds the op with the first ``ninja`` on PATH, in one cache directory per op, and ninja rebuilds
    every object whose recorded command hash its own version does not recognise. A rank started over
    ssh (pdsh) gets the remote shell's PATH, which finds the system's ninja (/usr/bin, 1.11 here), while
    local and SLURM ranks find the environment's pip-installed one (1.13): each saw the other's build as
    stale, so every switch of launcher recompiled the op (~30-60 s of g++, measured in the test suite).
    """
    bin_dir = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    os.environ["PATH"] = os.pathsep.join([bin_dir, *rest])


def build_note() -> str | None:
    """A line for people when the op still has to be compiled on this machine (None when it is cached)."""
    if op_is_built():
        return None
    return (f"first DeepSpeed start with this cache: compiling its CPU communication op ({OP_NAME}) with g++, "
            f"~30-60 s, once; cached in {op_build_dir().parent} (TORCH_EXTENSIONS_DIR) for later runs")


def build_op() -> None:
    """Compile and load the op now (what deepspeed.init_distributed would do on its first start)."""
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)


def main() -> int:
    note = build_note()
    if note is None:
        print(f"{OP_NAME}: already built in {op_build_dir()}", file=sys.stderr)
        return 0
    print(note, file=sys.stderr, flush=True)
    start = time.monotonic()
    build_op()
    print(f"{OP_NAME}: built in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
