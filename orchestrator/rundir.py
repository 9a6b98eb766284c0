"""The run dir: render every file of a Plan, write them atomically, read them back.

``render_run_dir(plan)`` is pure (name -> text). ``write_run_dir`` writes into a temporary sibling
directory and renames it into place, so a failure leaves nothing behind and an existing directory is
only replaced with ``force``. Output is byte-identical across runs: no clocks, sorted JSON keys.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .errors import OrchError, SpecError
from .plan import Plan
from .spec import Spec, parse_spec, spec_to_data

MANIFEST = "manifest.json"
EXECUTABLE = {"launch_local.sh", "launch.sbatch", "launch_pdsh.sh"}


def dump_json(data) -> str:
    """JSON as every orch file writes it: sorted keys, indent 2, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def render_spec_yaml(spec: Spec, header: str) -> str:
    import yaml  # noqa: PLC0415

    body = yaml.safe_dump(spec_to_data(spec), sort_keys=False, default_flow_style=False, width=100)
    return f"{header}\n{body}"


def render_run_dir(plan: Plan) -> dict[str, str]:
    """Every file of the run dir except the manifest, as name -> text."""
    from .render.deepspeed import render_deepspeed_notes, render_ds_config  # noqa: PLC0415
    from .render.megatron import render_megatron_args, render_megatron_config, render_megatron_notes  # noqa: PLC0415
    from .render.scripts import header, render_hostfile, render_local, render_pdsh, render_sbatch  # noqa: PLC0415

    return {
        "ds_config.json": dump_json(render_ds_config(plan)),
        "megatron_args.txt": "\n".join(render_megatron_args(plan)) + "\n",
        "megatron_config.json": dump_json(render_megatron_config(plan)),
        "launch_local.sh": render_local(plan),
        "launch.sbatch": render_sbatch(plan),
        "launch_pdsh.sh": render_pdsh(plan),
        "hostfile": render_hostfile(plan),
        "plan.json": dump_json(plan.plan_record(notes=render_megatron_notes(plan) + render_deepspeed_notes(plan))),
        "spec.resolved.yaml": render_spec_yaml(plan.spec, header(plan)),
    }


def render_manifest(plan: Plan, files: dict[str, str]) -> str:
    return dump_json({
        "orch_version": __version__,
        "spec_name": plan.spec.name,
        "spec_sha256": plan.spec_sha256,
        "files": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(files.items())},
    })


def write_run_dir(plan: Plan, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write the run dir atomically. Refuses an existing directory unless ``force``."""
    out = Path(out_dir)
    if out.exists() and not force:
        raise SpecError(f"{out} already exists (pass --force to replace it)", path=str(out))
    if out.exists() and not out.is_dir():
        raise SpecError(f"{out} exists and is not a directory", path=str(out))
    files = render_run_dir(plan)
    files[MANIFEST] = render_manifest(plan, files)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name, text in files.items():
            path = tmp / name
            path.write_text(text)
            os.chmod(path, 0o755 if name in EXECUTABLE else 0o644)
        os.chmod(tmp, 0o755)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / "d")
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old / "d", out)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class RunDir:
    """A run dir read back: the resolved spec, the plan record, the DeepSpeed config, the manifest."""

    path: Path
    spec: Spec
    plan: dict
    ds_config: dict
    manifest: dict

    @property
    def chosen(self) -> dict:
        return self.plan["chosen"]


def read_run_dir(path: str | Path) -> RunDir:
    """Load a run dir written by orch generate (raises SpecError naming what is missing or broken)."""
    import yaml  # noqa: PLC0415

    root = Path(path)
    if not root.is_dir():
        raise SpecError(f"not a run dir (no such directory)", path=str(root))
    missing = [n for n in ("spec.resolved.yaml", "plan.json", "ds_config.json", MANIFEST) if not (root / n).is_file()]
    if missing:
        raise SpecError(f"not a run dir: missing {', '.join(missing)} (create it with `orch generate`)",
                        path=str(root))
    try:
        spec = parse_spec(yaml.safe_load((root / "spec.resolved.yaml").read_text()))
        plan = json.loads((root / "plan.json").read_text())
        ds_config = json.loads((root / "ds_config.json").read_text())
        manifest = json.loads((root / MANIFEST).read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise OrchError(f"{root}: a run dir file is not valid JSON/YAML: {e}") from None
    return RunDir(path=root, spec=spec, plan=plan, ds_config=ds_config, manifest=manifest)
