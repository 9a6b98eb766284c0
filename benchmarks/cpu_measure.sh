#!/bin/bash
# Tokens/s of one layout of the `orch init --preset tiny-gpt` spec on this machine, as tests/data/cpu-measured.json
# records it:   bash benchmarks/cpu_measure.sh '{"data": 2, "micro_batch_size": 4, "zero_stage": 2, "offload": "none"}'
# Writes the spec with that parallelism (checkpoints off the timed steps), runs orch generate and
# orch launch --wait, and prints the median tokens_per_s of steps 4-60 (metrics.jsonl) and the load average
# before and after, and one core's GEMM rate just before the run (the host VM's speed varies: 145-200 GFLOP/s
# seen on 2026-12-01). Run 3 times at low load (uptime < 1.5: others' work on the 2 cores reads as slowness).
#   bash benchmarks/cpu_measure.sh --trace '<parallelism json>'
# instead trains 60 steps with every torch.distributed collective wrapped (benchmarks/cpu_trace/) and prints
# where a step's time goes, rank by rank: each collective's wall and CPU time (thread_time) and the rank's
# work up to the next one. Wall >> CPU inside a collective is waiting (the peer, gloo's transfer); wall ~ CPU
# between collectives is the rank's own work.
set -euo pipefail
TRACE=0; if [ "${1:-}" = "--trace" ]; then TRACE=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"; ORCH="$ROOT/.venv/bin/orch"
DIR="$(mktemp -d)"; trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
"$ORCH" init --preset tiny-gpt -o spec.yaml >/dev/null
"$PY" - "$1" "$TRACE" <<'PY'
import json, sys, yaml
s = yaml.safe_load(open("spec.yaml"))
s["parallelism"] = json.loads(sys.argv[1])
s["training"]["checkpoint"] = {"dir": "checkpoints", "interval": 1000}
s["training"]["train_iters"] = 60     # 20 steps left the median at the mercy of a few seconds of noise
yaml.safe_dump(s, open("spec.yaml", "w"))
PY
"$ORCH" generate spec.yaml -o run >/dev/null
if [ "$TRACE" = 1 ]; then
    mkdir trace
    PYTHONPATH="$ROOT/benchmarks/cpu_trace${PYTHONPATH:+:$PYTHONPATH}" ORCH_TRACE_DIR="$DIR/trace" \
        "$ORCH" launch run --wait >launch.log 2>&1 || { tail launch.log; exit 1; }
    "$PY" "$ROOT/benchmarks/cpu_trace/report.py" "$DIR/trace"; exit 0
fi
# The core's speed right now (the cost model's catalog says ~192 GFLOP/s; a busy host VM gives less).
gemm=$("$PY" - <<'PY'
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(512, 512), torch.randn(512, 512)
rates = []
for _ in range(6):
    t = time.perf_counter()
    for _ in range(40):
        a @ b
    rates.append(2 * 512 ** 3 * 40 / (time.perf_counter() - t) / 1e9)
print(f"{max(rates[1:]):.0f}")
PY
)
before=$(cut -d' ' -f1 /proc/loadavg)
"$ORCH" launch run --wait >launch.log 2>&1 || { tail launch.log; exit 1; }
"$PY" - "$before" "$(cut -d' ' -f1 /proc/loadavg)" "$gemm" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open("run/metrics.jsonl")]
tps = [r["tokens_per_s"] for r in rows if "step_time_s" in r and r.get("step", 0) >= 4]
print(f"tokens/s median {statistics.median(tps):.0f} over {len(tps)} steps; load average {sys.argv[1]} -> {sys.argv[2]}; "
      f"GEMM {sys.argv[3]} GFLOP/s on one core before the run")
PY
