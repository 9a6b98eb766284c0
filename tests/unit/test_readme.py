"""The README's marked console blocks are what the commands print today, and docs/spec.md is what the schema
says (tests/tools/readme_outputs.py and spec_reference.py, which also rewrite them)."""
from __future__ import annotations

from tests.tools import readme_outputs, spec_reference


def test_readme_outputs_are_the_commands_current_output():
    text = readme_outputs.README.read_text()
    assert len(readme_outputs.blocks(text)) >= 4, "the README lost its marked output blocks"
    stale = readme_outputs.stale(text)
    assert not stale, "\n\n".join(
        f"README.md:{block.line}: `{block.commands[0]}` ... now prints:\n{actual}" for block, actual in stale
    ) + f"\n\nrefresh the README with: {readme_outputs.REGENERATE}"


def test_readme_keeps_the_set_up_commands():
    text = readme_outputs.README.read_text()
    assert "make demo" in text and "make test" in text       # .ci/run calls `make test`


def test_spec_reference_is_generated_from_the_schema():
    assert not spec_reference.is_stale(), f"docs/spec.md is stale; regenerate it with: {spec_reference.REGENERATE}"


def test_spec_reference_names_every_field():
    import json

    text = spec_reference.TARGET.read_text()

    def fields(node):
        for key, child in node.get("properties", {}).items():
            yield key
            for choice in [child, *child.get("anyOf", [])]:
                yield from fields(choice)

    missing = {key for key in fields(json.loads(spec_reference.SCHEMA.read_text())) if f"`{key}`" not in text}
    assert not missing, missing
