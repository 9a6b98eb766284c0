"""A small typed-record layer over dataclasses: strict parsing, dumping and JSON Schema export.

Every user-facing record (the spec) is a frozen dataclass whose fields carry their documentation and
bounds in ``metadata``. :func:`parse` turns plain YAML/JSON data into such a record and collects EVERY
problem (unknown key with "did you mean", wrong type, out-of-range value) instead of stopping at the
first. :func:`json_schema` exports the same tree, so the schema is never written by hand.

Types understood: bool, int, float, str, ``X | None``, ``Literal[...]``, ``list[X]`` and nested
dataclasses. Booleans are not integers and strings are not numbers here (``"yes"`` is not ``true``):
DeepSpeed and YAML both let such values through silently, we do not.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from functools import lru_cache
from typing import Any, Literal, Union, get_args, get_origin

from .errors import Problem

MISSING = dataclasses.MISSING
_INVALID = object()  # a value of the wrong type: the record holding it cannot be built


def spec_field(default: Any = MISSING, *, doc: str, minimum: float | None = None,
               maximum: float | None = None, pattern: str | None = None,
               default_factory: Any = MISSING, exclusive_minimum: float | None = None,
               omit_if_none: bool = False, exclusive_maximum: float | None = None,
               min_items: int | None = None, max_items: int | None = None, pattern_hint: str | None = None,
               not_a_flag: bool = False, bound_reason: str | None = None) -> Any:
    """A dataclass field with its documentation and bounds (used by parse and json_schema).

    ``omit_if_none``: :func:`dump` leaves the field out while it is None, so that adding an optional field
    changes neither the resolved spec nor the spec hash of specs that do not use it. On a list field the
    bounds and pattern apply to each item; ``min_items``/``max_items`` bound its length. ``not_a_flag``: a
    string that reaches a command line as an argument's value must not start with '-' (argparse would read
    ``--mock-data`` as a flag of its own). ``bound_reason`` says why the bounds are where they are.
    """
    meta = {"doc": doc, "minimum": minimum, "maximum": maximum, "pattern": pattern,
            "exclusive_minimum": exclusive_minimum, "omit_if_none": omit_if_none,
            "exclusive_maximum": exclusive_maximum, "min_items": min_items, "max_items": max_items,
            "pattern_hint": pattern_hint, "not_a_flag": not_a_flag, "bound_reason": bound_reason}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def type_name(tp: Any) -> str:
    optional, inner = _is_optional(tp)
    if optional:
        return f"{type_name(inner)} or null"
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is list:
        return f"list of {type_name(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp, str(tp))


def article(noun: str) -> str:
    """'a number', 'an integer'."""
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def describe_value(value: Any, quote=repr) -> str:
    """A value as an error message names it: 'boolean true', 'string 'x'', 'a mapping'."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {quote(value)}"
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def did_you_mean(word: str, choices: list[str]) -> str:
    """A hint for a misspelled key or value: the closest choice, else the list of choices."""
    prefixed = [c for c in choices if c.lower().startswith(word.lower())] if word else []
    if len(prefixed) == 1:
        return f"did you mean {prefixed[0]!r}?"
    if prefixed:
        return "did you mean one of " + ", ".join(repr(c) for c in prefixed) + "?"
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "allowed: " + ", ".join(sorted(choices))


def control_character(text: str) -> str | None:
    """The first control or line/paragraph-separator character of ``text`` (a newline would add a flag to
    megatron_args.txt, one argument per line), or None."""
    import unicodedata  # noqa: PLC0415

    return next((c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)


def parse(cls: type, data: Any, path: str, problems: list[Problem]) -> Any:
    """Build ``cls`` from ``data``; append a Problem for everything wrong.

    Returns None when a value has the wrong type or a required key is missing. A value of the right
    type that breaks a bound or pattern is reported but kept, so later cross-field rules still run.
    """
    if not isinstance(data, dict):
        problems.append(Problem(path, f"expected a mapping, got {describe_value(data)}",
                                f"write {path} as 'key: value' lines"))
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    ok = True
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in fields:
            problems.append(Problem(sub, "unknown key", did_you_mean(str(key), list(fields))))
            ok = False
            continue
        parsed = _parse_value(hints[key], value, sub, problems, fields[key].metadata)
        if parsed is _INVALID:
            ok = False  # wrong type: the record cannot be built (out-of-range values still can)
        kwargs[key] = parsed
    for name, f in fields.items():
        if name not in kwargs and f.default is MISSING and f.default_factory is MISSING:
            sub = f"{path}.{name}" if path else name
            problems.append(Problem(sub, "required key is missing",
                                    f"add '{name}:' ({fields[name].metadata.get('doc', '')})"))
            ok = False
    return cls(**kwargs) if ok else None


def _parse_value(tp: Any, value: Any, path: str, problems: list[Problem], meta: Any) -> Any:
    optional, inner = _is_optional(tp)
    if value is None and dataclasses.is_dataclass(tp):
        value = {}  # an empty YAML section ("parallelism:") means all defaults
    if value is None:
        if optional:
            return None
        problems.append(Problem(path, f"must be {article(type_name(tp))}, got null", "give a value or remove the key"))
        return _INVALID
    tp = inner
    if dataclasses.is_dataclass(tp):
        record = parse(tp, value, path, problems)
        return _INVALID if record is None else record
    origin = get_origin(tp)
    if origin is Literal:
        allowed = list(get_args(tp))
        if value in allowed and type(value) is type(allowed[allowed.index(value)]):
            return value
        hint = did_you_mean(str(value), [str(a) for a in allowed]) if isinstance(value, str) else \
            "allowed: " + ", ".join(repr(a) for a in allowed)
        problems.append(Problem(path, f"{describe_value(value)} is not allowed", hint))
        return _INVALID
    if origin is list:
        if not isinstance(value, list):
            problems.append(Problem(path, f"must be a list, got {describe_value(value)}", "write [a, b, ...]"))
            return _INVALID
        if (length := _length_problem(value, path, meta or {})) is not None:
            problems.append(length)
            return _INVALID
        item_tp = get_args(tp)[0]
        items = [_parse_value(item_tp, v, f"{path}[{i}]", problems, meta) for i, v in enumerate(value)]
        return _INVALID if any(item is _INVALID for item in items) else items
    return _parse_scalar(tp, value, path, problems, meta or {})


def _length_problem(value: list, path: str, meta: Any) -> Problem | None:
    low, high = meta.get("min_items"), meta.get("max_items")
    if (low is not None and len(value) < low) or (high is not None and len(value) > high):
        want = f"exactly {low}" if low == high else f"{low or 0} to {high}" if high is not None else f"at least {low}"
        return Problem(path, f"has {len(value)} item{'s' if len(value) != 1 else ''}, needs {want}",
                       f"write {want} values in [ ]")
    return None


def _parse_scalar(tp: Any, value: Any, path: str, problems: list[Problem], meta: Any) -> Any:
    ok = (tp is bool and isinstance(value, bool)) or \
         (tp is int and isinstance(value, int) and not isinstance(value, bool)) or \
         (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool)) or \
         (tp is str and isinstance(value, str))
    if not ok:
        hint = {bool: "write true or false, unquoted", int: "write a whole number, unquoted",
                float: "write a number, unquoted", str: "quote the value"}[tp]
        problems.append(Problem(path, f"must be {article(type_name(tp))}, got {describe_value(value)}", hint))
        return _INVALID
    if tp is float:
        value = float(value)
        if not math.isfinite(value):
            problems.append(Problem(path, f"{value!r} is not a finite number", "write a finite number"))
            return _INVALID
    if tp is str and (bad := control_character(value)) is not None:
        problems.append(Problem(path, f"contains the control character {bad!r}",
                                "remove it: free-form values must be one line of printable text"))
        return _INVALID
    if tp is str and meta.get("not_a_flag") and value.startswith("-"):
        problems.append(Problem(path, f"{value[:80]!r} starts with '-': on the command line it would be read as a "
                                "flag, not as this value", "write it without the leading '-', or a path as ./" +
                                value[:40]))
        return _INVALID
    why = f" ({meta['bound_reason']})" if meta.get("bound_reason") else ""
    if meta.get("minimum") is not None and value < meta["minimum"]:
        problems.append(Problem(path, f"{value!r} is below the minimum {meta['minimum']!r}",
                                f"use a value >= {meta['minimum']!r}{why}"))
    if meta.get("exclusive_minimum") is not None and value <= meta["exclusive_minimum"]:
        problems.append(Problem(path, f"{value!r} must be greater than {meta['exclusive_minimum']!r}",
                                f"use a value > {meta['exclusive_minimum']!r}{why}"))
    if meta.get("maximum") is not None and value > meta["maximum"]:
        problems.append(Problem(path, f"{value!r} is above the maximum {meta['maximum']!r}",
                                f"use a value <= {meta['maximum']!r}{why}"))
    if meta.get("exclusive_maximum") is not None and value >= meta["exclusive_maximum"]:
        problems.append(Problem(path, f"{value!r} must be less than {meta['exclusive_maximum']!r}",
                                f"use a value < {meta['exclusive_maximum']!r}{why}"))
    if meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
        problems.append(Problem(path, f"{value!r} does not match {meta['pattern']}", meta.get("pattern_hint") or
                                "use letters, digits, '.', '_' and '-' only (no spaces or shell syntax)"))
    return value


def dump(record: Any) -> Any:
    """A record as plain data (dicts in field order, lists), for YAML/JSON output."""
    if dataclasses.is_dataclass(record):
        return {f.name: dump(getattr(record, f.name)) for f in dataclasses.fields(record)
                if not (f.metadata.get("omit_if_none") and getattr(record, f.name) is None)}
    if isinstance(record, (list, tuple)):
        return [dump(v) for v in record]
    return record


def json_schema(cls: type, title: str | None = None) -> dict:
    """JSON Schema (draft 2020-12) of a record tree, with documentation from the field metadata."""
    schema = _object_schema(cls)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title or cls.__name__,
              **schema}
    return schema


def _object_schema(cls: type) -> dict:
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        meta = f.metadata
        if meta.get("doc"):
            prop["description"] = meta["doc"]
        _schema_bounds(prop.get("items", prop), meta)
        for key, name in (("min_items", "minItems"), ("max_items", "maxItems")):
            if meta.get(key) is not None:
                prop[name] = meta[key]
        if f.default is not MISSING and not dataclasses.is_dataclass(f.default):
            prop["default"] = f.default
        elif f.default_factory is not MISSING:
            prop["default"] = dump(f.default_factory())
        else:
            required.append(f.name)
        props[f.name] = prop
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _schema_bounds(prop: dict, meta: Any) -> None:
    for key, name in (("minimum", "minimum"), ("maximum", "maximum"), ("pattern", "pattern"),
                      ("exclusive_minimum", "exclusiveMinimum"), ("exclusive_maximum", "exclusiveMaximum")):
        if meta.get(key) is not None:
            prop[name] = meta[key]
    if meta.get("not_a_flag"):
        prop["not"] = {"pattern": "^-"}


def _type_schema(tp: Any) -> dict:
    optional, inner = _is_optional(tp)
    if optional:
        base = _type_schema(inner)
        if "enum" in base:
            return {"enum": base["enum"] + [None]}
        if "type" in base and isinstance(base["type"], str) and base["type"] != "object":
            return {**base, "type": [base["type"], "null"]}
        return {"anyOf": [base, {"type": "null"}]}
    if dataclasses.is_dataclass(tp):
        return _object_schema(tp)
    if get_origin(tp) is Literal:
        return {"enum": list(get_args(tp))}
    if get_origin(tp) is list:
        return {"type": "array", "items": _type_schema(get_args(tp)[0])}
    if get_origin(tp) is dict:
        return {"type": "object", "additionalProperties": _type_schema(get_args(tp)[1])}
    return {"type": {bool: "boolean", int: "integer", float: "number", str: "string"}[tp]}
