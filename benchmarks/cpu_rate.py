"""`orch init`'s spec and its pp = 2 variant on this CPU: predicted step time against measured.

    .venv/bin/python benchmarks/cpu_rate.py [--steps 30] [--only init|pp2] [--keep DIR]

For each spec, the loop a user runs on a slow day: `orch init` (the tiny-gpt spec; pp2: parallelism
``{pipeline: 2, micro_batch_size: 1}``), `orch generate`, `orch doctor RUN --quick`, `orch plan --measured
RUN/doctor.json` (the layout fixed to what generate chose, so the prediction is for the run that trains),
`orch launch --wait`, then `orch doctor --quick` again (the core's speed after the run: a shared machine's load
moves; ``after`` is --measured with that doctor.json, the first is kept as doctor-before.json). Measured: the median step_time_s of steps >= 4 in metrics.jsonl. Printed per spec: the catalog's
prediction, ``gemm core`` (the GEMM probe's core fraction: --measured before the model probe), ``--measured``
(the doctor's model probe, doctor/measured.py kernel_mix_terms), ``after`` (--measured with the doctor after the
run), ``bracket`` (the mean of --measured before and after: the doctor at the run's mean load when the load drifts
during the run; ``gemm core bracket`` the same for the GEMM probe) and the measured step, each prediction's
error as measured / predicted - 1, and the load average before and after. Run it under ``nice`` when the
machine is quiet; each figure is a ratio within one run, so a busy day still reads, only noisier.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.doctor.measured import measured_cost  # noqa: E402
from orchestrator.plan import build_plan  # noqa: E402
from orchestrator.spec_loader import load_spec  # noqa: E402

ORCH = str(Path(sys.executable).parent / "orch")
VARIANTS = {"init": {}, "pp2": {"pipeline": 2, "micro_batch_size": 1}}
LAYOUT = {"tp": "tensor", "pp": "pipeline", "vpp": "virtual_pipeline", "dp": "data", "zero_stage": "zero_stage",
          "micro_batch_size": "micro_batch_size", "offload": "offload", "recompute": "recompute"}


def orch(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([ORCH, *argv], capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"cpu_rate: `orch {' '.join(argv)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done


def load() -> float:
    return os.getloadavg()[0]


def write_spec(path: Path, parallelism: dict, steps: int) -> None:
    spec = yaml.safe_load(path.read_text())
    spec["parallelism"] = parallelism
    spec["training"]["train_iters"] = steps
    spec["training"]["checkpoint"] = {"dir": "checkpoints", "interval": 10 * steps}   # off the timed steps
    path.write_text(yaml.safe_dump(spec))


def doctor_gemm_flops(run: Path) -> float:
    """Runs `orch doctor RUN --quick`; the GEMM rate the ranks sustain together (doctor/report.py)."""
    orch("doctor", str(run), "--quick", check=False)      # exit 1 names offenders; doctor.json is written anyway
    measured = json.loads((run / "doctor.json").read_text())["measured"]
    return measured.get("gemm_sync_flops") or measured["gemm_flops"]     # what --measured plans with on CPU


def predictions(spec_path: Path, doctor_json: Path) -> dict:
    """Step seconds: the catalog's, the GEMM probe's core fraction (the earlier --measured: doctor.json without
    the model probe), and --measured (the model probe's core fraction, doctor/measured.py kernel_mix_terms)."""
    spec = load_spec(spec_path)
    data = json.loads(doctor_json.read_text())
    gemm_json = doctor_json.with_name("doctor-gemm.json")
    gemm_json.write_text(json.dumps({**data, "measured": {k: v for k, v in data["measured"].items()
                                                          if not k.startswith("model_step")}}))
    gemm, gemm_record = measured_cost(gemm_json, spec)
    measured, record = measured_cost(doctor_json, spec)
    core = {k for k, v in record["figures"].items() if "core_fraction" in v}
    return {"catalog": build_plan(spec).chosen["step_time_s"],
            "gemm core": build_plan(spec, cost=gemm).chosen["step_time_s"],
            "--measured": build_plan(spec, cost=measured).chosen["step_time_s"],
            "core_fraction": next((record["figures"][k]["core_fraction"] for k in core), 1.0),
            "gemm_fraction": next((v["core_fraction"] for v in gemm_record["figures"].values()
                                   if "core_fraction" in v), 1.0)}


def run_variant(name: str, root: Path, steps: int) -> dict:
    work = root / name
    work.mkdir(parents=True)
    spec = work / "spec.yaml"
    orch("init", "-o", str(spec))
    write_spec(spec, VARIANTS[name], steps)
    run = work / "run"
    orch("generate", str(spec), "-o", str(run))
    chosen = json.loads((run / "plan.json").read_text())["chosen"]
    write_spec(spec, {field: chosen[key] for key, field in LAYOUT.items()}, steps)   # the layout that trains
    load_before = load()
    gemm_before = doctor_gemm_flops(run)
    pred = predictions(spec, run / "doctor.json")
    orch("launch", str(run), "--wait")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step_s = statistics.median(r["step_time_s"] for r in rows if "step_time_s" in r and r.get("step", 0) >= 4)
    (run / "doctor.json").rename(run / "doctor-before.json")
    gemm_after = doctor_gemm_flops(run)
    post = predictions(spec, run / "doctor.json")
    after, bracket = post["--measured"], (pred["--measured"] + post["--measured"]) / 2
    return {"name": name, "tag": chosen["tag"], "measured_step_s": step_s, **pred, "after": after,
            "bracket": bracket, "gemm core bracket": (pred["gemm core"] + post["gemm core"]) / 2,
            "gemm_before": gemm_before, "gemm_after": gemm_after, "load_before": load_before, "load_after": load()}


def report(r: dict) -> str:
    cells = "  ".join(f"{k} {r[k] * 1e3:.0f} ms ({r['measured_step_s'] / r[k] - 1:+.0%})"
                      for k in ("catalog", "gemm core", "--measured", "after", "bracket", "gemm core bracket"))
    return (f"{r['name']:<5} {r['tag']:<22} measured {r['measured_step_s'] * 1e3:.0f} ms;  {cells};  doctor GEMM "
            f"{r['gemm_before'] / 1e9:.0f} -> {r['gemm_after'] / 1e9:.0f} GFLOP/s (core fraction: GEMM "
            f"{r['gemm_fraction']:.2f}, model {r['core_fraction']:.2f}); load {r['load_before']:.1f} -> {r['load_after']:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--only", choices=sorted(VARIANTS))
    parser.add_argument("--keep", type=Path, help="keep the run dirs here (default: a temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for name in [args.only] if args.only else list(VARIANTS):
            print(report(run_variant(name, root, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
