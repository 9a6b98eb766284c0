"""The wheel carries templates/ and schemas/: build it, install it (non-editable) in a fresh venv, generate."""
from __future__ import annotations

import subprocess
import sys
import venv

import pytest

from tests.conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.integration


def test_wheel_installs_and_generates(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True)
    [wheel] = dist.glob("orch-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "orchestrator/templates/local.sh.j2" in names and "orchestrator/schemas/spec.schema.json" in names
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # a fresh, empty venv: orch and its install deps only
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", str(wheel)],
                   check=True, capture_output=True, text=True)
    where = subprocess.run([str(py), "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=tmp_path,
                           check=True, capture_output=True, text=True).stdout
    assert str(env_dir) in where, f"orch was not imported from the wheel: {where}"
    out = tmp_path / "run"
    result = subprocess.run([str(env_dir / "bin" / "orch"), "generate", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "-o",
                             str(out)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (out / "launch_local.sh").is_file() and (out / "ds_config.json").is_file()
    init = subprocess.run([str(env_dir / "bin" / "orch"), "init"], cwd=tmp_path, capture_output=True, text=True)
    assert init.returncode == 0 and "orchestrator/schemas/spec.schema.json" in init.stdout
