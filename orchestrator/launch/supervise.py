"""The pdsh job's local supervisor: ``python -m orchestrator.launch.supervise [options] -- COMMAND...``.

Runs COMMAND (``bash launch_pdsh.sh``) and copies its output to stdout (``logs/launch.log``). pdsh alone
waits for every host even after one failed, and a node left waiting for a dead peer's rendezvous never
ends, so the supervisor watches pdsh's "HOST: ssh exited with exit code N" lines: at the first one it
stops the job on every host. SIGTERM/SIGINT (``orch cancel``) stop it the same way. At the end it writes
the result file: state, exit code (the first failing host's own code), that host, every host's code.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .base import CommandRunner, JobState
from .pdsh import PDSH_EXIT, PdshTarget, stop_remote, write_result

CANCELLED_EXIT = 143
STOP_GRACE_S = 20     # after stopping the hosts, how long pdsh may take to notice before it is terminated


class Supervisor:
    """One supervised pdsh run: which hosts failed, whether it was cancelled, the stopping of the job."""

    def __init__(self, target: PdshTarget, run_id: str, runner: CommandRunner, say=print):
        self.target, self.run_id, self.runner, self.say = target, run_id, runner, say
        self.host_codes: dict[str, int] = {}
        self.first_failure: tuple[str, int] | None = None
        self.cancelled = False
        self.proc: subprocess.Popen | None = None
        self._stopper: threading.Thread | None = None
        self._lock = threading.Lock()

    def on_line(self, line: str) -> None:
        match = PDSH_EXIT.match(line)
        if not match:
            return
        host, code = match.group(1), int(match.group(2))
        self.host_codes.setdefault(host, code)
        if self.first_failure is None and not self.cancelled:
            self.first_failure = (host, code)
            self.say(f"orch: {host} failed with exit code {code}: stopping the job on every host")
            self.stop()

    def cancel(self) -> None:
        if not self.cancelled and self.first_failure is None:
            self.cancelled = True
            self.say("orch: cancelled: stopping the job on every host")
        self.stop()

    def stop(self) -> None:
        """Once: end the run's processes on every host, then give pdsh a while to notice, then end pdsh."""
        with self._lock:
            if self._stopper is None:
                self._stopper = threading.Thread(target=self._stop, daemon=True)
                self._stopper.start()

    def _stop(self) -> None:
        stop_remote(self.target, self.run_id, self.runner)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.terminate()

    def join(self) -> None:
        if self._stopper is not None:
            self._stopper.join()

    def result(self, returncode: int) -> dict:
        if self.cancelled:
            state, code, host = JobState.CANCELLED, CANCELLED_EXIT, None
        elif self.first_failure:
            state, (host, code) = JobState.FAILED, self.first_failure
        else:
            state, code, host = (JobState.COMPLETED if returncode == 0 else JobState.FAILED), returncode, None
        return {"state": state.value, "exit_code": code, "failed_host": host, "host_exit_codes": self.host_codes,
                "run_id": self.run_id}


def supervise(command: list[str], sup: Supervisor, result_path: Path) -> int:
    """Run the command to its end (copying its output), stopping every host on failure or cancel."""
    sup.proc = sup.runner.start_piped(command)
    for line in sup.proc.stdout:   # until pdsh and every ssh it started have closed the pipe
        sys.stdout.write(line)
        sys.stdout.flush()
        sup.on_line(line)
    code = sup.proc.wait()
    sup.join()
    result = sup.result(code)
    write_result(result_path, result)
    sup.say(f"orch: pdsh job {result['state']}, exit code {result['exit_code']}"
            + (f" (first failing host: {result['failed_host']})" if result["failed_host"] else ""))
    return int(result["exit_code"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.launch.supervise")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--hosts", required=True, help="comma-separated, in node-rank order")
    parser.add_argument("--ssh-port", type=int, required=True)
    parser.add_argument("--fanout", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True, help="where to write the result JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    target = PdshTarget(hosts=tuple(args.hosts.split(",")), ssh_port=args.ssh_port, fanout=args.fanout)
    sup = Supervisor(target, args.run_id, CommandRunner(), say=lambda m: print(m, flush=True))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sup.cancel())
    return supervise(command, sup, args.result)


if __name__ == "__main__":
    sys.exit(main())
