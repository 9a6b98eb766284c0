"""Calibration on real CPU runs: does `orch calibrate` bring a held-out layout's predictions closer?

    python benchmarks/calibration.py [--steps 16] [--keep DIR] [--reuse DIR]

Trains four layouts of the tiny-gpt-cpu demo (examples/tiny-gpt-cpu.yaml: 2 processes, global batch 16) for
real with DeepSpeed on this machine, one after the other:

    calibration   tp1-pp1-dp2-z1-mb1   ZeRO-1, 8 micro-batches of 1
                  tp1-pp1-dp2-z0-mb4   ZeRO-0, 2 micro-batches of 4
                  tp1-pp2-dp1-z1-mb2   2 pipeline stages, 8 micro-batches of 2
    held out      tp1-pp1-dp2-z2-mb2   the demo's own layout (ZeRO-2, not seen in calibration)

then fits the cost model to the first three (orchestrator.calibrate, what `orch calibrate` runs) and
predicts the fourth with the default and with the calibrated cost model. Prints, for the held-out layout,
the measured compute time, data-parallel reduction time and step time (medians after the warm-up steps)
against both predictions, each error, and the mean absolute error over the three; exits 1 unless the
calibrated mean error is lower than the default's.

--reuse DIR trains only the layouts missing from DIR (to iterate on the fit); --keep DIR keeps the run dirs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "examples" / "tiny-gpt-cpu.yaml"
CALIBRATION = {"z1-mb1": {"zero_stage": 1, "micro_batch_size": 1},
               "z0-mb4": {"zero_stage": 0, "micro_batch_size": 4},
               "pp2-mb2": {"pipeline": 2, "data": 1, "zero_stage": 1, "micro_batch_size": 2}}
HELD_OUT = {"z2-mb2": {"zero_stage": 2, "micro_batch_size": 2}}
QUANTITIES = ("compute_s", "dp_reduction_s", "step_time_s")


def make_run_dir(out: Path, parallelism: dict, steps: int) -> Path:
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir
    from orchestrator.spec import read_spec_data
    from orchestrator.spec_loader import parse_spec

    data = read_spec_data(SPEC)
    data["parallelism"].update(parallelism)
    data["training"]["train_iters"] = steps
    data["training"]["checkpoint"] = {"dir": "checkpoints", "interval": steps}
    data["tracking"]["wandb"]["mode"] = "disabled"
    return write_run_dir(build_plan(parse_spec(data)), out, force=True, discard_outputs=True)


def train(run_dir: Path) -> float:
    """Train the run dir with torchrun (2 processes); returns the wall time."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port), "-m", "orchestrator.train", str(run_dir), "--no-resume"]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"training {run_dir} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def runs(root: Path, layouts: dict, steps: int, reuse: bool) -> dict:
    out = {}
    for name, parallelism in layouts.items():
        run_dir = root / name
        if reuse and (run_dir / "metrics.jsonl").is_file():
            print(f"  {name}: reusing {run_dir}", flush=True)
        else:
            make_run_dir(run_dir, parallelism, steps)
            print(f"  {name}: trained {steps} steps in {train(run_dir):.0f} s", flush=True)
        out[name] = run_dir
    return out


def held_out_errors(run_dir: Path, cal) -> tuple[dict, dict, dict]:
    from orchestrator.calibrate import observe, predict
    from orchestrator.estimate import CostModel
    from orchestrator.runs import load_run

    run = load_run(str(run_dir))
    obs = observe(run, run.tag)
    return obs.measured, predict(obs, CostModel()), predict(obs, cal.cost)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="steps per run (3 are warm-up)")
    parser.add_argument("--keep", type=Path, help="keep the run dirs here")
    parser.add_argument("--reuse", type=Path, help="reuse trained run dirs found here (train the missing ones)")
    args = parser.parse_args()
    from orchestrator.calibrate import calibrate

    root = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="orch-calibration-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(f"training 4 layouts of {SPEC.name} on this machine ({root}):", flush=True)
        train_dirs = runs(root, CALIBRATION, args.steps, bool(args.reuse))
        held_dir = runs(root, HELD_OUT, args.steps, bool(args.reuse))["z2-mb2"]
        cal = calibrate([str(p) for p in train_dirs.values()])
        print("\nfitted on " + ", ".join(train_dirs) + ": " +
              ", ".join(f"{k}={v:.4g}" for k, v in cal.fitted.items()))
        print(f"calibration runs: typical error (rms of log predicted/measured) {cal.error_before_pct:.1f}% "
              f"default -> {cal.error_after_pct:.1f}% calibrated")
        measured, before, after = held_out_errors(held_dir, cal)
        return report(measured, before, after)
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(root, ignore_errors=True)


def report(measured: dict, before: dict, after: dict) -> int:
    print("\nheld-out layout tp1-pp1-dp2-z2-mb2 (the demo), seconds per step:")
    print(f"{'quantity':<16} {'measured':>9} {'default':>9} {'error':>8} {'calibrated':>10} {'error':>8}")
    errors_before, errors_after = [], []
    for key in QUANTITIES:
        meas = measured[key]
        if not meas:
            continue
        eb, ea = 100 * (before[key] / meas - 1), 100 * (after[key] / meas - 1)
        errors_before.append(abs(eb))
        errors_after.append(abs(ea))
        print(f"{key:<16} {meas:>9.4f} {before[key]:>9.4f} {eb:>+7.1f}% {after[key]:>10.4f} {ea:>+7.1f}%")
    mean_before = sum(errors_before) / len(errors_before)
    mean_after = sum(errors_after) / len(errors_after)
    print(f"{'mean |error|':<16} {'':>9} {'':>9} {mean_before:>7.1f}% {'':>10} {mean_after:>7.1f}%")
    ok = mean_after < mean_before
    print(f"\nheld-out prediction error: {mean_before:.1f}% before calibration, {mean_after:.1f}% after "
          f"({'closer' if ok else 'NOT closer'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
