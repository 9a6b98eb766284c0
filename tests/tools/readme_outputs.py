"""Run the README's marked console blocks and compare (or rewrite) their output.

A block marked with the line ``<!-- orch-output -->`` just before its ```console fence is a terminal session:
``$ command`` lines and what each prints (stdout and stderr as a terminal shows them, at 100 columns). All
marked blocks run in README order in one scratch directory (so a block may use what an earlier one wrote),
with ``examples`` linked into it, ``orch`` from this interpreter's environment and this checkout first on
PYTHONPATH. Only deterministic commands belong in marked blocks (init, validate, plan, generate, ls); a
training run's timings vary, so its block is shown unmarked, as an example.

    python tests/tools/readme_outputs.py           # rewrite the marked blocks with today's output (make readme)
    python tests/tools/readme_outputs.py --check   # exit 1 naming each stale block
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = "<!-- orch-output -->"
REGENERATE = "make readme   (or: python tests/tools/readme_outputs.py)"
COLUMNS = 100
_BLOCK = re.compile(re.escape(MARK) + r"\n```console\n(.*?)```\n", re.S)


@dataclasses.dataclass
class Block:
    start: int          # offsets of the block's body in the README text
    end: int
    body: str

    @property
    def commands(self) -> list[str]:
        return [line[2:] for line in self.body.splitlines() if line.startswith("$ ")]

    @property
    def line(self) -> int:
        return README.read_text()[: self.start].count("\n") + 1


def blocks(text: str) -> list[Block]:
    return [Block(m.start(1), m.end(1), m.group(1)) for m in _BLOCK.finditer(text)]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "ORCH_", "SLURM_"))}
    env.update(COLUMNS=str(COLUMNS), NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p))
    return env


def run_session(commands: list[str], workdir: Path, env: dict[str, str]) -> str:
    """The block body a terminal would show for ``commands`` run one after another in ``workdir``."""
    out = []
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        out.append(f"$ {command}\n{proc.stdout}")
    return "".join(out)


def current(text: str) -> list[tuple[Block, str]]:
    """Each marked block of ``text`` with what its commands print today."""
    env = environment()
    with tempfile.TemporaryDirectory(prefix="orch-readme-") as scratch:
        workdir = Path(scratch)
        (workdir / "examples").symlink_to(ROOT / "examples")
        return [(block, run_session(block.commands, workdir, env)) for block in blocks(text)]


def stale(text: str) -> list[tuple[Block, str]]:
    return [(block, actual) for block, actual in current(text) if actual != block.body]


def main(argv: list[str]) -> int:
    text = README.read_text()
    if "--check" in argv:
        found = stale(text)
        for block, _ in found:
            print(f"README.md:{block.line}: the output of `{block.commands[0]}` ... is stale; "
                  f"refresh it with: {REGENERATE}", file=sys.stderr)
        return 1 if found else 0
    for block, actual in reversed(current(text)):
        text = text[: block.start] + actual + text[block.end:]
    README.write_text(text)
    print(f"refreshed {len(blocks(text))} output block(s) in README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
