"""Telemetry for MoE and context parallelism without a cluster: routing metrics, the all-to-all bucket, the
record and its predictions."""
from __future__ import annotations

import time

import jsonschema
import pytest

from orchestrator.telemetry.comm import CommTimer
from orchestrator.telemetry.metrics import ROW, RunConstants, build_record
from orchestrator.telemetry.moe import MoEShape, load_imbalance, moe_metrics
from orchestrator.telemetry.sinks import record_dict
from orchestrator.telemetry.timing import BusyTimer
from orchestrator.telemetry.wandb_sink import predicted_values
from tests.integration.train_support import metrics_schema

C = RunConstants(global_batch_size=8, seq_length=128, world_size=2, pp=1, model_flops_per_step=4e12,
                 hardware_flops_per_step=4e12, peak_flops=1e11)


def test_load_imbalance_is_max_over_mean():
    assert load_imbalance([4, 4, 4, 4]) == 1.0
    assert load_imbalance([8, 4, 2, 2]) == 2.0
    assert load_imbalance([16, 0, 0, 0]) == 4.0          # all on one of E experts: E
    assert load_imbalance([0, 0, 0, 0]) == 1.0


def test_moe_metrics_from_summed_counts():
    shape = MoEShape(num_layers=2, num_experts=4)
    # layer 0 balanced, layer 1 skewed; 6 of 64 slots dropped; aux 0.05 summed over 2 forward passes
    summed = [8, 8, 8, 8] + [20, 4, 4, 4] + [6, 64, 0.05, 2]
    assert len(summed) == shape.size
    m = moe_metrics(shape, summed)
    assert m["expert_load_imbalance"] == pytest.approx(2.5)           # the worst layer
    assert m["tokens_dropped_fraction"] == pytest.approx(6 / 64)
    assert m["moe_aux_loss"] == pytest.approx(0.025)


def test_record_with_and_without_moe_matches_the_schema():
    row = dict.fromkeys(ROW, 0.0) | {"step_time_s": 1.0, "loss": 2.0, "alltoall_s": 0.25}
    dense = build_record(C, [row, row | {"alltoall_s": 0.5}], step=1, time_unix=0.0, lr=0.0, grad_norm=None)
    assert dense.alltoall_time_s == 0.5 and dense.expert_load_imbalance is None
    moe = build_record(C, [row], step=1, time_unix=0.0, lr=0.0, grad_norm=None,
                       moe={"expert_load_imbalance": 1.5, "tokens_dropped_fraction": 0.0, "moe_aux_loss": 0.01})
    for record in (dense, moe):
        jsonschema.validate(record_dict(record), metrics_schema())
    with pytest.raises(jsonschema.ValidationError):                    # imbalance below 1 is impossible
        jsonschema.validate(record_dict(moe) | {"expert_load_imbalance": 0.5}, metrics_schema())


class _Backend:
    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        time.sleep(0.01)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        time.sleep(0.01)


class _Timer(CommTimer):
    def _group_kind(self, group):
        return {"dp": ("dp", 2), "ep": ("other", 2), "solo": ("local", 1)}[group]


def test_all_to_all_has_its_own_bucket_and_is_not_compute():
    backend = _Backend()
    timer = _Timer().install(backend)
    busy = BusyTimer(timer)

    def forward():
        backend.all_to_all_single(None, None, group="ep")
        backend.all_to_all_single(None, None, group="dp")              # an ep group that is also the dp group
        time.sleep(0.01)

    busy.wrap(forward)()
    backend.all_to_all_single(None, None, group="solo")                # one process: moves nothing
    backend.all_reduce(None, group="dp")
    s = timer.take()
    assert 0.019 < s.alltoall_s < 0.1 and s.alltoall_blocked_s == s.alltoall_s
    assert s.other_s == 0.0 and 0.009 < s.allreduce_s < 0.05
    assert busy.take() < 0.025                                        # the exchanges (>= 0.02 s) are not busy


def test_predicted_alltoall_and_imbalance():
    chosen = {"ep": 2, "cp": 1, "engine": "megatron", "comm": {"ep_s": 0.2, "cp_s": 0.5},
              "moe": {"load_imbalance": 1.1}}
    assert predicted_values(chosen)["predicted/alltoall_time_s"] == 0.2            # Megatron's cp ring is p2p
    assert predicted_values(chosen)["predicted/expert_load_imbalance"] == 1.1
    ulysses = {"ep": 1, "cp": 2, "engine": "deepspeed", "comm": {"ep_s": 0.0, "cp_s": 0.5}}
    assert predicted_values(ulysses)["predicted/alltoall_time_s"] == 0.5
    dense = {"ep": 1, "cp": 1, "engine": "deepspeed", "comm": {"ep_s": 0.0, "cp_s": 0.0, "dp_s": 1.0}}
    assert "predicted/alltoall_time_s" not in predicted_values(dense)
