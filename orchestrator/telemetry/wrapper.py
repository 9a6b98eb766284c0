"""Telemetry for a program orch did not write: observe it from outside, in its own interpreter.

:class:`ProgramTelemetry` is installed before the program's imports (orchestrator/programs/__main__.py) and
sees optimizer steps (torch.optim's step hooks; DeepSpeed's ``_take_model_step``), every ``torch.distributed``
collective and point-to-point call, the loss DeepSpeed's engine is handed, the learning rate, busy time and
peak memory; each step ends in one asynchronous all_reduce on a gloo group of its own, completed at the next
step. On CUDA, times are device events (devicetime.py). What it sees and why it cannot deadlock:
docs/telemetry-wrapper.md.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import math
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from .comm import OPS, CommTimer
from .metrics import ROW, build_record
from .timing import BusyTimer, peak_memory_bytes

PREFIX = "[orch-program]"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
SIDE_GROUP_TIMEOUT_S = 600


def note(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def dp_ranks_of(rank: int, tp: int, dp: int) -> list[int]:
    """The data-parallel group of ``rank`` in the layout DeepSpeed's PipeModelDataParallelTopology and
    Megatron both use (tensor fastest, then data, then pipeline): same stage, same tensor-parallel index."""
    block = tp * dp
    base = (rank // block) * block + rank % tp
    return [base + k * tp for k in range(dp)]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` right after one of ``targets`` is executed (the program's own import)."""

    def __init__(self, targets: dict):
        self.targets = targets

    def find_spec(self, name, path, target=None):
        patch = self.targets.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, targets, finder = spec.loader, self.targets, self

        class Loader(importlib.abc.Loader):
            def create_module(self, spec_):
                return loader.create_module(spec_)

            def exec_module(self, module):
                loader.exec_module(module)
                targets.pop(name, None)
                patch(module)
                if not targets and finder in sys.meta_path:
                    sys.meta_path.remove(finder)      # nothing left to watch for

        spec.loader = Loader()
        return spec


class ProgramTelemetry:
    """One per rank. ``install()`` before the program runs, ``finish(code)`` after it."""

    def __init__(self, run_dir: str | Path, *, kind: str = "script", log_format: str | None = None,
                 start_step: int = 0):
        self.run_dir_path = Path(run_dir)
        self.kind, self.log_format = kind, log_format
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.comm = CommTimer()
        self.busy = BusyTimer(self.comm)
        self.busy_source = None           # set when DeepSpeed's pipeline instructions are timed
        self._pipe_busy = None
        self.start_step = start_step      # the checkpoint this start resumes from (orchestrator.programs.resume)
        self.step = start_step
        self.sinks: list = []
        self.stragglers = None
        self.hosts: list | None = None
        self.last_record = None
        self.signal_name: str | None = None
        self._t0: float | None = None
        self._lr: float | None = None
        self._losses: list = []
        self._grad_norm = None
        self._engine_depth = 0
        self._pipe_depth = 0
        self._step_due = False
        self._optimizer_id: int | None = None
        self._side = None
        self._raw: dict = {}
        self._device = None               # devicetime.DeviceClock on CUDA
        self._pending = None              # CUDA: the step waiting for its events
        self._inflight = None             # (work, table, meta): the step whose cross-rank reduce is under way
        self._closed = False
        self.own_s = 0.0                  # time spent in end_step (the cross-rank reduce and the sinks included)
        self._own_last = 0.0
        self._finder = None
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._forward_hook = None
        self._constants = None
        self._status = None
        self._sources: dict[str, str] = {}

    # --- installation ------------------------------------------------------------------------------
    def install(self, run, layout, constants, status=None) -> "ProgramTelemetry":
        """``run``: the RunDir; ``layout``: its resolved Layout; ``constants``: its RunConstants; ``status``:
        ``status(data)`` writes train_status.json (the caller knows where the trainer keeps it)."""
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415
        import torch.distributed.distributed_c10d as c10d  # noqa: PLC0415
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook  # noqa: PLC0415

        self.run_dir, self.layout, self._status = run, layout, status
        self.pp = layout.pp or 1
        self.comm.set_dp_ranks(dp_ranks_of(self.rank, layout.tp or 1, layout.dp or 1))
        self._constants = constants
        if torch.cuda.is_available():
            from .devicetime import DeviceClock  # noqa: PLC0415

            self._device = DeviceClock(self.comm)
        self._raw = {"all_reduce": dist.all_reduce, "all_gather_object": dist.all_gather_object,
                     "new_group": dist.new_group}      # the originals: the wrapper's own calls are never timed
        for namespace in (c10d, dist):
            self.comm.install(namespace, OPS)
        for namespace in (c10d, dist):
            namespace.init_process_group = self._wrap_init(namespace.init_process_group)
            namespace.destroy_process_group = self._wrap_destroy(namespace.destroy_process_group)
        register_optimizer_step_pre_hook(self._pre_step)
        register_optimizer_step_post_hook(self._post_step)
        self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._first_forward)
        self._finder = _AfterImport({"deepspeed.runtime.engine": self._patch_engine,
                                     "deepspeed.runtime.pipe.engine": self._patch_pipe})
        sys.meta_path.insert(0, self._finder)
        self._install_signals()
        if self.rank == 0:
            self._open_sinks()
        return self

    def _wrap_init(self, fn):
        def init_process_group(*args, **kwargs):
            result = fn(*args, **kwargs)
            self._start_side_group()
            return result

        init_process_group.__wrapped__ = fn
        return init_process_group

    def _wrap_destroy(self, fn):
        def destroy_process_group(group=None):
            if group is None:
                self.flush()                      # the side group goes with the others
                self._side = None
            return fn(group)

        destroy_process_group.__wrapped__ = fn
        return destroy_process_group

    def _start_side_group(self) -> None:
        import datetime  # noqa: PLC0415

        import torch.distributed as dist  # noqa: PLC0415

        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        if self.world > 1 and self._side is None:
            self._side = self._raw["new_group"](backend="gloo",
                                                 timeout=datetime.timedelta(seconds=SIDE_GROUP_TIMEOUT_S))
            self.comm._group_info[id(self._side)] = ("local", self.world)    # never timed
            self._gather_hosts()        # here, where the ranks have just met, not at a step

    # --- DeepSpeed ---------------------------------------------------------------------------------
    def _patch_engine(self, module) -> None:
        engine_cls = module.DeepSpeedEngine
        take, backward = engine_cls._take_model_step, engine_cls.backward
        telemetry = self

        def _take_model_step(engine, *args, **kwargs):
            telemetry._engine_depth += 1
            try:
                return take(engine, *args, **kwargs)
            finally:
                telemetry._engine_depth -= 1
                telemetry._grad_norm = _number(getattr(engine, "get_global_grad_norm", lambda: None)())
                telemetry._sources["grad_norm"] = "deepspeed engine.get_global_grad_norm()"
                if telemetry._lr is None:
                    telemetry._lr = _engine_lr(engine)
                if telemetry._pipe_depth:
                    telemetry._step_due = True      # train_batch's loss is still to come
                else:
                    telemetry.end_step()

        def backward_(engine, loss, *args, **kwargs):
            if telemetry._pipe_depth == 0 and hasattr(loss, "detach"):
                value = loss.detach()
                if kwargs.get("scale_wrt_gas", True) is False:    # the HF Trainer: already / accumulation
                    value = value * engine.gradient_accumulation_steps()
                telemetry._losses.append(value)
                telemetry._sources["loss"] = "deepspeed engine.backward(loss), mean over micro-batches"
            return backward(engine, loss, *args, **kwargs)

        def load_checkpoint_(engine, *args, **kwargs):
            """The steps continue from the step the engine loaded (before the program's first step)."""
            result = load(engine, *args, **kwargs)
            loaded = getattr(engine, "global_steps", None)
            path = result[0] if isinstance(result, tuple) and result else None
            if path is not None and isinstance(loaded, int) and loaded != telemetry.step and \
                    telemetry.step == telemetry.start_step:
                if telemetry.rank == 0:
                    note(f"the program loaded the checkpoint of step {loaded} ({path}), not of step "
                         f"{telemetry.step}: its steps are numbered from {loaded + 1}")
                telemetry.step = telemetry.start_step = loaded
            return result

        load = engine_cls.load_checkpoint
        engine_cls._take_model_step = _take_model_step
        engine_cls.backward = backward_
        engine_cls.load_checkpoint = load_checkpoint_

    def _patch_pipe(self, module) -> None:
        from deepspeed.runtime.pipe import schedule  # noqa: PLC0415

        pipe_cls = module.PipelineEngine
        train_batch = pipe_cls.train_batch
        telemetry = self

        def train_batch_(engine, *args, **kwargs):
            """The optimizer step comes before train_batch's loss: the step ends when train_batch returns."""
            telemetry._pipe_depth += 1
            if telemetry._pipe_busy is not None:
                telemetry.busy_source = telemetry._pipe_busy    # this program runs the pipeline engine
            try:
                loss = train_batch(engine, *args, **kwargs)
            finally:
                telemetry._pipe_depth -= 1
            if hasattr(loss, "detach"):
                telemetry._losses.append(loss.detach())
                telemetry._sources["loss"] = "deepspeed PipelineEngine.train_batch() (its aggregate loss)"
            if telemetry._step_due:
                telemetry._step_due = False
                telemetry.end_step()
            return loss

        pipe_cls.train_batch = train_batch_
        if self._device is None:           # CPU: host time is device time, time the stage's compute
            table = pipe_cls._INSTRUCTION_MAP
            for instruction in (schedule.ForwardPass, schedule.BackwardPass, schedule.OptimizerStep):
                table[instruction] = self.busy.wrap(table[instruction])
            self._pipe_busy = ("deepspeed pipeline instructions (forward, backward, optimizer step) minus the "
                                "collectives inside them")

    # --- torch hooks -------------------------------------------------------------------------------
    def _first_forward(self, module, inputs):
        if self._t0 is None:
            self._begin()
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def _pre_step(self, optimizer, args, kwargs) -> None:
        if self._optimizer_id is None:
            self._optimizer_id = id(optimizer)
        if self._lr is None and getattr(optimizer, "param_groups", None):
            self._lr = _number(optimizer.param_groups[0].get("lr"))
            self._sources["lr"] = "the optimizer's first param group"

    def _post_step(self, optimizer, args, kwargs) -> None:
        if self._engine_depth == 0 and id(optimizer) == self._optimizer_id:
            self.end_step()

    # --- steps -------------------------------------------------------------------------------------
    def _begin(self) -> None:
        self.comm.take()
        self.busy.take()
        if self._device is not None:
            self._device.mark()
        self._t0 = time.perf_counter()

    def end_step(self) -> None:
        """The program's optimizer step is done. Its row goes into an asynchronous all_reduce on the side
        group, completed (and the record written) at the next step: no rank waits for the others here. On
        CUDA the row itself waits one step for its events."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self.step += 1
        wall = now - self._t0
        loss = self._take_loss()
        lr, grad_norm = self._lr, self._grad_norm
        self._lr = self._grad_norm = None
        if self._device is not None:                    # this step's events are read at the next step
            token = self._device.end_step()
            previous, self._pending = self._pending, (self.step, loss, lr, grad_norm, token, self.busy.take(),
                                                      self._own_last)
            if previous is not None:
                self._exchange(*previous)
        else:
            self._exchange(self.step, loss, lr, grad_norm, (wall, self.comm.take()), self.busy.take())
        # Steps are contiguous: the next one starts where this one ended, so the time spent here is in the
        # program's measured step time (it is the program's time) but not in its busy compute time.
        self._t0 = now
        self._own_last = time.perf_counter() - now
        self.own_s += self._own_last

    def _take_loss(self):
        values, self._losses = self._losses, []
        if not values:
            return None
        import torch  # noqa: PLC0415

        return torch.stack([v.float().mean() for v in values]).mean()

    def flush(self) -> None:
        """Publish every step still in flight (a collective on the side group: every rank calls it at the same
        point, the program's end or its destroy_process_group)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._exchange(*pending)
        self._complete()

    def _exchange(self, step, loss, lr, grad_norm, measured, busy_s, own_s=None) -> None:
        import torch  # noqa: PLC0415

        own_s = self._own_last if own_s is None else own_s     # the wrapper's time inside this step

        step_s, comm = self._device.resolve(measured) if self._device is not None else measured
        busy = busy_s if self.busy_source else max(0.0, step_s - comm.blocked_s - own_s)
        loss_value = float(loss) if loss is not None else math.nan
        row = {"step_time_s": step_s, "compute_time_s": busy, "allreduce_s": comm.allreduce_s,
               "allreduce_blocked_s": comm.allreduce_blocked_s, "allgather_s": comm.allgather_s,
               "other_s": comm.other_s, "allreduce_bytes": comm.allreduce_bytes,
               "allreduce_bus_bytes": comm.allreduce_bus_bytes, "mem_peak_bytes": peak_memory_bytes(),
               "loss": loss_value, "stop": 0.0, "alltoall_s": comm.alltoall_s}
        meta = (step, lr, grad_norm)
        if self._side is None:
            self._emit(meta, [row])
            return
        width = len(ROW)
        table = torch.zeros(self.world * (width + 1), dtype=torch.float64)
        mine = [0.0 if k == "loss" and not math.isfinite(loss_value) else float(row[k]) for k in ROW]
        table[self.rank * width:(self.rank + 1) * width] = torch.tensor(mine, dtype=torch.float64)
        table[self.world * width + self.rank] = 1.0 if math.isfinite(loss_value) else 0.0   # NaN would poison the sum
        with torch.profiler.record_function("orch-telemetry"):    # a profiler of the program can tell it apart
            work = self._raw["all_reduce"](table, group=self._side, async_op=True)
        self._complete()
        self._inflight = (work, table, meta)

    def _complete(self) -> None:
        """Wait for the step in flight (long done by now) and write its record."""
        if self._inflight is None:
            return
        (work, table, meta), self._inflight = self._inflight, None
        work.wait()
        width, values = len(ROW), table.tolist()
        rows = [dict(zip(ROW, values[r * width:(r + 1) * width])) for r in range(self.world)]
        for r, has_loss in enumerate(values[self.world * width:]):
            if not has_loss:
                rows[r]["loss"] = math.nan
        self._emit(meta, rows)

    def complete_if_done(self) -> None:
        """Write the step in flight if its reduce has completed (never waits: a signal handler calls it)."""
        if self._inflight is not None and self._inflight[0].is_completed():
            self._complete()

    def _emit(self, meta, rows) -> None:
        if self.rank != 0:
            return
        step, lr, grad_norm = meta
        record = build_record(self._constants, rows, step=step, time_unix=time.time(),
                              lr=lr, grad_norm=grad_norm, hosts=self.hosts)
        record = replace(record, telemetry_source=self.sources())
        self.last_record = record
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_records, name="orch-telemetry-sinks", daemon=True)
            self._writer.start()
        self._queue.put(record)

    def _write_records(self) -> None:
        """Rank 0's sink thread: metrics.jsonl, the progress line, W&B and the straggler watch, off the
        training thread (their I/O never delays a step)."""
        while True:
            record = self._queue.get()
            if record is None:
                return
            try:
                for sink in self.sinks:
                    sink.write(record)
                if self.stragglers is not None:
                    self.stragglers.observe(record, self.sinks)
            except Exception as e:  # noqa: BLE001  (telemetry must never stop the program)
                note(f"warning: writing the record of step {record.step} failed: {e}")

    def _gather_hosts(self) -> None:
        from ..node import host_name  # noqa: PLC0415

        hosts: list = [None] * self.world
        self._raw["all_gather_object"](hosts, host_name(), group=self._side)
        self.hosts = hosts

    def sources(self) -> dict[str, str]:
        device = self._device is not None
        clock = "CUDA events on the current stream at each optimizer step" if device else \
            "host wall clock between optimizer steps (CPU: host time is device time)"
        comm = ("CUDA events around each torch.distributed call on its stream; exposed = the time the compute "
                "stream waited on it" if device else "host wall clock inside each torch.distributed call "
                "(asynchronous ones: issue until wait() returns)")
        return {"step_time_s": clock, "tokens_per_s": "global_batch_size * seq_length (plan) / step_time_s",
                "tflops_per_gpu": "model FLOPs of the plan's model / step_time_s / world_size",
                "allreduce_time_s": comm, "comm_exposed_s": comm,
                "compute_time_s": self.busy_source or "step_time_s minus the time blocked in collectives",
                "bubble_fraction": ("1 - compute_time_s / step_time_s, the worst stage" if self.pp > 1 else
                                    "0: pp = 1"),
                "mem_peak_bytes": "torch.cuda.max_memory_allocated()" if device else "peak resident set size",
                "loss": self._sources.get("loss", "null: the program does not expose it"),
                "lr": self._sources.get("lr", "null: no torch optimizer step seen"),
                "grad_norm": self._sources.get("grad_norm", "null: the program does not expose it")}

    # --- sinks, signals, the end ----------------------------------------------------------------------
    def _open_sinks(self) -> None:
        from ..spec import spec_to_data  # noqa: PLC0415
        from .sinks import METRICS_FILE, ConsoleSink, JsonlSink, truncate_metrics  # noqa: PLC0415
        from .straggler import StragglerWatch  # noqa: PLC0415
        from .wandb_sink import open_wandb_sink  # noqa: PLC0415

        run = self.run_dir
        metrics = run.path / METRICS_FILE
        truncate_metrics(metrics, self.start_step)    # the records up to the checkpoint this start resumes from
        sink = open_wandb_sink(run_dir=run.path, spec=run.spec, spec_data=spec_to_data(run.spec),
                               chosen=run.plan.get("chosen") or {}, layout_tag=self.layout.tag(),
                               engine=f"program:{self.log_format or self.kind}")
        self.sinks = [JsonlSink(metrics), ConsoleSink(run.spec.training.train_iters)] + ([sink] if sink else [])
        self.stragglers = StragglerWatch(run.path)

    def _install_signals(self) -> None:
        """Record a stop signal, then let it do what it would have done: the program's own handler when it
        installs one (signal.signal is wrapped), else the default action (the process ends by the signal)."""
        original = signal.signal
        telemetry = self

        def on_signal(signum, frame, handler=None):
            telemetry.signal_name = signal.Signals(signum).name
            telemetry.complete_if_done()
            telemetry.write_status(128 + signum, state="preempted")
            if callable(handler):
                return handler(signum, frame)
            if handler == signal.SIG_IGN:
                return None
            telemetry.close_sinks(128 + signum)
            original(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return None

        def signal_(signum, handler):
            if signum in STOP_SIGNALS:
                previous = original(signum, lambda s, f: on_signal(s, f, handler))
                return getattr(previous, "_orch_user", previous)
            return original(signum, handler)

        signal_.__wrapped__ = original
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                original(sig, lambda s, f: on_signal(s, f))
        signal.signal = signal_

    def write_status(self, code: int, *, state: str | None = None) -> None:
        """train_status.json (rank 0): how this attempt of the program ended."""
        if self.rank != 0 or self._status is None:
            return
        state = state or ("finished" if code == 0 else "failed")
        self._status({
            "state": state, "step": self.step, "exit_code": code, "signal": self.signal_name,
            "program": self.kind, "attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1,
            "time_unix": time.time()})

    def close_sinks(self, code: int) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:           # every queued record is written first
            self._queue.put(None)
            self._writer.join(timeout=60)
        for sink in self.sinks:
            try:
                sink.close(exit_code=code)
            except Exception as e:  # noqa: BLE001  (telemetry must never change how the program ends)
                note(f"warning: closing {type(sink).__name__} failed: {e}")
        self.sinks = []

    def _close_process_groups(self) -> None:
        try:
            _leave_groups(self)
        except Exception as e:  # noqa: BLE001  (closing must never change how the program ends)
            note(f"warning: could not close the process groups the program left: {e}")

    def finish(self, code: int, *, clean: bool = True) -> None:
        """After the program: publish the last CUDA step (only when it ended cleanly: a peer that crashed
        would never join the collective), close the sinks, write train_status.json."""
        try:
            if clean:
                self.flush()
                self._close_process_groups()
        finally:
            self.write_status(code, state="preempted" if self.signal_name else None)
            self.close_sinks(code)
            if self.rank == 0:
                after = f" after step {self.start_step}" if self.start_step else ""
                note(f"{self.step - self.start_step} optimizer step(s) observed{after}; telemetry's own time "
                     f"{self.own_s:.4f} s; metrics: {self.run_dir_path / 'metrics.jsonl'}")


def _leave_groups(wrapper: "ProgramTelemetry") -> None:
    """After a clean end, close the process groups a program left up (the HF Trainer does): on gloo a process
    that exits with them alive may abort ("terminate called without an active exception", ENV-NOTES.md). The
    ranks meet first on the wrapper's own gloo group, with a deadline, so that one that is still working is
    not cut off and one that died cannot hang the others."""
    import datetime  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    if not (dist.is_available() and dist.is_initialized()):
        return
    side, wrapper._side = wrapper._side, None
    if side is not None:
        dist.monitored_barrier(group=side, timeout=datetime.timedelta(seconds=120))
    destroy = getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)
    destroy()


def _number(value) -> float | None:
    if value is None:
        return None
    try:
        value = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _engine_lr(engine) -> float | None:
    try:
        lrs = engine.get_lr()
    except Exception:  # noqa: BLE001
        return None
    return _number(lrs[0]) if lrs else None
