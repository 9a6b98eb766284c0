"""Property: whatever job.json, straggler.json and .orch.lock hold, `orch status`, `orch cancel` and
`orch launch --dry-run` answer with exit 0, 1 or 2 and a message, never a traceback or a hang (issue 21).

Job ids are kept to values that can name no process here (pid_max is at most 4194304) and no SLURM or pdsh
job can be formed, so a regression in what cancel signals cannot reach anything.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.rundir import write_run_dir
from tests.conftest import fixed_plan, spec_data

PID_MAX_LIMIT = 4194304
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**64) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
IDS = st.sampled_from(["0", "1", "-1", "abc", "", "4194999", "99999999999", " 5", "5 ", "1e3", "--user=root",
                       "12_3", "٣٤٥٦٧٨٩"])
RECORD_KEYS = ["backend", "job_id", "run_dir", "submitted_unix", "log_path", "extra", "extra.start_ticks",
               "extra.boot_id", "extra.cancelled_unix", "extra.run_id", "extra.ssh_port", "bogus"]
RECORD_VALUES = st.one_of(JSON, IDS, st.sampled_from(["local", "pdsh", "nope", "/", "relative/dir"]))
STRAGGLER = {"rank": 1, "host": "h", "spread": 1.5, "since_step": 3, "step": 8, "threshold": 1.2, "window": 5}
STRAGGLER_KEYS = [*STRAGGLER, "bogus"]


def _record(run_dir, mutations) -> dict:
    data = {"backend": "local", "job_id": "4194999", "run_dir": str(run_dir), "submitted_unix": 0.0,
            "log_path": "", "extra": {}}
    for key, value in mutations:
        if key.startswith("extra.") and isinstance(data.get("extra"), dict):
            data["extra"][key.split(".", 1)[1]] = value
        elif not key.startswith("extra."):
            data[key] = value
    job_id = data.get("job_id")
    if data.get("backend") == "slurm" or (isinstance(job_id, str) and job_id.strip().isdigit()
                                          and int(job_id) <= PID_MAX_LIMIT):
        data["job_id"] = "4194999"          # could name a real process or SLURM job: never let it
        data["backend"] = "local"
    if isinstance(data.get("extra"), dict):
        data["extra"].pop("hosts", None)    # never a pdsh record that would ssh somewhere
    return data


def _content(kind: str, value, run_dir, base: dict | None):
    if kind == "bytes":
        return value
    if kind == "json":
        return json.dumps(value).encode()
    if kind == "nested":
        return b"[" * 50000
    data = dict(base or {})
    for key, v in value:
        data[key] = v
    return json.dumps(data, allow_nan=True).encode()


def _place(path, kind: str, content: bytes | None, target) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "absent":
        return
    if kind == "file":
        path.write_bytes(content or b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target.write_bytes(content or b"")
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)


def _orch(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run_dir(fixed_plan(spec_data()), tmp_path_factory.mktemp("prop") / "run")


FILE_KINDS = st.sampled_from(["absent", "file", "file", "file", "directory", "symlink", "fifo"])
JOB = st.one_of(st.tuples(st.just("bytes"), st.binary(max_size=40)), st.tuples(st.just("json"), JSON),
                st.tuples(st.just("nested"), st.none()),
                st.tuples(st.just("record"), st.lists(st.tuples(st.sampled_from(RECORD_KEYS), RECORD_VALUES),
                                                      max_size=4)))
STRAGGLERS = st.one_of(st.tuples(st.just("bytes"), st.binary(max_size=40)), st.tuples(st.just("json"), JSON),
                       st.tuples(st.just("fields"), st.lists(st.tuples(st.sampled_from(STRAGGLER_KEYS), JSON),
                                                             max_size=3)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_kind=FILE_KINDS, job=JOB, straggler_kind=FILE_KINDS, straggler=STRAGGLERS,
       lock_kind=st.sampled_from(["absent", "file", "directory", "symlink", "fifo"]))
def test_status_cancel_and_dry_run_never_crash(run_dir, job_kind, job, straggler_kind, straggler, lock_kind):
    kind, value = job
    job_bytes = (json.dumps(_record(run_dir, value)).encode() if kind == "record"
                 else _content(kind, value, run_dir, None))
    _place(run_dir / "job.json", job_kind, job_bytes, run_dir.parent / "job-target")
    _place(run_dir / "straggler.json", straggler_kind, _content(*straggler, run_dir, STRAGGLER),
           run_dir.parent / "straggler-target")
    _place(run_dir / ".orch.lock", lock_kind, b"", run_dir.parent / "lock-target")
    for argv in (("status", str(run_dir)), ("status", str(run_dir), "--json"), ("cancel", str(run_dir)),
                 ("launch", str(run_dir), "--dry-run")):
        code, err = _orch(*argv)
        assert code in (0, 1, 2), (argv, code, err)
        assert "Traceback" not in err, (argv, err)
        if code == 2:
            assert err.startswith("error:"), (argv, err)
