"""The run dir: render every file of a Plan, write them atomically, read them back.

``render_run_dir(plan)`` is pure (name -> text). ``write_run_dir`` writes into a temporary sibling
directory and renames it into place, so a failure leaves nothing behind and an existing directory is
only replaced with ``force``. Output is byte-identical across runs: no clocks, sorted JSON keys.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .errors import OrchError, Problem, SpecError, raise_if
from .generate_rules import generate_problems
from .outfiles import temp_prefix, write_error
from .plan import Plan
from .spec import Spec, spec_sha256, spec_to_data
from .spec_loader import parse_spec

MANIFEST = "manifest.json"
PROGRAM_FILE = "program.json"   # orchestrator.programs.PROGRAM_FILE: only for a program kind other than orch
EXECUTABLE = {"launch_local.sh", "launch.sbatch", "launch_pdsh.sh"}
# What every run dir holds besides the manifest; the manifest must list each (an empty list checks nothing).
GENERATED_FILES = ("ds_config.json", "megatron_args.txt", "megatron_config.json", "launch_local.sh", "launch.sbatch",
                   "launch_pdsh.sh", "hostfile", "plan.json", "spec.resolved.yaml")
# Written by `orch generate --plot`, kept out of the manifest: a picture's bytes follow the matplotlib release and
# its fonts, and the manifest stays the same with or without it (the picture is drawn from plan.json, which is hashed).
PICTURES = ("plan.png",)
# Written only by some run dirs, listed in the manifest when present: resume.json (orch resize, generate --resume-from).
OPTIONAL_FILES = ("resume.json",)


def dump_json(data) -> str:
    """JSON as every orch file writes it: sorted keys, indent 2, trailing newline; never NaN or Infinity
    (OrchError, exit 1: the inputs are checked, so one would be a bug)."""
    try:
        return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"
    except ValueError as e:      # NaN or Infinity: never written, so no file claims "nan s/step"
        raise OrchError(f"refusing to write a non-finite number into a generated file ({e}); please report "
                        "this with the spec and the --measured / --calibration files") from None


def render_spec_yaml(spec: Spec, header: str) -> str:
    from .userfiles import dump_yaml  # noqa: PLC0415

    return f"{header}\n{dump_yaml(spec_to_data(spec))}"


def render_run_dir(plan: Plan) -> dict[str, str]:
    """Every file of the run dir except the manifest, as name -> text."""
    from .render.deepspeed import render_deepspeed_notes, render_ds_config  # noqa: PLC0415
    from .render.megatron import render_megatron_args, render_megatron_config, render_megatron_notes  # noqa: PLC0415
    from .render.scripts import header, render_hostfile, render_local, render_pdsh, render_sbatch  # noqa: PLC0415

    from .programs import PROGRAM_FILE  # noqa: PLC0415
    from .programs.argv import render_program  # noqa: PLC0415

    program = render_program(plan)
    return {
        **({PROGRAM_FILE: dump_json(program)} if program is not None else {}),
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
    manifest = {
        "orch_version": __version__,
        "spec_name": plan.spec.name,
        "spec_sha256": plan.spec_sha256,
        "files": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(files.items())},
    }
    if PROGRAM_FILE in files:   # the user's program: recorded, and an edit to it reported (never refused)
        program = json.loads(files[PROGRAM_FILE])
        manifest["program"] = {key: program[key] for key in ("kind", "script_path", "script_sha256")}
    return dump_json(manifest)


def write_run_dir(plan: Plan, out_dir: str | Path, *, force: bool = False, discard_outputs: bool = False,
                  pictures: dict[str, bytes] | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """Write the run dir atomically. An existing directory is refused unless ``force``; even then only a
    run dir orch generated is replaced, never while a job uses it, and never with training outputs or other
    files in it (named in the error) unless ``discard_outputs``. ``pictures``: PICTURES name -> PNG bytes,
    written with the rest and left out of the manifest. ``extra_files``: OPTIONAL_FILES name -> text, listed in the
    manifest."""
    out = Path(out_dir)
    try:
        os.lstat(out)
    except FileNotFoundError:
        pass
    except OSError as e:        # a name too long, a file where a directory should be, ...
        raise write_error(out, e, "--output") from None
    if out.exists() and not force:
        raise SpecError(f"{out} already exists (pass --force to replace it)", path=str(out))
    if out.exists() and not out.is_dir():
        raise SpecError(f"{out} exists and is not a directory", path=str(out))
    if out.exists() and _holds_cwd(out):
        raise SpecError(Problem("--output", f"{out} is the current directory (or one holding it): it cannot be "
                                "replaced while in use", "run orch from another directory (e.g. `cd ..`) and "
                                "name the run dir with -o"))
    raise_if(generate_problems(plan.spec))
    files = render_run_dir(plan)
    files.update(extra_files or {})
    files[MANIFEST] = render_manifest(plan, files)
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out.name), dir=out.parent))
        for name, text in files.items():
            path = tmp / name
            path.write_text(text)
            os.chmod(path, 0o755 if name in EXECUTABLE else 0o644)
        for name, data in (pictures or {}).items():
            (tmp / name).write_bytes(data)
            os.chmod(tmp / name, 0o644)
        os.chmod(tmp, 0o755)
        if force and out.exists():
            _replace(tmp, out, discard_outputs=discard_outputs)
        else:
            _rename_new(tmp, out)
    except OSError as e:        # a full disk, a file-size limit, a name too long: say so, leave nothing
        raise write_error(out, e, "--output") from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _holds_cwd(path: Path) -> bool:
    here, there = Path.cwd().resolve(), path.resolve()
    return here == there or there in here.parents


def _rename_new(tmp: Path, out: Path) -> None:
    """Move into place only if ``out`` is still absent: of two concurrent generates, one wins, one fails."""
    try:
        os.rename(tmp, out)
    except OSError as e:          # ENOTEMPTY / EEXIST: another writer got there first
        raise SpecError(f"{out} was created by someone else meanwhile ({e.strerror}); pass --force to replace "
                        "it", path=str(out)) from None


def _replace(tmp: Path, out: Path, *, discard_outputs: bool) -> None:
    """--force: replace a run dir orch generated, under its lock (no job may be using it)."""
    from .runlock import LOCK_FILE, locked  # noqa: PLC0415

    if not (out / MANIFEST).is_file():
        raise SpecError(Problem(str(out), "not a run dir written by orch (no manifest.json): --force replaces only "
                                "a directory orch generated", "choose a new output directory"))
    with locked(out, f"{out} is in use by a running job or another orch command; --force will not replace it "
                     f"(see `orch status {out}`)"):
        extra = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                       if p.name not in (*GENERATED_FILES, *OPTIONAL_FILES, *PICTURES, PROGRAM_FILE, MANIFEST,
                                         LOCK_FILE))
        if extra and not discard_outputs:
            raise SpecError(Problem(str(out), "--force would delete what orch did not generate: " + ", ".join(extra),
                                    "add --discard-outputs to delete them too, or generate into a new directory"))
        _swap_into_place(tmp, out)


def _swap_into_place(tmp: Path, out: Path) -> None:
    old = Path(tempfile.mkdtemp(prefix=f".{out.name[:40]}.old-", dir=out.parent))
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
    root = Path(path)
    if not root.is_dir():
        raise SpecError(f"not a run dir (no such directory)", path=str(root))
    missing = [n for n in ("spec.resolved.yaml", "plan.json", "ds_config.json", MANIFEST) if not (root / n).is_file()]
    if missing:
        raise SpecError(f"not a run dir: missing {', '.join(missing)} (create it with `orch generate`)",
                        path=str(root))
    from .userfiles import parse_json, parse_yaml, read_user_text  # noqa: PLC0415

    def load(name: str, parse):
        return parse(read_user_text(root / name), str(root / name))

    try:
        spec = parse_spec(load("spec.resolved.yaml", parse_yaml))
    except SpecError as e:
        raise SpecError([dataclasses.replace(p, path=f"{root}/spec.resolved.yaml:{p.path}")
                         if not p.path.startswith(str(root)) else p for p in e.problems]) from None
    plan, ds_config, manifest = (load(n, parse_json) for n in ("plan.json", "ds_config.json", MANIFEST))
    raise_if(run_dir_shape_problems(root, plan, ds_config, manifest))
    return RunDir(path=root, spec=spec, plan=plan, ds_config=ds_config, manifest=manifest)


def run_dir_shape_problems(root: Path, plan, ds_config, manifest) -> list[Problem]:
    """The JSON files hold the shapes orch wrote (objects where objects belong), or a problem each."""
    hint = "orch did not write this: re-generate the run dir with `orch generate`"
    problems = []
    if not isinstance(plan, dict) or not isinstance(plan.get("chosen"), dict):
        problems.append(Problem(f"{root}/plan.json", "must be an object with a 'chosen' layout object", hint))
    if not isinstance(ds_config, dict):
        problems.append(Problem(f"{root}/ds_config.json", "must be a JSON object of DeepSpeed settings", hint))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in manifest["files"].items()):
        problems.append(Problem(f"{root}/{MANIFEST}", "must be an object with a 'files' object of name -> sha256",
                                hint))
    return problems


def manifest_problems(run: RunDir) -> list[Problem]:
    """Every generated file is listed in manifest.json and has the sha256 recorded there; the spec hash
    matches. What `orch validate` reports and `orch launch` refuses to run."""
    listed = run.manifest["files"]
    fix = "re-run `orch generate --force`"
    expected = (*GENERATED_FILES, PROGRAM_FILE) if run.spec.program is not None else GENERATED_FILES
    problems = [Problem(f"{run.path}/{name}", "not listed in manifest.json", fix)
                for name in expected if name not in listed]
    for name, digest in sorted(listed.items()):
        file = run.path / name
        if not file.is_file():
            problems.append(Problem(f"{run.path}/{name}", "listed in manifest.json but missing", fix))
        elif hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            problems.append(Problem(f"{run.path}/{name}", "changed since `orch generate` (sha256 differs "
                                    "from manifest.json)", "change the spec and re-generate instead of "
                                    "editing generated files"))
    if run.manifest.get("spec_sha256") != spec_sha256(run.spec):
        problems.append(Problem(f"{run.path}/{MANIFEST}", "spec_sha256 does not match spec.resolved.yaml", fix))
    return problems


def program_drift(run: RunDir) -> list[str]:
    """Warnings (never refusals: users edit their code) when the program's script changed since generate."""
    from .programs.argv import file_sha256  # noqa: PLC0415

    recorded = run.manifest.get("program")
    if not isinstance(recorded, dict) or not recorded.get("script_path"):
        return []
    path = recorded["script_path"]
    now = file_sha256(path)
    if now is None:
        return [f"program script {path} is missing or unreadable (orch generate read it)"]
    if now != recorded.get("script_sha256"):
        return [f"program script {path} changed since `orch generate` (sha256 {now[:12]}, manifest.json recorded "
                f"{str(recorded.get('script_sha256'))[:12]}): this run uses the edited script"]
    return []
