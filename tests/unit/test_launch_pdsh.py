"""The pdsh backend's pure parts: launch_pdsh.sh and its quoting (run for real with a stand-in pdsh that
expands %n/%h/%% as pdsh does, and the remote command run by sh), parsing of pdsh's output, preflight
errors, the supervisor's fail-fast logic, and the remote stop script against real local processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import OrchError, SpecError
from orchestrator.launch import pdsh, supervise
from orchestrator.launch.base import JobRecord, JobState
from orchestrator.rundir import read_run_dir, write_run_dir
from tests.conftest import fixed_plan, spec_data
from tests.deadlines import scaled_s

HOSTS = {"cluster.num_nodes": 2, "cluster.gpus_per_node": 1, "launch.pdsh.hosts": ["orch-n1", "orch-n2"],
         "launch.pdsh.ssh_port": 2222}
HOSTILE_DIR = "run dir $(touch PWNED); x'y %h `touch PWNED2` \"q\""


def make_run(parent: Path, name: str = "run", **overrides) -> Path:
    return write_run_dir(fixed_plan(spec_data(**{**HOSTS, **overrides})), parent / name)


# --- launch_pdsh.sh, run with stand-ins ----------------------------------------------------------------

FAKE_PDSH = r"""#!/usr/bin/env python3
# Stand-in for pdsh -R ssh: records its argv and environment, then runs the command for each host through
# `sh -c` the way sshd would, after expanding %n, %h and %% as pdsh does.
import json, os, re, subprocess, sys
argv = sys.argv[1:]
hosts = argv[argv.index("-w") + 1].split(",")
command = argv[-1]
json.dump({"argv": argv, "ssh_args": os.environ.get("PDSH_SSH_ARGS_APPEND", "")},
          open(os.environ["FAKE_PDSH_LOG"], "w"))
codes = []
for rank, host in enumerate(hosts):
    expanded = re.sub(r"%(.)", lambda m: {"n": str(rank), "h": host, "%": "%"}[m.group(1)], command)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    codes.append(subprocess.run(["sh", "-c", expanded], env=env).returncode)
sys.exit(max(codes))
"""
FAKE_PYTHON = r"""#!/usr/bin/env python3
# Stand-in for the ranks' python: records how it was called (the conversion step exits TORCH_FAKE_CONVERT_EXIT).
import json, os, sys
with open(os.environ.get("FAKE_OUT", "/dev/null"), "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}) + "\n")
if "orchestrator.train.convert" in sys.argv:
    sys.exit(int(os.environ.get("TORCH_FAKE_CONVERT_EXIT", "0")))
"""


def run_script(tmp_path: Path, run: Path, **env_extra) -> tuple[dict, list[dict]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("pdsh", FAKE_PDSH), ("fake-python", FAKE_PYTHON)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "python-calls.jsonl"
    log = tmp_path / "pdsh.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ORCH_PYTHON": str(bin_dir / "fake-python"),
           "FAKE_PDSH_LOG": str(log), "ORCH_PDSH_RUN_ID": "abc123", "MASTER_PORT": "4242",
           "TORCH_EXTENSIONS_DIR": f"/x/{HOSTILE_DIR}", "WANDB_API_KEY": "s3cret", "NOT_FORWARDED": "1",
           "HF_TOKEN": "s3cret", "TORCH_SECRET_THING": "s3cret", "ORCH_FAULT_AT_STEP": "3",
           **env_extra}
    # FAKE_OUT reaches the fake python only if the script forwards it: it does not, so pass it via a
    # forwarded name's prefix.
    env["TORCH_FAKE_OUT"] = str(out)
    (bin_dir / "fake-python").write_text(FAKE_PYTHON.replace('os.environ.get("FAKE_OUT", "/dev/null")',
                                                             'os.environ["TORCH_FAKE_OUT"]'))
    subprocess.run(["bash", str(run / "launch_pdsh.sh")], env=env, cwd=tmp_path, check=True, timeout=scaled_s(30))
    calls = [json.loads(line) for line in out.read_text().splitlines()]
    return json.loads(log.read_text()), calls


def test_hostile_run_dir_reaches_every_rank_quoted(tmp_path):
    parent = tmp_path / HOSTILE_DIR
    parent.mkdir()
    run = make_run(parent, "the run")
    pdsh_call, calls = run_script(tmp_path, run)
    assert not list(tmp_path.rglob("PWNED*")), "a value was executed by a shell"
    assert [c["cwd"] for c in calls] == [str(run)] * 2
    for rank, call in enumerate(calls):
        argv = call["argv"]
        assert argv[:2] == ["-m", "torch.distributed.run"]
        assert argv[-3:] == ["-m", "orchestrator.train", str(run)]
        assert f"--node_rank={rank}" in argv and "--nnodes=2" in argv and "--nproc_per_node=1" in argv
        assert "--master_addr=orch-n1" in argv and "--master_port=4242" in argv
        assert f"--log-dir={run}/logs/torchrun/orch-n{rank + 1}" in argv
        env = call["env"]
        assert env["ORCH_RUN_ID"] == "abc123" and env["DS_ACCELERATOR"] == "cpu"
        assert env["ORCH_FAULT_AT_STEP"] == "3"      # the trainer's fault injection works over pdsh too
        assert env["TORCH_EXTENSIONS_DIR"] == f"/x/{HOSTILE_DIR}"
        assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
        assert not {"WANDB_API_KEY", "HF_TOKEN", "TORCH_SECRET_THING", "NOT_FORWARDED"} & set(env)
    argv = pdsh_call["argv"]
    assert argv[:7] == ["-S", "-R", "ssh", "-f", "1024", "-w", "orch-n1,orch-n2"]
    assert "s3cret" not in json.dumps(pdsh_call)
    assert "-p 2222" in pdsh_call["ssh_args"] and "SendEnv=WANDB_API_KEY" in pdsh_call["ssh_args"]


def test_a_resized_run_converts_once_on_the_first_host_before_the_ranks(tmp_path):
    parent = tmp_path / HOSTILE_DIR
    parent.mkdir()
    run = make_run(parent, "the run")
    (run / "resume.json").write_text("{}")
    _, calls = run_script(tmp_path, run)
    assert not list(tmp_path.rglob("PWNED*")), "a value was executed by a shell"
    convert, *ranks = calls
    assert convert["argv"] == ["-m", "orchestrator.train.convert", str(run)] and convert["cwd"] == str(run)
    assert convert["env"]["ORCH_RUN_ID"] == "abc123" and convert["env"]["ORCH_HOST"] == "orch-n1"
    assert convert["env"]["DS_ACCELERATOR"] == "cpu" and "WANDB_API_KEY" not in convert["env"]
    assert [c["argv"][:2] for c in ranks] == [["-m", "torch.distributed.run"]] * 2


def test_a_failed_conversion_ends_the_script_with_its_code_before_any_rank(tmp_path):
    run = make_run(tmp_path)
    (run / "resume.json").write_text("{}")
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_script(tmp_path, run, TORCH_FAKE_CONVERT_EXIT="5")
    assert e.value.returncode == 5
    calls = [json.loads(line) for line in (tmp_path / "python-calls.jsonl").read_text().splitlines()]
    assert [c["argv"][1] for c in calls] == ["orchestrator.train.convert"]


def test_a_run_dir_without_resume_json_has_no_conversion_step(tmp_path):
    _, calls = run_script(tmp_path, make_run(tmp_path))
    assert [c["argv"][1] for c in calls] == ["torch.distributed.run"] * 2


def test_script_is_valid_bash_and_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "s3cret-never-written")
    run = make_run(tmp_path)
    script = (run / "launch_pdsh.sh").read_text()
    subprocess.run(["bash", "-n", str(run / "launch_pdsh.sh")], check=True)
    assert "# Generated by orch" in script.splitlines()[1]
    assert "s3cret" not in script + (run / "hostfile").read_text()
    assert (run / "hostfile").read_text().splitlines()[1:] == ["orch-n1 slots=1", "orch-n2 slots=1"]


def test_tp_env_reaches_the_remote_command(tmp_path):
    run = make_run(tmp_path, **{"cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 2, "parallelism.tensor": 2,
                                "parallelism.zero_stage": 1, "training.precision": "bf16"})
    assert "remote_env='CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONSAFEPATH=1'\n" in (run / "launch_pdsh.sh").read_text()


# --- build, tools, hosts -------------------------------------------------------------------------------

def test_build_runs_the_script_under_the_supervisor(tmp_path):
    run = read_run_dir(make_run(tmp_path))
    plan = pdsh.build(run, run_id="r1")
    assert plan.argv == [sys.executable, "-m", "orchestrator.launch.supervise", "--run-id", "r1",
                         "--hosts", "orch-n1,orch-n2", "--ssh-port", "2222", "--fanout", "1024",
                         "--result", "logs/pdsh_result.json", "--", "bash", "launch_pdsh.sh"]
    assert plan.env == {"ORCH_PYTHON": sys.executable, "ORCH_PDSH_RUN_ID": "r1", "PYTHONSAFEPATH": "1"}
    assert (run.path / "launch_pdsh.sh").read_text().rstrip() in plan.describe()
    assert "picks MASTER_PORT free on orch-n1" in plan.describe()


@pytest.mark.parametrize("hosts, message", [(["orch-n1", "orch-n1"], "'orch-n1' is listed twice"),
                                            (["orch-n1"], r"1 host\(s\) listed \(orch-n1\) for cluster.num_nodes\(2\)"),
                                            ([], r"no hosts listed, so pdsh would use only localhost")])
def test_hosts_must_be_one_distinct_host_per_node(tmp_path, hosts, message):
    data = spec_data(**{**HOSTS, "launch.pdsh.hosts": hosts})
    with pytest.raises(SpecError, match=message) as info:      # duplicates: refused by the spec already
        pdsh.build(read_run_dir(write_run_dir(fixed_plan(data), tmp_path / "run")))
    assert "listed twice" in message or \
        "list exactly 2 host names under launch.pdsh.hosts" in info.value.problems[0].hint


def test_missing_tools_say_what_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "pdsh" else f"/usr/bin/{tool}")
    with pytest.raises(OrchError, match=r"needs pdsh on PATH: install pdsh \(Debian/Ubuntu: apt-get install pdsh"):
        pdsh.require_tools()
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(OrchError, match="needs pdsh and ssh on PATH.*openssh-client"):
        pdsh.require_tools()


def test_cli_without_pdsh_on_path_exits_1_naming_the_package(tmp_path, orch_env):
    run = make_run(tmp_path)
    env = {**orch_env, "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run([str(Path(sys.executable).parent / "orch"), "launch", str(run), "--backend", "pdsh"],
                          env=env, capture_output=True, text=True, timeout=scaled_s(60))
    assert proc.returncode == 1, proc.stderr
    assert "apt-get install pdsh" in proc.stderr and "openssh-client" in proc.stderr
    assert not (run / "job.json").exists()


# --- pdsh output ----------------------------------------------------------------------------------------

PREFLIGHT_ERR = """orch-n3: ssh: connect to host orch-n3 port 2222: Connection refused
pdsh@vm: orch-n3: ssh exited with exit code 255
pdsh@vm: orch-n2: ssh exited with exit code 3
"""


def test_parse_exits_and_host_lines():
    assert pdsh.parse_exits(PREFLIGHT_ERR + "pdsh@vm: orch-n3: ssh exited with exit code 1\n") == \
        {"orch-n3": 255, "orch-n2": 3}
    assert pdsh.host_lines("orch-n1: a: b\norch-n2: c\nnoise\norch-n1: d\n", "orch-n1") == ["a: b", "d"]


def test_preflight_names_every_failing_host():
    target = pdsh.PdshTarget(hosts=("orch-n1", "orch-n2", "orch-n3"), ssh_port=2222, fanout=8)
    with pytest.raises(OrchError) as e:
        pdsh.parse_preflight(target, "orch-n1: orch-free-port 5000\n", PREFLIGHT_ERR, run_dir=Path("/r"),
                             python="/py")
    text = str(e.value)
    assert "nothing was started" in text
    assert "orch-n3: not reachable over ssh on port 2222 (ssh: connect to host orch-n3 port 2222: Connection " \
           "refused)" in text
    assert "orch-n2: the run dir /r is not there" in text and "orch-n1" not in text.split("started")[1]


def test_preflight_returns_the_first_hosts_free_port():
    target = pdsh.PdshTarget(hosts=("b", "a"), ssh_port=22, fanout=8)
    assert pdsh.parse_preflight(target, "a: x\nb: orch-free-port 31337\n", "", run_dir=Path("/r"), python="/p") \
        == 31337
    with pytest.raises(OrchError, match="expected 'orch-free-port N'"):
        pdsh.parse_preflight(target, "b: hello\n", "", run_dir=Path("/r"), python="/p")


# --- supervisor and status ------------------------------------------------------------------------------

class StopRecorder:
    """A runner whose only allowed command is the remote stop (pdsh ... sh -c STOP_SCRIPT orch-stop ID)."""

    def __init__(self):
        self.stops = []

    def run(self, argv, *, cwd=None, env=None, timeout_s=60, check=True):
        if argv[0] != "pdsh" or "orch-stop" not in argv[-1]:
            raise AssertionError(f"unexpected command: {argv}")
        self.stops.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    def start_piped(self, argv, *, cwd=None, env=None):
        from orchestrator.launch.base import CommandRunner

        return CommandRunner().start_piped(argv, cwd=cwd, env=env)


def supervise_fake(tmp_path: Path, body: str) -> tuple[int, dict, StopRecorder, list[str]]:
    target = pdsh.PdshTarget(hosts=("orch-n1", "orch-n2"), ssh_port=2222, fanout=4)
    runner, said = StopRecorder(), []
    sup = supervise.Supervisor(target, "rid", runner, say=said.append)
    code = supervise.supervise(["bash", "-c", body], sup, tmp_path / "result.json")
    return code, json.loads((tmp_path / "result.json").read_text()), runner, said


def test_first_failing_host_stops_every_host_and_gives_its_code(tmp_path):
    body = ("echo 'orch-n1: [rank0]: step 1'; echo 'pdsh@vm: orch-n2: ssh exited with exit code 7' >&2; sleep 0.2; "
            "echo 'pdsh@vm: orch-n1: ssh exited with exit code 143' >&2; exit 143")
    code, result, runner, said = supervise_fake(tmp_path, body)
    assert code == 7
    assert result == {"state": "FAILED", "exit_code": 7, "failed_host": "orch-n2",
                      "host_exit_codes": {"orch-n2": 7, "orch-n1": 143}, "run_id": "rid"}
    assert len(runner.stops) == 1
    stop = runner.stops[0]
    assert stop[:9] == ["pdsh", "-S", "-R", "ssh", "-f", "4", "-t", "5", "-w"] and stop[9] == "orch-n1,orch-n2"
    assert stop[-1].startswith("sh -c ") and stop[-1].endswith(" orch-stop rid")
    assert "orch: orch-n2 failed with exit code 7: stopping the job on every host" in said


def test_success_and_plain_failure(tmp_path):
    code, result, runner, _ = supervise_fake(tmp_path, "echo 'orch-n1: fine'")
    assert (code, result["state"], runner.stops) == (0, "COMPLETED", [])
    code, result, _, _ = supervise_fake(tmp_path, "echo 'pdsh: unknown option' >&2; exit 2")
    assert (code, result["state"], result["failed_host"]) == (2, "FAILED", None)


def test_cancel_stops_every_host_and_records_cancelled(tmp_path):
    target = pdsh.PdshTarget(hosts=("orch-n1",), ssh_port=22, fanout=1)
    runner = StopRecorder()
    sup = supervise.Supervisor(target, "rid", runner, say=lambda m: None)
    sup.cancel()
    code = supervise.supervise(["bash", "-c", "echo 'pdsh@vm: orch-n1: ssh exited with exit code 1' >&2; exit 1"],
                               sup, tmp_path / "result.json")
    result = json.loads((tmp_path / "result.json").read_text())
    assert code == 143 and result["state"] == "CANCELLED" and result["failed_host"] is None
    assert len(runner.stops) == 1


def test_stop_script_ends_exactly_the_runs_processes(tmp_path):
    env = dict(os.environ)
    mine = subprocess.Popen(["sleep", "60"], env={**env, "ORCH_RUN_ID": "run-a"})
    other = subprocess.Popen(["sleep", "60"], env={**env, "ORCH_RUN_ID": "run-a-longer"})
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & wait; sleep 60"],
                                env={**env, "ORCH_RUN_ID": "run-a"})
    try:
        time.sleep(0.2)
        started = time.monotonic()
        subprocess.run(["sh", "-c", pdsh.STOP_SCRIPT, "orch-stop", "run-a", "5"], check=True, timeout=scaled_s(30))
        assert mine.wait(timeout=scaled_s(5)) == -15
        assert stubborn.wait(timeout=scaled_s(5)) == -9
        assert time.monotonic() - started < 5
        assert other.poll() is None
    finally:
        for proc in (mine, other, stubborn):
            proc.kill()
            proc.wait()


def test_status_follows_the_result_file_and_the_supervisor(tmp_path):
    (tmp_path / "logs").mkdir()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        record = JobRecord(backend="pdsh", job_id=str(proc.pid), run_dir=str(tmp_path), submitted_unix=0,
                           log_path=str(tmp_path / "logs" / "launch.log"),
                           extra={"run_id": "r", "start_ticks": pdsh.process_stat(proc.pid)[1]})
        assert pdsh.status(record) is JobState.RUNNING
        assert pdsh.status(JobRecord(**{**record.__dict__, "extra": {"start_ticks": 1}})) is JobState.FAILED
        pdsh.write_result(tmp_path / "logs" / "pdsh_result.json",
                          {"state": "FAILED", "exit_code": 7, "failed_host": "orch-n2"})
        (tmp_path / "logs" / "launch.log").write_text("orch-n2: boom\norch-n1: fine\n")
        assert pdsh.status(record) is JobState.FAILED and pdsh.exit_code(record) == 7
        report = pdsh.failure_report(record, None, 7)
        assert report.startswith("host orch-n2 failed with exit code 7") and "orch-n2: boom" in report
        assert "fine" not in report
    finally:
        proc.kill()
        proc.wait()
