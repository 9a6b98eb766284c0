"""Regenerate schemas/megatron_lm_args.json: the flag table of Megatron-LM core_v0.16.1's arguments.py.

    ORCH_MEGATRON_LM=/tmp/megatron-lm-core_v0.16.1 python tests/tools/export_megatron_lm_args.py [--check]

The table is data (flag names, destinations, arity, value types, choices, defaults, deprecation), read by
orchestrator/validate/megatron.py for "unknown flag, did you mean" and value checks. It is derived by
building Megatron-LM's own parser in a subprocess; no Megatron-LM code or prose is copied.
``--check`` exits 1 when the committed file differs (tests/integration/test_megatron_real.py runs it).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.resources import data_dir  # noqa: E402
from orchestrator.rundir import dump_json  # noqa: E402
from orchestrator.validate.megatron_lm import HOW_TO_ENABLE, export_flag_table, megatron_lm_root  # noqa: E402

TARGET = data_dir("schemas") / "megatron_lm_args.json"


def main(argv: list[str]) -> int:
    root = megatron_lm_root()
    if root is None:
        print(f"ORCH_MEGATRON_LM is not set: {HOW_TO_ENABLE}", file=sys.stderr)
        return 2
    text = dump_json(export_flag_table(root))
    if "--check" in argv:
        if not TARGET.is_file() or TARGET.read_text() != text:
            print(f"{TARGET} is stale; regenerate it with: python tests/tools/export_megatron_lm_args.py",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
