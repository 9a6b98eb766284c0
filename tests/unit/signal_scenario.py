"""Forged job.json and lock files against `orch cancel` / `orch status`; run only inside a private PID
namespace (tests/pidns.py), so whatever a regression signals stays inside it. Usage: signal_scenario.py DIR.
Prints one JSON object: case name -> what orch answered and which bystander processes survived."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from orchestrator.launch import local

ORCH = str(Path(sys.executable).parent / "orch")
ROOT = Path(sys.argv[1])
HOLD_FLOCK = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n" \
             "fcntl.flock(fd, fcntl.LOCK_SH)\ntime.sleep(300)\n"
# Starts a job the way `orch launch` does (under the lock, which the job inherits) and exits, so the job's
# processes are orphans of the namespace's init, as after a real `orch launch`.
LAUNCH = """
import sys
from pathlib import Path
from orchestrator.launch import local
from orchestrator.launch.base import CommandRunner, LaunchPlan
from orchestrator.launch.run import submit_exclusive
wrap = '; code=$?; echo "$code" > logs/exitcode; exit "$code"'
plan = LaunchPlan(backend="local", argv=["bash", "-c", sys.argv[2] + wrap], cwd=Path(sys.argv[1]))
print(submit_exclusive(Path(sys.argv[1]), local, plan, CommandRunner()).job_id)
"""
results: dict[str, dict] = {}


def identity(pid: int) -> dict:
    """What job.json records of the process orch started: its start time (/proc/PID/stat field 22), the boot."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return {"start_ticks": ticks, "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip()}


def report() -> None:
    """What was seen so far (the test reads the last line: a case that killed the scenario leaves the rest)."""
    print(json.dumps(results), flush=True)


def orch(*argv, cwd: Path | None = None) -> dict:
    proc = subprocess.run([ORCH, *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=cwd,
                          start_new_session=True)
    return {"rc": proc.returncode, "out": proc.stdout.strip(), "err": proc.stderr.strip()}


def bystander(argv=("sleep", "300"), *, session: bool = True, **kw) -> subprocess.Popen:
    """A process orch did not start (``setsid sleep`` by default)."""
    return subprocess.Popen(list(argv), start_new_session=session, **kw)


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def wait_until(test, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_dir(name: str, job_id, *, extra: dict | None = None, exitcode: str | None = None) -> Path:
    path = ROOT / name
    (path / "logs").mkdir(parents=True)
    (path / "job.json").write_text(json.dumps({"backend": "local", "job_id": str(job_id), "run_dir": str(path),
                                               "submitted_unix": time.time() - 60, "log_path": "",
                                               "extra": extra or {}}))
    if exitcode is not None:
        (path / "logs" / "exitcode").write_text(exitcode + "\n")
    return path


def holds_flock(path: Path) -> subprocess.Popen:
    path.touch()
    proc = bystander([sys.executable, "-c", HOLD_FLOCK, str(path)])
    assert wait_until(lambda: str(path.stat().st_ino) in Path("/proc/locks").read_text())
    return proc


def job(cwd: Path, script: str) -> int:
    """Start a local job in ``cwd`` (relative to this process's cwd, as given); its leader's pid."""
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(cwd), script], capture_output=True, text=True,
                          timeout=120, check=True)
    return int(proc.stdout.strip())


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def finished() -> dict:
    """A finished run whose job.json names an unrelated `setsid sleep` (even with its true start time)."""
    victim = bystander()
    path = run_dir("finished", victim.pid, extra=identity(victim.pid), exitcode="0")
    return {**orch("cancel", path), "alive": alive(victim)}


def not_started_by_orch(name: str) -> dict:
    """A run that looks live, but job.json's pid is not the process orch started."""
    victim = bystander()
    extra = {"no_start_time": {}, "other_start_time": {**identity(victim.pid), "start_ticks": 1},
             "other_boot": {**identity(victim.pid), "boot_id": "another-boot"}}[name]
    path = run_dir(name, victim.pid, extra=extra)
    return {"status": orch("status", path, "--json"), **orch("cancel", path), "alive": alive(victim)}


def opened_lock() -> dict:
    """A process that only opened the lock file is no holder: not RUNNING, not signalled."""
    path = run_dir("opened_lock", 4194999)
    (path / ".orch.lock").write_text("")
    with open(path / ".orch.lock") as f:
        reader = bystander(["sleep", "300"], stdin=f)
    return {"status": orch("status", path, "--json"), **orch("cancel", path), "alive": alive(reader)}


def symlink_lock() -> dict:
    """.orch.lock a symlink to a file a bystander has open: refused, nothing signalled."""
    other = ROOT / "elsewhere.txt"
    other.write_text("")
    with open(other) as f:
        reader = bystander(["sleep", "300"], stdin=f)
    path = run_dir("symlink_lock", 4194999)
    (path / ".orch.lock").symlink_to(other)
    return {"status": orch("status", path), **orch("cancel", path), "alive": alive(reader)}


def real_holder() -> dict:
    """A real flock holder of a live-looking run is stopped (the job's ranks are found by the lock)."""
    path = run_dir("real_holder", 4194999)
    holder = holds_flock(path / ".orch.lock")
    running = orch("status", path, "--json")
    return {"status": running, **orch("cancel", path), "stopped": wait_until(lambda: not alive(holder)),
            "after": orch("status", path, "--json")}


def other_cwd() -> dict:
    """A job launched from one cwd, cancelled from another by absolute path; the other cwd has a run dir of
    the same name with a job of its own (a flock holder) that must not be touched; a copy of the job's
    job.json in a third dir is refused."""
    for name in "abc":
        (ROOT / name / "runA").mkdir(parents=True)
    os.chdir(ROOT / "a")
    leader = job(Path("runA"), "sleep 300")
    os.chdir(ROOT / "b")
    neighbour = holds_flock(ROOT / "b" / "runA" / ".orch.lock")
    shutil.copy(ROOT / "a" / "runA" / "job.json", ROOT / "c" / "runA" / "job.json")
    answer = {"recorded_run_dir": json.loads((ROOT / "a" / "runA" / "job.json").read_text())["run_dir"],
              "copied": orch("cancel", ROOT / "c" / "runA")}
    answer.update(leader_alive_after_copied_cancel=group_alive(leader),
                  status=orch("status", ROOT / "a" / "runA", "--json"), cancel=orch("cancel", ROOT / "a" / "runA"))
    answer.update(job_gone=wait_until(lambda: not group_alive(leader)),
                  after=orch("status", ROOT / "a" / "runA", "--json"), neighbour_alive=alive(neighbour),
                  neighbour_job_json=(ROOT / "b" / "runA" / "job.json").exists())
    return answer


def completed_elsewhere() -> dict:
    """A completed run is COMPLETED whatever the cwd of `orch status`."""
    (ROOT / "a" / "runB").mkdir(parents=True)
    os.chdir(ROOT / "a")
    job(Path("runB"), "true")
    wait_until(lambda: (ROOT / "a" / "runB" / "logs" / "exitcode").exists() and not local.holders(ROOT / "a" / "runB"))
    os.chdir(ROOT)
    return orch("status", ROOT / "a" / "runB", "--json")


def killed_outside() -> dict:
    """Killed from outside orch: FAILED, not CANCELLED; cancel afterwards signals nothing."""
    (ROOT / "killed").mkdir()
    leader = job(ROOT / "killed", "sleep 300")
    os.killpg(leader, signal.SIGKILL)
    wait_until(lambda: not group_alive(leader))
    return {"status": orch("status", ROOT / "killed", "--json"), "cancel": orch("cancel", ROOT / "killed")}


def forged_id(job_id: str) -> dict:
    """A forged job id: kill(-1), orch's own group, a negative pid, not an integer."""
    victim, plain = bystander(), bystander(session=False)      # plain: in this scenario's own process group
    path = run_dir(f"id_{len(results)}", job_id)
    return {**orch("cancel", path), "alive": alive(victim) and alive(plain)}


def main() -> None:
    assert os.environ.get("ORCH_TEST_PIDNS") == "1" and os.getppid() == 1, "run me through tests/pidns.py"
    cases = [("finished", finished), *((name, lambda n=name: not_started_by_orch(n))
                                        for name in ("no_start_time", "other_start_time", "other_boot")),
             ("opened_lock", opened_lock), ("symlink_lock", symlink_lock), ("real_holder", real_holder),
             ("cwd", other_cwd), ("completed_elsewhere", completed_elsewhere), ("killed_outside", killed_outside),
             # last: before the fix, "1" was kill(-1), which ended the scenario too
             *((f"id {job_id!r}", lambda j=job_id: forged_id(j)) for job_id in ("abc", "2.5", "", " 7", "-1", "0", "1"))]
    for name, run in cases:
        try:
            results[name] = run()
        except Exception:  # noqa: BLE001  (recorded for the test to show)
            results[name] = {"error": traceback.format_exc()[-1500:]}
        report()


if __name__ == "__main__":
    main()
