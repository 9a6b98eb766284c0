"""Telemetry overhead: the same DeepSpeed training with telemetry on and off, in ONE torchrun job.

    python benchmarks/telemetry_overhead.py [--rounds 30] [--block 4] [--spec examples/tiny-gpt-cpu.yaml]

The job (2 processes, the tiny-gpt-cpu demo spec) trains continuously and switches telemetry on and off
every ``--block`` steps, alternating the order each round (off/on, on/off, ...) so that slow drifts of the
machine cancel. "On" is what the trainer runs by default: collective timers installed, compute timed,
the per-step all_reduce of every rank's numbers, metrics.jsonl, the progress line and W&B (offline).
"Off" keeps only the trainer's 1-element stop-flag all_reduce. Prints the ratio of the wall time of the
"on" blocks to the adjacent "off" blocks (the median over rounds; the ratio of the totals and the direct
cost measured inside telemetry.end are printed too) and exits 1 when the overhead is 3 % or more.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 1.03


def make_run_dir(spec_path: Path, out: Path, steps: int) -> Path:
    from orchestrator.plan import build_plan
    from orchestrator.rundir import write_run_dir
    from orchestrator.spec import read_spec_data
    from orchestrator.spec_loader import parse_spec

    data = read_spec_data(spec_path)
    data["training"]["train_iters"] = steps
    data["training"]["checkpoint"] = {"dir": "checkpoints", "interval": steps}
    data.setdefault("tracking", {}).setdefault("wandb", {})["mode"] = "offline"
    return write_run_dir(build_plan(parse_spec(data)), out)


def worker(run_dir: Path, rounds: int, block: int, warmup: int) -> None:
    """One rank of the benchmark job (started by torchrun)."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm
    import torch.distributed as dist

    from orchestrator.rundir import read_run_dir
    from orchestrator.train.data import build_dataset
    from orchestrator.train.engine import build_engine
    from orchestrator.train.session import TelemetrySession

    run = read_run_dir(run_dir)
    deepspeed.init_distributed(verbose=False)
    rank = dist.get_rank()
    session = TelemetrySession(run, engine_name="deepspeed", rank=rank, enabled=True)
    session.install_comm(ds_comm.cdb)
    session.start_wandb(run)
    engine = build_engine(run.spec, run.ds_config, build_dataset(run.spec, run.path), session.busy)
    session.comm.set_dp_ranks(engine.dp_ranks)
    telemetry = session.open(run, engine, total_steps=run.spec.training.train_iters, start_step=0,
                             device=engine.device)
    step = 0

    def run_block(on: bool, n: int) -> tuple[float, float]:
        """(wall time of the block's steps, time inside telemetry.end) on this rank."""
        nonlocal step
        if on:
            session.comm.install(ds_comm.cdb)
        else:
            session.comm.uninstall()
        telemetry.set_enabled(on)
        wall = inside_end = 0.0
        for _ in range(n):
            step += 1
            t0 = time.perf_counter()
            telemetry.begin()
            result = engine.train_step(step)
            t1 = time.perf_counter()
            telemetry.end(step=step, loss=result.loss, lr=result.lr, grad_norm=result.grad_norm)
            t2 = time.perf_counter()
            wall += t2 - t0
            inside_end += t2 - t1
        return wall, inside_end

    run_block(True, warmup)
    rounds_out = []
    for i in range(rounds):
        pair = {}
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            pair["on" if on else "off"] = run_block(on, block)
        rounds_out.append(pair)
    telemetry.close()
    if rank == 0:
        print("RESULT " + json.dumps({"rounds": rounds_out, "block": block}), flush=True)
    engine.close()
    dist.destroy_process_group()


def summarize(result: dict) -> dict:
    """Ratios from the per-round (on, off) block times: total, and the median of the per-round ratios
    (adjacent blocks see the same machine load, the median drops rounds disturbed by other work)."""
    rounds, n = result["rounds"], result["block"]
    on = [r["on"][0] for r in rounds]
    off = [r["off"][0] for r in rounds]
    end_on = sum(r["on"][1] for r in rounds) / (n * len(rounds))
    end_off = sum(r["off"][1] for r in rounds) / (n * len(rounds))
    step_off = sum(off) / (n * len(rounds))
    return {"ratio_total": sum(on) / sum(off), "ratio_paired_median": statistics.median(a / b for a, b in zip(on, off)),
            "step_on_ms": 1e3 * sum(on) / (n * len(rounds)), "step_off_ms": 1e3 * step_off,
            "end_on_ms": 1e3 * end_on, "end_off_ms": 1e3 * end_off,
            "direct_fraction": (end_on - end_off) / step_off}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "tiny-gpt-cpu.yaml")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.block, args.warmup)
        return 0
    total = args.warmup + 2 * args.rounds * args.block
    with tempfile.TemporaryDirectory(prefix="orch-telemetry-bench-") as tmp:
        run_dir = make_run_dir(args.spec, Path(tmp) / "run", total)
        env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(_free_port()), str(Path(__file__).resolve()), "--worker",
                str(run_dir), "--rounds", str(args.rounds), "--block", str(args.block), "--warmup", str(args.warmup)]
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout[-3000:], proc.stderr[-5000:], sep="\n", file=sys.stderr)
        return 1
    s = summarize(json.loads(lines[-1][len("RESULT "):]))
    print(f"telemetry overhead: {args.rounds} rounds of {args.block} steps on + {args.block} off, one 2-process job")
    print(f"  mean step: on {s['step_on_ms']:.2f} ms, off {s['step_off_ms']:.2f} ms")
    print(f"  inside telemetry.end per step: on {s['end_on_ms']:.3f} ms, off {s['end_off_ms']:.3f} ms "
          f"(direct cost {100 * s['direct_fraction']:.2f}% of a step)")
    print(f"  ratio on/off: {s['ratio_paired_median']:.4f} (median of per-round ratios), "
          f"{s['ratio_total']:.4f} (total time); limit {LIMIT:.2f}")
    ratio = s["ratio_paired_median"]
    if ratio >= LIMIT:
        print(f"FAIL: telemetry overhead {100 * (ratio - 1):.1f}% >= {100 * (LIMIT - 1):.0f}%", file=sys.stderr)
        return 1
    print(f"OK: telemetry overhead {100 * (ratio - 1):+.2f}%")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
