"""Reading files a user hands to orch (specs, ds_config.json, run-dir JSON) with every limit a hostile or
broken file could otherwise break: size, nesting depth, YAML alias expansion, duplicate keys and integers
too long for Python to convert. Every failure is a :class:`SpecError` naming the file (exit 2), never a
traceback or a hang.

The limits are far above any real spec (a spec is a few KiB, a dozen levels deep, no aliases needed).
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import Problem, SpecError, raise_if

MAX_FILE_BYTES = 1 << 20        # 1 MiB: real specs and ds_configs are a few KiB
MAX_DEPTH = 64                  # nesting of mappings/lists
MAX_NODES = 100_000             # YAML nodes after alias expansion (an alias bomb expands to billions)
MAX_DATA_BYTES = 16 << 20       # 16 MiB: doctor.json and calib.json are a few KiB, a run's plan.json < 1 MiB
MAX_INT_DIGITS = 19             # a number file's integers: up to 10**19 (bytes of a cluster fit in 18 digits)


def open_regular(path: str | Path, missing_hint: str = ""):
    """A user file opened for reading in binary, or SpecError: missing, unreadable, or not a regular file.

    It is opened with O_NONBLOCK and checked with fstat before anything is read, so a FIFO (which would
    block until a writer comes), a device (/dev/zero reads forever) or a directory is refused at once,
    also through a symlink."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise SpecError(Problem(where, "cannot read: no such file", missing_hint)) from None
    except OSError as e:
        raise SpecError(Problem(where, f"cannot read: {e.strerror or e.__class__.__name__}")) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a plain file")
            raise SpecError(Problem(where, f"not a regular file ({kind})", "pass the file itself"))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_bytes(path: str | Path, limit_bytes: int = MAX_FILE_BYTES, missing_hint: str = "",
                    too_big_hint: str = "check that this is the right file") -> bytes:
    """The bytes of a regular user file (:func:`open_regular`), refused above ``limit_bytes``."""
    with open_regular(path, missing_hint) as f:
        try:
            data = f.read(limit_bytes + 1)
        except OSError as e:
            raise SpecError(Problem(str(path), f"cannot read: {e.strerror or e.__class__.__name__}")) from None
    if len(data) > limit_bytes:
        raise SpecError(Problem(str(path), f"larger than {limit_bytes} bytes", too_big_hint))
    return data


def read_user_text(path: str | Path, limit_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a user file, refused above ``limit_bytes``."""
    path = Path(path)
    data = read_user_bytes(path, limit_bytes, too_big_hint="a spec or config is a few KiB: check that this is "
                           "the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(Problem(str(path), f"not UTF-8 text (byte {e.start})", "save the file as UTF-8")) from None


def nesting_depth(data: Any) -> int:
    """How deeply lists and mappings nest (iterative: safe on any depth)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, list):
            items = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((v, depth + 1) for v in items)
    return deepest


def _too_deep(where: str) -> SpecError:
    return SpecError(Problem(where, f"nested more than {MAX_DEPTH} levels deep", "a spec nests a few levels"))


def parse_json(text: str, where: str, duplicates: list[str] | None = None) -> Any:
    """JSON data; duplicate keys are appended to ``duplicates`` when given, else refused."""
    seen_twice: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                seen_twice.append(key)
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise SpecError(Problem(f"{where}:{e.lineno}:{e.colno}", f"not valid JSON: {e.msg}",
                                "fix the JSON syntax at that position")) from None
    except RecursionError:
        raise _too_deep(where) from None
    except ValueError as e:      # an integer literal beyond Python's digit limit
        raise SpecError(Problem(where, f"invalid JSON value: {e}", "write numbers with at most a few digits")) from None
    if nesting_depth(data) > MAX_DEPTH:
        raise _too_deep(where)
    if duplicates is not None:
        duplicates.extend(seen_twice)
    elif seen_twice:
        raise SpecError([Problem(f"{where}:{key}", "duplicate key: only one value can count", "keep one of them")
                         for key in dict.fromkeys(seen_twice)])
    return data


class _BadNumber(str):
    """A JSON number token no finite float or sane int can hold (NaN, Infinity, 1e999, 20-digit ints)."""


def _float_or_bad(token: str):
    value = float(token)
    return value if math.isfinite(value) else _BadNumber(token)


def _int_or_bad(token: str):
    digits = token.lstrip("-")
    return int(token) if len(digits) <= MAX_INT_DIGITS else _BadNumber(token[:24] + ("..." if len(token) > 24 else ""))


def bad_number_problems(data: Any, where: str) -> list[Problem]:
    """A Problem per non-finite or huge number in data parsed by :func:`parse_number_json` (iterative)."""
    problems, stack = [], [(data, "")]
    while stack:
        value, at = stack.pop()
        if isinstance(value, _BadNumber):
            problems.append(Problem(f"{where}: {at or '(top level)'}", f"{value} is not a finite number",
                                    "JSON has no NaN or Infinity; write a finite number, floats under 1.8e308, "
                                    f"integers of at most {MAX_INT_DIGITS} digits"))
        elif isinstance(value, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))
    return sorted(problems, key=lambda p: p.path)


def parse_number_json(text: str, where: str) -> Any:
    """JSON of measured numbers (doctor.json, calib.json): :func:`parse_json`'s limits, and every NaN,
    Infinity, float overflowing to infinity or integer over :data:`MAX_INT_DIGITS` digits refused naming
    its field."""
    try:
        data = json.loads(text, parse_constant=_BadNumber, parse_float=_float_or_bad, parse_int=_int_or_bad)
    except json.JSONDecodeError as e:
        raise SpecError(Problem(f"{where}:{e.lineno}:{e.colno}", f"invalid JSON: {e.msg}",
                                "fix the JSON syntax at that position")) from None
    except RecursionError:
        raise _too_deep(where) from None
    if nesting_depth(data) > MAX_DEPTH:
        raise _too_deep(where)
    raise_if(bad_number_problems(data, where))
    return data


def read_number_json(path: str | Path, missing_hint: str = "", limit_bytes: int = MAX_DATA_BYTES) -> Any:
    """A regular JSON file of measured numbers, at most ``limit_bytes``, parsed by :func:`parse_number_json`."""
    data = read_user_bytes(path, limit_bytes, missing_hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(Problem(str(path), f"not UTF-8 text (byte {e.start})", "is it the right file?")) from None
    return parse_number_json(text, str(path))


def parse_yaml(text: str, where: str) -> Any:
    """YAML data (safe types only), refusing duplicate keys, deep nesting and alias bombs."""
    import yaml  # noqa: PLC0415

    loader = None
    try:
        loader = _bounded_loader_class()(text)     # the reader already refuses some characters
        return loader.get_single_data()
    except _Refused as e:
        raise SpecError(Problem(e.where(where), e.message, e.hint)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        reason = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(Problem(at, f"invalid YAML: {reason}", "fix the YAML syntax at that position")) from None
    except RecursionError:
        raise _too_deep(where) from None
    except ValueError as e:      # an integer beyond Python's digit limit
        raise SpecError(Problem(where, f"invalid YAML value: {e}", "write numbers with at most a few digits")) from None
    finally:
        if loader is not None:
            loader.dispose()


class _Refused(Exception):
    def __init__(self, message: str, hint: str, mark=None):
        super().__init__(message)
        self.message, self.hint, self.mark = message, hint, mark

    def where(self, path: str) -> str:
        return f"{path}:{self.mark.line + 1}:{self.mark.column + 1}" if self.mark else path


_LOADER = None


def _bounded_loader_class():
    global _LOADER  # noqa: PLW0603  (built once, on first use: yaml is imported lazily)
    if _LOADER is None:
        _LOADER = _make_loader()
    return _LOADER


def _make_loader():
    import yaml  # noqa: PLC0415

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader with limits: depth while composing, expanded size and duplicate keys before building."""

        _depth = 0

        def compose_node(self, parent, index):
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise _Refused(f"nested more than {MAX_DEPTH} levels deep", "a spec nests a few levels",
                                   self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_document(self, node):
            if _expanded_size(node, {}) > MAX_NODES:
                raise _Refused(f"expands to more than {MAX_NODES} values (YAML aliases)",
                               "write the values out instead of nesting aliases", node.start_mark)
            return super().construct_document(node)

        def construct_mapping(self, node, deep=False):
            seen: set = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise _Refused(f"duplicate key {key_node.value!r}: only one value can count",
                                       "keep one of them", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    BoundedLoader.add_implicit_resolver(*_EXPONENT_FLOAT)
    return BoundedLoader


# YAML 1.2 reads 1e12 and 1.0e12 as numbers; PyYAML's 1.1 resolver wants a dot and a signed exponent and
# would make them strings (SPEC.md writes training.total_tokens: 1.0e12). The loader and dump_yaml's dumper
# share it, so that a string such as "5e-05" is written quoted and reads back as a string.
_EXPONENT_FLOAT = ("tag:yaml.org,2002:float", re.compile(r"^[-+]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                   list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    """YAML that parse_yaml reads back as ``data`` (block style, keys in their order)."""
    import yaml  # noqa: PLC0415

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_implicit_resolver(*_EXPONENT_FLOAT)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def _expanded_size(node, memo: dict) -> int:
    """Nodes after expanding every alias (a shared node counts each time it is used); memoised per node."""
    key = id(node)
    if key in memo:
        return memo[key]
    value = node.value
    if isinstance(value, list):
        total = 1
        for item in value:
            children = item if isinstance(item, tuple) else (item,)
            for child in children:
                total += _expanded_size(child, memo)
                if total > MAX_NODES:
                    break
    else:
        total = 1
    memo[key] = min(total, MAX_NODES + 1)
    return memo[key]
