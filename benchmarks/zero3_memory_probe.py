"""Where a DeepSpeed rank's resident memory goes, phase by phase, on the CPU target (issue 18, "No false OOM").

Runs the reference trainer's model and DeepSpeed engine (orchestrator.train.engine.ZeroEngine, the run dir's
ds_config.json, optionally changed) for a few steps and prints, per rank and phase (model built, after
deepspeed.initialize, each step's forward, backward and optimizer step), the peak resident set of that phase
(VmHWM, reset before each phase through /proc/self/clear_refs), the resident set after it, glibc's heap
accounting (mallinfo2: bytes in use, free bytes the allocator keeps) and, with PROBE_TENSORS=1, the storages
Python's tensors hold at the last step's forward end and after its optimizer step (gc).

    flock /work/wt/cpu.lock torchrun --nproc_per_node 2 benchmarks/zero3_memory_probe.py RUN_DIR \
        ['{"zero_optimization": {"stage3_max_reuse_distance": 0}}']

The optional JSON is merged into ds_config.json (one level deep per top-level key). Environment:
PROBE_STEPS (default 4), PROBE_TENSORS=1; MALLOC_MMAP_THRESHOLD_=65536 removes glibc's kept heap. Each rank prints one JSON line prefixed "PROBE".
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

MiB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def status() -> dict:
    """This process's /proc/self/status memory lines (bytes) and glibc's heap accounting."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    m = _LIBC.mallinfo2()
    out["malloc_in_use"] = m.uordblks + m.hblkhd        # bytes handed out: heap chunks + mmapped chunks
    out["malloc_free_kept"] = m.fordblks                  # free bytes in the arenas (not returned to the OS)
    out["malloc_mmapped"] = m.hblkhd
    return out


def reset_peak() -> None:
    """Reset VmHWM to the current resident set (Linux: 'echo 5 > /proc/PID/clear_refs')."""
    Path("/proc/self/clear_refs").write_text("5")


class Phases:
    """Peak and end-of-phase figures of each named phase."""

    def __init__(self):
        self.rows: list[dict] = []
        reset_peak()

    def mark(self, name: str) -> None:
        s = status()
        self.rows.append({"phase": name, "peak_MiB": round(s["VmHWM"] / MiB, 1),
                          "rss_MiB": round(s["VmRSS"] / MiB, 1),
                          "anon_MiB": round(s["RssAnon"] / MiB, 1), "shmem_MiB": round(s["RssShmem"] / MiB, 1),
                          "malloc_in_use_MiB": round(s["malloc_in_use"] / MiB, 1),
                          "malloc_free_kept_MiB": round(s["malloc_free_kept"] / MiB, 1),
                          "malloc_mmapped_MiB": round(s["malloc_mmapped"] / MiB, 1)})
        reset_peak()


def live_tensors(top: int = 12) -> dict:
    """Storages reachable from Python tensors (gc): total MiB, and the largest by (shape, dtype) with counts.
    Autograd's saved activations are not Python objects and do not appear."""
    import gc  # noqa: PLC0415

    import torch  # noqa: PLC0415

    seen, groups = {}, {}
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu":
            continue
        try:
            storage = obj.untyped_storage()
        except RuntimeError:
            continue
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if not nbytes or ptr in seen:
            continue
        seen[ptr] = nbytes
        key = f"{tuple(obj.shape)} {str(obj.dtype).replace('torch.', '')} storage {nbytes / MiB:.2f} MiB"
        groups[key] = groups.get(key, 0) + 1
    biggest = sorted(groups.items(), key=lambda kv: -float(kv[0].split("storage ")[1].split()[0]) * kv[1])[:top]
    return {"total_MiB": round(sum(seen.values()) / MiB, 1), "largest": [f"{n} x {k}" for k, n in biggest]}


def gathered_params(module) -> dict:
    """ZeRO-3 parameters by DeepSpeed's status (ds_status): count and elements of their current data."""
    out: dict = {}
    for p in module.parameters():
        key = str(getattr(p, "ds_status", "not zero-3")).split(".")[-1]
        count, numel = out.get(key, (0, 0))
        out[key] = (count + 1, numel + p.data.numel())
    return out


def merged_config(ds_config: dict, overrides: dict) -> dict:
    out = dict(ds_config)
    for key, value in overrides.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def main(argv: list[str]) -> int:
    import deepspeed  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from orchestrator.rundir import read_run_dir  # noqa: PLC0415
    from orchestrator.train.data import build_dataset  # noqa: PLC0415
    from orchestrator.train.engine import ZeroEngine  # noqa: PLC0415
    from orchestrator.train.ops import use_interpreter_tools  # noqa: PLC0415
    from orchestrator.train.session import resolved_layout  # noqa: PLC0415

    use_interpreter_tools()
    run_dir = read_run_dir(argv[0])
    ds_config = merged_config(run_dir.ds_config, json.loads(argv[1]) if len(argv) > 1 else {})
    steps = int(os.environ.get("PROBE_STEPS", "4"))
    deepspeed.init_distributed(verbose=False)

    class Busy:
        @staticmethod
        def wrap(fn):
            return fn

    tensors: dict = {}
    phases = Phases()
    phases.mark("imported")
    engine = ZeroEngine(run_dir.spec, ds_config, build_dataset(run_dir.spec, run_dir.path), Busy(),
                        resolved_layout(run_dir))
    phases.mark("initialize")
    for step in range(steps):
        tokens, labels = engine._micro_batch(step, 0)
        loss = engine.engine(tokens, labels)
        phases.mark(f"step{step}.forward")
        if os.environ.get("PROBE_TENSORS") == "1" and step == steps - 1:
            tensors["forward"] = live_tensors()
            tensors["forward_params"] = gathered_params(engine.engine.module)
        engine.engine.backward(loss)
        del loss
        phases.mark(f"step{step}.backward")
        engine.engine.step()
        phases.mark(f"step{step}.step")
        if os.environ.get("PROBE_TENSORS") == "1" and step == steps - 1:
            tensors["step"] = live_tensors()
    result = {"rank": dist.get_rank(), "overrides": argv[1] if len(argv) > 1 else "", "phases": phases.rows,
              "max_peak_MiB": max(r["peak_MiB"] for r in phases.rows)}
    if tensors:
        result["tensors"] = tensors
    print("PROBE " + json.dumps(result), flush=True)
    dist.barrier()
    engine.engine.destroy()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
