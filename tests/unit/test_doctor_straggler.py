"""Pure parts of the doctor report and the straggler detector (the real runs: tests/integration/test_doctor.py
and test_straggler.py)."""
from __future__ import annotations

import pytest

from orchestrator.doctor.report import build_report, render_text
from orchestrator.spec_loader import parse_spec
from orchestrator.telemetry.metrics import ROW, RunConstants, build_record
from orchestrator.telemetry.straggler import StragglerConfig, StragglerDetector, rank_spread
from tests.conftest import spec_data


def _spec(**overrides):
    return parse_spec(spec_data(**{"cluster.num_nodes": 3, "cluster.gpus_per_node": 1, "training.global_batch_size": 12, **overrides}))


def _rank(rank, node, gflops, host=None, pairs=()):
    return {"rank": rank, "node_rank": node, "local_rank": 0, "host": host or f"n{node}", "device": "cpu",
            "device_name": "cpu", "device_count": 0, "mem_available_bytes": 8 << 30, "mem_needed_bytes": 1 << 30,
            "local_world_size": 1, "gemm": {"flops": gflops * 1e9, "dtype": "float32", "n": 8, "window_flops": []},
            "comm": {}, "pairs": list(pairs)}


def _pair(a, b, gbps):
    return {"nodes": [a, b], "ranks": [a, b], "bytes": 1, "p2p_GBps": gbps, "latency_s": 1e-4}


def test_a_rank_more_than_the_threshold_below_the_median_is_named_by_host_and_rank():
    result = {"backend": "gloo", "ranks": [_rank(0, 0, 50), _rank(1, 1, 48), _rank(2, 2, 30)]}
    report = build_report(result, _spec(), backend="local", mode="full")
    assert not report["healthy"]
    assert [(o["host"], o["rank"], o["what"]) for o in report["offenders"]] == [("n2", 2, "gemm")]
    assert "n2 rank 2: GEMM 30.0 GFLOP/s, 38% below the median rank's 48.0" in render_text(report)
    # 15% below is within the default 20%.
    result["ranks"][2]["gemm"]["flops"] = 41e9
    assert build_report(result, _spec(), backend="local", mode="full")["healthy"]


def test_pairwise_tests_locate_the_node_in_every_slow_pair():
    ranks = [_rank(0, 0, 50, pairs=[_pair(0, 1, 2.0), _pair(0, 2, 0.5)]), _rank(1, 1, 50, pairs=[_pair(1, 2, 0.5)]),
             _rank(2, 2, 50)]
    report = build_report({"backend": "gloo", "ranks": ranks}, _spec(), backend="local", mode="full")
    assert [(o["host"], o["what"]) for o in report["offenders"]] == [("n2", "pair_p2p_GBps")]


def test_missing_nodes_and_memory_are_named_and_pdsh_hosts_replace_hostnames():
    ranks = [_rank(0, 0, 50), _rank(1, 1, 50)]
    ranks[1]["mem_available_bytes"] = 1 << 29
    report = build_report({"backend": "gloo", "ranks": ranks}, _spec(), backend="pdsh", mode="quick",
                          hosts=["h0", "h1", "h2"])
    found = {(o["host"], o["what"]) for o in report["offenders"]}
    assert found == {("h2", "rendezvous"), ("h1", "preflight")}
    assert [n["host"] for n in report["nodes"]] == ["h0", "h1"]


def test_nothing_measured_reports_the_launch_problem():
    problem = {"host": "orch-n9", "rank": None, "what": "preflight", "message": "not reachable"}
    report = build_report(None, _spec(), backend="pdsh", mode="quick", launch_problems=[problem])
    assert not report["healthy"] and report["offenders"] == [problem] and report["nodes"] == []


def test_rank_spread_is_slowest_over_median():
    assert rank_spread([1.0, 1.0, 3.0]) == (3.0, 2)
    assert rank_spread([0.1, 0.3]) == (pytest.approx(1.5), 1)
    assert rank_spread([]) == (1.0, 0)
    # Pipeline stages do different work: ranks are compared within their stage (pp outermost).
    assert rank_spread([1.0, 1.0, 3.0, 3.0], num_stages=2) == (1.0, 0)
    assert rank_spread([1.0, 1.0, 3.0, 6.0], num_stages=2) == (pytest.approx(6 / 4.5), 3)
    assert rank_spread([1.0, 3.0], num_stages=2) == (1.0, 0)


def test_the_record_carries_the_spread_and_the_slowest_rank_and_host():
    c = RunConstants(global_batch_size=4, seq_length=8, world_size=2, pp=1, model_flops_per_step=1e9,
                     hardware_flops_per_step=1e9, peak_flops=1e11)
    rows = [dict.fromkeys(ROW, 0.0) | {"step_time_s": 1.0, "compute_time_s": t} for t in (0.2, 0.6)]
    record = build_record(c, rows, step=1, time_unix=0.0, lr=0.1, grad_norm=None, hosts=["a", "b"])
    assert (record.rank_step_time_spread, record.slowest_rank, record.slowest_host) == (pytest.approx(1.5), 1, "b")


def test_a_straggler_is_named_once_after_a_full_window_of_the_same_rank():
    d = StragglerDetector(StragglerConfig(threshold=1.2, window=3))
    seen = [d.observe(step, spread, rank, "h") for step, spread, rank in
            [(1, 1.5, 1), (2, 1.1, 1), (3, 1.5, 1), (4, 1.5, 1), (5, 1.6, 1), (6, 1.7, 1), (7, 1.5, 0)]]
    named = [(s.step, s.rank, s.since_step) for s in seen if s]
    assert named == [(5, 1, 3)]   # step 2 was under the threshold; named once, not again at step 6
    assert StragglerConfig.from_env({"ORCH_STRAGGLER_THRESHOLD": "1.5", "ORCH_STRAGGLER_WINDOW": "7"}) == \
        StragglerConfig(1.5, 7)


def test_measured_doctor_json_replaces_the_catalog_figures_and_plan_json_says_so(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from orchestrator.spec_loader import load_spec

    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-8b-64xh100.yaml"
    spec = load_spec(example)
    doctor = {"doctor_version": 1, "backend": "slurm", "time_unix": 0.0,
              "spec": {"gpu": spec.cluster.gpu, "precision": spec.training.precision},
              "measured": {"intra_node_bandwidth_GBps": 90.0, "inter_node_bandwidth_GBps": 5.0,
                           "allreduce_latency_s": 1e-4, "allreduce_latency_ranks": 64, "gemm_flops": 400e12}}
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(doctor))
    orch = [str(Path(sys.executable).parent / "orch")]
    base = subprocess.run([*orch, "generate", str(example), "-o", str(tmp_path / "base")], capture_output=True, text=True)
    slow = subprocess.run([*orch, "generate", str(example), "-o", str(tmp_path / "measured"), "--measured", str(path)],
                          capture_output=True, text=True)
    assert base.returncode == 0 and slow.returncode == 0, base.stderr + slow.stderr
    before = json.loads((tmp_path / "base" / "plan.json").read_text())
    after = json.loads((tmp_path / "measured" / "plan.json").read_text())
    assert "measured" not in before
    figures = after["measured"]["figures"]
    # The latency is not among them on GPUs: NCCL's per-link latencies come from the cost model's table.
    assert set(figures) == {"intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps", "matmul_efficiency"}
    assert figures["inter_node_bandwidth_GBps"]["value"] == 5.0 and after["cost_model"]["inter_node_bandwidth_GBps"] == 5.0
    assert after["chosen"]["step_time_s"] > before["chosen"]["step_time_s"]
    # A doctor.json of another GPU is refused, naming the file and the field.
    doctor["spec"]["gpu"] = "a100-80gb"
    path.write_text(json.dumps(doctor))
    bad = subprocess.run([*orch, "plan", str(example), "--measured", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "spec.gpu" in bad.stderr and "a100-80gb" in bad.stderr


def test_gpu_ranks_below_the_catalog_or_the_plans_calibrated_rate_are_named():
    spec = _spec(**{"cluster.gpu": "h100-sxm", "training.precision": "bf16"})
    ranks = [_rank(r, r, 600e3) for r in range(3)]          # 600 TFLOP/s each: at the catalog's ~750
    for r in ranks:
        r.update(device="cuda", device_name="NVIDIA H100 80GB HBM3", device_count=1, local_world_size=1)
    result = {"backend": "nccl", "ranks": ranks}
    assert build_report(result, spec, backend="slurm", mode="full")["healthy"]
    calibrated = build_report(result, spec, backend="slurm", mode="full", cost_model={"matmul_efficiency": 0.9})
    assert [(o["rank"], o["what"]) for o in calibrated["offenders"]] == [(0, "gemm"), (1, "gemm"), (2, "gemm")]
    ranks[1]["device_name"] = "NVIDIA A100-SXM4-80GB"
    report = build_report(result, spec, backend="slurm", mode="full")
    assert [(o["host"], o["message"]) for o in report["offenders"]] == \
        [("n1", "GPU is 'NVIDIA A100-SXM4-80GB', the spec says 'h100-sxm'")]
