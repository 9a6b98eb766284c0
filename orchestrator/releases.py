"""Engine releases as comparable tuples, for the rules and the estimator alike (it imports nothing of either,
so orchestrator/parallel_rules.py and orchestrator/estimate/engines.py share it without an import cycle)."""
from __future__ import annotations

from .validate._deepspeed_keys_data import DEEPSPEED_VERSION  # the DeepSpeed orch writes ds_config for


def ds_version(version: str | None) -> tuple[int, ...]:
    """A DeepSpeed release as a comparable tuple ("0.3" -> (0, 3)); None: the one orch writes configs for."""
    return tuple(int(p) for p in (version or DEEPSPEED_VERSION).split(".")[:3] if p.isdigit())
