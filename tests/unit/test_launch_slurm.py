"""The SLURM backend's pure parts: sbatch rendering and quoting, strict parsing of sbatch / scontrol / sacct
output, state mapping, and the backend functions against a fake runner that refuses unknown commands.
The batch script's signal and requeue logic runs for real here, with stand-ins for srun and scontrol."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import OrchError, SpecError
from orchestrator.launch import slurm
from orchestrator.launch.base import JobRecord, JobState
from orchestrator.render.scripts import render_sbatch, sbatch_directives
from orchestrator.rundir import read_run_dir, write_run_dir
from orchestrator.spec_loader import parse_spec
from tests.conftest import fixed_plan, spec_data
from tests.deadlines import scaled_s

TWO_NODES = {"cluster.num_nodes": 2, "cluster.gpus_per_node": 1, "launch.slurm.partition": "debug"}
WORKDIR_TRAP = "/tmp/a b JobState=FAILED ExitCode=9:0"
SCONTROL_RUNNING = (
    "JobId=7 JobName=tiny UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=00:10:00 Partition=debug NodeList=orch-n[1-2] "
    f"BatchHost=orch-n1 NumNodes=2 Command={WORKDIR_TRAP}/launch.sbatch WorkDir={WORKDIR_TRAP} "
    f"StdErr={WORKDIR_TRAP}/logs/slurm-7.err StdOut={WORKDIR_TRAP}/logs/slurm-7.out Power=\n")
ARRAY = (
    "JobId=10 ArrayJobId=10 ArrayTaskId=2-3%2 ArrayTaskThrottle=2 JobName=a JobState=PENDING "
    "Reason=JobArrayTaskLimit Restarts=0 ExitCode=0:0 NodeList=(null)\n"
    "JobId=12 ArrayJobId=10 ArrayTaskId=1 JobName=a JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0\n"
    "JobId=11 ArrayJobId=10 ArrayTaskId=0 JobName=a JobState=FAILED Reason=NonZeroExitCode Restarts=0 "
    "ExitCode=3:0\n")


def make_run(tmp_path: Path, name: str = "run", **overrides) -> Path:
    return write_run_dir(fixed_plan(spec_data(**{**TWO_NODES, **overrides})), tmp_path / name)


class FakeRunner:
    """Answers only the commands it was given (argv prefix -> CompletedProcess fields); refuses the rest."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]]):
        self.answers, self.calls = answers, []

    def run(self, argv, *, cwd=None, env=None, timeout_s=60, check=True):
        self.calls.append((list(argv), cwd, env))
        for prefix, (code, out, err) in self.answers.items():
            if tuple(argv[:len(prefix)]) == prefix:
                if check and code:
                    raise OrchError(f"{argv[0]} exited {code}: {err}")
                return subprocess.CompletedProcess(argv, code, out, err)
        raise AssertionError(f"unexpected command: {argv}")


# --- rendering ------------------------------------------------------------------------------------------

def test_directives_follow_the_spec_in_a_fixed_order():
    plan = fixed_plan(spec_data(**TWO_NODES, **{
        "launch.slurm.account": "proj1", "launch.slurm.qos": "high", "launch.slurm.cpus_per_task": 8,
        "launch.slurm.nodelist": "orch-n[1-2]", "launch.slurm.dependency": "afterok:12:13",
        "launch.slurm.extra_args": "--mem=0 --constraint=h100", "launch.slurm.time": "01:00:00"}))
    assert sbatch_directives(plan) == [
        "#SBATCH --job-name=tiny", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8", "#SBATCH --time=01:00:00", "#SBATCH --partition=debug",
        "#SBATCH --account=proj1", "#SBATCH --qos=high", "#SBATCH --nodelist='orch-n[1-2]'",
        "#SBATCH --dependency=afterok:12:13", "#SBATCH --exclusive", "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@120", "#SBATCH --output=logs/slurm-%j.out", "#SBATCH --error=logs/slurm-%j.err",
        "#SBATCH --open-mode=append", "#SBATCH --mem=0", "#SBATCH --constraint=h100"]


def test_gpus_no_requeue_and_no_signal():
    plan = fixed_plan(spec_data(**{**TWO_NODES, "cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 8,
                                   "training.precision": "bf16", "training.global_batch_size": 64,
                                   "launch.slurm.requeue": False, "launch.slurm.signal_before_end_s": 0}))
    lines = sbatch_directives(plan)
    assert "#SBATCH --gpus-per-node=8" in lines and "#SBATCH --no-requeue" in lines
    assert not any("--signal" in line or line.endswith("--requeue") for line in lines)
    script = render_sbatch(plan)
    assert "--nproc_per_node=8" in script and "resubmit to resume" in script and "scontrol requeue" not in script


def test_script_is_valid_bash_with_header_and_tp_env(tmp_path):
    plan = fixed_plan(spec_data(**{**TWO_NODES, "cluster.gpu": "h100-sxm", "cluster.gpus_per_node": 2,
                                   "training.precision": "bf16", "parallelism.tensor": 2,
                                   "parallelism.zero_stage": 1}))
    script = render_sbatch(plan)
    assert script.splitlines()[0] == "#!/usr/bin/env bash"
    assert "# Generated by orch" in script
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in script
    path = tmp_path / "launch.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    # The #SBATCH block is contiguous right after the shebang (sbatch stops reading at the first command).
    lines = script.splitlines()
    first_other = next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("#SBATCH"))
    assert not any(line.startswith("#SBATCH") for line in lines[first_other:])


@pytest.mark.parametrize("field, value", [
    ("launch.slurm.partition", "x; touch /tmp/pwned"), ("launch.slurm.account", "$(touch /tmp/pwned)"),
    ("launch.slurm.qos", "a b"), ("launch.slurm.dependency", "afterok:1; touch /tmp/pwned"),
    ("launch.slurm.nodelist", "n1`touch /tmp/pwned`"), ("launch.slurm.extra_args", "--mem=0\n#SBATCH --x"),
    ("launch.slurm.extra_args", "--comment='x y'"), ("launch.slurm.time", "1:00; reboot"),
    ("name", "x; touch /tmp/pwned"),
])
def test_hostile_values_are_rejected_by_the_spec(field, value):
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data(**{**TWO_NODES, field: value}))
    assert field in str(e.value)


def test_no_secret_is_rendered(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "s3cret-never-written")
    run = make_run(tmp_path)
    for path in run.iterdir():
        assert "s3cret-never-written" not in path.read_text(), path.name


# --- parsing --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out, job_id", [("123\n", "123"), ("123;orch\n", "123"), ("\n  42  \n", "42")])
def test_sbatch_parsable_output(out, job_id):
    assert slurm.parse_sbatch_output(out) == job_id


@pytest.mark.parametrize("out", ["", "Submitted batch job 123\n", "123\n124\n", "12a\n", "123;bad cluster\n"])
def test_sbatch_unexpected_output_is_quoted(out):
    with pytest.raises(OrchError) as e:
        slurm.parse_sbatch_output(out, "sbatch: warning: something")
    assert repr(out.strip()) in str(e.value) and "sbatch: warning: something" in str(e.value)


def test_every_documented_state_maps_and_unknown_ones_fail():
    assert slurm.parse_state("CANCELLED by 0") is JobState.CANCELLED
    assert slurm.parse_state("COMPLETING") is JobState.RUNNING
    assert slurm.parse_state("REQUEUE_HOLD") is JobState.REQUEUED
    assert slurm.parse_state("BOOT_FAIL") is JobState.NODE_FAIL
    assert {slurm.parse_state(name) for name in slurm.SLURM_STATES} <= set(JobState)
    with pytest.raises(OrchError, match="unknown SLURM job state 'EXPLODED'"):
        slurm.parse_state("EXPLODED")


@pytest.mark.parametrize("text, code", [("0:0", 0), ("1:0", 1), ("0:15", 143), ("0:9", 137), ("2:0", 2)])
def test_exit_codes(text, code):
    assert slurm.parse_exit_code(text) == code


def test_scontrol_first_fields_win_over_free_text():
    [job] = slurm.parse_scontrol_jobs(SCONTROL_RUNNING)
    assert job == slurm.SlurmJob(job_id="7", state="RUNNING", reason="None", exit_code=0, restarts=0,
                                 nodes="orch-n[1-2]")
    assert job.job_state is JobState.RUNNING


def test_scontrol_array_tasks_and_combined_state():
    jobs = slurm.parse_scontrol_jobs(ARRAY)
    assert [j.job_id for j in jobs] == ["10_2-3%2", "10_1", "10_0"]
    assert slurm.combined_state(jobs) is JobState.PENDING
    done = [slurm.SlurmJob("1_0", "COMPLETED"), slurm.SlurmJob("1_1", "FAILED", exit_code=3)]
    assert slurm.combined_state(done) is JobState.FAILED
    assert slurm.combined_state(done[:1]) is JobState.COMPLETED


@pytest.mark.parametrize("text", ["JobId=3 JobName=x ExitCode=0:0\n", "garbage\n", "",
                                  "JobId=3 JobState=WEIRD ExitCode=0:0\n", "JobId=3 JobState=RUNNING ExitCode=x\n"])
def test_scontrol_unexpected_output_is_quoted(text):
    with pytest.raises(OrchError) as e:
        slurm.parse_scontrol_jobs(text)
    assert text.strip()[:20] in str(e.value)


def test_sacct_lines():
    jobs = slurm.parse_sacct("12|CANCELLED by 0|0:15\n13_1|COMPLETED|0:0\n")
    assert [(j.job_id, j.job_state, j.exit_code) for j in jobs] == [
        ("12", JobState.CANCELLED, 143), ("13_1", JobState.COMPLETED, 0)]
    with pytest.raises(OrchError, match="expected 'JOBID|STATE|EXIT:SIGNAL'"):
        slurm.parse_sacct("12 COMPLETED 0:0\n")


# --- backend functions ----------------------------------------------------------------------------------

def test_build_is_sbatch_with_exported_environment(tmp_path):
    run = read_run_dir(make_run(tmp_path))
    plan = slurm.build(run)
    assert plan.argv == ["sbatch", "--parsable", "--export=ALL", "launch.sbatch"]
    assert plan.cwd == run.path and set(plan.env) == {"ORCH_PYTHON"}
    text = plan.describe()
    assert text.startswith(f"cd {run.path} && ORCH_PYTHON=")
    assert (run.path / "launch.sbatch").read_text().rstrip() in text
    assert slurm.build(run, dependency="afterany:5").argv[3] == "--dependency=afterany:5"


def test_submit_parses_and_records(tmp_path):
    run = read_run_dir(make_run(tmp_path))
    runner = FakeRunner({("sbatch",): (0, "77\n", "")})
    record, handle = slurm.submit(slurm.build(run), runner)
    assert handle is None and record.job_id == "77"
    assert json.loads((run.path / "job.json").read_text())["job_id"] == "77"
    assert record.log_path == str(run.path / "logs" / "slurm-77.out")
    assert (run.path / "logs").is_dir()
    assert runner.calls[0][1] == run.path


def test_submit_error_quotes_sbatch(tmp_path):
    run = read_run_dir(make_run(tmp_path))
    runner = FakeRunner({("sbatch",): (1, "", "sbatch: error: invalid partition name specified")})
    with pytest.raises(OrchError, match="invalid partition name"):
        slurm.submit(slurm.build(run), runner)
    assert not (run.path / "job.json").exists()


def record_for(tmp_path: Path, job_id: str = "7") -> JobRecord:
    return JobRecord(backend="slurm", job_id=job_id, run_dir=str(tmp_path), submitted_unix=0.0,
                     log_path=str(tmp_path / f"slurm-{job_id}.out"),
                     extra={"error_path": str(tmp_path / f"slurm-{job_id}.err")})


def test_status_and_exit_code_from_scontrol(tmp_path):
    done = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=FAILED").replace("ExitCode=0:0", "ExitCode=1:0")
    runner = FakeRunner({("scontrol", "show", "job", "-o", "7"): (0, done, "")})
    assert slurm.status(record_for(tmp_path), runner) is JobState.FAILED
    assert slurm.exit_code(record_for(tmp_path), runner) == 1


def test_forgotten_job_asks_sacct_then_reports_unknown(tmp_path):
    forgot = (1, "", "slurm_load_jobs error: Invalid job id specified")
    runner = FakeRunner({("scontrol",): forgot, ("sacct",): (0, "7|COMPLETED|0:0\n", "")})
    assert slurm.status(record_for(tmp_path), runner) is JobState.COMPLETED
    runner = FakeRunner({("scontrol",): forgot, ("sacct",): (1, "", "Slurm accounting storage is disabled")})
    assert slurm.status(record_for(tmp_path), runner) is JobState.UNKNOWN


def test_scontrol_failure_is_an_error(tmp_path):
    runner = FakeRunner({("scontrol",): (1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    with pytest.raises(OrchError, match="Unable to contact slurm controller"):
        slurm.status(record_for(tmp_path), runner)


def test_cancel_runs_scancel_and_waits_for_the_end(tmp_path):
    states = iter(["COMPLETING", "CANCELLED"])

    class Runner(FakeRunner):
        def run(self, argv, **kw):
            if argv[0] == "scontrol":
                self.calls.append((argv, None, None))
                state = next(states)
                return subprocess.CompletedProcess(argv, 0, f"JobId=7 JobState={state} ExitCode=0:15\n", "")
            return super().run(argv, **kw)

    runner = Runner({("scancel", "7"): (0, "", "")})
    slurm.cancel(record_for(tmp_path), runner)
    assert [c[0][0] for c in runner.calls] == ["scancel", "scontrol", "scontrol"]


def test_failure_report_shows_the_failing_ranks_lines(tmp_path):
    (tmp_path / "slurm-7.out").write_text("[orch-n1 rank0]:step 1\n[orch-n2 rank1]:step 1\n")
    (tmp_path / "slurm-7.err").write_text(
        "[orch-n2 rank1]:Traceback\n[orch-n2 rank1]:ValueError: boom\n[orch-n1 rank0]:fine\n"
        "Root Cause (first observed failure):\n[0]:\n  time : x\n  host : vm\n  rank : 1 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 5)\n")
    failed = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=FAILED").replace("Reason=None",
                                                                                      "Reason=NonZeroExitCode")
    runner = FakeRunner({("scontrol",): (0, failed, "")})
    report = slurm.failure_report(record_for(tmp_path), runner, 1)
    assert "NonZeroExitCode" in report and "rank 1 failed with exit code 1" in report
    assert "[orch-n2 rank1]:ValueError: boom" in report and "rank0" not in report


def test_sweep_is_one_array_over_run_dirs(tmp_path):
    runs = [read_run_dir(make_run(tmp_path, f"r{i}", **{"training.optimizer.lr": 1e-3 * (i + 1)}))
            for i in range(3)]
    plan = slurm.build_sweep(runs, max_parallel=2, dependency="afterok:9")
    assert plan.argv == ["sbatch", "--parsable", "--export=ALL", "--dependency=afterok:9", "--array=0-2%2",
                         "--output=logs/slurm-%A_%a.out", "--error=logs/slurm-%A_%a.err", "launch.sbatch"]
    assert plan.env["ORCH_SWEEP_RUN_DIRS"].split("\n") == [str(r.path.resolve()) for r in runs]
    records = slurm.submit_sweep(plan, FakeRunner({("sbatch",): (0, "40\n", "")}))
    assert [r.job_id for r in records] == ["40_0", "40_1", "40_2"]
    assert json.loads((runs[2].path / "job.json").read_text())["job_id"] == "40_2"
    other = read_run_dir(make_run(tmp_path, "big", **{"cluster.num_nodes": 1, "cluster.gpus_per_node": 2}))
    with pytest.raises(OrchError, match="#SBATCH lines differ"):
        slurm.build_sweep([runs[0], other])


# --- the batch script's own logic, with stand-ins for srun and scontrol ----------------------------------

FAKE_SRUN = """#!/bin/bash
# Stand-in for srun: one "task" that works until USR1/TERM, then exits like torchrun after a checkpoint.
# The conversion step's command runs (its python is FAKE_PYTHON), as step 0 on orch-n1.
echo "srun $*" >> "$FAKE_LOG"
if [ "$4" = --job-name=orch-convert ]; then shift 4; SLURM_STEP_ID=0 SLURMD_NODENAME=orch-n1 exec "$@"; fi
trap 'echo "task got USR1" >> "$FAKE_LOG"; exit 1' USR1
trap 'echo "task got TERM" >> "$FAKE_LOG"; exit 1' TERM
echo ready > "$FAKE_READY"
for _ in $(seq "${FAKE_TASK_TICKS:-200}"); do sleep 0.05; done
exit "${FAKE_TASK_EXIT:-0}"
"""
FAKE_PYTHON = """#!/bin/bash
printf 'python' >> "$FAKE_LOG"; printf ' [%s]' "$@" >> "$FAKE_LOG"; echo >> "$FAKE_LOG"
exit "${FAKE_CONVERT_EXIT:-0}"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then echo orch-n1; echo orch-n2; fi
"""


def run_batch_script(tmp_path: Path, *, send: int | None, task_exit: int = 0, resized: bool = False,
                     convert_exit: int = 0, name: str = "run", **spec) -> tuple[int, str, str]:
    run = make_run(tmp_path, name, **spec)
    if resized:
        (run / "resume.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log, ready = tmp_path / "fake.log", tmp_path / "ready"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log), "FAKE_READY": str(ready),
           "FAKE_TASK_EXIT": str(task_exit), "FAKE_TASK_TICKS": "200" if send else "4", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "orch-n[1-2]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_SUBMIT_DIR": str(run), "MASTER_PORT": "29999",
           "ORCH_PYTHON": str(bin_dir / "python"), "FAKE_CONVERT_EXIT": str(convert_exit)}
    proc = subprocess.Popen(["bash", str(run / "launch.sbatch")], env=env, cwd=run, stderr=subprocess.PIPE,
                            text=True)
    if send:                     # signal the job once its ranks run (a job with no signal just runs to its end)
        deadline = time.monotonic() + scaled_s(20)
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        proc.send_signal(send)
    _, err = proc.communicate(timeout=scaled_s(30))
    return proc.returncode, log.read_text(), err


def test_usr1_reaches_the_step_and_the_job_requeues_itself(tmp_path):
    code, log, err = run_batch_script(tmp_path, send=signal.SIGUSR1)
    assert "task got USR1" in log
    assert "scontrol requeue 42" in log, log
    assert code == 0, err
    assert "srun --whole --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 bash -c" in log
    assert "rendezvous orch-n1:29999" in err


def test_usr1_without_requeue_ends_with_the_steps_code(tmp_path):
    code, log, err = run_batch_script(tmp_path, send=signal.SIGUSR1, **{"launch.slurm.requeue": False})
    assert "task got USR1" in log and "scontrol requeue" not in log
    assert code == 1 and "resubmit to resume" in err


def test_term_is_passed_on_and_never_requeues(tmp_path):
    code, log, _ = run_batch_script(tmp_path, send=signal.SIGTERM)
    assert "task got TERM" in log and "scontrol requeue" not in log
    assert code == 1


def test_the_steps_exit_code_is_the_jobs(tmp_path):
    code, log, _ = run_batch_script(tmp_path, send=None, task_exit=3)
    assert code == 3 and "scontrol requeue" not in log


def test_a_resized_run_converts_in_a_step_of_its_own_before_the_ranks(tmp_path):
    name = "run $(touch PWNED); x'y"
    code, log, err = run_batch_script(tmp_path, send=None, resized=True, name=name)
    assert code == 0, err
    convert, python, ranks = _steps(log)
    assert convert.startswith("srun --whole --nodes=1 --ntasks=1 --job-name=orch-convert bash -c")
    assert python == f"python [-m] [orchestrator.train.convert] [{tmp_path / name}]"
    assert ranks.startswith("srun --whole --kill-on-bad-exit=1 --nodes=2")
    assert "orch: step 42.0 on orch-n1: converting the checkpoint of the resized run" in err
    assert "the checkpoint conversion step is done" in err
    assert not list(tmp_path.rglob("PWNED*"))


def test_a_failed_conversion_ends_the_job_with_its_code_and_starts_no_rank(tmp_path):
    code, log, err = run_batch_script(tmp_path, send=None, resized=True, convert_exit=4)
    assert code == 4 and len(_steps(log)) == 2 and "--nodes=2" not in log
    assert "the checkpoint conversion step failed with exit code 4; no rank started" in err


def test_a_run_dir_without_resume_json_has_no_conversion_step(tmp_path):
    from orchestrator import render, resize

    assert render.scripts.RESUME_FILE == resize.RESUME_FILE       # the file orch resize writes
    code, log, _ = run_batch_script(tmp_path, send=None)
    assert code == 0 and [line.split(" bash -c")[0] for line in _steps(log)] == [
        "srun --whole --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1"]


def _steps(log: str) -> list[str]:
    """The srun calls and the conversion's python call, in order."""
    return [line for line in log.splitlines() if line.startswith(("srun ", "python ["))]


# --- the CLI --------------------------------------------------------------------------------------------

def test_cli_dry_run_prints_the_command_and_script_and_submits_nothing(tmp_path, orch_env):
    run = make_run(tmp_path)
    orch = str(Path(sys.executable).parent / "orch")
    env = {**orch_env, "WANDB_API_KEY": "s3cret-never-printed", "PATH": str(tmp_path)}   # no sbatch here
    proc = subprocess.run([orch, "launch", str(run), "--backend", "slurm", "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=scaled_s(60))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    prefix, _, python = lines[0].partition(" && ORCH_PYTHON=")
    assert prefix == f"cd {run}" and python.endswith(" sbatch --parsable --export=ALL launch.sbatch")
    assert proc.stdout.rstrip().endswith((run / "launch.sbatch").read_text().rstrip())
    assert "s3cret" not in proc.stdout + proc.stderr
    assert not (run / "job.json").exists() and not (run / "logs").exists()


def test_cli_rejects_a_hostile_partition_before_anything_runs(tmp_path, orch_env):
    import yaml

    spec = tmp_path / "spec.yaml"
    pwned = tmp_path / "pwned"
    spec.write_text(yaml.safe_dump(spec_data(**{**TWO_NODES, "launch.slurm.partition": f"x; touch {pwned}"})))
    proc = subprocess.run([str(Path(sys.executable).parent / "orch"), "generate", str(spec), "-o",
                           str(tmp_path / "run")], env=orch_env, capture_output=True, text=True, timeout=scaled_s(60))
    assert proc.returncode == 2 and "launch.slurm.partition" in proc.stderr
    assert not pwned.exists() and not (tmp_path / "run").exists()
