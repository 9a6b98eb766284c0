"""The pdsh backend: one torchrun per host over ssh, DeepSpeed-style, with a local supervisor.

``orch launch --backend pdsh`` checks every host first (reachable over ssh, the run dir and the Python
interpreter present, a free rendezvous port on the first host), then starts
``python -m orchestrator.launch.supervise ... -- bash launch_pdsh.sh`` in the background. The supervisor
tees pdsh's output to ``logs/launch.log``, and when a host's command fails it stops the job on every host
and records that host and its exit code in ``logs/pdsh_result.json``. Each rank carries
``ORCH_RUN_ID=<id>`` in its environment; stopping a job ends exactly those processes on every host.

``orch status`` / ``orch cancel`` use the supervisor's pid, so they work from the host that launched.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import OrchError, SpecError
from ..layout import pdsh_host_count_problem
from ..render.scripts import pdsh_hosts, pdsh_ssh_options
from ..rundir import RunDir, read_run_dir
from .base import (LOG_DIR, CommandRunner, JobRecord, JobState, LaunchPlan, identity,  # noqa: F401
                   is_started_process, process_stat, rank_exit_code, tail_lines, torchrun_failure)

SCRIPT = "launch_pdsh.sh"
RESULT_FILE = "pdsh_result.json"
LAUNCH_LOG = "launch.log"
PREFLIGHT_TIMEOUT_S = 60
CANCEL_WAIT_S = 30
INSTALL = {
    "pdsh": "install pdsh (Debian/Ubuntu: apt-get install pdsh; RHEL/Fedora: dnf install pdsh pdsh-rcmd-ssh)",
    "ssh": "install an ssh client (Debian/Ubuntu: apt-get install openssh-client; RHEL/Fedora: dnf install "
           "openssh-clients)",
}
# pdsh -S reports each failing host on stderr as "pdsh@LOCAL: HOST: ssh exited with exit code N".
PDSH_EXIT = re.compile(r"^pdsh@[^:]*: (\S+): ssh exited with exit code (\d+)\s*$")
_HOST_LINE = re.compile(r"^(\S+): (.*)$")
_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print('orch-free-port', s.getsockname()[1])"
_PREFLIGHT_EXIT = {3: "the run dir {run_dir} is not there (every host must see it at the same path: a shared "
                      "file system)",
                   4: "{python} is missing or not executable (install orch at the same path on every host, or "
                      "set ORCH_PYTHON)"}
# Runs on each host: TERM every process whose environment holds ORCH_RUN_ID=$1, KILL what is left after
# ${2:-50} ticks of 0.2 s (10 s: time for the ranks to checkpoint).
STOP_SCRIPT = """
pids() { grep -lzxF "ORCH_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null | sed -e 's|^/proc/||' -e 's|/environ$||'; }
left=$(pids "$1"); [ -n "$left" ] || exit 0
kill -TERM $left 2>/dev/null
n=0
while [ $n -lt "${2:-50}" ]; do
  sleep 0.2; left=$(pids "$1"); [ -n "$left" ] || exit 0; n=$((n + 1))
done
kill -KILL $left 2>/dev/null; exit 0
"""


@dataclass(frozen=True)
class PdshTarget:
    """Where a pdsh job runs: the hosts (node rank = position), the ssh port, pdsh's fanout."""

    hosts: tuple[str, ...]
    ssh_port: int
    fanout: int

    def pdsh_argv(self, remote_command: str, *, connect_timeout_s: int = 10) -> list[str]:
        return ["pdsh", "-S", "-R", "ssh", "-f", str(self.fanout), "-t", str(connect_timeout_s),
                "-w", ",".join(self.hosts), remote_command]

    def pdsh_env(self) -> dict[str, str]:
        """What pdsh needs in its environment: the ssh rcmd and our ssh options after the caller's own."""
        extra = pdsh_ssh_options(self.ssh_port)
        return {"PDSH_RCMD_TYPE": "ssh",
                "PDSH_SSH_ARGS_APPEND": f"{os.environ.get('PDSH_SSH_ARGS_APPEND', '')} {extra}".strip()}


def target_of(run: RunDir) -> PdshTarget:
    """The run dir's hosts, checked: one distinct host per node."""
    spec = run.spec
    hosts = tuple(pdsh_hosts(spec))
    if len(hosts) != spec.cluster.num_nodes:
        raise SpecError(pdsh_host_count_problem(spec))
    dupes = sorted({h for h in hosts if hosts.count(h) > 1})
    if dupes:
        raise SpecError(f"{', '.join(dupes)} listed more than once (pdsh runs one command per host name)",
                        path="launch.pdsh.hosts")
    return PdshTarget(hosts=hosts, ssh_port=spec.launch.pdsh.ssh_port, fanout=spec.launch.pdsh.fanout)


def remote_quote(value: str) -> str:
    """A constant for the remote shell through pdsh: POSIX single quotes, % doubled (pdsh expands %h, %n)."""
    return shlex.quote(value).replace("%", "%%")


# --- pure parts: pdsh output ------------------------------------------------------------------------------

def parse_exits(text: str) -> dict[str, int]:
    """HOST -> exit code for every "pdsh@...: HOST: ssh exited with exit code N" line, in order."""
    codes: dict[str, int] = {}
    for line in text.splitlines():
        match = PDSH_EXIT.match(line)
        if match:
            codes.setdefault(match.group(1), int(match.group(2)))
    return codes


def host_lines(text: str, host: str) -> list[str]:
    """The output lines pdsh prefixed with ``host: `` (prefix removed)."""
    lines = []
    for line in text.splitlines():
        match = _HOST_LINE.match(line)
        if match and match.group(1) == host:
            lines.append(match.group(2))
    return lines


def parse_preflight(target: PdshTarget, stdout: str, stderr: str, *, run_dir: Path, python: str) -> int:
    """The free port on the first host, or an OrchError listing every host that failed its check."""
    codes = parse_exits(stderr)
    problems = []
    for host in target.hosts:
        code = codes.get(host, 0)
        said = " ".join(host_lines(stderr, host))[-300:]
        if code == 255:
            problems.append(f"{host}: not reachable over ssh on port {target.ssh_port} ({said or 'ssh exit 255'})")
        elif code in _PREFLIGHT_EXIT:
            problems.append(f"{host}: " + _PREFLIGHT_EXIT[code].format(run_dir=run_dir, python=python))
        elif code:
            problems.append(f"{host}: the check exited {code}" + (f" ({said})" if said else ""))
    if problems:
        raise OrchError("pdsh preflight failed, nothing was started:\n  " + "\n  ".join(problems))
    ports = [line.split()[1] for line in host_lines(stdout, target.hosts[0]) if line.startswith("orch-free-port ")]
    if len(ports) != 1 or not ports[0].isdigit():
        raise OrchError(f"pdsh preflight: {target.hosts[0]} printed {stdout.strip()[-300:]!r}, expected "
                        "'orch-free-port N'")
    return int(ports[0])


# --- the backend -------------------------------------------------------------------------------------------

def build(run: RunDir, *, run_id: str | None = None) -> LaunchPlan:
    """The supervisor command that runs ``bash launch_pdsh.sh`` (pure apart from a fresh run id)."""
    target = target_of(run)
    run_id = run_id or uuid.uuid4().hex[:16]
    argv = [sys.executable, "-m", "orchestrator.launch.supervise", "--run-id", run_id,
            "--hosts", ",".join(target.hosts), "--ssh-port", str(target.ssh_port), "--fanout", str(target.fanout),
            "--result", f"{LOG_DIR}/{RESULT_FILE}", "--", "bash", SCRIPT]
    env = {"ORCH_PYTHON": sys.executable, "ORCH_PDSH_RUN_ID": run_id, "PYTHONSAFEPATH": "1"}   # cwd: the run dir
    script = (run.path / SCRIPT).read_text()
    preview = (f"# first: ssh to {', '.join(target.hosts)} (port {target.ssh_port}) checks every host and picks "
               f"MASTER_PORT free on {target.hosts[0]}\n# {SCRIPT}, which the supervisor runs:\n{script}")
    return LaunchPlan(backend="pdsh", argv=argv, cwd=run.path, env=env, preview=preview)


def require_tools() -> None:
    missing = [tool for tool in ("pdsh", "ssh") if shutil.which(tool) is None]
    if missing:
        raise OrchError("the pdsh backend needs " + " and ".join(missing) + " on PATH: " +
                        "; ".join(INSTALL[tool] for tool in missing))


def preflight(target: PdshTarget, run_dir: Path, python: str, runner: CommandRunner) -> int:
    """Every host: reachable over ssh, sees the run dir, has the interpreter. Returns a free port on host 0."""
    require_tools()
    remote = (f"cd {remote_quote(str(run_dir))} || exit 3; test -x {remote_quote(python)} || exit 4; "
              f"if [ %n = 0 ]; then exec {remote_quote(python)} -c {remote_quote(_FREE_PORT)}; fi")
    result = runner.run(target.pdsh_argv(remote, connect_timeout_s=5), env=target.pdsh_env(),
                        timeout_s=PREFLIGHT_TIMEOUT_S, check=False)
    return parse_preflight(target, result.stdout, result.stderr, run_dir=run_dir, python=python)


def submit(plan: LaunchPlan, runner: CommandRunner):
    """Preflight, then start the supervisor in the background; returns (JobRecord, Popen)."""
    run = read_run_dir(plan.cwd)
    target = target_of(run)
    port = preflight(target, plan.cwd.resolve(), plan.env.get("ORCH_PYTHON", sys.executable), runner)
    env = {**plan.env, "MASTER_PORT": os.environ.get("MASTER_PORT") or str(port)}   # the caller's port wins
    logs = plan.cwd / LOG_DIR
    logs.mkdir(exist_ok=True)
    (logs / RESULT_FILE).unlink(missing_ok=True)
    log_path = logs / LAUNCH_LOG
    proc = runner.start(replace(plan, env=env), log_path=log_path)
    record = JobRecord(backend="pdsh", job_id=str(proc.pid), run_dir=str(plan.cwd.resolve()),
                       submitted_unix=time.time(), log_path=str(log_path.resolve()),
                       extra={"run_id": env["ORCH_PDSH_RUN_ID"], "hosts": list(target.hosts), **identity(proc.pid),
                              "ssh_port": target.ssh_port, "fanout": target.fanout,
                              "master_port": int(env["MASTER_PORT"])})
    record.save()
    return record, proc


def read_result(record: JobRecord) -> dict | None:
    """logs/pdsh_result.json when it is what the supervisor writes (a state and an exit code), else None."""
    path = Path(record.run_dir) / LOG_DIR / RESULT_FILE
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(result, dict) or result.get("state") not in JobState.__members__ or \
            isinstance(result.get("exit_code"), bool) or not isinstance(result.get("exit_code"), int):
        return None
    return result


def status(record: JobRecord, runner: CommandRunner | None = None) -> JobState:
    """The supervisor's result; RUNNING while it lives; FAILED when it is gone without one. A result of
    CANCELLED that `orch cancel` did not ask for (the supervisor was signalled from outside) is FAILED."""
    result = read_result(record)
    if not result and supervisor_alive(record):
        return JobState.RUNNING
    result = result or read_result(record)   # it may have ended between the two looks
    if not result:
        return JobState.FAILED
    state = JobState(result["state"])
    if state is JobState.CANCELLED and not isinstance(record.extra.get("cancelled_unix"), (int, float)):
        return JobState.FAILED
    return state


def exit_code(record: JobRecord, runner: CommandRunner | None = None) -> int:
    result = read_result(record)
    return rank_exit_code(int(result["exit_code"]), Path(record.log_path)) if result else 1


def cancel(record: JobRecord, runner: CommandRunner | None = None, *, wait_s: float = CANCEL_WAIT_S) -> bool:
    """SIGTERM the supervisor (it stops every host and records CANCELLED); stop the hosts ourselves if it
    is gone. Nothing is signalled once the supervisor recorded a result; the supervisor only when it is the
    process orch started (same start time and boot). Returns whether anything was asked to stop."""
    if read_result(record):
        return False
    record.extra["cancelled_unix"] = time.time()
    record.save()
    if supervisor_alive(record):
        os.kill(int(record.job_id), signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and read_result(record) is None:
            time.sleep(0.1)
    if read_result(record) is None:
        target = PdshTarget(hosts=tuple(record.extra["hosts"]), ssh_port=record.extra["ssh_port"],
                            fanout=record.extra["fanout"])
        stop_remote(target, record.extra["run_id"], runner or CommandRunner())
        write_result(Path(record.run_dir) / LOG_DIR / RESULT_FILE,
                     {"state": JobState.CANCELLED.value, "exit_code": 143, "failed_host": None,
                      "host_exit_codes": {}, "run_id": record.extra["run_id"]})
    return True


def stop_remote(target: PdshTarget, run_id: str, runner: CommandRunner) -> None:
    """End every process of run ``run_id`` on every host (TERM: the ranks checkpoint; KILL after 10 s)."""
    remote = remote_quote("sh") + " -c " + remote_quote(STOP_SCRIPT) + " orch-stop " + remote_quote(run_id)
    runner.run(target.pdsh_argv(remote, connect_timeout_s=5), env=target.pdsh_env(), timeout_s=60, check=False)


def write_result(path: Path, result: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, sort_keys=True, indent=2) + "\n")
    os.replace(tmp, path)


def supervisor_alive(record: JobRecord) -> bool:
    """The supervisor of this record is running: its pid is alive, not a zombie, and started when it did
    (same start time, same boot)."""
    return is_started_process(record)


def failure_report(record: JobRecord, runner: CommandRunner | None, code: int) -> str:
    """Which host failed first, with its exit code, and its (or its failing rank's) last lines."""
    result = read_result(record) or {}
    host = result.get("failed_host")
    log = Path(record.log_path)
    text = "\n".join(tail_lines(log, 4000))
    if not host:
        return f"exit code {code}; last lines of {log}:\n" + "\n".join("  " + l for l in tail_lines(log, 20))
    lines = host_lines(text, host)
    found = torchrun_failure("\n".join(lines))
    head = f"host {host} failed with exit code {result.get('exit_code', code)}"
    if found:
        rank_lines = [line for line in lines if line.startswith(f"[rank{found[0]}]:")]
        if rank_lines:
            return (f"{head}; rank {found[0]} failed with exit code {found[1]}; its last lines:\n" +
                    "\n".join(f"  {host}: {line}" for line in rank_lines[-20:]))
    if not lines:
        return f"{head}; it printed nothing (see {log})"
    return f"{head}; its last lines ({log}):\n" + "\n".join(f"  {host}: {line}" for line in lines[-20:])
