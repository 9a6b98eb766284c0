"""Megatron-LM argument tokens parsed as its own argparse parser would, against its flag table.

The flag table (``schemas/megatron_lm_args.json``) is data generated from Megatron-LM core_v0.16.1's
arguments.py by tests/tools/export_megatron_lm_args.py: flag -> dest, action, arity, value type, choices,
default, deprecation. Parsing reports unknown flags with "did you mean", missing or extra values, wrong
types, values outside the choices, duplicates (argparse silently keeps the last) and deprecated flags.

File format: what orch writes, one token per line taken verbatim (a value may contain spaces); a line
that starts with ``--`` and holds more words is split like a shell line (``--lr 3e-4`` on one line,
quotes respected); blank lines and lines starting with ``#`` are skipped.
"""
from __future__ import annotations

import difflib
import json
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import Problem
from ..render.megatron import MEGATRON_LM_TAG
from ..resources import data_dir

FLAG_TABLE = "megatron_lm_args.json"
# Flags whose help does not say so, but which Megatron-LM core_v0.16.1 retires in validate_args.
RETIRED = {"--checkpoint-activations": "use --recompute-granularity selective (or full)",
           "--tiktoken-special-tokens": "use --tokenizer-special-tokens",
           "--no-weight-decay-cond-type": "use --apply-wd-to-qk-layernorm"}
# What to write instead of a deprecated flag (orch's own hints).
REPLACEMENTS = {"--use-mcore-models": "remove it: Megatron-Core models are the default",
                "--batch-size": "use --micro-batch-size", "--warmup": "use --lr-warmup-iters",
                "--model-parallel-size": "use --tensor-model-parallel-size",
                "--use-rotary-position-embeddings": "use --position-embedding-type rope",
                "--no-position-embedding": "use --position-embedding-type none"}


@lru_cache(maxsize=1)
def flag_table() -> dict[str, dict]:
    """Megatron-LM core_v0.16.1's flags: flag -> {dest, action, nargs, type, choices, default, ...}."""
    return json.loads((data_dir("schemas") / FLAG_TABLE).read_text())["flags"]


@lru_cache(maxsize=None)
def dest_to_flag(dest: str) -> str | None:
    """The flag that writes ``dest``: Megatron's first spelling, a positive one before a ``--no-`` one."""
    table = flag_table()
    flags = sorted((f for f, e in table.items() if e["dest"] == dest),
                   key=lambda f: ("alias_of" in table[f], f.startswith("--no-"), f))
    return flags[0] if flags else None


# --- reading tokens ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    text: str
    line: int


def tokens_from_text(text: str) -> list[Token]:
    """Tokens of an args file (see the module docstring for the format)."""
    tokens: list[Token] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--") and len(line.split()) > 1:
            try:
                words = shlex.split(line)
            except ValueError:
                words = line.split()
            tokens += [Token(w, number) for w in words]
        else:
            tokens.append(Token(line, number))
    return tokens


@dataclass
class MegatronArgs:
    """Parsed arguments: dest -> value, and where each dest was set (flag, line)."""

    path: str
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, tuple[str, int]] = field(default_factory=dict)

    def given(self, dest: str) -> bool:
        return dest in self.values

    def get(self, dest: str) -> Any:
        """The value as Megatron-LM sees it: given, else its argparse default."""
        if dest in self.values:
            return self.values[dest]
        flag = dest_to_flag(dest)
        return flag_table()[flag].get("default") if flag else None

    def at(self, dest: str) -> str:
        """Location for a Problem: ``file:line --flag`` (or ``file --flag`` when not given)."""
        if dest in self.origin:
            flag, line = self.origin[dest]
            return f"{self.path}:{line} {flag}"
        return f"{self.path} {dest_to_flag(dest) or dest}"


def parse_tokens(tokens: list[Token], path: str) -> tuple[MegatronArgs, list[Problem]]:
    """Parse tokens the way Megatron-LM's argparse parser would, collecting every problem."""
    args, problems = MegatronArgs(path), []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.text.startswith("--"):
            problems.append(Problem(f"{path}:{tok.line}", f"{tok.text!r} is a value with no flag before it",
                                    "put it after its flag, or remove it"))
            i += 1
            continue
        flag, _, inline = tok.text.partition("=")
        values = [inline] if "=" in tok.text else []
        j = i + 1
        if "=" not in tok.text:
            while j < len(tokens) and not _looks_like_flag(tokens[j].text):
                values.append(tokens[j].text)
                j += 1
        problems += _flag_like_value_problems(flag, values, tokens[j] if j < len(tokens) else None, path, tok.line)
        problems += _store(args, flag, values, tok.line)
        i = j
    return args, problems


def _looks_like_flag(text: str) -> bool:
    return text.startswith("--") and len(text) > 2


# What argparse itself takes for a negative number rather than a flag (argparse's _negative_number_matcher).
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _flag_like_value_problems(flag: str, values: list[str], following: Token | None, path: str,
                              line: int) -> list[Problem]:
    """A value that starts with '-' (argparse reads it as a flag of its own: data.path "--mock-data" made
    Megatron-LM train on mock data), or a flag that takes values but got none because the next line is a
    flag (the value it was meant to have may be that line)."""
    entry = flag_table().get(flag) or {}
    where = f"{path}:{line} {flag}"
    problems = [Problem(where, f"the value {v[:60]!r} starts with '-': Megatron-LM's argparse reads it as a flag",
                        "a value must not start with '-': write a path as ./" + v[:30])
                for v in values if v.startswith("-") and not NEGATIVE_NUMBER.match(v)]
    takes_values = entry.get("action") not in ("store_true", "store_false", "store_const", "count",
                                               "boolean_optional", "help", None)
    if takes_values and entry.get("nargs") == "*" and not values and following is not None:
        problems.append(Problem(where, f"{flag} takes values but got none: the next line {following.text[:60]!r} "
                                "is a flag (a value starting with '-' is read as one)",
                                "give the values right after the flag, none starting with '-'"))
    return problems



def _store(args: MegatronArgs, flag: str, values: list[str], line: int) -> list[Problem]:
    where = f"{args.path}:{line} {flag}"
    entry = flag_table().get(flag)
    if entry is None:
        return [Problem(where, f"{flag} is not a Megatron-LM {MEGATRON_LM_TAG} argument", _flag_hint(flag))]
    problems = _deprecation(flag, entry, where)
    if entry["dest"] in args.origin:
        first_flag, first_line = args.origin[entry["dest"]]
        problems.append(Problem(where, f"{flag} sets {entry['dest']} again (first at line {first_line} by "
                                f"{first_flag}); argparse silently keeps the last value",
                                "keep one of them"))
    value, value_problems = _convert(entry, flag, values, where)
    if not value_problems:
        args.values[entry["dest"]] = value
        args.origin[entry["dest"]] = (flag, line)
    return problems + value_problems


def _flag_hint(flag: str) -> str:
    current = [f for f, entry in flag_table().items() if not entry.get("deprecated")]
    close = difflib.get_close_matches(flag, current, n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"see `python pretrain_gpt.py --help` of Megatron-LM {MEGATRON_LM_TAG}"


def _deprecation(flag: str, entry: dict, where: str) -> list[Problem]:
    if flag in RETIRED:
        return [Problem(where, f"{flag} is no longer accepted by Megatron-LM {MEGATRON_LM_TAG}", RETIRED[flag])]
    if entry.get("deprecated"):
        return [Problem(where, f"{flag} is deprecated in Megatron-LM {MEGATRON_LM_TAG}",
                        REPLACEMENTS.get(flag, "remove it (see its --help)"))]
    return []


def _convert(entry: dict, flag: str, values: list[str], where: str) -> tuple[Any, list[Problem]]:
    action = entry["action"]
    if action in ("store_true", "store_false", "store_const", "count", "boolean_optional", "help"):
        if values:
            return None, [Problem(where, f"{flag} takes no value, got {' '.join(values)!r}",
                                  f"write {flag} alone (it is a switch)")]
        return _switch_value(entry, action), []
    nargs = entry.get("nargs", 1)
    count_problem = _count_problem(flag, nargs, values, where)
    if count_problem:
        return None, [count_problem]
    converted, problems = [], []
    for text in values:
        value, problem = _typed(entry, flag, text, where)
        converted.append(value)
        problems += [problem] if problem else []
    if nargs in (1, "?"):
        return (converted[0] if converted else None), problems
    return converted, problems


def _switch_value(entry: dict, action: str) -> Any:
    return {"store_true": True, "store_false": False}.get(action, entry.get("value", True))


def _count_problem(flag: str, nargs: Any, values: list[str], where: str) -> Problem | None:
    if nargs == 1 and len(values) != 1:
        got = "none" if not values else f"{len(values)}: {' '.join(values)!r}"
        return Problem(where, f"{flag} takes exactly one value, got {got}", "give one value right after the flag")
    if nargs == "+" and not values:
        return Problem(where, f"{flag} needs at least one value", "give its values right after the flag")
    if isinstance(nargs, int) and nargs != 1 and len(values) != nargs:
        return Problem(where, f"{flag} takes {nargs} values, got {len(values)}", f"give exactly {nargs} values")
    return None


def _typed(entry: dict, flag: str, text: str, where: str) -> tuple[Any, Problem | None]:
    kind = entry.get("type", "str")
    try:
        value = {"int": int, "float": float}.get(kind, str)(text)
    except ValueError:
        noun = "an integer" if kind == "int" else "a number"
        return None, Problem(where, f"{flag} needs {noun}, got {text!r}", f"write {flag} with {noun}")
    choices = entry.get("choices")
    if choices is not None and value not in choices:
        hint = _choice_hint(str(value), [str(c) for c in choices])
        return None, Problem(where, f"{flag} {text!r} is not one of Megatron's choices", hint)
    return value, None


def _choice_hint(value: str, choices: list[str]) -> str:
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.5)
    return f"did you mean {lowered[close[0]]!r}?" if close else "allowed: " + ", ".join(choices)
