"""Checkpoints load only what the run wrote (issue 21): every shard's size and sha256 are recorded when it
is written and checked before anything is unpickled; a stale shard of another step, an extra (planted)
file, a same-size overwrite of a non-torch file and a truncated one are each refused with their own
reason. Real torch archives and real run dirs; no process group."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.launch.run import already_trained
from orchestrator.rundir import read_run_dir, write_run_dir
from orchestrator.train import checkpoint
from orchestrator.validate.rundir import validate_run_dir
from tests.conftest import fixed_plan, spec_data

torch = pytest.importorskip("torch")
ORCH = str(Path(sys.executable).parent / "orch")


def _save(ckpt: Path, step: int) -> Path:
    step_dir = ckpt / checkpoint.tag_for(step)
    step_dir.mkdir(parents=True)
    for rank in range(2):
        torch.save({"w": torch.arange(1000.0) * step, "rank": rank}, step_dir / f"shard_{rank}.pt")
    (step_dir / "extra_state.bin").write_bytes(bytes(range(256)) * 8)     # a shard that is not a zip
    assert checkpoint.write_manifest(ckpt, step) is None
    checkpoint.write_latest(ckpt, step)
    return step_dir


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "checkpoints"
    for step in (5, 10):
        _save(path, step)
    return path


def test_the_manifest_records_size_and_sha256_of_every_shard(ckpt):
    import hashlib

    manifest = json.loads((ckpt / "global_step10" / checkpoint.CHECKPOINT_MANIFEST).read_text())
    assert set(manifest["files"]) == set(manifest["sha256"]) == {"shard_0.pt", "shard_1.pt", "extra_state.bin"}
    shard = ckpt / "global_step10" / "shard_1.pt"
    assert manifest["files"]["shard_1.pt"] == shard.stat().st_size
    assert manifest["sha256"]["shard_1.pt"] == hashlib.sha256(shard.read_bytes()).hexdigest()


def _problem(ckpt) -> str:
    choice = checkpoint.resume_choice(ckpt)
    assert choice.step == 5 and [s for s, _ in choice.unusable] == [10], choice
    return choice.unusable[0][1]


def test_a_stale_shard_of_another_step_with_the_same_size_is_refused(ckpt):
    stale, fresh = ckpt / "global_step5" / "shard_0.pt", ckpt / "global_step10" / "shard_0.pt"
    assert stale.stat().st_size == fresh.stat().st_size            # a valid torch archive, CRCs intact
    fresh.write_bytes(stale.read_bytes())
    assert "shard_0.pt's sha256 differs" in _problem(ckpt)


class _Payload:
    def __reduce__(self):
        return (print, ("PLANTED CODE RAN",))


def test_a_planted_file_the_run_did_not_write_is_refused_unread(ckpt):
    with open(ckpt / "global_step10" / "zz_planted_optim_states.pt", "wb") as f:
        pickle.dump(_Payload(), f)
    assert "zz_planted_optim_states.pt is not among the files the run wrote" in _problem(ckpt)


def test_a_same_size_overwrite_of_a_non_torch_shard_is_refused_by_its_digest(ckpt):
    path = ckpt / "global_step10" / "extra_state.bin"
    data = bytearray(path.read_bytes())
    data[100:164] = b"\x00" * 64
    path.write_bytes(bytes(data))
    assert "extra_state.bin's sha256 differs" in _problem(ckpt)


def test_a_truncated_non_torch_shard_is_refused_by_its_size(ckpt):
    """Not a zip, so no CRC catches it: the size check names the bytes (its own message, so that a
    verification without the size check fails this test)."""
    path = ckpt / "global_step10" / "extra_state.bin"
    path.write_bytes(path.read_bytes()[:1000])
    assert "extra_state.bin has 1000 bytes, 2048 were written" in _problem(ckpt)


def test_a_symlinked_shard_is_refused_even_with_the_same_bytes(ckpt, tmp_path):
    shard = ckpt / "global_step10" / "shard_1.pt"
    outside = tmp_path / "outside.pt"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    assert "shard_1.pt is not a regular file" in _problem(ckpt)


def test_a_manifest_from_an_older_orch_without_digests_is_not_trusted(ckpt):
    path = ckpt / "global_step10" / checkpoint.CHECKPOINT_MANIFEST
    data = json.loads(path.read_text())
    del data["sha256"]
    path.write_text(json.dumps(data))
    assert "records no sha256" in _problem(ckpt)


def test_loading_a_state_of_another_step_is_refused():
    assert checkpoint.checked_step(10, Path("c/global_step10"), 10) == 10
    with pytest.raises(RuntimeError, match="holds the state of step 5, not of step 10"):
        checkpoint.checked_step(5, Path("c/global_step10"), 10)


# --- a run dir: orch validate and orch launch -------------------------------------------------------------

def _run_dir(tmp_path, **overrides) -> Path:
    return write_run_dir(fixed_plan(spec_data(**overrides)), tmp_path / "run")   # train_iters 10


def test_validate_reports_a_checkpoint_whose_digest_does_not_match(tmp_path):
    from orchestrator.plan import build_plan
    from orchestrator.spec_loader import parse_spec

    run = write_run_dir(build_plan(parse_spec(spec_data())), tmp_path / "run")
    _save(run / "checkpoints", 5)
    assert validate_run_dir(run, deep=False) == []
    shard = run / "checkpoints" / "global_step5" / "extra_state.bin"
    shard.write_bytes(bytes(reversed(shard.read_bytes())))
    proc = subprocess.run([ORCH, "validate", str(run), "--static"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "global_step5: checkpoint does not verify: extra_state.bin's sha256 differs" in proc.stdout + proc.stderr


@pytest.mark.parametrize("corrupt", ["truncate", "garbage"])
def test_a_corrupt_final_checkpoint_is_not_already_trained(tmp_path, corrupt):
    run = _run_dir(tmp_path)
    for step in (5, 10):
        _save(run / "checkpoints", step)
    notes = []
    assert "is already trained" in already_trained(read_run_dir(run), notes.append) and notes == []
    shard = run / "checkpoints" / "global_step10" / "shard_1.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2] if corrupt == "truncate" else b"\x00" * len(data))
    assert already_trained(read_run_dir(run), notes.append) is None
    assert len(notes) == 1 and "global_step10 is unusable" in notes[0] and "resume from global_step5" in notes[0]


def test_a_corrupt_only_checkpoint_of_the_last_step_says_it_starts_over(tmp_path):
    run = _run_dir(tmp_path)
    _save(run / "checkpoints", 10)
    (run / "checkpoints" / "global_step10" / "shard_0.pt").write_bytes(b"junk")
    notes = []
    assert already_trained(read_run_dir(run), notes.append) is None
    assert "step 0 (no checkpoint verifies)" in notes[0]


# --- where checkpoints may live ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["/data/ckpt", "../../shared", "checkpoints/../../x", ".", ""])
def test_a_checkpoint_dir_outside_the_run_dir_is_a_spec_error(tmp_path, value):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data(**{"training.checkpoint.dir": value})))
    for argv in (["validate", str(spec)], ["generate", str(spec), "-o", str(tmp_path / "run")]):
        proc = subprocess.run([ORCH, *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "training.checkpoint.dir" in proc.stdout + proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def _launch(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, "launch", str(run)], capture_output=True, text=True, timeout=120)


def test_a_symlinked_checkpoint_dir_leading_out_of_the_run_dir_is_refused_before_launch(tmp_path):
    run = _run_dir(tmp_path, **{"training.checkpoint.dir": "ckpt/inner"})
    (tmp_path / "elsewhere").mkdir()
    (run / "ckpt").symlink_to(tmp_path / "elsewhere")
    proc = _launch(run)
    assert proc.returncode == 2 and "training.checkpoint.dir" in proc.stderr and "out of the run dir" in proc.stderr
    assert not (run / "job.json").exists() and not (run / "logs").exists()
    problems = validate_run_dir(run, deep=False)
    assert any(p.path == "training.checkpoint.dir" for p in problems)


def test_a_file_named_like_the_checkpoint_dir_is_refused_before_launch(tmp_path):
    run = _run_dir(tmp_path)
    (run / "checkpoints").write_text("not a directory")
    proc = _launch(run)
    assert proc.returncode == 2, proc.stderr
    assert "training.checkpoint.dir" in proc.stderr and "exists and is not a directory" in proc.stderr
    assert not (run / "job.json").exists() and (run / "checkpoints").read_text() == "not a directory"
