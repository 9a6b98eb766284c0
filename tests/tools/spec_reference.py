"""Render docs/spec.md, the spec reference, from schemas/spec.schema.json (never edit docs/spec.md by hand).

    python tests/tools/spec_reference.py           # rewrite docs/spec.md (make schemas does it too)
    python tests/tools/spec_reference.py --check   # exit 1 when docs/spec.md is stale
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "spec.schema.json"
TARGET = ROOT / "docs" / "spec.md"
REGENERATE = "make schemas   (or: python tests/tools/spec_reference.py)"
# Sections in the order SPEC.md and `orch init` write them; any other follows alphabetically.
ORDER = ("name", "spec_version", "model", "cluster", "training", "data", "parallelism", "launch", "tracking")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(value) -> str:
    return "`" + json.dumps(value) + "`"


def _object_of(node: dict) -> dict | None:
    """The object schema of a field that is an object (or an object or null)."""
    if node.get("type") == "object" and "properties" in node:
        return node
    for choice in node.get("anyOf", []):
        if choice.get("type") == "object" and "properties" in choice:
            return choice
    return None


def _type(node: dict) -> str:
    if "enum" in node:
        return " \\| ".join(_value(v) for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(choice) for choice in node["anyOf"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    words = []
    for k in kinds:
        if k == "array" and "items" in node:
            size = ""
            if node.get("minItems") is not None and node.get("minItems") == node.get("maxItems"):
                size = f"{node['minItems']} x "
            words.append(f"list of {size}{_type(node['items'])}")
        else:
            words.append(k)
    return " or ".join(words)


def _limits(node: dict) -> str:
    parts = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in node:
            parts.append(f"{sign} {node[key]}")
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    return ", ".join(parts)


def _ordered(properties: dict) -> list[str]:
    return sorted(properties, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))


def _section(path: str, node: dict, required: bool, out: list[str]) -> None:
    obj = _object_of(node)
    assert obj is not None
    level = "#" * min(2 + path.count("."), 4)
    out += ["", f"{level} `{path}`", ""]
    notes = ["**Required.**" if required else "Optional" + (", may be `null`." if "anyOf" in node else ".")]
    for text in (node.get("description", ""), obj.get("description", "") if obj is not node else ""):
        if text:
            notes.append(_cell(text[0].upper() + text[1:]).rstrip(".") + ".")
    out += [" ".join(notes), ""]
    rows, nested = [], []
    needed = set(obj.get("required", ()))
    for key in _ordered(obj["properties"]):
        child = obj["properties"][key]
        if _object_of(child) is not None:
            nested.append((key, child))
            rows.append(f"| `{key}` | object (below) | | {'yes' if key in needed else ''} | "
                        f"{_cell(child.get('description', ''))} |")
            continue
        default = _value(child["default"]) if "default" in child else ""
        limits = _limits(child)
        description = _cell(child.get("description", "")) + (f" ({limits})" if limits else "")
        rows.append(f"| `{key}` | {_type(child)} | {default} | {'yes' if key in needed else ''} | {description} |")
    out += ["| field | type | default | required | description |", "|---|---|---|---|---|", *rows]
    for key, child in nested:
        _section(f"{path}.{key}", child, key in needed, out)


def render(schema: dict) -> str:
    out = ["# Spec reference", "",
           "<!-- Generated from schemas/spec.schema.json by tests/tools/spec_reference.py: do not edit. -->",
           "",
           f"{schema.get('description', '')} A spec is YAML or JSON; `orch init` writes a commented one. "
           "This page is generated from the JSON Schema `schemas/spec.schema.json` (itself exported from the "
           f"typed model in `orchestrator/spec.py`); regenerate both with `{REGENERATE.split('   ')[0]}`. "
           "`orch validate SPEC` checks a spec against it and against the layout rules, listing every problem "
           "with its field and a fix. A field left out takes its default; a `parallelism` field left out "
           "is searched by `orch plan`. Extra fields are refused.",
           "",
           "| section | type | default | required | description |", "|---|---|---|---|---|"]
    top, sections = schema["properties"], []
    needed = set(schema.get("required", ()))
    for key in _ordered(top):
        node = top[key]
        if _object_of(node) is not None:
            sections.append(key)
            out.append(f"| [`{key}`](#{key}) | object | | {'yes' if key in needed else ''} | "
                       f"{_cell(node.get('description', ''))} |")
        else:
            default = _value(node["default"]) if "default" in node else ""
            limits = _limits(node)
            out.append(f"| `{key}` | {_type(node)} | {default} | {'yes' if key in needed else ''} | "
                       f"{_cell(node.get('description', ''))}{f' ({limits})' if limits else ''} |")
    for key in sections:
        _section(key, top[key], key in needed, out)
    return "\n".join(out) + "\n"


def rendered() -> str:
    return render(json.loads(SCHEMA.read_text()))


def is_stale() -> bool:
    return not TARGET.is_file() or TARGET.read_text() != rendered()


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if is_stale():
            print(f"docs/spec.md is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(rendered())
    print("wrote docs/spec.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
