#!/bin/bash
# Where a CPU training step's time goes, rank by rank: every collective's wall time and the stretches of
# work between them, in wall time and in the rank's CPU time (thread_time). Wall >> CPU inside a collective
# is waiting (the peer, gloo's transfer); wall ~ CPU between collectives is the rank's own work.
#   bash benchmarks/cpu_step_trace.sh '{"data": 2, "micro_batch_size": 4, "zero_stage": 2, "offload": "none"}'
# Runs the `orch init --preset tiny-gpt` spec with that parallelism for 60 steps and prints, for each
# position in the step's sequence of collectives, the medians over the last two thirds of the calls.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"; ORCH="$ROOT/.venv/bin/orch"
DIR="$(mktemp -d)"; trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
"$ORCH" init --preset tiny-gpt -o spec.yaml >/dev/null
"$PY" - "$1" <<'PY'
import json, sys, yaml
s = yaml.safe_load(open("spec.yaml"))
s["parallelism"] = json.loads(sys.argv[1])
s["training"].update(train_iters=60, checkpoint={"dir": "checkpoints", "interval": 1000})
yaml.safe_dump(s, open("spec.yaml", "w"))
PY
"$ORCH" generate spec.yaml -o run >/dev/null
mkdir trace
PYTHONPATH="$ROOT/benchmarks/cpu_trace${PYTHONPATH:+:$PYTHONPATH}" ORCH_TRACE_DIR="$DIR/trace" \
    "$ORCH" launch run --wait >launch.log 2>&1 || { tail launch.log; exit 1; }
"$PY" - "$DIR/trace" <<'PY'
import statistics, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("trace.[0-9]*")):
    calls = [line.split() for line in path.read_text().splitlines()]
    calls = [(c[0], *map(float, c[1:])) for c in calls]
    # one step = the calls between two telemetry all_reduces (the last all_reduce of each step)
    n = len(calls)
    period = next((p for p in range(1, 40) if all(calls[i][0] == calls[i + p][0] for i in range(n // 3, n // 3 + 4 * p))), None)
    if period is None:
        print(path.name, "no repeating step pattern"); continue
    rows = [calls[i:i + period + 1] for i in range(n // 3, n - period - 1, period)][:50]   # past start-up
    print(f"rank {path.name.split('.')[-1]}: {period} collectives per step; medians over {len(rows)} steps (ms)")
    for j in range(period):
        op = rows[0][j][0]
        inside = [(r[j][2] - r[j][1], r[j][4] - r[j][3]) for r in rows]
        after = [(r[j + 1][1] - r[j][2], r[j + 1][3] - r[j][4]) for r in rows]
        med = lambda xs, k: 1e3 * statistics.median(x[k] for x in xs)
        print(f"  {op:24s} wall {med(inside, 0):7.2f} cpu {med(inside, 1):6.2f} | then work: wall {med(after, 0):7.2f} cpu {med(after, 1):6.2f}")
PY
