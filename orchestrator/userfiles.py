"""Reading files a user hands to orch (specs, ds_config.json, run-dir JSON) with every limit a hostile or
broken file could otherwise break: size, nesting depth, YAML alias expansion, duplicate keys and integers
too long for Python to convert. Every failure is a :class:`SpecError` naming the file (exit 2), never a
traceback or a hang.

The limits are far above any real spec (a spec is a few KiB, a dozen levels deep, no aliases needed).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .errors import Problem, SpecError

MAX_FILE_BYTES = 1 << 20        # 1 MiB: real specs and ds_configs are a few KiB
MAX_DEPTH = 64                  # nesting of mappings/lists
MAX_NODES = 100_000             # YAML nodes after alias expansion (an alias bomb expands to billions)


def read_user_text(path: str | Path, limit_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a user file, refused above ``limit_bytes``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    except FileNotFoundError:
        raise SpecError("cannot read: no such file", path=str(path)) from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.__class__.__name__}", path=str(path)) from None
    if len(data) > limit_bytes:
        raise SpecError(Problem(str(path), f"larger than {limit_bytes} bytes", "a spec or config is a few KiB: "
                                "check that this is the right file"))
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

    # YAML 1.2 reads 1e12 and 1.0e12 as numbers; PyYAML's 1.1 resolver wants a dot and a signed exponent and
    # would make them strings (SPEC.md writes training.total_tokens: 1.0e12).
    BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
        r"^[-+]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))
    return BoundedLoader


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
