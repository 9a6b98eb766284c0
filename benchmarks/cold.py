"""Cold estimator caches for the planner-speed benchmarks: every memoised function of orch, found rather
than listed (a hand-kept list goes stale when an estimator gains a cache), so each run pays what a fresh
`orch plan` process pays."""
from __future__ import annotations

import sys


def clear_orch_caches() -> None:
    for name, module in list(sys.modules.items()):
        if name == "orchestrator" or name.startswith("orchestrator."):
            for obj in vars(module).values():
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()
