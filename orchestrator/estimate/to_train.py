"""Days and cost to train ``training.total_tokens`` at a layout's predicted throughput, with its error band.

The band is the throughput's own relative error (LayoutEstimate.uncertainty) applied to the time and the cost:
to first order a tokens/s off by ±e makes the time and the GPU-hours off by ±e as well.
"""
from __future__ import annotations

DAY_S = 86400.0
HOUR_S = 3600.0


def to_train(total_tokens: float, tokens_per_s: float, world_size: int, relative_error: float,
             gpu_hour_cost: tuple[float, str] | None = None) -> dict:
    """{"total_tokens", "num_gpus", "time_to_train_s", "days", "gpu_hours" (each with _low/_high), "cost"} of a layout;
    ``gpu_hour_cost``: (amount, currency) per GPU-hour, else no "cost"."""
    time_s = total_tokens / tokens_per_s
    record = {"total_tokens": float(total_tokens), "num_gpus": world_size, "relative_error": relative_error}
    for key, value in (("time_to_train_s", time_s), ("days", time_s / DAY_S),
                       ("gpu_hours", world_size * time_s / HOUR_S)):
        record |= _band(key, value, relative_error)
    if gpu_hour_cost is not None:
        amount, currency = gpu_hour_cost
        band = _band("amount", record["gpu_hours"] * amount, relative_error)
        record["cost"] = {"amount": band["amount"], "low": band["amount_low"], "high": band["amount_high"],
                          "currency": currency, "per_gpu_hour": float(amount)}
    return record


def _band(key: str, value: float, relative_error: float) -> dict:
    return {key: value, f"{key}_low": value * (1 - relative_error), f"{key}_high": value * (1 + relative_error)}


def short_amount(value: float) -> str:
    """An amount (money, tokens) in 3 significant figures with k/M/B/T: '49.2k', '1.23M', '812'."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale * 0.9995:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"
