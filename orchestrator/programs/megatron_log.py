"""Megatron-LM's per-iteration log line, parsed: the second telemetry source of a megatron-lm program.

Megatron-LM core_v0.16.1's ``training_log`` (megatron/training/training.py) prints, on the last pipeline
rank, every ``--log-interval`` iterations, fields of the form `` name: value |`` after a timestamp::

     [2026-12-01 12:00:00.000000] iteration       10/     500 | consumed samples:          640 |
     elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 312.4 | learning rate:
     3.000000E-04 | global batch size:    64 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 |
     number of skipped iterations:   0 | number of nan iterations:   0 |

(one line). Fields Megatron leaves out (throughput without --log-throughput, the grad norm when it is not
computed) are None.
"""
from __future__ import annotations

import re

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELD = re.compile(r"\s*([^|:]+?):\s*([^|]*?)\s*\|")
# Megatron's field names -> ours (units in the names); the value's type.
FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "skipped samples": ("skipped_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_time_per_iteration_ms", float),
    "throughput per GPU (TFLOP/s/GPU)": ("throughput_tflops_per_gpu", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "energy per GPU (J/iter/GPU)": ("energy_j_per_iteration_per_gpu", float),
    "power per GPU (W/GPU)": ("power_w_per_gpu", float),
}
_LOSS = re.compile(r"loss\b", re.I)


def parse_iteration_line(line: str) -> dict | None:
    """The figures of one training_log line (iteration, train_iters, every FIELDS name, None where absent, and
    ``losses``: every loss Megatron printed, by its own name), or None when the line is not one."""
    match = _ITERATION.search(line)
    if match is None:
        return None
    record: dict = {"iteration": int(match.group(1)), "train_iters": int(match.group(2)),
                    **{name: None for name, _ in FIELDS.values()}, "losses": {}}
    for key, text in _FIELD.findall(line[match.end():]):
        value = _number(text)
        if value is None:
            continue
        if key in FIELDS:
            name, kind = FIELDS[key]
            record[name] = kind(value)
        elif _LOSS.search(key):
            record["losses"][key] = value
    if record["lm_loss"] is not None:
        record["losses"].setdefault("lm loss", record["lm_loss"])
    return record if record["elapsed_time_per_iteration_ms"] is not None else None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
