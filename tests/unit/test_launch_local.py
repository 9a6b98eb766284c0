"""`orch launch` / `status` with the local backend, up to the point where a job would start: refusals, option
values, exit codes, the start-up watch. (Real torchrun runs: tests/integration/test_launch_local.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.launch import local
from orchestrator.launch.base import JobRecord
from orchestrator.launch.progress import StartupWatch
from orchestrator.rundir import write_run_dir
from tests.conftest import EXAMPLES, fixed_plan, spec_data
from tests.deadlines import scaled_s

ORCH = str(Path(sys.executable).parent / "orch")


def orch(*argv, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *map(str, argv)], capture_output=True, text=True, timeout=scaled_s(timeout))


def run_dir(tmp_path, **overrides) -> Path:
    return write_run_dir(fixed_plan(spec_data(**overrides)), tmp_path / "run")


def test_multi_node_spec_with_the_local_backend_is_refused_at_once(tmp_path):
    run = run_dir(tmp_path, **{"cluster.num_nodes": 8, "training.global_batch_size": 32})
    start = time.monotonic()
    proc = orch("launch", run, "--wait", "--timeout", "40")
    assert proc.returncode == 2 and time.monotonic() - start < 30
    assert "launch.backend: 'local' runs torchrun on this host only, but cluster.num_nodes is 8" in proc.stderr
    assert "--backend slurm" in proc.stderr and "--backend pdsh" in proc.stderr
    assert not (run / "job.json").exists() and not (run / "logs").exists()
    dry = orch("launch", run, "--dry-run")       # the dry run still shows the command, and says it
    assert dry.returncode == 0 and "launch_local.sh" in dry.stdout and "would be refused" in dry.stderr


@pytest.mark.parametrize("argv, option", [
    (["launch", "RUN", "--wait", "--timeout", "-5"], "--timeout"),
    (["launch", "RUN", "--wait", "--timeout", "0"], "--timeout"),
    (["generate", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "-o", "OUT", "--top", "0"], "--top"),
    (["generate", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "-o", "OUT", "--top", "-3"], "--top"),
])
def test_option_values_are_checked_like_spec_fields(tmp_path, argv, option):
    run = run_dir(tmp_path)
    argv = [str(run) if a == "RUN" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    proc = orch(*argv)
    assert proc.returncode == 2 and f"'{option}'" in proc.stderr
    assert not (run / "job.json").exists() and not (tmp_path / "out").exists()


def test_status_of_a_never_launched_run_dir_exits_2(tmp_path):
    run = run_dir(tmp_path)
    proc = orch("status", run)
    assert proc.returncode == 2 and "nothing was launched from this run dir" in proc.stderr
    assert f"orch launch {run}" in proc.stderr
    assert "2 when nothing was launched" in " ".join(orch("status", "--help").stdout.split())


def test_relaunching_a_trained_run_says_so_and_how_to_train_again(tmp_path):
    run = run_dir(tmp_path)                         # train_iters 10; checkpoint of step 10 is the last step
    from orchestrator.train import checkpoint

    (run / "checkpoints" / "global_step10").mkdir(parents=True)
    (run / "checkpoints" / "global_step10" / "state.bin").write_bytes(b"weights")
    assert checkpoint.write_manifest(run / "checkpoints", 10) is None     # verified when written
    (run / "checkpoints" / "latest").write_text("global_step10")
    proc = orch("launch", run, "--wait")
    assert proc.returncode == 0
    assert "is already trained" in proc.stderr and "step 10 of 10" in proc.stderr
    assert "--force" in proc.stderr and not (run / "job.json").exists()


def test_generate_says_micro_batch_in_the_singular(tmp_path):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data(**{"training.global_batch_size": 4})))
    proc = subprocess.run([ORCH, "generate", str(spec), "-o", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=scaled_s(60))
    assert proc.returncode == 0, proc.stderr
    assert "1 micro-batch/step" in proc.stderr and "micro-batches" not in proc.stderr


TORCHRUN_SUMMARY = """[default1]:[orch-train] rank 1: injected fault at step 3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_01:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 123)
"""


@pytest.mark.parametrize("rank_code, expected", [(3, 3), (-9, 137)])
def test_exit_code_is_the_failed_ranks_not_torchruns(tmp_path, rank_code, expected):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "launch.log").write_text(TORCHRUN_SUMMARY.format(code=rank_code))
    (logs / local.EXIT_CODE_FILE).write_text("1\n")     # torchrun's own code
    record = JobRecord(backend="local", job_id="1", run_dir=str(tmp_path), submitted_unix=0.0)
    assert local.exit_code(record) == expected


def test_pdsh_and_slurm_pass_the_ranks_code_through_too(tmp_path):
    import json

    from orchestrator.launch import pdsh, slurm
    from tests.unit.test_launch_slurm import SCONTROL_RUNNING, FakeRunner

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "launch.log").write_text("".join(f"orch-n2: {line}\n" for line in
                                             TORCHRUN_SUMMARY.format(code=3).splitlines()))
    (logs / pdsh.RESULT_FILE).write_text(json.dumps({"state": "FAILED", "exit_code": 1, "failed_host": "orch-n2"}))
    record = JobRecord(backend="pdsh", job_id="1", run_dir=str(tmp_path), submitted_unix=0.0,
                       log_path=str(logs / "launch.log"))
    assert pdsh.exit_code(record) == 3
    (tmp_path / "slurm-7.err").write_text(TORCHRUN_SUMMARY.format(code=3))
    failed = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=FAILED").replace("ExitCode=0:0", "ExitCode=1:0")
    record = JobRecord(backend="slurm", job_id="7", run_dir=str(tmp_path), submitted_unix=0.0,
                       log_path=str(tmp_path / "slurm-7.out"), extra={"error_path": str(tmp_path / "slurm-7.err")})
    assert slurm.exit_code(record, FakeRunner({("scontrol", "show", "job", "-o", "7"): (0, failed, "")})) == 3


def test_startup_watch_relays_the_trainer_and_beats(tmp_path):
    log = tmp_path / "launch.log"
    log.write_text("old line [orch-train] from an earlier start\n")
    now = [0.0]
    notes: list[str] = []
    watch = StartupWatch(log, notes.append, heartbeat_s=15, clock=lambda: now[0])
    with open(log, "a") as f:
        f.write("[default0]:[orch-train] first DeepSpeed start with this cache: compiling ...\nnoise\n"
                "[default0]:[orch-train] step 1/40 loss 6.1787 tokens/s 8741\n[default0]:par")
    watch.poll()
    assert notes == ["first DeepSpeed start with this cache: compiling ..."]
    now[0] = 16.0
    watch.poll()
    assert notes[-1].startswith("starting: 16 s, no step yet; its log: ")
    watch.stop()
    now[0] = 60.0
    watch.poll()
    assert len(notes) == 2


def test_trainer_says_when_deepspeed_will_compile_its_cpu_op(tmp_path, monkeypatch):
    """The first start with an empty extension cache is announced (the launcher relays it); a cached op is not."""
    pytest.importorskip("torch")
    from orchestrator.train import ops

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    note = ops.build_note()
    assert note and "compiling its CPU communication op (deepspeed_shm_comm)" in note and str(tmp_path) in note
    built = ops.op_build_dir()
    built.mkdir(parents=True, exist_ok=True)
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    assert ops.build_note() is None


def test_every_rank_builds_the_op_with_this_interpreters_ninja(monkeypatch):
    """A rank started over ssh has the remote shell's PATH (/usr/bin first: the system's ninja); torch would
    build the op with it and the next local or SLURM rank (the environment's ninja) would rebuild it. After
    use_interpreter_tools the interpreter's directory comes first, once, whatever PATH held before."""
    import shutil

    from orchestrator.train import ops

    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"/usr/bin:/bin:{bin_dir}:/usr/bin")
    ops.use_interpreter_tools()
    assert os.environ["PATH"].split(os.pathsep) == [bin_dir, "/usr/bin", "/bin", "/usr/bin"]
    if (Path(bin_dir) / "ninja").is_file():       # the venv's pip-installed ninja (torch's build tool)
        assert shutil.which("ninja") == str(Path(bin_dir) / "ninja")
    ops.use_interpreter_tools()
    assert os.environ["PATH"].split(os.pathsep).count(bin_dir) == 1


def test_a_job_that_ends_after_cancel_is_cancelled_whatever_its_code(tmp_path):
    """A SIGINT that lands while the ranks are still starting makes torchrun exit 1: still CANCELLED, as
    SLURM reports an scancelled job; the same exit code without a cancel is FAILED."""
    logs = tmp_path / "logs"
    logs.mkdir()
    record = JobRecord(backend="local", job_id="999999999", run_dir=str(tmp_path), submitted_unix=time.time() - 60)
    (logs / local.EXIT_CODE_FILE).write_text("1\n")
    assert local.status(record) == local.JobState.FAILED
    record.extra["cancelled_unix"] = (logs / local.EXIT_CODE_FILE).stat().st_mtime - 0.5    # asked, then it ended
    assert local.status(record) == local.JobState.CANCELLED
    record.extra["cancelled_unix"] = time.time() + 3600     # asked for after the job had already failed
    assert local.status(record) == local.JobState.FAILED
