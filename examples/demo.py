"""`make demo`: plan, generate, validate and really train two tiny GPTs on this machine's CPU, then put
measured beside predicted.

1. examples/tiny-gpt-cpu.yaml      -- 2 processes, data parallel, ZeRO-2
2. examples/tiny-gpt-cpu-pp2.yaml  -- 2 pipeline stages (DeepSpeed's pipeline engine), 4 micro-batches
Each: `orch plan` -> `orch generate` -> `orch doctor --quick` (this CPU's speed today, through the run's
launch path) -> `orch generate --measured` (the plan from what the doctor measured) -> `orch validate` ->
`orch launch --wait` (one line per step), then `orch compare` prints tokens/s, TFLOP/s, bubble and all-reduce
overhead, measured against predicted.
Run dirs land in demo-runs/ (metrics.jsonl, W&B offline run under wandb/, logs/).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-runs"
ORCH = str(Path(sys.executable).parent / "orch")
CASES = [("tiny-gpt-cpu", "data parallel, ZeRO-2"), ("tiny-gpt-cpu-pp2", "2 pipeline stages, 4 micro-batches")]


def bold(text: str) -> str:
    """Bold on a terminal; plain text in a log file or a pipe (no raw escape codes)."""
    return f"\033[1m{text}\033[0m" if sys.stdout.isatty() and not os.environ.get("NO_COLOR") else text


def step(title: str, *argv: str) -> None:
    print(f"\n{bold('$ orch ' + ' '.join(shlex.quote(a) for a in argv))}   # {title}", flush=True)
    result = subprocess.run([ORCH, *argv], cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"demo: `orch {' '.join(argv)}` failed with exit code {result.returncode}")


def main() -> None:
    start = time.monotonic()
    OUT.mkdir(exist_ok=True)
    runs = []
    for name, what in CASES:
        spec, run = f"examples/{name}.yaml", OUT / name
        step(f"{what}: rank the layouts", "plan", spec, "--top", "3")
        step("write the run dir (afresh: the last demo's outputs go)", "generate", spec, "-o", str(run), "--force",
             "--discard-outputs")
        step("measure this CPU through the run's launch path: a shared machine's cores vary by the day", "doctor",
             str(run), "--quick")
        measured = OUT / f"{name}.doctor.json"
        shutil.copyfile(run / "doctor.json", measured)
        step("plan again from what the doctor measured", "generate", spec, "-o", str(run), "--force",
             "--discard-outputs", "--measured", str(measured))
        step("check it with DeepSpeed's and Megatron-Core's own config classes", "validate", str(run))
        step("train for real: 2 processes on this CPU", "launch", str(run), "--wait")
        runs.append(str(run))
    step("measured beside predicted", "compare", *runs)
    print(f"\nmetrics: {', '.join(str(Path(r) / 'metrics.jsonl') for r in runs)}")
    for run in runs:
        offline = sorted((Path(run) / "wandb").glob("offline-run-*"))
        if offline:
            print(f"W&B offline run: {offline[-1]}  (upload later with: wandb sync {offline[-1]})")
    print(f"demo finished in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
