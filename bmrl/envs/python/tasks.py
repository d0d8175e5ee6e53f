"""Task files of Python environments: JSONL, one task (a JSON object, `reset`'s options) a line.

    tasks = read_tasks("tasks.jsonl")      # [dict, ...] in file order
    splits = bmrl.data.task_splits(tasks)   # .tasks["train" | "validation" | "test"]: disjoint by content

The split is by content, the JAX envs' rule (`bmrl.data.suites`): a task's split is decided by the
hash of its canonical JSON (sorted keys, no whitespace), about 1 in 16 tasks test, 1 in 16 validation,
the rest train; each split keeps the file's order, a repeated task is dropped (and counted), and no
task is in two splits. So a file needs a few dozen distinct tasks for a test split
(`bmrl.assembly.python_splits` refuses one without train or test tasks), and adding tasks at the end
never moves the earlier ones. `data.train_size` / `val_size` / `test_size`, when set, keep the first n of a split.
"""

from __future__ import annotations

import json
import os


class TaskFileError(ValueError):
    """A task file that cannot be read: missing, not UTF-8, a line that is not a JSON object, no task."""


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
    if not tasks:
        raise TaskFileError(f"{str(path)!r} holds 0 task(s); write one JSON object (a task) a line.")
    return tasks


__all__ = ["TaskFileError", "read_tasks"]
