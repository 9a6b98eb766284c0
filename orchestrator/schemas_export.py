"""Export the JSON Schemas in schemas/ from the typed records (never edit those files by hand).

    python -m orchestrator.schemas_export           # rewrite schemas/*.schema.json
    python -m orchestrator.schemas_export --check   # exit 1 when a file is stale (the tests run this)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .resources import data_dir
from .typed import json_schema

REGENERATE = "make schemas   (or: python -m orchestrator.schemas_export)"


def exported_schemas() -> dict[str, dict]:
    """File name -> schema, for every record type orch publishes."""
    from .spec import Spec  # noqa: PLC0415

    schemas = {"spec.schema.json": json_schema(Spec, title="orch training spec")}
    try:
        from .telemetry.record import MetricsRecord  # noqa: PLC0415  (added by the telemetry module)
    except ImportError:
        pass
    else:
        schemas["metrics.schema.json"] = json_schema(MetricsRecord, title="orch metrics.jsonl record")
    return schemas


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def stale_files(directory: Path | None = None) -> list[str]:
    directory = directory or data_dir("schemas")
    return [name for name, schema in exported_schemas().items()
            if not (directory / name).is_file() or (directory / name).read_text() != render(schema)]


def main(argv: list[str]) -> int:
    directory = data_dir("schemas")
    if "--check" in argv:
        stale = stale_files(directory)
        for name in stale:
            print(f"schemas/{name} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for name, schema in exported_schemas().items():
        (directory / name).write_text(render(schema))
        print(f"wrote schemas/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
