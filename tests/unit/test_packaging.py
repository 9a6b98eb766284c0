"""Packaging: every sub-package is listed, templates and schemas ship, schemas are fresh, CLI stays light."""
from __future__ import annotations

import configparser
import json
import subprocess
import sys

from orchestrator.schemas_export import REGENERATE, stale_files
from tests.conftest import ROOT

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
