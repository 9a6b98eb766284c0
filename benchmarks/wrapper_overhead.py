"""Wrapper overhead: the same DeepSpeed script (examples/programs/ds_train.py) with and without orch's
telemetry wrapper, in one run of this benchmark.

    python benchmarks/wrapper_overhead.py [--rounds 4] [--steps 40] [--spec examples/tiny-gpt-cpu.yaml]

Each round starts two 2-process torchrun jobs one after the other, in alternating order (plain/wrapped,
wrapped/plain, ...) so that slow drifts of the machine cancel: ``python ds_train.py ...`` and
``python -m orchestrator.programs RUN_DIR`` (the same script and arguments, observed: hooks, collective
timers, the per-step cross-rank reduce, metrics.jsonl, the progress line, W&B offline). The figure compared is
the script's own loop time ("trained N steps in X s", startup excluded). Prints per-round ratios, their median
and spread, and the wrapper's own time measured inside it (end of step: reduce + sinks) as a fraction of the
loop time — the low-noise figure; a shared 2-core machine moves job-to-job times by several percent.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "programs" / "ds_train.py"


def make_run_dir(spec_path: Path, out: Path, steps: int) -> Path:
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir
    from orchestrator.spec import read_spec_data
    from orchestrator.spec_loader import parse_spec

    data = read_spec_data(spec_path)
    data["training"]["train_iters"] = steps
    data["training"]["checkpoint"] = {"dir": "checkpoints", "interval": steps}
    run = write_run_dir(build_plan(parse_spec(data)), out)
    argv = [str(SCRIPT), "--deepspeed_config", str(run / "ds_config.json"), "--steps", str(steps),
            "--log-interval", str(steps)]
    (run / "program.json").write_text(json.dumps({"kind": "script", "argv": argv, "cwd": None,
                                                  "log_format": "deepspeed"}))
    return run


def torchrun(*target: str, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port), *target]


def run_job(argv: list[str]) -> tuple[float, float | None]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("DS_ACCELERATOR", "cpu")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{out[-3000:]}")
    loop = float(re.search(r"trained \d+ steps in ([0-9.]+) s", out).group(1))
    own = re.search(r"telemetry's own time ([0-9.]+) s", out)
    return loop, float(own.group(1)) if own else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "tiny-gpt-cpu.yaml")
    args = parser.parse_args()
    from orchestrator.launch.local import free_port

    with tempfile.TemporaryDirectory() as tmp:
        run = make_run_dir(args.spec, Path(tmp) / "run", args.steps)
        program = json.loads((run / "program.json").read_text())
        plain_argv, wrapped_argv = program["argv"], ["-m", "orchestrator.programs", str(run)]
        ratios, owns = [], []
        for r in range(args.rounds):
            order = ("plain", "wrapped") if r % 2 == 0 else ("wrapped", "plain")
            times = {}
            for which in order:
                target = plain_argv if which == "plain" else wrapped_argv
                times[which] = run_job(torchrun(*target, port=free_port()))
            ratio = times["wrapped"][0] / times["plain"][0]
            ratios.append(ratio)
            owns.append(times["wrapped"][1] / times["wrapped"][0])
            print(f"round {r + 1}: plain {times['plain'][0]:.3f} s, wrapped {times['wrapped'][0]:.3f} s, "
                  f"ratio {ratio:.4f}; wrapper's own time {100 * owns[-1]:.2f}% of its loop", flush=True)
    spread = (max(ratios) - min(ratios)) / 2
    print(f"wrapped / plain loop time: median {statistics.median(ratios):.4f} over {args.rounds} rounds "
          f"(+/- {spread:.4f} half-range: job-to-job noise); wrapper's own time: median "
          f"{100 * statistics.median(owns):.2f}% of the step time ({args.steps} steps/job, target < 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
