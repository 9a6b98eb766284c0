"""Report of benchmarks/cpu_measure.sh --trace: for each rank, each position in the step's sequence of
collectives, its wall and CPU time and the rank's work up to the next one (medians, past start-up).

    python benchmarks/cpu_trace/report.py TRACE_DIR
"""
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
