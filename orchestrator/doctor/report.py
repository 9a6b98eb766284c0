"""From the ranks' probe results to the doctor report: per-node rows, outliers, measured figures. Pure.

An outlier is named by host and rank:
- a rank whose GEMM rate is more than ``threshold`` (default 20%) below the median rank's, or (GPUs) below
  (1 - threshold) x the catalog's sustained GEMM rate for the precision (peak x matmul efficiency; the
  plan's calibrated or measured efficiency when it has one);
- a node whose pairwise p2p bandwidth (median over the pairs it is in) is more than ``threshold`` below the
  median node's (needs 3 nodes or more: with two, the one pair cannot say which end is slow), or whose
  intra-node all-reduce bus bandwidth is more than ``threshold`` below the median node's;
- (GPUs) collective bandwidths below (1 - threshold) x the catalog's intra/inter-node figure;
- a rank that fails a preflight fact: no GPU or the wrong GPU type or count, less free memory than the plan's
  per-rank peak;
- a node that never reported (missing from the rendezvous), or that the launcher's checks refused.
CPU runs are compared among themselves only: the catalog's CPU entry is a nominal test target.
"""
from __future__ import annotations

import statistics
import time

from .. import __version__

DOCTOR_VERSION = 1
DEFAULT_THRESHOLD = 0.2


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def below(value: float, reference: float, threshold: float) -> bool:
    return reference > 0 and value < (1 - threshold) * reference


def _pct(value: float, reference: float) -> str:
    return f"{100 * (1 - value / reference):.0f}% below" if reference > 0 else "below"


def catalog_figures(spec, cost_model: dict | None = None) -> dict:
    """What the catalog expects of one device of the spec's cluster ({} on CPU: not compared); the plan's
    calibrated or measured cost-model terms (plan.json ``cost_model``) take the catalog's place when set."""
    from ..catalog.gpus import GPUS  # noqa: PLC0415

    if spec.cluster.gpu == "cpu":
        return {}
    gpu, cm = GPUS[spec.cluster.gpu], cost_model or {}
    efficiency = cm.get("matmul_efficiency") or gpu.matmul_efficiency * gpu.sustained_clock_fraction
    return {"gemm_flops": gpu.peak_for(spec.training.precision) * efficiency,
            "intra_node_bandwidth_GBps": cm.get("intra_node_bandwidth_GBps") or gpu.intra_node_bandwidth_GBps,
            "inter_node_bandwidth_GBps": cm.get("inter_node_bandwidth_GBps") or gpu.inter_node_bandwidth_GBps}


def fact_problems(rank: dict, spec) -> list[str]:
    """Preflight facts of one rank that do not match the spec or the plan."""
    problems, c = [], spec.cluster
    if c.gpu != "cpu":
        if rank.get("device") != "cuda":
            problems.append(f"no GPU visible (the spec asks for {c.gpus_per_node} x {c.gpu})")
        else:
            if rank.get("device_count", 0) < c.gpus_per_node:
                problems.append(f"{rank['device_count']} GPU(s) visible, the spec asks for {c.gpus_per_node}")
            family = c.gpu.split("-")[0].lower()
            if family not in str(rank.get("device_name", "")).lower():
                problems.append(f"GPU is {rank.get('device_name')!r}, the spec says {c.gpu!r}")
    need, have = rank.get("mem_needed_bytes", 0), rank.get("mem_available_bytes", 0)
    per_node = rank.get("local_world_size", 1) if rank.get("device") == "cpu" else 1
    if need and have and have < need * per_node:
        problems.append(f"{have / 2**30:.1f} GiB free, the plan's peak needs {need * per_node / 2**30:.1f} GiB "
                        f"({per_node} rank(s) x {need / 2**30:.1f} GiB)")
    return problems


def build_report(result: dict | None, spec, *, backend: str, mode: str, threshold: float = DEFAULT_THRESHOLD,
                 hosts: list[str] | None = None, launch_problems: list[dict] | None = None,
                 seconds: float = 0.0, cost_model: dict | None = None) -> dict:
    """The doctor report (doctor.json) from rank 0's gathered results (None: nothing was measured)."""
    ranks = sorted((result or {}).get("ranks") or [], key=lambda r: r["rank"])
    if hosts:   # pdsh: the node's name is the host pdsh reached, in node-rank order
        for r in ranks:
            r["host"] = hosts[r["node_rank"]] if r["node_rank"] < len(hosts) else r["host"]
    offenders = list(launch_problems or [])
    offenders += _missing_nodes(ranks, spec, hosts) if result is not None else []
    for r in ranks:
        offenders += [{"host": r["host"], "rank": r["rank"], "what": "preflight", "message": m}
                      for m in fact_problems(r, spec)]
    catalog = catalog_figures(spec, cost_model)
    offenders += _gemm_outliers(ranks, threshold, catalog)
    nodes = node_rows(ranks, result)
    offenders += _node_outliers(nodes, threshold, catalog)
    return {
        "doctor_version": DOCTOR_VERSION, "orch_version": __version__, "time_unix": time.time(),
        "backend": backend, "mode": mode, "threshold": threshold, "seconds": seconds,
        "process_group": (result or {}).get("backend"), "rendezvous": (result or {}).get("rendezvous"),
        "spec": {"name": spec.name, "gpu": spec.cluster.gpu, "num_nodes": spec.cluster.num_nodes,
                 "gpus_per_node": spec.cluster.gpus_per_node, "precision": spec.training.precision},
        "healthy": not offenders, "offenders": offenders, "nodes": nodes,
        "ranks": [_rank_row(r) for r in ranks],
        "collectives": _collectives(ranks), "pairs": [p for r in ranks for p in r.get("pairs", [])],
        "catalog": catalog, "measured": measured_figures(ranks),
    }


def _missing_nodes(ranks: list[dict], spec, hosts: list[str] | None) -> list[dict]:
    seen = {r["node_rank"] for r in ranks}
    out = []
    for node in range(spec.cluster.num_nodes):
        if node not in seen:
            host = hosts[node] if hosts and node < len(hosts) else f"node {node}"
            out.append({"host": host, "rank": None, "what": "rendezvous",
                        "message": "never reported: did not join the rendezvous"})
    return out


def _gemm_outliers(ranks: list[dict], threshold: float, catalog: dict) -> list[dict]:
    rates = [r["gemm"]["flops"] for r in ranks if r.get("gemm")]
    mid, out = median(rates), []
    for r in ranks:
        rate = (r.get("gemm") or {}).get("flops", 0.0)
        if below(rate, mid, threshold):
            out.append({"host": r["host"], "rank": r["rank"], "what": "gemm",
                        "message": f"GEMM {rate / 1e9:.1f} GFLOP/s, {_pct(rate, mid)} the median rank's "
                                   f"{mid / 1e9:.1f}"})
        elif catalog and below(rate, catalog["gemm_flops"], threshold):
            out.append({"host": r["host"], "rank": r["rank"], "what": "gemm",
                        "message": f"GEMM {rate / 1e12:.1f} TFLOP/s, {_pct(rate, catalog['gemm_flops'])} the "
                                   f"catalog's {catalog['gemm_flops'] / 1e12:.1f}"})
    return out


def node_rows(ranks: list[dict], result: dict | None) -> list[dict]:
    """One row per node: its host, ranks, slowest GEMM, free memory, its intra-node and pairwise figures."""
    pairs = [p for r in ranks for p in r.get("pairs", [])]
    rows = []
    for node in sorted({r["node_rank"] for r in ranks}):
        mine = [r for r in ranks if r["node_rank"] == node]
        intra = next((r["comm"]["intra_node"] for r in mine if "intra_node" in r.get("comm", {})), None)
        inter = next((r["comm"]["inter_node"] for r in mine if "inter_node" in r.get("comm", {})), None)
        its = [p for p in pairs if node in p["nodes"]]
        rows.append({
            "node_rank": node, "host": mine[0]["host"], "ranks": [r["rank"] for r in mine],
            "device": mine[0].get("device_name"), "gemm_gflops_min": min(r["gemm"]["flops"] for r in mine) / 1e9,
            "mem_available_GiB": min(r.get("mem_available_bytes", 0) for r in mine) / 2**30,
            "intra_allreduce_GBps": intra["all_reduce"]["busbw_GBps"] if intra else None,
            "inter_allreduce_GBps": inter["all_reduce"]["busbw_GBps"] if inter else None,
            "pair_p2p_GBps": median([p["p2p_GBps"] for p in its]) if its else None,
            "pair_latency_us": median([p["latency_s"] for p in its]) * 1e6 if its else None,
        })
    return rows


def _node_outliers(nodes: list[dict], threshold: float, catalog: dict) -> list[dict]:
    out = []
    for key, what, need in (("pair_p2p_GBps", "pairwise p2p bandwidth", 3),
                            ("intra_allreduce_GBps", "intra-node all-reduce", 2)):
        values = [n[key] for n in nodes if n[key] is not None]
        mid = median(values)
        for n in nodes:
            if len(values) >= need and n[key] is not None and below(n[key], mid, threshold):
                out.append({"host": n["host"], "rank": n["ranks"][0], "what": key,
                            "message": f"{what} {n[key]:.2f} GB/s, {_pct(n[key], mid)} the median node's {mid:.2f}"})
    for key, cat in (("intra_allreduce_GBps", "intra_node_bandwidth_GBps"),
                     ("inter_allreduce_GBps", "inter_node_bandwidth_GBps")):
        for n in nodes:
            if catalog and n[key] is not None and below(n[key], catalog[cat], threshold):
                out.append({"host": n["host"], "rank": n["ranks"][0], "what": key,
                            "message": f"{key.split('_')[0]}-node all-reduce {n[key]:.1f} GB/s, "
                                       f"{_pct(n[key], catalog[cat])} the catalog's {catalog[cat]:.1f}"})
    return out


def _rank_row(r: dict) -> dict:
    keep = ("rank", "node_rank", "local_rank", "host", "device", "device_name", "device_count",
            "mem_available_bytes", "mem_needed_bytes", "python")
    return {**{k: r.get(k) for k in keep}, "gemm_flops": r["gemm"]["flops"], "gemm": r["gemm"],
            **({"gemm_fp32": r["gemm_fp32"]} if r.get("gemm_fp32") else {}),
            **({"model_step": r["model_step"]} if r.get("model_step") else {})}


def _collectives(ranks: list[dict]) -> dict:
    """Per scope (world, intra_node per node, inter_node): the slowest rank's view of each collective."""
    out: dict = {}
    for scope in ("world", "inter_node"):
        views = [r["comm"][scope] for r in ranks if scope in r.get("comm", {})]
        if views:
            out[scope] = _slowest(views)
    intra = {}
    for node in sorted({r["node_rank"] for r in ranks}):
        views = [r["comm"]["intra_node"] for r in ranks if r["node_rank"] == node and "intra_node" in r.get("comm", {})]
        if views:
            intra[str(node)] = _slowest(views)
    if intra:
        out["intra_node"] = intra
    return out


def _slowest(views: list[dict]) -> dict:
    out = {"ranks": views[0]["ranks"], "bytes": views[0]["bytes"], "latency_s": max(v["latency_s"] for v in views)}
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        if op in views[0]:
            out[op] = min((v[op] for v in views), key=lambda x: x["busbw_GBps"])
    return out


def synchronous_rate(windows: list[list[float]]) -> float | None:
    """What ranks that wait for each other sustain: in each window (the ranks measure at once, after a
    barrier) the slowest rank's rate, over the windows as time adds up (the harmonic mean). On a shared CPU a
    rank's best window is a moment its neighbours left it the core; a synchronous step runs through the
    other moments too, at the pace of whichever rank has the core least."""
    n = min((len(w) for w in windows), default=0)
    if n == 0:
        return None
    slowest = [min(w[i] for w in windows) for i in range(n)]
    return n / sum(1.0 / r for r in slowest) if all(r > 0 for r in slowest) else None


def synchronous_seconds(windows: list[list[float]]) -> float | None:
    """Ranks that wait for each other, in durations: each window's slowest rank, the median over the windows
    (a neighbour's burst that fills one window of a few-second probe is not the run's typical step, as the
    median step within a window is not: a run is read by its median step)."""
    n = min((len(w) for w in windows), default=0)
    if n == 0:
        return None
    slowest = [max(w[i] for w in windows) for i in range(n)]
    return statistics.median(slowest) if all(t > 0 for t in slowest) else None


def measured_figures(ranks: list[dict]) -> dict:
    """What ``--measured`` feeds the cost model: the slowest node's figures (synchronous training waits for it)."""
    out: dict = {}
    rates = [r["gemm"]["flops"] for r in ranks if r.get("gemm")]
    if rates:
        out["gemm_flops"] = min(rates)
        out["gemm_dtype"] = ranks[0]["gemm"]["dtype"]
    fp32 = [r["gemm_fp32"]["flops"] for r in ranks if r.get("gemm_fp32")]
    if fp32:
        out["gemm_fp32_flops"] = min(fp32)      # CPU ranks of a 16-bit spec: the core's speed (measured.py)
    for key, name in (("gemm", "gemm_sync_flops"), ("gemm_fp32", "gemm_fp32_sync_flops")):
        sync = synchronous_rate([r[key]["window_flops"] for r in ranks if (r.get(key) or {}).get("window_flops")])
        if sync:
            out[name] = sync
    steps = [r["model_step"] for r in ranks if (r.get("model_step") or {}).get("window_s")]
    if steps:       # CPU: the trainer's kernel mix (probe.measure_model_step), as the ranks sustain it together
        sync = synchronous_seconds([s["window_s"] for s in steps])
        if sync:
            out["model_step_s"] = sync
            out["model_step_micro_batch"] = steps[0]["micro_batch"]
        parts = {"model_fwd_bwd_s": "fwd_bwd_window_s", "model_optimizer_s": "optimizer_window_s"}
        if all(s.get(key) for s in steps for key in parts.values()):    # a doctor of stop 25 on: the two parts
            for name, key in parts.items():
                value = synchronous_seconds([s[key] for s in steps])
                if value:
                    out[name] = value
            out["model_optimizer_params"] = steps[0]["optimizer_params"]
    coll = _collectives(ranks)
    if "intra_node" in coll:
        out["intra_node_bandwidth_GBps"] = min(v["all_reduce"]["busbw_GBps"] for v in coll["intra_node"].values())
    if "inter_node" in coll:
        out["inter_node_bandwidth_GBps"] = coll["inter_node"]["all_reduce"]["busbw_GBps"]
    if coll.get("world"):
        out["allreduce_latency_s"] = coll["world"]["latency_s"]      # an 8-byte all-reduce over every rank
        out["allreduce_latency_ranks"] = coll["world"]["ranks"]
    return out


# --- for people -------------------------------------------------------------------------------------------

def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render_text(report: dict) -> str:
    """The per-node table, the collectives, the pairs and the verdict (plain text)."""
    s = report["spec"]
    lines = [f"orch doctor ({report['mode']}, {report['backend']}, {report.get('process_group') or '-'}): "
             f"{s['num_nodes']} node(s) x {s['gpus_per_node']} {s['gpu']}, {report['seconds']:.1f} s"
             + (f"; rendezvous {report['rendezvous']}: {len(report['ranks'])} rank(s) joined" if report.get("rendezvous")
                else ""),
             "", f"{'node':<5} {'host':<16} {'ranks':<8} {'device':<12} {'GEMM GFLOP/s':>13} {'free GiB':>9} "
             f"{'intra GB/s':>11} {'inter GB/s':>11} {'pair GB/s':>10} {'pair lat us':>12}"]
    for n in report["nodes"]:
        ranks = ",".join(map(str, n["ranks"]))
        lines.append(f"{n['node_rank']:<5} {n['host']:<16} {ranks:<8} {str(n['device'])[:12]:<12} "
                     f"{n['gemm_gflops_min']:>13.1f} {n['mem_available_GiB']:>9.1f} "
                     f"{_fmt(n['intra_allreduce_GBps']):>11} {_fmt(n['inter_allreduce_GBps']):>11} "
                     f"{_fmt(n['pair_p2p_GBps']):>10} {_fmt(n['pair_latency_us'], '.0f'):>12}")
    lines += ["", f"{'rank':<5} {'host':<16} {'node':<5} {'GEMM GFLOP/s':>13}  windows"]
    for r in report["ranks"]:
        windows = " ".join(f"{w / 1e9:.1f}" for w in r["gemm"].get("window_flops", []))
        lines.append(f"{r['rank']:<5} {r['host']:<16} {r['node_rank']:<5} {r['gemm_flops'] / 1e9:>13.1f}  {windows}")
    lines.append("")
    for scope, view in report["collectives"].items():
        for key, v in (view.items() if scope == "intra_node" else [(None, view)]):
            ops = "  ".join(f"{op} {v[op]['busbw_GBps']:.2f}" for op in
                            ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") if op in v)
            where = f"{scope}[node {key}]" if key is not None else scope
            lines.append(f"{where}: {v['ranks']} ranks, {v['bytes'] / 2**20:.0f} MiB, busbw GB/s: {ops}; "
                         f"latency {v['latency_s'] * 1e6:.0f} us")
    lines.append("")
    if report["healthy"]:
        lines.append("healthy: no outlier (threshold: "
                     f"{100 * report['threshold']:.0f}% below the median or the catalog)")
    else:
        lines.append(f"UNHEALTHY: {len(report['offenders'])} problem(s):")
        for o in report["offenders"]:
            rank = f" rank {o['rank']}" if o.get("rank") is not None else ""
            lines.append(f"  {o['host']}{rank}: {o['message']}")
    return "\n".join(lines)


def offender_summary(report: dict) -> str:
    """'orch-n2 (rank 1: GEMM ...), ...' for an error message."""
    parts = []
    for o in report["offenders"]:
        rank = f"rank {o['rank']}: " if o.get("rank") is not None else ""
        parts.append(f"{o['host']} ({rank}{o['message']})")
    return "; ".join(parts)
