"""Packaging: every sub-package is listed, templates and schemas ship, schemas are fresh, CLI stays light."""
from __future__ import annotations

import configparser
import json
import subprocess
import sys

from orchestrator.schemas_export import REGENERATE, stale_files
from tests.conftest import ROOT
from tests.deadlines import scaled_s

HEAVY = ("torch", "deepspeed", "megatron", "wandb", "matplotlib")


def test_every_subpackage_is_listed_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "orchestrator").rglob("__init__.py")}
    assert on_disk <= listed, f"add to setup.cfg [options] packages: {sorted(on_disk - listed)}"
    assert {"orchestrator.templates", "orchestrator.schemas"} <= listed


def test_schemas_are_fresh():
    stale = stale_files()
    assert not stale, f"stale: {stale}; regenerate with: {REGENERATE}"


def test_spec_schema_is_a_valid_schema_that_accepts_the_examples():
    import jsonschema
    import yaml

    schema = json.loads((ROOT / "schemas" / "spec.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    for example in examples:
        jsonschema.validate(yaml.safe_load(example.read_text()), schema)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_fast_paths_import_no_training_stack(tmp_path):
    out = tmp_path / "run"
    code = ("from orchestrator.cli import main\n"
            "for argv in (['--help'], ['validate', '--static', 'examples/tiny-gpt-cpu.yaml'], ['init'],\n"
            "             ['plan', 'examples/llama3-8b-64xh100.yaml', '--json'],\n"
            f"             ['generate', 'examples/tiny-gpt-cpu.yaml', '-o', {str(out)!r}],\n"
            "             ['launch', " + repr(str(out)) + ", '--dry-run']):\n"
            "    try: main(argv)\n"
            "    except SystemExit as e: assert e.code == 0, (argv, e.code)")
    loaded = _modules_after(code)
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]


def test_makefile_finds_a_python_of_at_least_3_10(tmp_path):
    """Not a hard-coded python3.11: the first interpreter >= 3.10 on PATH (here a too-old python3.11 is
    skipped for python3.12), and a clear message when there is none."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    old = bin_dir / "python3.11"
    old.write_text("#!/bin/sh\nexit 1\n")           # fails the version check, as a Python 3.9 would
    old.chmod(0o755)
    (bin_dir / "python3.12").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("PYTHON", None)
    proc = subprocess.run(["make", "-n", "-B", "venv", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=scaled_s(60))
    assert proc.returncode == 0, proc.stderr
    assert f"python3.12 -m venv {tmp_path / 'venv'}" in proc.stdout
    none = subprocess.run(["make", "-B", "venv", "PYTHON=", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=scaled_s(60))
    assert none.returncode != 0 and "make PYTHON=/path/to/python3.x" in none.stderr
    assert not (tmp_path / "venv").exists()


def test_readme_command_table_lists_every_command_and_option():
    """The README's command table names every `orch` command, docs/commands.md's table every command and each
    of its options; no --help points at a file the repository does not have."""
    import re

    import click

    from orchestrator.cli import COMMANDS, cli

    readme = (ROOT / "README.md").read_text()
    short = readme[readme.index("| command | does |"):readme.index("Every command has `--help`.")]
    reference = (ROOT / "docs" / "commands.md").read_text()
    table = reference[reference.index("| command | does | exit |"):reference.index("Every command has `--help`.")]
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert f"`orch {name}" in short, f"README command table: add orch {name}"
        assert f"`orch {name}" in table, f"docs/commands.md command table: add orch {name}"
        for param in [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]:
            assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", table) for o in param.opts), \
                f"docs/commands.md command table: add orch {name} {param.opts[-1]}"
        help_text = command.get_help(click.Context(command, info_name=name))
        for ref in re.findall(r"\b[A-Z][A-Za-z_-]*\.md\b", help_text):
            assert (ROOT / ref).exists(), f"orch {name} --help points at {ref}, which the repository lacks"
