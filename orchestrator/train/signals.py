"""Stop on request: SIGTERM, SIGUSR1 or SIGINT -> finish the current step, checkpoint, exit EXIT_PREEMPTED.

SLURM sends SIGUSR1 ahead of the time limit (``#SBATCH --signal=B:USR1@120``) or SIGTERM on
preemption; Ctrl-C is SIGINT. torchrun forwards the signal it gets to every rank for the signals of its
``--signals-to-handle`` option (default SIGTERM,SIGINT,SIGHUP,SIGQUIT: pass
``--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``, or send SIGTERM; a SIGUSR1 torchrun does
not handle kills torchrun and orphans the ranks), then waits 30 s before SIGKILL. The handler only sets
a flag; the ranks agree on it in the per-step all_reduce (so a signal reaching one rank stops all of them
after the same step), save a checkpoint and exit with EXIT_PREEMPTED, which tells a requeueing script
"resume me". torchrun itself then exits 1 (it re-raises the signal as an exception); the trainer's
``train_status.json`` in the run dir records ``"state": "preempted", "exit_code": 75``.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75    # EX_TEMPFAIL (sysexits.h): checkpoint saved, run again to resume
EXIT_INJECTED_FAULT = 3  # ORCH_FAULT_AT_STEP: a deliberate failure, for testing launchers

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopRequest:
    """Remembers the first stop signal received; ``requested`` is its name or None."""

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name

    def install(self, signals=STOP_SIGNALS) -> "StopRequest":
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def exit_with_parent(*, poll_s: float = 0.5, grace_s: float = 30.0) -> None:
    """Under torchrun: when torchrun dies (``kill -9`` of the job's process group does not reach ranks,
    which torchrun starts in sessions of their own), stop like on SIGTERM — checkpoint after the current
    step and exit — and SIGKILL this rank if it has not exited ``grace_s`` later (a peer may be gone)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        print(f"[orch-train] rank {os.environ.get('RANK', '?')}: torchrun (pid {parent}) is gone: stopping",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="orch-exit-with-parent", daemon=True).start()
