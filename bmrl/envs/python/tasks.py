"""Task files of Python environments: JSONL, one task (a JSON object, `reset`'s options) a line.

    tasks = read_tasks("tasks.jsonl")      # [dict, ...] in file order
    split = split_tasks(tasks)              # {"train": tasks[0::2], "test": tasks[1::2]}

The split is by line position: lines 0, 2, 4, ... (0-based) train, lines 1, 3, 5, ... test. It is
deterministic, keeps the file's order, and train and test never share a line; identical tasks in
both halves are the file's choice, counted by content in reports (`bmrl.build.suite_summary`).
"""

from __future__ import annotations

import json
import os

SPLITS = ("train", "test")


class TaskFileError(ValueError):
    """A task file that cannot be read: missing, not UTF-8, a line that is not a JSON object, too few lines."""


def read_tasks(path: str | os.PathLike) -> list[dict]:
    """The tasks of JSONL file `path` (blank lines skipped). Raises TaskFileError naming the line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise TaskFileError(f"{str(path)!r} does not exist; give a JSONL file with one task a line.") from None
    except IsADirectoryError:
        raise TaskFileError(f"{str(path)!r} is a directory; give a JSONL file with one task a line.") from None
    except UnicodeDecodeError as e:
        raise TaskFileError(f"{str(path)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSONL.") from None
    except OSError as e:
        raise TaskFileError(f"{str(path)!r} cannot be read ({e.strerror}).") from None
    tasks = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{str(path)!r} line {number} is not valid JSON ({e.msg} at column {e.colno}); "
                                "write one JSON object a line.") from None
        if not isinstance(task, dict):
            raise TaskFileError(f"{str(path)!r} line {number} is a JSON {type(task).__name__}, not an object; "
                                "write each task as {\"key\": value, ...}.")
        tasks.append(task)
    if len(tasks) < 2:
        raise TaskFileError(f"{str(path)!r} holds {len(tasks)} task(s); give at least 2 (even lines train, odd "
                            "lines test).")
    return tasks


def split_tasks(tasks: list[dict]) -> dict[str, list[dict]]:
    """{"train": the tasks at even positions, "test": those at odd positions} (module docstring)."""
    return {"train": tasks[0::2], "test": tasks[1::2]}


__all__ = ["SPLITS", "TaskFileError", "read_tasks", "split_tasks"]
