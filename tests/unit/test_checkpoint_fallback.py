"""Checkpoints verified when written, the newest intact one chosen on resume (issue 13), and metrics.jsonl
that survives garbage and deletion. Real torch archives; no process group needed."""
from __future__ import annotations

import json

import pytest

from orchestrator.telemetry.record import MetricsRecord
from orchestrator.telemetry.sinks import JsonlSink, read_metrics, truncate_metrics
from orchestrator.train import checkpoint

torch = pytest.importorskip("torch")


def _save(ckpt, step: int, *, manifest: bool = True, latest: bool = True) -> None:
    step_dir = ckpt / checkpoint.tag_for(step)
    step_dir.mkdir(parents=True)
    for rank in range(2):
        torch.save({"w": torch.arange(1000.0) * step, "rank": rank}, step_dir / f"shard_{rank}.pt")
    if manifest:
        assert checkpoint.write_manifest(ckpt, step) is None
    if latest:
        checkpoint.write_latest(ckpt, step)


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "checkpoints"
    for step in (4, 8, 12):
        _save(path, step)
    return path


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\x00" * 64     # same size, content overwritten
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated shard": lambda c: _truncate(c / "global_step12" / "shard_1.pt"),
    "empty shard": lambda c: (c / "global_step12" / "shard_0.pt").write_bytes(b""),
    "garbage shard": lambda c: _garbage(c / "global_step12" / "shard_1.pt"),
    "deleted shard": lambda c: (c / "global_step12" / "shard_1.pt").unlink(),
    "killed while saving": lambda c: ((c / "global_step12" / checkpoint.CHECKPOINT_MANIFEST).unlink(),
                                      checkpoint.write_latest(c, 8)),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(ckpt, corrupt):
    assert checkpoint.resume_choice(ckpt).step == 12
    corrupt(ckpt)
    choice = checkpoint.resume_choice(ckpt)
    assert choice.step == 8 and [step for step, _ in choice.unusable] == [12]


@pytest.mark.parametrize("latest", [b"\xff\xfegarbage", b"global_step99", b"", b"global_step4"])
def test_latest_pointer_garbage_dangling_or_old_does_not_decide(ckpt, latest):
    (ckpt / checkpoint.LATEST).write_bytes(latest)
    assert checkpoint.resume_choice(ckpt).step == 12


def test_a_deleted_step_dir_resumes_from_the_previous_one(ckpt):
    import shutil

    shutil.rmtree(ckpt / "global_step12")        # latest now dangles
    assert checkpoint.latest_step(ckpt) is None
    assert checkpoint.resume_choice(ckpt).step == 8


def test_nothing_intact_starts_over_and_unusable_dirs_are_set_aside_not_deleted(ckpt):
    for step in (4, 8, 12):
        (ckpt / checkpoint.tag_for(step) / "shard_0.pt").write_bytes(b"junk")
    choice = checkpoint.resume_choice(ckpt)
    assert choice.step is None and [s for s, _ in choice.unusable] == [12, 8, 4]
    moved = checkpoint.set_aside(ckpt, [12])
    assert moved[0].name.startswith("global_step12.unusable-") and (moved[0] / "shard_1.pt").is_file()
    assert checkpoint.saved_steps(ckpt) == [8, 4]


def test_a_checkpoint_without_a_manifest_is_never_loaded_even_where_latest_points(tmp_path):
    ckpt = tmp_path / "c"
    _save(ckpt, 4)
    _save(ckpt, 8, manifest=False)                # latest names it, but nothing vouches for its files
    choice = checkpoint.resume_choice(ckpt)
    assert choice.step == 4 and "no orch_checkpoint.json" in choice.unusable[0][1]


def test_a_manifest_whose_files_is_not_a_mapping_is_unreadable_even_under_python_O(ckpt):
    """The check is not an assert: `python -O` (asserts stripped) must still refuse it, not crash."""
    import subprocess
    import sys

    (ckpt / checkpoint.tag_for(12) / checkpoint.CHECKPOINT_MANIFEST).write_text('{"step": 12, "files": ["x"]}')
    code = ("import sys; from orchestrator.train import checkpoint; "
            "print(checkpoint.step_problem(sys.argv[1], 12))")
    out = subprocess.run([sys.executable, "-O", "-c", code, str(ckpt)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "is unreadable" in out.stdout


def test_verification_at_write_refuses_a_bad_file(tmp_path):
    ckpt = tmp_path / "c"
    _save(ckpt, 4, manifest=False)
    _truncate(ckpt / "global_step4" / "shard_0.pt")
    assert "shard_0.pt" in checkpoint.write_manifest(ckpt, 4)
    assert not (ckpt / "global_step4" / checkpoint.CHECKPOINT_MANIFEST).exists()


# --- metrics.jsonl -----------------------------------------------------------------------------------------

def _record(step: int) -> MetricsRecord:
    import dataclasses

    values = {f.name: 0.0 for f in dataclasses.fields(MetricsRecord)}
    return MetricsRecord(**{**values, "step": step, "loss": float(step)})


GARBAGE = b'\xff\xfe\x00not utf-8\n[1, 2]\n"step"\n7\n{"step": "3"}\n{"step": true}\n{"step": 2, "loss": 9}\n' \
          b'{"step": ' + b"9" * 5000 + b'}\n{"step": 5, "lo'


def test_garbage_in_metrics_never_blocks_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(json.dumps({"step": s, "loss": float(s)}).encode() + b"\n" for s in (1, 2, 3, 4))
                     + GARBAGE)
    assert [r["step"] for r in read_metrics(path) if isinstance(r.get("step"), int)][:4] == [1, 2, 3, 4]
    dropped = truncate_metrics(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert dropped == 1 + 9   # step 4, and the 9 garbage / repeated / torn lines


def test_sink_starts_on_a_fresh_line_after_a_torn_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\xff{"step": 2, "lo')
    sink = JsonlSink(path)
    sink.write(_record(2))
    sink.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_metrics_deleted_mid_run_is_recreated_and_reported(tmp_path):
    path, warnings = tmp_path / "metrics.jsonl", []
    sink = JsonlSink(path, warn=warnings.append)
    sink.write(_record(1))
    path.unlink()
    sink.write(_record(2))
    sink.write(_record(3))
    sink.close()
    assert [r["step"] for r in read_metrics(path)] == [2, 3]
    assert len(warnings) == 1 and "deleted or replaced" in warnings[0] and "step 2" in warnings[0]


def test_the_wait_follower_skips_garbage(tmp_path):
    from orchestrator.launch.progress import follow

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "time_unix": 1}\n' + GARBAGE + b'\n{"step": 2, "loss": "x"}\n'
                     b'{"step": 2, "time_unix": 2}\n')
    assert [r["step"] for r in follow(path, lambda: True)] == [1, 2, 2]
