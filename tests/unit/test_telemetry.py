"""Telemetry without a cluster: the record and its schema, the formulas, the timers, the sinks."""
from __future__ import annotations

import json
import math
import time

import jsonschema
import pytest

from orchestrator.resources import data_dir
from orchestrator.telemetry.comm import CommTimer, bus_factor
from orchestrator.telemetry.metrics import ROW, RunConstants, bubble, build_record
from orchestrator.telemetry.record import SPEC_FIELDS, MetricsRecord, record_fields
from orchestrator.telemetry.sinks import (JsonlSink, progress_line, read_metrics, record_dict,
                                          truncate_metrics)
from orchestrator.telemetry.timing import BusyTimer, peak_memory_bytes
from orchestrator.telemetry.wandb_sink import (has_wandb_credentials, predicted_values, resolve_wandb_mode,
                                               run_tags)


def _schema() -> dict:
    return json.loads((data_dir("schemas") / "metrics.schema.json").read_text())


def test_metrics_schema_file_is_current():
    from orchestrator.schemas_export import REGENERATE, exported_schemas, render

    expected = render(exported_schemas()["metrics.schema.json"])
    actual = (data_dir("schemas") / "metrics.schema.json").read_text()
    assert actual == expected, f"schemas/metrics.schema.json is stale; regenerate it with: {REGENERATE}"


def test_record_carries_every_spec_name_as_required():
    assert set(SPEC_FIELDS) <= set(record_fields())
    assert set(SPEC_FIELDS) <= set(_schema()["required"])
    assert _schema()["additionalProperties"] is False


C = RunConstants(global_batch_size=8, seq_length=128, world_size=2, pp=2, model_flops_per_step=4e12,
                 hardware_flops_per_step=5e12, peak_flops=1e11)


def _row(**values) -> dict:
    row = dict.fromkeys(ROW, 0.0)
    row.update(values)
    return row


def test_build_record_formulas():
    rows = [_row(step_time_s=2.0, compute_time_s=1.5, allreduce_s=0.2, allreduce_blocked_s=0.1, loss=3.0,
                 mem_peak_bytes=100, allreduce_bytes=1000, allreduce_bus_bytes=1000, allgather_s=0.05),
            _row(step_time_s=1.0, compute_time_s=0.9, allreduce_s=0.3, allreduce_blocked_s=0.3, loss=5.0,
                 mem_peak_bytes=300, allreduce_bytes=1000, allreduce_bus_bytes=1000)]
    r = build_record(C, rows, step=3, time_unix=1.0, lr=1e-3, grad_norm=0.5)
    assert r.step_time_s == 2.0                                   # slowest rank
    assert r.tokens_per_s == 8 * 128 / 2.0
    assert r.tflops_per_gpu == pytest.approx(4e12 / (2.0 * 2) / 1e12)
    assert r.mfu == pytest.approx(r.tflops_per_gpu * 1e12 / 1e11)
    assert r.hfu == pytest.approx(5e12 / 4 / 1e11)
    assert r.bubble_fraction == pytest.approx(0.25)               # worst rank: 1 - 1.5/2
    assert r.bubble_fraction_mean == pytest.approx((0.25 + 0.1) / 2)
    assert r.allreduce_time_s == 0.3 and r.comm_exposed_s == 0.3
    assert r.allreduce_overhead == pytest.approx(0.3 / 2.0)
    assert r.mem_peak_bytes == 300 and r.loss == 4.0
    assert r.allreduce_busbw_GBps == pytest.approx(2000 / 0.5 / 1e9)
    assert r.allgather_time_s == 0.05 and r.world_size == 2
    jsonschema.validate(record_dict(r), _schema())


def test_no_bubble_without_pipeline_and_clipping():
    c = RunConstants(**{**C.__dict__, "pp": 1})
    r = build_record(c, [_row(step_time_s=1.0, compute_time_s=0.2)], step=1, time_unix=0.0, lr=0.0,
                     grad_norm=None)
    assert r.bubble_fraction == 0.0 and r.bubble_fraction_mean == 0.0
    assert bubble(2.0, 1.0) == 0.0 and bubble(0.0, 1.0) == 1.0 and bubble(1.0, 0.0) == 0.0


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("reduce_scatter_tensor", 4) == 0.75
    assert bus_factor("all_gather_into_tensor", 2) == 0.5


class _Tensor:
    def __init__(self, n):
        self.n = n

    def numel(self):
        return self.n

    def element_size(self):
        return 4


class _Work:
    def __init__(self, delay):
        self.delay = delay

    def wait(self):
        time.sleep(self.delay)
        return True


class _Backend:
    """A fake collective backend: every call takes `delay` seconds."""

    delay = 0.01

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        if async_op:
            return _Work(self.delay)
        time.sleep(self.delay)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        time.sleep(self.delay)

    def send(self, tensor, dst, group=None, tag=0):
        time.sleep(self.delay)

    def broadcast(self, tensor, src, group=None, async_op=False):
        self.all_reduce(tensor, group=group)      # nested: must be charged once


class _Timer(CommTimer):
    KINDS = {"dp": ("dp", 2), "tp": ("other", 2), "solo": ("local", 1)}

    def _group_kind(self, group):
        return self.KINDS[group]


def test_comm_timer_charges_buckets_once():
    backend = _Backend()
    timer = _Timer().install(backend)
    backend.all_reduce(_Tensor(250), group="dp")
    backend.all_gather_into_tensor(_Tensor(8), _Tensor(4), group="dp")
    backend.all_reduce(_Tensor(250), group="tp")
    backend.all_reduce(_Tensor(250), group="solo")
    backend.send(_Tensor(1), 1)
    backend.broadcast(_Tensor(1), 0, group="tp")
    s = timer.take()
    assert 0.009 < s.allreduce_s < 0.05 and s.allreduce_blocked_s == s.allreduce_s
    assert s.allreduce_bytes == 1000 and s.allreduce_bus_bytes == pytest.approx(1000.0)
    assert 0.009 < s.allgather_s < 0.05
    assert 0.029 < s.other_s < 0.1          # tp all_reduce + send + broadcast (its inner all_reduce not again)
    assert timer.take().allreduce_s == 0.0  # take() resets
    timer.uninstall()
    assert not hasattr(backend.all_reduce, "_orch_timed")


def test_comm_timer_async_blocked_is_the_wait():
    backend = _Backend()
    timer = _Timer().install(backend)
    work = backend.all_reduce(_Tensor(10), group="dp", async_op=True)
    time.sleep(0.02)                        # "compute" overlapping the collective
    assert work.wait() is True
    s = timer.take()
    assert s.allreduce_s >= 0.03 and 0.009 < s.allreduce_blocked_s < 0.02


def test_comm_timer_disabled_records_nothing():
    backend = _Backend()
    timer = _Timer().install(backend)
    timer.enabled = False
    backend.all_reduce(_Tensor(10), group="dp")
    assert timer.take().allreduce_s == 0.0


def test_busy_timer_excludes_collectives_inside():
    backend = _Backend()
    timer = _Timer().install(backend)
    busy = BusyTimer(timer)

    def backward():
        time.sleep(0.03)
        backend.all_reduce(_Tensor(10), group="dp")

    busy.wrap(backward)()
    assert 0.025 < busy.take() < 0.04
    busy.enabled = False
    busy.wrap(backward)()
    assert busy.take() == 0.0


def test_peak_memory_is_positive():
    assert peak_memory_bytes() > 10 * 2**20


def _record(step: int) -> MetricsRecord:
    return build_record(RunConstants(**{**C.__dict__, "pp": 1}), [_row(step_time_s=1.0, loss=float(step))],
                        step=step, time_unix=0.0, lr=0.1, grad_norm=float("nan"))


def test_jsonl_sink_and_truncation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    for step in range(1, 8):
        sink.write(_record(step))
    sink.close()
    with open(path, "a") as f:
        f.write('{"step": 8, "lo')                        # torn line from a killed job
    assert [r["step"] for r in read_metrics(path)] == list(range(1, 8))
    assert read_metrics(path)[0]["grad_norm"] is None      # NaN -> null
    assert truncate_metrics(path, 5) == 3
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]
    assert path.read_text().endswith("\n") and truncate_metrics(path, 5) == 0
    assert truncate_metrics(tmp_path / "absent.jsonl", 3) == 0
    for record in read_metrics(path):
        jsonschema.validate(record, _schema())


def test_progress_line():
    line = progress_line(_record(3), 10)
    assert line.startswith("[orch-train] step 3/10 loss 3.0000 tokens/s 1024 ")
    assert "bubble 0.0%" in line and "allreduce 0.0%" in line


def test_wandb_mode(tmp_path):
    empty_netrc = tmp_path / "netrc"
    empty_netrc.write_text("")
    base = {"NETRC": str(empty_netrc)}
    assert resolve_wandb_mode("offline", base) == ("offline", None)
    assert resolve_wandb_mode("offline", {**base, "WANDB_MODE": "disabled"}) == ("disabled", None)
    mode, note = resolve_wandb_mode("online", base)
    assert mode == "offline" and "not logged in" in note
    assert resolve_wandb_mode("online", {**base, "WANDB_API_KEY": "x" * 40}) == ("online", None)
    empty_netrc.write_text("machine api.wandb.ai login user password secret\n")
    assert has_wandb_credentials(base)
    assert resolve_wandb_mode("offline", {**base, "WANDB_MODE": "online"}) == ("online", None)


def test_predicted_values_and_tags():
    chosen = {"step_time_s": 2.0, "tokens_per_s": 10.0, "mfu": 0.4, "bubble_fraction": 0.2, "hfu": 0.5,
              "memory": {"total_bytes": 123}, "comm": {"dp_s": 0.5, "exposed_s": 0.1}, "fits": True}
    p = predicted_values(chosen)
    assert p["predicted/step_time_s"] == 2.0 and p["predicted/mem_peak_bytes"] == 123
    assert p["predicted/allreduce_overhead"] == 0.25 and p["predicted/comm_exposed_s"] == 0.1
    assert predicted_values({}) == {}
    assert run_tags(["demo"], "tp1-pp1-dp2-z2-mb2", "fp32", "deepspeed") == \
        ["demo", "tp1-pp1-dp2-z2-mb2", "fp32", "deepspeed"]
    assert math.isclose(p["predicted/mfu"], 0.4)
