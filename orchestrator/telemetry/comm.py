"""Measured time inside collectives, split by what they do for the step.

:class:`CommTimer` wraps the collective functions of a namespace (DeepSpeed's ``cdb``, or ``torch.distributed``
for Megatron-Core) and charges each call to one bucket (allreduce, allgather, alltoall, other) with its total
and its blocked (not overlapped) time. The buckets, and how each time is taken on CPU and on CUDA:
docs/internals.md, "telemetry/comm.py".
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields

REDUCTIONS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor"})
GATHERS = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced"})
ALLTOALL = frozenset({"all_to_all", "all_to_all_single"})
MOVES = frozenset({"broadcast", "send", "recv", "isend", "irecv", "batch_isend_irecv", "gather", "scatter"})
OPS = REDUCTIONS | GATHERS | ALLTOALL | MOVES
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})

# Where the tensors and the group are, per op: (tensor argument names, group argument name).
_TENSOR_ARGS = {
    "all_reduce": ("tensor",), "all_reduce_coalesced": ("tensors",), "reduce": ("tensor",),
    "reduce_scatter": ("input_list",), "reduce_scatter_tensor": ("input_tensor",),
    "all_gather": ("tensor",), "all_gather_into_tensor": ("input_tensor",), "all_gather_base": ("input_tensor",),
    "all_gather_coalesced": ("input_tensors",), "broadcast": ("tensor",),
}


@dataclass
class CommStats:
    """Collective time and traffic of one rank over one step."""

    allreduce_s: float = 0.0
    allreduce_blocked_s: float = 0.0
    allgather_s: float = 0.0
    allgather_blocked_s: float = 0.0
    other_s: float = 0.0
    other_blocked_s: float = 0.0
    allreduce_bytes: int = 0
    allreduce_bus_bytes: float = 0.0
    alltoall_s: float = 0.0
    alltoall_blocked_s: float = 0.0

    @property
    def blocked_s(self) -> float:
        return self.allreduce_blocked_s + self.allgather_blocked_s + self.other_blocked_s + self.alltoall_blocked_s


def _nbytes(value) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    numel = getattr(value, "numel", None)
    return numel() * value.element_size() if numel else 0


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests bus bandwidth factor: bytes each rank puts on the wire per byte of the message."""
    n = group_size
    if op in ("all_reduce", "all_reduce_coalesced"):
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "reduce_scatter_tensor") or op in GATHERS:
        return (n - 1) / n
    return 1.0


def charge(s: CommStats, bucket: str, op: str, size: int, total: float, blocked: float, nbytes: int) -> None:
    """Add one collective's times (and, for reductions, its bytes) to its bucket of ``s``."""
    if bucket == "allreduce":
        s.allreduce_s += total
        s.allreduce_blocked_s += blocked
        s.allreduce_bytes += nbytes
        s.allreduce_bus_bytes += nbytes * bus_factor(op, size)
    elif bucket == "allgather":
        s.allgather_s += total
        s.allgather_blocked_s += blocked
    elif bucket == "alltoall":
        s.alltoall_s += total
        s.alltoall_blocked_s += blocked
    else:
        s.other_s += total
        s.other_blocked_s += blocked


class _TimedWork:
    """Wraps the handle of an asynchronous collective so that ``wait()`` is timed."""

    __slots__ = ("_work", "_done")

    def __init__(self, work, done):
        self._work, self._done = work, done

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._done(t0, time.perf_counter())

    def __getattr__(self, name):
        return getattr(self._work, name)


class CommTimer:
    """Times collectives of wrapped namespaces; :meth:`take` returns and resets the step's CommStats."""

    def __init__(self, dp_ranks: list[int] | None = None):
        self.stats = CommStats()
        self.dp_ranks = frozenset(dp_ranks or [])
        self.enabled = True
        self._group_info: dict[int, tuple[str, int]] = {}
        self._local = threading.local()
        self._restore: list[tuple[object, str, object]] = []
        self._pending: list[tuple] = []        # CUDA event pairs not yet resolved
        self.device_hook = None                # devicetime.DeviceClock: CUDA collectives timed on their streams

    # --- installation ------------------------------------------------------------------------------
    def install(self, namespace, names=OPS) -> "CommTimer":
        """Wrap ``namespace.<op>`` for every op it has (idempotent). ``names``: op names, or a mapping
        attribute -> op name for functions kept under another name (e.g. Megatron's
        ``dist_reduce_scatter_func`` -> "reduce_scatter_tensor")."""
        ops = names if isinstance(names, dict) else {n: n for n in names}
        for attr, op in sorted(ops.items()):
            original = getattr(namespace, attr, None)
            if original is None or getattr(original, "_orch_timed", False):
                continue
            setattr(namespace, attr, self._wrap(op, original))
            self._restore.append((namespace, attr, original))
        return self

    def uninstall(self) -> None:
        for namespace, name, original in reversed(self._restore):
            setattr(namespace, name, original)
        self._restore.clear()

    def set_dp_ranks(self, ranks) -> None:
        self.dp_ranks = frozenset(ranks)
        self._group_info.clear()

    def take(self) -> CommStats:
        """The stats since the last call, then start a new step (CUDA events: synchronize first)."""
        for bucket, op, size, nbytes, start, end in self._pending:
            seconds = start.elapsed_time(end) / 1e3
            self._charge(bucket, op, size, seconds, seconds, nbytes)
        self._pending.clear()
        stats, self.stats = self.stats, CommStats()
        return stats

    # --- the wrapper -------------------------------------------------------------------------------
    def _wrap(self, op: str, fn):
        tensor_args = _TENSOR_ARGS.get(op, ())

        def timed(*args, **kwargs):
            if not self.enabled or getattr(self._local, "depth", 0):
                return fn(*args, **kwargs)
            bucket, size = self._classify(op, kwargs.get("group", _group_from_args(op, args)))
            if bucket is None:
                return fn(*args, **kwargs)
            self._local.depth = 1
            if self.device_hook is not None and _on_cuda(args, kwargs):
                try:
                    nbytes = _message_bytes(tensor_args, args, kwargs) if bucket == "allreduce" else 0
                    return self.device_hook.call(bucket, op, size, nbytes, fn, args, kwargs)
                finally:
                    self._local.depth = 0
            events = _cuda_events(args, kwargs)
            t0 = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                self._local.depth = 0
            t1 = time.perf_counter()
            nbytes = _message_bytes(tensor_args, args, kwargs) if bucket == "allreduce" else 0
            if events is not None and not kwargs.get("async_op"):
                events[1].record()
                self._pending.append((bucket, op, size, nbytes, *events))
                return result
            if kwargs.get("async_op") and hasattr(result, "wait"):
                def done(w0, w1):
                    self._charge(bucket, op, size, w1 - t0, (t1 - t0) + (w1 - w0), nbytes)
                return _TimedWork(result, done)
            self._charge(bucket, op, size, t1 - t0, t1 - t0, nbytes)
            return result

        timed._orch_timed = True
        timed.__wrapped__ = fn
        return timed

    def _charge(self, bucket: str, op: str, size: int, total: float, blocked: float, nbytes: int) -> None:
        charge(self.stats, bucket, op, size, total, blocked, nbytes)

    def _classify(self, op: str, group) -> tuple[str | None, int]:
        """(bucket, group size); bucket None for a group of one process."""
        if op in P2P:
            return "other", 2
        key = id(group)
        info = self._group_info.get(key)
        if info is None:
            info = self._group_info[key] = self._group_kind(group)
        kind, size = info
        if kind == "local":
            return None, size
        if op in ALLTOALL:
            return "alltoall", size
        if kind == "dp" and op in REDUCTIONS:
            return "allreduce", size
        if kind == "dp" and op in GATHERS:
            return "allgather", size
        return "other", size

    def _group_kind(self, group) -> tuple[str, int]:
        import torch.distributed as dist  # noqa: PLC0415

        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        if len(ranks) <= 1:
            return "local", len(ranks)
        return ("dp" if frozenset(ranks) == self.dp_ranks else "other"), len(ranks)


def _on_cuda(args: tuple, kwargs: dict) -> bool:
    for value in (*args, *kwargs.values()):
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if hasattr(value, "is_cuda"):
            return bool(value.is_cuda)
    return False


def _cuda_events(args: tuple, kwargs: dict):
    """(start, end) CUDA events, start recorded now, when the call's first tensor is on a GPU."""
    for value in (*args, *kwargs.values()):
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if getattr(value, "is_cuda", False):
            import torch  # noqa: PLC0415

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            return start, end
        if hasattr(value, "is_cuda"):
            return None
    return None


def _group_from_args(op: str, args: tuple):
    """The group of a call that passed it positionally (DeepSpeed passes keywords; torch may not)."""
    positions = {"all_reduce": 2, "reduce": 3, "broadcast": 2, "all_gather": 2, "all_gather_into_tensor": 2,
                 "reduce_scatter_tensor": 3, "reduce_scatter": 3, "all_reduce_coalesced": 2}
    i = positions.get(op)
    return args[i] if i is not None and len(args) > i else None


def _message_bytes(names: tuple, args: tuple, kwargs: dict) -> int:
    for name in names:
        if name in kwargs:
            return _nbytes(kwargs[name])
    if not names or not args:
        return 0
    # Positional: the tensor is the first argument, except reduce_scatter*(output, input).
    index = 1 if names[0] in ("input_list", "input_tensor", "input_tensors") else 0
    return _nbytes(args[index]) if len(args) > index else 0


def stats_fields() -> list[str]:
    return [f.name for f in fields(CommStats)]
