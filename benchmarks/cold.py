"""Cold estimator caches for the planner-speed benchmarks: every memoised function of orch, found rather
than listed (a hand-kept list goes stale when an estimator gains a cache), so each run pays what a fresh
`orch plan` process pays."""
from __future__ import annotations

import sys
import time


def clear_orch_caches() -> None:
    for name, module in list(sys.modules.items()):
        if name == "orchestrator" or name.startswith("orchestrator."):
            for obj in vars(module).values():
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()


def cold_search(spec, top_k: int = 5):
    """(wall s, CPU s, SearchResult) of one planner search from cold caches."""
    from orchestrator.planner import search  # noqa: PLC0415

    clear_orch_caches()
    start, cpu = time.perf_counter(), time.process_time()
    result = search(spec, top_k=top_k)
    return time.perf_counter() - start, time.process_time() - cpu, result
