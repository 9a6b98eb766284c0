"""The `orch` command line. The only package that imports click.

Each command lives in its own module (``orchestrator/cli/<name>.py``) exposing ``command``; modules
are imported only when their command runs, so ``orch --help`` stays fast. A command parses options,
calls one library function and renders the result; :func:`main` maps :class:`OrchError` to its exit
code in one place (2 = invalid input, 1 = runtime failure), printing problems to stderr.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from .. import __version__
from ..errors import OrchError, SpecError

# name -> (module, one-line help shown by `orch --help` without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("init", "Write a commented starting spec."),
    "validate": ("validate", "Check specs, ds_config.json, Megatron arguments or run dirs."),
    "plan": ("plan", "Search parallel layouts and rank them by predicted step time."),
    "generate": ("generate", "Write a run dir: DeepSpeed/Megatron configs, launch scripts, plan."),
    "resize": ("resize", "Continue a run dir on another cluster size: re-plan, convert its checkpoint."),
    "launch": ("launch", "Run a run dir locally, on SLURM or over pdsh."),
    "status": ("status", "Show the scheduler state of a launched run dir."),
    "cancel": ("cancel", "Cancel a launched run dir's job."),
    "compare": ("compare", "Put runs side by side, predicted against measured."),
    "calibrate": ("calibrate", "Fit the cost model's efficiency terms from measured runs."),
    "doctor": ("doctor", "Measure the cluster through the run's launch path; name slow nodes."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _exists(module)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _exists(COMMANDS[name][0]):
            return None
        module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if not rows:
            return
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _exists(module: str) -> bool:
    return importlib.util.find_spec(f"{__name__}.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """orch: one training spec -> planned, validated, launchable DeepSpeed / Megatron-Core runs."""


def report(error: OrchError) -> None:
    """Print an OrchError for people on stderr: one line per problem."""
    if isinstance(error, SpecError):
        n = len(error.problems)
        click.echo(f"error: {n} problem{'s' if n != 1 else ''} found:", err=True)
        for problem in error.problems:
            click.echo(f"  {problem}", err=True)
    else:
        click.echo(f"error: {error}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `orch` console script."""
    try:
        code = cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except OrchError as e:
        report(e)
        return _exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return _exit(130)
    except click.exceptions.Exit as e:
        return _exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        return _exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    return _exit(code if isinstance(code, int) else 0)


def _exit(code: int) -> int:
    sys.exit(code)
