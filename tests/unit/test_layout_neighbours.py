"""benchmarks/layout_neighbours.py: its neighbours keep the GPU count, and its anomaly checks fire on what they
name (FP8 slower than BF16, a neighbour far faster or slower, a refusal near the published memory floor, more
recompute predicted faster)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("layout_neighbours", ROOT / "benchmarks" / "layout_neighbours.py")
ln = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("layout_neighbours", ln)      # its dataclass looks its module up
_spec.loader.exec_module(ln)

PAR = {"tensor": 2, "pipeline": 4, "virtual_pipeline": 2, "micro_batch_size": 1, "zero_stage": 1,
       "sequence_parallel": True, "recompute": "none", "expert": 8, "data": 8, "account_for_embedding_loss": True}


def test_every_neighbour_keeps_the_gpu_count_and_moves_one_field():
    labels = []
    for label, data in ln.neighbours(PAR, {"training": {"precision": "bf16"}}, 64, num_layers=48, moe=True):
        p = data["parallelism"]
        assert p.get("tensor", 1) * p.get("pipeline", 1) * p.get("context", 1) * p["data"] == 64, label
        labels.append(label)
    assert {"tp 2->4", "tp 2->1", "pp 4->8", "pp 4->2", "vpp 2->off", "vpp 2->4", "mb 1->2", "ep 8->16",
            "ep 8->4", "cp 1->2", "zero 1->0", "zero 1->2", "recompute none->full", "sp True->False"} <= set(labels)
    tp1 = dict(ln.neighbours(PAR, {"training": {}}, 64, 48, True))["tp 2->1"]["parallelism"]
    assert "sequence_parallel" not in tp1 and tp1["data"] == 16      # sp needs tp > 1; data follows
    pp8 = dict(ln.neighbours(PAR, {"training": {}}, 64, 48, True))["pp 4->8"]["parallelism"]
    assert "virtual_pipeline" not in pp8 and "account_for_embedding_loss" not in pp8   # the planner re-splits


def _outcome(label, precision, tflops, step_s=1.0, floor=10 * ln.GiB, other=None):
    return ln.Outcome(label, precision, tflops=tflops, step_s=step_s, floor_bytes=floor, tag="t", other=other)


def test_the_anomaly_checks_fire_on_what_they_name():
    base = _outcome("published", "fp8", 100.0, other=_outcome("published", "bf16", 120.0))
    fast = _outcome("tp 2->4", "fp8", 170.0)
    refused = ln.Outcome("mb 1->2", "fp8", floor_bytes=10.2 * ln.GiB, refusal="does not fit")
    faster_full = _outcome("recompute none->full", "fp8", 110.0, step_s=0.9)
    found = ln.anomalies("s", base, [fast, refused, faster_full], "none")
    assert any("fp8<bf16 at published" in a for a in found)
    assert any("ratio 1.70x at tp 2->4" in a for a in found)
    assert any("refusal at mb 1->2" in a for a in found)
    assert any("monotone: recompute none" in a for a in found)
    calm = ln.anomalies("s", _outcome("published", "fp8", 100.0), [_outcome("tp 2->4", "fp8", 120.0)], "none")
    assert calm == []
