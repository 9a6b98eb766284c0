"""The progress follower keeps up with a metrics.jsonl that a resumed trainer rewrote (requeue, restart)."""
from __future__ import annotations

import json
import os

from orchestrator.launch.progress import follow


def write(path, records, mode="a"):
    with open(path, mode) as f:
        for step, t in records:
            f.write(json.dumps({"step": step, "time_unix": t}) + "\n")


def test_rewritten_file_is_read_again_without_repeating_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, [(1, 1.0)])                   # before the launch: not shown
    offset = path.stat().st_size
    plan = iter([lambda: write(path, [(2, 2.0), (3, 3.0), (4, 4.0)]),
                 # resume from the checkpoint of step 2: the file is rewritten (new inode), then step 3 again
                 lambda: (write(tmp_path / "new", [(1, 1.0), (2, 2.0)], "w"), os.replace(tmp_path / "new", path),
                          write(path, [(3, 3.5)])),
                 lambda: write(path, [(4, 4.5), (5, 5.0)])])

    def done():
        action = next(plan, None)
        if action is None:
            return True
        action()
        return False

    seen = [(r["step"], r["time_unix"]) for r in follow(path, done, poll_s=0, offset=offset)]
    assert seen == [(2, 2.0), (3, 3.0), (4, 4.0), (3, 3.5), (4, 4.5), (5, 5.0)]


def test_partial_lines_wait_for_their_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    plan = iter([lambda: path.write_text('{"step": 1, "time_unix": 1.0}\n{"step": 2,'),
                 lambda: open(path, "a").write(' "time_unix": 2.0}\n')])

    def done():
        action = next(plan, None)
        if action:
            action()
        return action is None

    assert [r["step"] for r in follow(path, done, poll_s=0)] == [1, 2]
