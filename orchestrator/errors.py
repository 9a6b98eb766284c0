"""Error types shared by every stage.

A user mistake is a :class:`SpecError` carrying one :class:`Problem` per violated rule, so that every
problem is reported at once. ``assert`` is kept for programmer bugs only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, what is wrong, how to fix it."""

    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text

    def to_dict(self) -> dict:
        return asdict(self)


class OrchError(Exception):
    """A failure orch reports to the user without a traceback."""

    exit_code = 1


class SpecError(OrchError):
    """Invalid user input (spec, config file, arguments): exit code 2, every problem listed."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem | str, path: str = "spec"):
        if isinstance(problems, str):
            problems = [Problem(path, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def raise_if(problems: list[Problem]) -> None:
    """Raise a SpecError holding ``problems`` when there is any."""
    if problems:
        raise SpecError(problems)
