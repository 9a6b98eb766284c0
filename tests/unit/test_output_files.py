"""Files orch writes (issue 21): calib.json, a starter spec, a run dir, metrics.jsonl and wandb_run_id are
never written through a link or onto a device node, FIFO or directory; an existing file is replaced only
with --force; a full disk, a file-size limit or an over-long name is a clean error that leaves no
temporary file. Device nodes and FIFOs are made under tmp_path (never the system's own), the full disk is
a 64 KiB tmpfs mounted in a private mount namespace."""
from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.telemetry.sinks import JsonlSink, read_metrics
from orchestrator.telemetry.wandb_sink import RUN_ID_FILE, _run_id
from tests.conftest import EXAMPLES, spec_data
from tests.unit.test_checkpoint_fallback import _record

ORCH = str(Path(sys.executable).parent / "orch")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and mount need root")


def orch(*argv, cwd=None, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=cwd,
                          preexec_fn=preexec_fn)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two measured runs (calibrate needs more layouts than terms it fits: one suffices with warnings)."""
    from tests.unit.compare_support import make_run_dir, steady

    root = tmp_path_factory.mktemp("runs")
    return [make_run_dir(root / "a", steady(12, 0.5)),
            make_run_dir(root / "b", steady(12, 0.4), **{"parallelism.micro_batch_size": 1})]


def _calibrate(runs, out, *extra):
    return orch("calibrate", *runs, "-o", out, *extra)


def _init(out, *extra, **kw):
    return orch("init", "-o", out, *extra, **kw)


# --- calibrate -o / init -o -------------------------------------------------------------------------------

def test_calibrate_refuses_an_existing_file_without_force(runs, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("my spec\n")
    proc = _calibrate(runs, spec)
    assert proc.returncode == 2 and "already exists" in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert spec.read_text() == "my spec\n"
    proc = _calibrate(runs, spec, "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(spec.read_text())["calibration_version"] == 1


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _device(path: Path) -> Path:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))    # a null device of our own, in tmp_path
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _link_to_fifo(path: Path) -> Path:
    path.symlink_to(_fifo(path.with_name("fifo")))
    return path


TARGETS = [pytest.param(_fifo, "is a FIFO", id="FIFO"),
           pytest.param(_directory, "is a directory", id="directory"),
           pytest.param(_link_to_fifo, "is a symlink to a FIFO", id="link to a FIFO"),
           pytest.param(_device, "is a character device", id="device", marks=ROOT_ONLY)]


@pytest.mark.parametrize("make, says", TARGETS)
@pytest.mark.parametrize("command", ["calibrate", "init"])
def test_a_non_regular_target_is_refused_even_with_force(runs, tmp_path, make, says, command):
    target = make(tmp_path / "out")
    kind = stat.S_IFMT(os.lstat(target).st_mode)
    proc = _calibrate(runs, target, "--force") if command == "calibrate" else _init(target, "--force")
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert stat.S_IFMT(os.lstat(target).st_mode) == kind          # still what it was: nothing replaced
    assert _leftovers(tmp_path, {"out", "fifo"}) == []


def test_init_force_replaces_a_regular_file_and_a_link_only_replaces_the_link(tmp_path):
    target, other = tmp_path / "spec.yaml", tmp_path / "other.yaml"
    target.write_text("old\n")
    assert _init(target).returncode == 2 and target.read_text() == "old\n"
    assert _init(target, "--force").returncode == 0 and "model:" in target.read_text()
    other.write_text("keep\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(other)
    assert _init(link, "--force").returncode == 0
    assert not link.is_symlink() and "model:" in link.read_text() and other.read_text() == "keep\n"


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_a_name_too_long_is_a_clean_error(runs, tmp_path):
    name = "x" * 300
    for proc in (_init(tmp_path / f"{name}.yaml"), _calibrate(runs, tmp_path / f"{name}.json"),
                 orch("generate", EXAMPLES / "tiny-gpt-cpu.yaml", "-o", tmp_path / name)):
        assert proc.returncode == 2 and "File name too long" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert _leftovers(tmp_path, set()) == []


def _file_size_limit(limit_bytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def test_a_file_size_limit_is_a_clean_error_and_leaves_no_temporary_file(runs, tmp_path):
    limit = _file_size_limit(200)        # smaller than a starter spec, a calib.json and ds_config.json
    for proc in (_init(tmp_path / "spec.yaml", preexec_fn=limit),
                 orch("calibrate", *runs, "-o", tmp_path / "calib.json", preexec_fn=limit),
                 orch("generate", EXAMPLES / "tiny-gpt-cpu.yaml", "-o", tmp_path / "run", preexec_fn=limit)):
        assert proc.returncode == 1 and "File too large" in proc.stderr and "nothing was written" in proc.stderr, \
            proc.stderr
        assert "Traceback" not in proc.stderr
    assert _leftovers(tmp_path, set()) == []


@ROOT_ONLY
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_a_full_disk_is_a_clean_error_and_leaves_no_temporary_file(runs, tmp_path):
    """A 64 KiB tmpfs, filled up, in a mount namespace of its own (gone when the shell exits)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    spec = EXAMPLES / "tiny-gpt-cpu.yaml"
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} || exit 99; head -c 1000000 /dev/zero > {disk}/fill; "
              f"{ORCH} init -o {disk}/spec.yaml; echo init=$?; {ORCH} calibrate {runs[0]} {runs[1]} -o "
              f"{disk}/calib.json; echo calibrate=$?; {ORCH} generate {spec} -o {disk}/run; echo generate=$?; "
              f"echo left:; ls -A {disk}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180)
    if "mount:" in proc.stderr and proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert "init=1" in proc.stdout and "calibrate=1" in proc.stdout and "generate=1" in proc.stdout, \
        proc.stdout + proc.stderr
    assert proc.stderr.count("No space left on device; nothing was written") == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.split("left:\n", 1)[1].split() == ["fill"]


# --- generate -o ------------------------------------------------------------------------------------------

def test_generate_into_the_current_directory_with_force_is_refused_cleanly(tmp_path):
    run = tmp_path / "run"
    assert orch("generate", EXAMPLES / "tiny-gpt-cpu.yaml", "-o", run).returncode == 0
    (run / "sub").mkdir()
    before = sorted(p.name for p in run.iterdir())
    for target, cwd in ((".", run), ("..", run / "sub")):
        proc = orch("generate", EXAMPLES / "tiny-gpt-cpu.yaml", "-o", target, "--force", "--discard-outputs", cwd=cwd)
        assert proc.returncode == 2 and "is the current directory" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "EBUSY" not in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]            # no ..old-* / .tmp-* left anywhere


def test_force_discard_outputs_never_replaces_a_directory_orch_did_not_write(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data()))
    proc = orch("generate", spec, "-o", mine, "--force", "--discard-outputs")
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr, proc.stderr
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "spec.yaml"]


# --- metrics.jsonl and wandb_run_id -----------------------------------------------------------------------

def test_metrics_swapped_for_a_symlink_mid_run_is_not_written_through(tmp_path):
    path, outside, warnings = tmp_path / "metrics.jsonl", tmp_path / "outside.txt", []
    outside.write_text("someone else's file\n")
    sink = JsonlSink(path, warn=warnings.append)
    sink.write(_record(1))
    path.unlink()
    path.symlink_to(outside)
    for step in (2, 3):
        sink.write(_record(step))
    sink.close()
    assert outside.read_text() == "someone else's file\n"
    assert not path.is_symlink() and [r["step"] for r in read_metrics(path)] == [2, 3]
    assert len(warnings) == 1 and "was a symlink (to " in warnings[0] and "nothing was written through" in warnings[0]


def test_metrics_as_a_symlink_at_start_or_a_fifo_mid_run_never_hangs_or_leaks(tmp_path):
    path, outside, warnings = tmp_path / "metrics.jsonl", tmp_path / "outside.txt", []
    outside.write_text("x\n")
    path.symlink_to(outside)
    sink = JsonlSink(path, warn=warnings.append)
    sink.write(_record(1))
    path.unlink()
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # so that a sink opening it fails the test, not hangs
    sink.write(_record(2))
    sink.write(_record(3))
    assert os.read(reader, 4096) == b""                  # nothing went into the FIFO
    os.close(reader)
    path.unlink()
    sink.write(_record(4))
    sink.close()
    assert outside.read_text() == "x\n" and [r["step"] for r in read_metrics(path)] == [4]
    assert "was a symlink" in warnings[0] and "not a regular file" in warnings[1] and len(warnings) == 2


@pytest.mark.parametrize("content", ["../../etc", "a" * 65, "id with space", "", "\xff"])
def test_an_unusable_wandb_run_id_is_replaced_not_used(tmp_path, content, capsys):
    (tmp_path / RUN_ID_FILE).write_text(content + "\n", errors="surrogateescape")
    run_id = _run_id(tmp_path)
    assert run_id != content.strip() and len(run_id) == 8 and run_id.isalnum()
    assert (tmp_path / RUN_ID_FILE).read_text() == run_id + "\n"
    assert _run_id(tmp_path) == run_id                                  # kept for a resumed job


def test_wandb_run_id_is_never_read_through_a_symlink(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_text("topsecret1\n")
    (tmp_path / RUN_ID_FILE).symlink_to(secret)
    run_id = _run_id(tmp_path)
    assert run_id != "topsecret1" and secret.read_text() == "topsecret1\n"
    assert not (tmp_path / RUN_ID_FILE).is_symlink()
    assert "not a regular file holding a W&B run id" in capsys.readouterr().err


def test_run_dir_files_are_replaced_without_writing_through_a_planted_link(tmp_path):
    """train_status.json, latest, the checkpoint manifest and wandb_run_id go through a temporary file:
    a link planted under its name (or at the file itself) is replaced, its target never written."""
    from orchestrator.train.checkpoint import write_latest
    from orchestrator.train.trainer import write_json

    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    (tmp_path / ".train_status.json.tmp").symlink_to(outside)
    (tmp_path / "latest").symlink_to(outside)
    write_json(tmp_path / "train_status.json", {"state": "finished"})
    write_latest(tmp_path, 4)
    assert outside.read_text() == "keep\n"
    assert json.loads((tmp_path / "train_status.json").read_text()) == {"state": "finished"}
    assert not (tmp_path / "latest").is_symlink() and (tmp_path / "latest").read_text() == "global_step4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "outside", "train_status.json"]
