"""Training metrics out: a JSONL file, TensorBoard scalars (tensorboardX) and a tqdm progress bar.

    log = MetricsLogger(out_dir, start_step=0)       # metrics.jsonl + tb/
    log.write(step, {"train/success": 0.4, ...})
    bar = Progress(total=steps, initial=start)       # live success rate, tokens/s and ETA
    bar.update(success=0.4, tokens_per_s=1.2e4)

On resume, the records written after the checkpoint resumed from are dropped from the JSONL, so the
file reads as one uninterrupted run: exactly the first `keep_records` (the count the checkpoint
stored, `logger.count` at save time), or else those at steps <= `start_step`.
On a multi-process run only process 0 writes (`bmrl.distributed.main_writes`); the others count the same records.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def to_scalar(v: Any) -> float | int | bool | None:
    """A JSON-friendly Python scalar (nan/inf become None)."""
    v = np.asarray(v).item() if not isinstance(v, (int, float, bool)) else v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` through a temporary file and a rename, so a reader (or
    a resume after a kill) sees the old file or the new one, never a cut one."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every record of a metrics.jsonl (skipping a torn last line of a killed run)."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def write_jsonl_atomic(path: str | os.PathLike, records: list[dict]) -> None:
    """Rewrite a JSONL file with `records` through a temporary file and a rename (a kill leaves the
    old file, never a cut one)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    os.replace(tmp, path)


class MetricsLogger:
    """Append-only JSONL (`out_dir/metrics.jsonl`) and TensorBoard (`out_dir/tb`) of scalar metrics."""

    def __init__(self, out_dir: str | os.PathLike, start_step: int = 0, tensorboard: bool = True,
                 keep_records: int | None = None, name: str = "metrics.jsonl"):
        from bmrl.distributed import main_writes

        self.path = os.path.join(out_dir, name)  # SFT logs to sft_metrics.jsonl with the same logger
        if keep_records is not None:
            kept = read_jsonl(self.path)[: max(int(keep_records), 0)]
        else:
            kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= start_step] if start_step else []
        self.count = len(kept)  # records in the file (a checkpoint stores it: see keep_records)
        self._file = self._tb = None

        def open_files() -> None:  # process 0 only: the other processes of a run keep no files (`write`)
            os.makedirs(out_dir, exist_ok=True)
            write_jsonl_atomic(self.path, kept)
            self._file = open(self.path, "a", buffering=1)
            if tensorboard:
                from tensorboardX import SummaryWriter

                purge = start_step + 1 if start_step else None
                self._tb = SummaryWriter(os.path.join(out_dir, "tb"), purge_step=purge)

        main_writes(f"bmrl-metrics-{name}", open_files, wait=False)  # every record after is a line: no meetings

    def write(self, step: int, metrics: dict[str, Any]) -> dict:
        """Log scalars at `step`; returns the JSON record written."""
        record = {"step": int(step)}
        record.update({k: to_scalar(v) for k, v in metrics.items()})
        self.count += 1
        if self._file is None:
            return record
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


class Progress:
    """A tqdm bar over train steps with live success rate and tokens/s; tqdm computes the ETA.

    Disabled when stderr is not a terminal or CI is set (logs stay clean), unless `enable=True`.
    `on_step(n, total)`, called bar or no bar, every `every` steps (default: a tenth of `total`) and
    at the last step, lets a caller report progress in plain lines (`bmrl.stages`).
    """

    def __init__(self, total: int, initial: int = 0, enable: bool | None = None, desc: str = "train",
                 on_step: Callable[[int, int], Any] | None = None, every: int | None = None):
        from tqdm.auto import tqdm

        self.n, self.total, self.on_step = initial, total, on_step
        self.every = max(1, every or total // 10)

        if enable is None:
            enable = sys.stderr.isatty() and os.environ.get("CI", "").lower() not in ("1", "true")
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=not enable, dynamic_ncols=True)

    def update(self, n: int = 1, **postfix: float) -> None:
        self.bar.set_postfix({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in postfix.items()}, refresh=False)
        self.bar.update(n)
        before, self.n = self.n, self.n + n
        if self.on_step is not None and (self.n // self.every > before // self.every or self.n >= self.total > before):
            self.on_step(self.n, self.total)

    def write(self, text: str) -> None:
        self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


__all__ = ["MetricsLogger", "Progress", "read_jsonl", "to_scalar", "write_json_atomic"]
