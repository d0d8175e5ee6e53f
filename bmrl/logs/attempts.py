"""Streaming readers for evaluation logs of any agent harness: one record per attempt.

A record names its task and says when (if ever) the attempt first succeeded, in one of three forms
(field names configurable through `LogFields`; defaults in docs/passkt_logs.md):

1. `first_success_turn`: an int >= 1, or 0 / null for never. A list of such ints is the grouped
   form: one record holding all attempts of a task (an empty list is a task with zero attempts).
2. `turn_success`: a per-turn list of booleans (or 0/1); first success = 1 + index of the first true.
3. `success` and `turns`: the attempt succeeded (bool) and used `turns` turns; first success = turns.

Records are parsed one line at a time (`bmrl.logs.files`) into `array` buffers (task index,
turn, line number, attempt id hash); no per-record Python object is kept alive, so 10^6 attempts
stream in about 20 bytes each. Task ids are mapped to ints through one dict of unique ids. Turns are
bounded by MAX_TURN (a larger one is refused on its line), so no grid over T can explode.
"""

from __future__ import annotations

import dataclasses
import json
import os
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from bmrl.logs.files import (
    JSONL_SUFFIXES,
    LogFormatError,
    detect_format,
    iter_csv,
    iter_jsonl,
)

__all__ = ["JSONL_SUFFIXES", "MAX_TURN", "AttemptLog", "LogFields", "LogFormatError", "detect_format", "read_attempt_log"]

_TRUE_STRINGS = {"1", "true", "t", "yes", "y"}
_FALSE_STRINGS = {"0", "false", "f", "no", "n", ""}
_MAX_EXAMPLES = 5
MAX_TURN = 1_000_000  # largest turn a record may name (documented in docs/passkt_logs.md)
_KEY_RANGE = 2**62  # int attempt ids below this are their own key; others are hashed
_NO_ATTEMPT = -1  # hash() never returns -1, so it can mark "no attempt id"


def _attempt_key(attempt: Any) -> int:
    """An int64 key per attempt id; '3' and 3 are the same attempt."""
    if isinstance(attempt, str) and attempt.strip().isdigit():
        value = int(attempt)
        if value < _KEY_RANGE:
            return value
    return hash(str(attempt))


@dataclasses.dataclass(frozen=True)
class LogFields:
    """Names of the record fields; `None` turns an optional field off."""

    task: str = "task_id"
    attempt: str | None = "attempt_id"
    first_success_turn: str | None = "first_success_turn"
    turn_success: str | None = "turn_success"
    success: str | None = "success"
    turns: str | None = "turns"
    budget_visible: str | None = "budget_visible"


@dataclasses.dataclass
class AttemptLog:
    """One log as arrays: `turns: [num_attempts]` int32, the first-success turns grouped by task in
    task order (task i's attempts are `turns[offsets[i]:offsets[i] + n_per_task[i]]`), and
    `n_per_task: [num_tasks]` (row i = `task_ids[i]`). Nothing is padded, so a task with many more
    attempts than the rest costs its attempts, not tasks x its attempts."""

    path: str
    task_ids: list[str]
    turns: np.ndarray
    n_per_task: np.ndarray
    num_records: int
    num_attempts: int
    skipped_records: int
    skipped_examples: list[str]
    empty_tasks: list[str]
    budget_visible: bool
    max_turn: int

    @property
    def offsets(self) -> np.ndarray:
        """[num_tasks]: where each task's attempts start in `turns`."""
        return np.concatenate([[0], np.cumsum(self.n_per_task)[:-1]]).astype(np.int64)

    @property
    def first_success_turn(self) -> np.ndarray:
        """[num_tasks, max_attempts] int32 padded with 0 (use with `n_per_task`); for balanced logs."""
        return self._padded(np.arange(len(self.task_ids)), int(self.n_per_task.max()))

    def _padded(self, rows: np.ndarray, width: int) -> np.ndarray:
        col = np.arange(width)[None, :]
        valid = col < self.n_per_task[rows][:, None]
        where = np.where(valid, self.offsets[rows][:, None] + col, 0)
        return np.where(valid, self.turns[where], 0).astype(np.int32)

    def per_task(self, ks: Sequence[int], ts: Sequence[int], cells_per_call: int = 1 << 20) -> np.ndarray:
        """Unbiased per-task Pass@(k,T): float64 [num_tasks, len(ks), len(ts)] (`pass_at_kt_per_task`).

        Tasks are grouped by their attempt count rounded up to a power of two, so the padded arrays
        hold at most twice the attempts, and in calls of about `cells_per_call` numbers (memory stays
        bounded), each group in one shape (one compiled program per group size)."""
        from bmrl.eval.passkt import pass_at_kt_per_task

        n = self.n_per_task
        width = (1 << np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64)).astype(np.int64)
        out = np.empty((len(n), len(ks), len(ts)), np.float64)
        for w in np.unique(width):
            rows = np.flatnonzero(width == w)
            step = max(1, min(len(rows), cells_per_call // max(int(w), len(ks) * len(ts))))
            for start in range(0, len(rows), step):
                part = rows[start:start + step]
                padded = np.concatenate([part, np.full(step - len(part), part[0])])  # one shape per group
                out[part] = pass_at_kt_per_task(self._padded(padded, int(w)), ks, ts,
                                                n_per_task=n[padded])[: len(part)]
        return out

    def task_index(self) -> dict[str, int]:
        """Task id -> row."""
        return {t: i for i, t in enumerate(self.task_ids)}

    def summary(self) -> dict[str, Any]:
        """JSON-ready facts about the log (not the arrays)."""
        n = self.n_per_task
        return {
            "log": self.path,
            "records": self.num_records,
            "attempts": self.num_attempts,
            "tasks": len(self.task_ids),
            "attempts_per_task": {"min": int(n.min()), "max": int(n.max()), "mean": float(n.mean())},
            "skipped_records": self.skipped_records,
            "skipped_examples": self.skipped_examples,
            "tasks_with_zero_attempts": self.empty_tasks,
            "budget_visible": self.budget_visible,
            "max_turn_logged": self.max_turn,
        }


def _parse_int(value: Any) -> int | None:
    """An int from an int, an integral float, or a numeric string; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        s = value.strip()
        try:
            return int(s)
        except ValueError:
            try:
                x = float(s)
            except ValueError:
                return None
            return int(x) if x.is_integer() else None
    return None


def _parse_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE_STRINGS:
            return True
        if s in _FALSE_STRINGS:
            return False
    return None


def _parse_list(value: Any) -> list | None:
    """A list from a JSON list, or (CSV) a string: '[0, 1]', '0;0;1', '0 0 1' or '0,0,1'."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                parsed = json.loads(s)
            except json.JSONDecodeError:
                return None
            return parsed if isinstance(parsed, list) else None
        for sep in (";", ",", " "):
            if sep in s:
                return [p for p in s.split(sep) if p.strip() != ""]
        return [s] if s else []
    return None


def _turn_value(value: Any, path: str, line: int, field: str) -> int:
    if value is None:
        return 0
    turn = _parse_int(value)
    if turn is None:
        raise LogFormatError(path, line, field, f"expected an integer turn (0 or null = never), got {value!r}.")
    if turn < 0:
        raise LogFormatError(path, line, field, f"negative turn {turn}; turns are 1-based and 0 means never succeeded.")
    if turn > MAX_TURN:
        raise LogFormatError(
            path, line, field,
            f"turn {turn} is beyond the largest supported turn {MAX_TURN:,} (a timestamp or step counter?); "
            "log the 1-based turn of the episode.",
        )
    return turn


def _outcomes(record: dict, fields: LogFields, path: str, line: int) -> tuple[list[int], int, bool]:
    """(first-success turns of the record's attempts, largest turn seen, grouped form?)."""
    name = fields.first_success_turn
    if name is not None and name in record:
        value = record[name]
        items = _parse_list(value) if isinstance(value, list) or (isinstance(value, str) and value.lstrip().startswith("[")) else None
        if items is None:
            turn = _turn_value(value, path, line, name)
            return [turn], turn, False
        if not items:
            task = record.get(fields.task)
            raise LogFormatError(path, line, name, f"task {task!r} has zero attempts (an empty list).")
        turns = [_turn_value(v, path, line, name) for v in items]
        return turns, max(turns), True
    name = fields.turn_success
    if name is not None and name in record:
        items = _parse_list(record[name])
        if items is None:
            raise LogFormatError(path, line, name, f"expected a per-turn list of booleans, got {record[name]!r}.")
        if len(items) > MAX_TURN:
            raise LogFormatError(path, line, name, f"{len(items):,} turns, beyond the largest supported turn {MAX_TURN:,}.")
        first = 0
        for i, v in enumerate(items):
            flag = _parse_bool(v)
            if flag is None:
                raise LogFormatError(path, line, name, f"turn {i + 1} is {v!r}, not a boolean or 0/1.")
            if flag and not first:
                first = i + 1
        return [first], len(items), False
    if fields.success is not None and fields.turns is not None and fields.success in record:
        flag = _parse_bool(record[fields.success])
        if flag is None:
            raise LogFormatError(path, line, fields.success, f"expected a boolean, got {record[fields.success]!r}.")
        if fields.turns not in record:
            raise LogFormatError(path, line, fields.turns, f"missing: '{fields.success}' needs the number of turns used.")
        turns = _turn_value(record[fields.turns], path, line, fields.turns)
        if flag and turns < 1:
            raise LogFormatError(path, line, fields.turns, f"a successful attempt must use >= 1 turn, got {turns}.")
        return [turns if flag else 0], turns, False
    wanted = [f"'{n}'" for n in (fields.first_success_turn, fields.turn_success) if n]
    if fields.success and fields.turns:
        wanted.append(f"'{fields.success}' + '{fields.turns}'")
    raise LogFormatError(
        path, line, fields.first_success_turn or fields.turn_success or fields.success,
        f"missing: the record has none of {' / '.join(wanted)} (found fields {sorted(record)[:8]}); "
        "name your fields with --turn-field / --turn-list-field / --success-field + --turns-field.",
    )


def read_attempt_log(
    path: str | os.PathLike,
    fields: LogFields = LogFields(),
    *,
    fmt: str | None = None,
    skip_bad: bool = False,
) -> AttemptLog:
    """Stream a JSONL or CSV attempt log into arrays.

    Malformed records (unparseable line, missing or invalid field, negative turn, a task with zero
    attempts, a repeated attempt id within a task) raise `LogFormatError` naming file, line and
    field; with `skip_bad=True` they are counted and skipped (the first few messages are kept).
    """
    path = os.fspath(path)
    fmt = fmt or detect_format(path)
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"unknown log format {fmt!r}: use 'jsonl' or 'csv'.")
    records = iter_jsonl(path) if fmt == "jsonl" else iter_csv(path)

    task_of: dict[str, int] = {}
    task_buf, turn_buf, line_buf = array("i"), array("i"), array("i")
    attempt_key = array("q")
    skipped, examples = 0, []
    bad_tasks: set[str] = set()
    budget_visible, max_turn, num_records = False, 0, 0
    task_field, attempt_field, budget_field = fields.task, fields.attempt, fields.budget_visible

    def reject(err: LogFormatError, task: str | None) -> None:
        nonlocal skipped
        if not skip_bad:
            raise err
        skipped += 1
        if task is not None:
            bad_tasks.add(task)
        if len(examples) < _MAX_EXAMPLES:
            examples.append(str(err))

    fast_turn = fields.first_success_turn
    for line, record in records:
        num_records += 1
        if type(record) is not dict:
            reject(record, None)
            continue
        task = record.get(task_field)
        if type(task) is not str or not task:
            if task is None or task == "" or isinstance(task, (list, dict, bool, float)):
                msg = "missing" if task is None or task == "" else f"expected a string or int task id, got {task!r}"
                reject(LogFormatError(path, line, task_field, msg + "."), None)
                continue
            task = str(task)
        turn = record.get(fast_turn) if fast_turn is not None else None
        if type(turn) is int and 0 <= turn <= MAX_TURN and (budget_field is None or budget_field not in record):
            turns, record_max, grouped = (turn,), turn, False  # the common case, no further checks
        else:
            try:
                turns, record_max, grouped = _outcomes(record, fields, path, line)
                if budget_field is not None and budget_field in record:
                    flag = _parse_bool(record[budget_field])
                    if flag is None:
                        raise LogFormatError(path, line, budget_field, f"expected a boolean, got {record[budget_field]!r}.")
                    budget_visible |= flag
            except LogFormatError as err:
                reject(err, task)
                continue
        index = task_of.get(task)
        if index is None:
            index = task_of[task] = len(task_of)
        if record_max > max_turn:
            max_turn = record_max
        key = _NO_ATTEMPT
        if attempt_field is not None and not grouped:
            attempt = record.get(attempt_field)
            if attempt is not None:
                key = attempt if type(attempt) is int and 0 <= attempt < _KEY_RANGE else _attempt_key(attempt)
        for turn in turns:
            task_buf.append(index)
            turn_buf.append(turn)
            line_buf.append(line)
            attempt_key.append(key)

    tasks = np.frombuffer(task_buf, np.int32) if task_buf else np.zeros(0, np.int32)
    turns_arr = np.frombuffer(turn_buf, np.int32) if turn_buf else np.zeros(0, np.int32)
    keep = _duplicate_filter(path, attempt_field, tasks, attempt_key, line_buf, list(task_of), skip_bad)
    if keep is not None:
        dropped_lines = np.frombuffer(line_buf, np.int32)[~keep]
        skipped += len(np.unique(dropped_lines))
        for ln in dropped_lines[: max(0, _MAX_EXAMPLES - len(examples))]:
            examples.append(f"{path}:{ln}: field '{attempt_field}': repeats an earlier attempt id of the same task.")
        tasks, turns_arr = tasks[keep], turns_arr[keep]

    task_ids = list(task_of)
    empty = sorted(bad_tasks - set(task_ids))
    if not task_ids:
        raise LogFormatError(
            path, 0, None,
            "no valid attempts" + (f" ({skipped} records skipped)." if skipped else " (the log is empty)."),
        )
    counts = np.bincount(tasks, minlength=len(task_ids)).astype(np.int32)
    order = np.argsort(tasks, kind="stable")
    return AttemptLog(
        path=path,
        task_ids=task_ids,
        turns=turns_arr[order],
        n_per_task=counts,
        num_records=num_records,
        num_attempts=int(len(tasks)),
        skipped_records=skipped,
        skipped_examples=examples,
        empty_tasks=empty,
        budget_visible=bool(budget_visible),
        max_turn=int(max_turn),
    )


def _duplicate_filter(
    path: str,
    attempt_field: str | None,
    tasks: np.ndarray,
    attempt_key: array,
    line_buf: array,
    task_ids: list[str],
    skip_bad: bool,
) -> np.ndarray | None:
    """None if no (task, attempt id) repeats; else a keep-mask (first occurrence kept) or an error."""
    if attempt_field is None or not len(tasks):
        return None
    hashes = np.frombuffer(attempt_key, np.int64)
    idx = np.flatnonzero(hashes != _NO_ATTEMPT)
    if len(idx) < 2:
        return None
    order = idx[np.lexsort((idx, hashes[idx], tasks[idx]))]
    same = (tasks[order][1:] == tasks[order][:-1]) & (hashes[order][1:] == hashes[order][:-1])
    if not same.any():
        return None
    lines = np.frombuffer(line_buf, np.int32)
    if not skip_bad:
        j = int(np.flatnonzero(same)[0])
        first, dup = order[j], order[j + 1]
        raise LogFormatError(
            path, int(lines[dup]), attempt_field,
            f"attempt id repeats the one on line {int(lines[first])} for task {task_ids[tasks[dup]]!r}; "
            "each attempt of a task needs its own id.",
        )
    keep = np.ones(len(tasks), bool)
    keep[order[1:][same]] = False
    return keep
