"""``python -m orchestrator.programs RUN_DIR``: run the user's program of a run dir on this rank, observed.

Reads RUN_DIR/program.json ({kind, argv, cwd, log_format, script_path, script_sha256}; ``{run_dir}`` in any
argv element is the run dir), installs the telemetry wrapper (orchestrator/telemetry/wrapper.py) in this
interpreter before the program imports anything (a script given program.load_arg also gets the checkpoint this
start resumes from: orchestrator/programs/resume.py), then runs argv[0] as ``__main__`` with sys.argv = argv, as
``python argv[0] argv[1:]`` would (its directory first on sys.path, in ``cwd`` when set). The program's exit
code is this process's; a signal that would have ended it still does.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from . import PROGRAM_FILE, load_program as read_program, substitute_run_dir
from ..train.ops import use_interpreter_tools

EXIT_USAGE = 2


def load_program(run_dir: Path) -> dict:
    """program.json with ``{run_dir}`` substituted; SystemExit(2) naming the problem when it is unusable."""
    path = run_dir / PROGRAM_FILE
    try:
        program = read_program(run_dir)
    except (OSError, ValueError) as e:
        raise SystemExit(f"orch-program: error: {path}: {e}; write the run dir with `orch generate` from a spec "
                         "with a `program:` section") from None
    argv = program.get("argv") if isinstance(program, dict) else None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise SystemExit(f"orch-program: error: {path}: 'argv' must be a non-empty list of strings")
    program["argv"] = substitute_run_dir(argv, run_dir)
    if program.get("kind") == "megatron-lm":    # a resized run loads its own checkpoint once it has one
        from ..resize_megatron import start_argv  # noqa: PLC0415

        program["argv"] = start_argv(run_dir, program["argv"])
    if not Path(program["argv"][0]).is_file():
        raise SystemExit(f"orch-program: error: program.argv[0]: {program['argv'][0]} is not a file; fix "
                         "program.path in the spec and run `orch generate` again")
    return program


def plan_start(run_dir: Path, program: dict):
    """(the RunDir, this start's Start): a script with program.load_arg resumes from the run's own checkpoint or a
    resized run's converted one (orchestrator.programs.resume), its argv in ``program`` extended to load it.
    SystemExit(2) naming the fix when a resized run's converted checkpoint is not there."""
    from ..errors import OrchError  # noqa: PLC0415
    from ..rundir import read_run_dir  # noqa: PLC0415
    from .resume import Start, start_argv, start_of  # noqa: PLC0415

    run = read_run_dir(run_dir)
    if program.get("kind") == "megatron-lm":     # numbered from the iteration Megatron-LM resumes after
        from ..resize_megatron import start_iteration  # noqa: PLC0415

        step = start_iteration(program["argv"][1:], Path(program.get("cwd") or "."))
        return run, Start(step=step, why=f"resumes after iteration {step}" if step else "starts from step 0")
    if program.get("kind") != "script" or run.spec.program is None:
        return run, Start()
    try:
        start = start_of(run_dir, run.spec)
    except OrchError as e:
        raise SystemExit(f"orch-program: error: {e}") from None
    program["argv"] = start_argv(program["argv"], run.spec.program, start, run_dir)
    if start.load_dir is not None and os.environ.get("RANK", "0") == "0":
        print(f"[orch-program] {start.why}: {run.spec.program.load_arg} {start.load_dir}"
              + (f", {run.spec.program.ds_config_arg} {start.ds_config}" if start.ds_config else ""),
              file=sys.stderr, flush=True)
    return run, start


def install_telemetry(run_dir: Path, program: dict, run=None, start_step: int = 0):
    """The wrapper, installed in this interpreter for the run dir (torch is imported here, after the checks);
    its step numbers continue from ``start_step``."""
    from ..rundir import read_run_dir  # noqa: PLC0415
    from ..telemetry.wrapper import ProgramTelemetry  # noqa: PLC0415
    from ..train.session import resolved_layout, run_constants  # noqa: PLC0415
    from ..train.trainer import STATUS_FILE, write_json  # noqa: PLC0415

    run = run or read_run_dir(run_dir)
    telemetry = ProgramTelemetry(run_dir, kind=program.get("kind", "script"), log_format=program.get("log_format"),
                                 start_step=start_step)
    return telemetry.install(run, resolved_layout(run), run_constants(run, telemetry.world),
                             status=lambda data: write_json(run_dir / STATUS_FILE, data))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestrator.programs RUN_DIR", file=sys.stderr)
        return EXIT_USAGE
    run_dir = Path(args[0]).resolve()
    try:
        program = load_program(run_dir)
        run, start = plan_start(run_dir, program)
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        return EXIT_USAGE
    telemetry = install_telemetry(run_dir, program, run, start.step)
    use_interpreter_tools()     # a DeepSpeed program builds its CPU op with the same ninja on every launcher
    script = program["argv"][0]
    if program.get("cwd"):
        os.chdir(program["cwd"])
    sys.argv = list(program["argv"])
    sys.path[0] = str(Path(script).resolve().parent)     # as `python script.py` puts it
    code, clean = 0, True
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
        clean = code == 0
    except KeyboardInterrupt:       # SIGINT (torchrun forwards Ctrl-C and `orch cancel`'s first signal)
        traceback.print_exc()
        code, clean = 130, False
        telemetry.signal_name = telemetry.signal_name or "SIGINT"
    except BaseException:  # noqa: BLE001  (the program's failure is its exit code, its traceback on stderr)
        traceback.print_exc()
        code, clean = 1, False
    finally:
        try:
            telemetry.finish(code, clean=clean)
        except Exception as e:  # noqa: BLE001  (telemetry must never change how the program ends)
            print(f"[orch-program] warning: telemetry did not finish: {e}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
