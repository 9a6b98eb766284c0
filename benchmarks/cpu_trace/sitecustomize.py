"""Loaded by every rank when `benchmarks/cpu_measure.sh --trace` puts this folder on PYTHONPATH: wraps
torch.distributed's collectives to record, per call, its wall interval and the calling thread's CPU time
(time.thread_time), and writes them to $ORCH_TRACE_DIR/trace.<rank> at exit: at the interpreter's exit and at
os._exit, which orch's trainer leaves by (orchestrator/train/__main__.py) and which skips atexit."""
import atexit
import os
import time

if os.environ.get("ORCH_TRACE_DIR"):
    import torch.distributed as dist

    _log = []

    def _wrap(name):
        fn = getattr(dist, name)

        def traced(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                _log.append((name, t0, time.perf_counter(), c0, time.thread_time()))
        setattr(dist, name, traced)

    for _name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "broadcast",
                  "all_gather", "send", "recv"):
        _wrap(_name)

    @atexit.register
    def _dump():
        if not _log:
            return
        path = os.path.join(os.environ["ORCH_TRACE_DIR"], f"trace.{os.environ.get('RANK', 'x')}")
        with open(path, "w") as f:
            for entry in _log:
                f.write("%s %.6f %.6f %.6f %.6f\n" % entry)
        _log.clear()

    _os_exit = os._exit

    def _exit_after_dump(code):
        _dump()
        _os_exit(code)
    os._exit = _exit_after_dump
