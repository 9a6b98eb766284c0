"""Per-step metrics records as columns: what ``orch compare`` and ``orch calibrate`` read of each step,
kept in compact arrays (8 bytes a value) so that a long run's metrics.jsonl is aggregated as it streams
in, not held as one dict per line (a 200 MB file took 5.5x its size that way).

:class:`Records` is a read-only sequence of :class:`Row` mappings (``row["step_time_s"]``, ``row.get(key)``);
``records.column(key)`` gives one field of every row as a list.
"""
from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence

# The record fields kept (SPEC.md's names); the rest of a record is not read by compare or calibrate.
KEPT_KEYS = ("step", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "allreduce_time_s",
             "allreduce_overhead", "comm_exposed_s", "mem_peak_bytes", "compute_time_s", "alltoall_time_s",
             "expert_load_imbalance", "tokens_dropped_fraction", "moe_aux_loss")
_ABSENT = math.nan      # in a column: the record had no value (every kept value is finite)


class Row(Mapping):
    """One record's kept fields (a view into the columns)."""

    __slots__ = ("_cols", "_i")

    def __init__(self, cols: dict, i: int):
        self._cols, self._i = cols, i

    def __getitem__(self, key: str):
        col = self._cols[key]
        value = col[self._i]
        if value != value:          # NaN: absent
            raise KeyError(key)
        if col.typecode == "q" or (key.endswith("_bytes") and value.is_integer()):
            return int(value)
        return value

    def __iter__(self):
        return (k for k in KEPT_KEYS if self._cols[k][self._i] == self._cols[k][self._i])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


class Records(Sequence):
    """Rows ``start..stop`` of the columns; slicing gives a view, not a copy."""

    def __init__(self, cols: dict, start: int = 0, stop: int | None = None):
        self._cols = cols
        self._start, self._stop = start, len(cols["step"]) if stop is None else stop

    @classmethod
    def from_dicts(cls, records) -> "Records":
        builder = RecordsBuilder()
        for record in records:
            builder.add(record)
        return builder.finish()

    def __len__(self) -> int:
        return max(0, self._stop - self._start)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return Records(self._cols, self._start + start, self._start + max(start, stop))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return Row(self._cols, self._start + index)

    def column(self, key: str) -> list:
        """Every row's value of ``key`` (None where a row has none)."""
        values = self._cols[key][self._start:self._stop].tolist()
        if key == "step":
            return values
        return [None if v != v else v for v in values]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"Records({len(self)} steps)"


class RecordsBuilder:
    """Collects records one at a time; a step given again replaces its row (the last record wins)."""

    def __init__(self):
        self._cols = {k: array("q" if k == "step" else "d") for k in KEPT_KEYS}
        self._row_of_step: dict[int, int] | None = None    # built only once a step comes out of order

    def add(self, record: dict) -> None:
        """Keep ``record``'s KEPT_KEYS (already checked: step an int, the rest finite numbers or absent)."""
        step, steps = record["step"], self._cols["step"]
        if self._row_of_step is None and steps and step <= steps[-1]:
            self._row_of_step = {s: i for i, s in enumerate(steps)}
        row = None if self._row_of_step is None else self._row_of_step.get(step)
        for key, col in self._cols.items():
            value = record.get(key)
            value = _ABSENT if value is None else value
            if row is None:
                col.append(value)
            else:
                col[row] = value
        if row is None and self._row_of_step is not None:
            self._row_of_step[step] = len(steps) - 1

    def __len__(self) -> int:
        return len(self._cols["step"])

    def finish(self) -> Records:
        """The rows sorted by step."""
        steps = self._cols["step"]
        if any(steps[i] > steps[i + 1] for i in range(len(steps) - 1)):
            order = sorted(range(len(steps)), key=steps.__getitem__)
            self._cols = {k: array(col.typecode, (col[i] for i in order)) for k, col in self._cols.items()}
        return Records(self._cols)
