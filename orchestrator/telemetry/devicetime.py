"""Device time on CUDA for the program wrapper: CUDA events, read one step late, never a device-wide sync.

- Step time: an event recorded on the compute stream (the device's default stream, where programs compute)
  at every optimizer step; a step is the interval between two of them.
- A collective on CUDA tensors: events on the stream current at the call, before and after it (the NCCL
  kernel runs on NCCL's own stream, which waits for that stream first; a synchronous call makes that stream
  wait for it on return), so ``total`` is the collective's device interval. ``exposed`` is the part of it
  the compute stream waited: all of it when the call was made on the compute stream; none when it was made
  on a side stream (DeepSpeed's ``overlap_comm`` reduction stream), whose waits are charged where the
  compute stream waits on that stream (``Stream.wait_stream``, timed with events on the compute stream).
  An asynchronous call's ``wait()`` is bracketed the same way on the stream that waits.
- Resolution: :meth:`DeviceClock.resolve` waits on the step's own last events only (``Event.synchronize``),
  one step after they were recorded, by which time they have normally completed.

Not yet run on a GPU (none was available when it was written): the CPU path (host time) is the tested one.
"""
from __future__ import annotations

from .comm import CommStats, CommTimer, charge

_EXPOSED, _OVERLAPPED = 1, 0


class DeviceClock:
    """Step events on the compute stream and the CUDA side of a CommTimer's collectives."""

    def __init__(self, comm: CommTimer, cuda=None):
        if cuda is None:
            import torch  # noqa: PLC0415

            cuda = torch.cuda
        self.cuda = cuda                # torch.cuda (a stand-in in the unit tests)
        self.comm = comm
        self._start = None
        self._events: list = []         # this step: (bucket, op, size, nbytes, start, end, mode)
        self._side_streams: dict = {}   # stream -> bucket of the last collective issued on it this step
        comm.device_hook = self         # CommTimer asks us first for CUDA tensors (see wrap_cuda)
        self._patch_wait_stream()

    def _event(self, stream=None):
        event = self.cuda.Event(enable_timing=True)
        event.record(stream) if stream is not None else event.record()
        return event

    def compute_stream(self):
        return self.cuda.default_stream()

    def mark(self) -> None:
        self._start = self._event(self.compute_stream())

    def end_step(self):
        """Close the step: its token (resolve it later); the next step starts at this event."""
        end = self._event(self.compute_stream())
        token = (self._start or end, end, self._events, self.comm.take())
        self._start, self._events, self._side_streams = end, [], {}
        return token

    def resolve(self, token, *, wait: bool = True):
        """(step device seconds, CommStats): host-timed collectives plus the CUDA ones of the step."""
        if isinstance(token, tuple) and len(token) == 2 and isinstance(token[1], CommStats):
            return token                              # already resolved
        start, end, events, stats = token
        end.synchronize()
        for bucket, op, size, nbytes, first, last, mode in events:
            last.synchronize()
            total = first.elapsed_time(last) / 1e3
            self._charge(stats, bucket, op, size, total, total if mode == _EXPOSED else 0.0, nbytes)
        return start.elapsed_time(end) / 1e3 if start is not end else 0.0, stats

    @staticmethod
    def _charge(stats: CommStats, bucket, op, size, total, blocked, nbytes) -> None:
        if bucket != "wait":
            charge(stats, bucket, op, size, total, blocked, nbytes)
            return
        # the compute stream waiting on a side stream's collectives (op: the bucket of those): exposed only
        stats.allreduce_blocked_s += blocked if op == "allreduce" else 0.0
        stats.allgather_blocked_s += blocked if op == "allgather" else 0.0
        stats.alltoall_blocked_s += blocked if op == "alltoall" else 0.0
        stats.other_blocked_s += blocked if op not in ("allreduce", "allgather", "alltoall") else 0.0

    # --- called by CommTimer for a collective on CUDA tensors ----------------------------------------
    def call(self, bucket: str, op: str, size: int, nbytes: int, fn, args, kwargs):
        stream = self.cuda.current_stream()
        on_compute = stream == self.compute_stream()
        first = self._event(stream)
        result = fn(*args, **kwargs)
        if not on_compute:
            self._side_streams[stream] = bucket
        if kwargs.get("async_op") and hasattr(result, "wait"):
            return _CudaWork(result, self, (bucket, op, size, nbytes, first))
        self._events.append((bucket, op, size, nbytes, first, self._event(stream),
                             _EXPOSED if on_compute else _OVERLAPPED))
        return result

    def waited(self, issued: tuple, before, after, on_compute: bool) -> None:
        bucket, op, size, nbytes, first = issued
        self._events.append((bucket, op, size, nbytes, first, after, _OVERLAPPED))     # total: issue -> done
        if on_compute:
            self._events.append(("wait", bucket, size, 0, before, after, _EXPOSED))   # exposed: the stall

    def _patch_wait_stream(self) -> None:
        stream_cls = self.cuda.Stream
        original = stream_cls.wait_stream
        if getattr(original, "_orch_timed", False):
            return
        clock = self

        def wait_stream(stream, other):
            bucket = clock._side_streams.get(other) if clock.comm.enabled else None
            if bucket is None or stream != clock.compute_stream():
                return original(stream, other)
            before = clock._event(stream)
            result = original(stream, other)
            clock._events.append(("wait", bucket, 0, 0, before, clock._event(stream), _EXPOSED))
            return result

        wait_stream._orch_timed = True
        stream_cls.wait_stream = wait_stream


class _CudaWork:
    """The handle of an asynchronous CUDA collective: its wait() is bracketed on the waiting stream."""

    __slots__ = ("_work", "_clock", "_issued")

    def __init__(self, work, clock: DeviceClock, issued: tuple):
        self._work, self._clock, self._issued = work, clock, issued

    def wait(self, *args, **kwargs):
        clock = self._clock
        stream = clock.cuda.current_stream()
        before = clock._event(stream)
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            clock.waited(self._issued, before, clock._event(stream), stream == clock.compute_stream())

    def __getattr__(self, name):
        return getattr(self._work, name)
