"""The program wrapper's own parts (orchestrator/telemetry/wrapper.py, orchestrator/programs): the data-parallel
group it infers, the loss mean over ranks that report one, the import hook, and a plain torch script (no
DeepSpeed, one process) run through `python -m orchestrator.programs` end to end."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from orchestrator.telemetry.metrics import mean_loss
from orchestrator.telemetry.wrapper import _AfterImport, dp_ranks_of
from tests.conftest import ROOT, fixed_plan, spec_data


def test_dp_group_is_same_stage_same_tensor_index():
    # tp 2, dp 2, pp 2: rank = stage * 4 + dp_index * 2 + tp_index (DeepSpeed's and Megatron's order)
    assert dp_ranks_of(0, tp=2, dp=2) == [0, 2]
    assert dp_ranks_of(3, tp=2, dp=2) == [1, 3]
    assert dp_ranks_of(5, tp=2, dp=2) == [5, 7]
    assert dp_ranks_of(2, tp=1, dp=2) == [2, 3]      # pp 2 x dp 2: stage 1 holds ranks 2, 3
    assert dp_ranks_of(1, tp=1, dp=1) == [1]


def test_loss_is_the_mean_of_the_ranks_that_report_one():
    assert mean_loss([{"loss": 2.0}, {"loss": math.nan}, {"loss": 4.0}]) == 3.0
    assert mean_loss([{"loss": math.nan}, {"loss": None}]) is None


def test_after_import_hook_patches_the_module_once(tmp_path, monkeypatch):
    (tmp_path / "orch_fake_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = _AfterImport({"orch_fake_mod": lambda module: seen.append(module.VALUE)})
    sys.meta_path.insert(0, finder)
    try:
        import orch_fake_mod  # noqa: F401
        assert seen == [1] and "orch_fake_mod" not in finder.targets
        assert finder not in sys.meta_path          # nothing left to watch: it took itself off
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        sys.modules.pop("orch_fake_mod", None)


SCRIPT = """
import sys
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("argv", sys.argv[1:])
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def plain_run(tmp_path):
    from orchestrator.rundir import write_run_dir

    run = write_run_dir(fixed_plan(spec_data(**{"cluster.gpus_per_node": 1, "tracking.wandb.mode": "disabled"})),
                        tmp_path / "run")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return run, script


def run_program(run, argv):
    (run / "program.json").write_text(json.dumps({"kind": "script", "argv": argv, "cwd": None, "log_format": None}))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "orchestrator.programs", str(run)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=run)


def test_plain_torch_script_is_observed_and_its_exit_code_kept(plain_run):
    run, script = plain_run
    proc = run_program(run, [str(script), "5", "3"])
    assert proc.returncode == 3, proc.stderr
    assert "argv ['5', '3']" in proc.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["loss"] is None and r["grad_norm"] is None and r["tokens_per_s"] > 0 for r in records)
    assert records[0]["lr"] == pytest.approx(0.1)
    assert records[0]["telemetry_source"]["loss"].startswith("null")
    status = json.loads((run / "train_status.json").read_text())
    assert (status["state"], status["exit_code"], status["step"]) == ("failed", 3, 5)


def test_unusable_program_json_exits_2_naming_the_field(plain_run):
    run, _ = plain_run
    proc = run_program(run, [str(run / "missing.py")])
    assert proc.returncode == 2 and "program.argv[0]" in proc.stderr and "Traceback" not in proc.stderr
    (run / "program.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.programs", str(run)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 2 and "program.json" in proc.stderr


class _Stream:
    """A CUDA stream stand-in: its own timeline in ms."""

    def __init__(self, t=0.0):
        self.t = t

    def wait_stream(self, other):
        self.t = max(self.t, other.t)


class _Event:
    def __init__(self, cuda):
        self.cuda, self.t = cuda, None

    def record(self, stream=None):
        self.t = (stream or self.cuda.current).t

    def elapsed_time(self, end):
        return end.t - self.t

    def synchronize(self):
        pass


class _Cuda:
    """Just enough of torch.cuda for devicetime.DeviceClock: streams with timelines, timing events."""

    Stream = _Stream

    def __init__(self):
        self.default = self.current = _Stream()

    def Event(self, enable_timing=True):  # noqa: N802  (torch.cuda.Event)
        return _Event(self)

    def current_stream(self):
        return self.current

    def default_stream(self):
        return self.default


def test_device_clock_counts_overlapped_communication_as_overlapped(monkeypatch):
    """A collective on the compute stream is exposed; one on a side stream is exposed only for the time the
    compute stream waits on that stream afterwards (DeepSpeed's overlap_comm)."""
    from orchestrator.telemetry.comm import CommTimer
    from orchestrator.telemetry.devicetime import DeviceClock

    monkeypatch.setattr(_Stream, "wait_stream", _Stream.wait_stream)     # DeviceClock patches the class
    cuda = _Cuda()
    clock = DeviceClock(CommTimer(), cuda=cuda)
    side = _Stream()
    clock.mark()

    def work(stream, ms):
        def fn():
            stream.t += ms
        return fn

    clock.call("allreduce", "all_reduce", 2, 100, work(cuda.default, 5.0), (), {})   # compute stream: 5 exposed
    for collective_ms, compute_ms in ((8.0, 10.0), (20.0, 5.0)):   # hidden behind compute, then 15 ms not
        side.t = cuda.default.t
        cuda.current = side
        clock.call("allreduce", "all_reduce", 2, 100, work(side, collective_ms), (), {})
        cuda.current = cuda.default
        cuda.default.t += compute_ms
        cuda.default.wait_stream(side)
    step_s, stats = clock.resolve(clock.end_step())
    assert step_s == pytest.approx(0.035)
    assert stats.allreduce_s == pytest.approx(0.033) and stats.allreduce_bytes == 300
    assert stats.allreduce_blocked_s == pytest.approx(0.020)
