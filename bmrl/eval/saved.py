"""Evaluation results saved as JSON (never pickle) and read back, with what `bmrl reproduce` needs to
compute its findings, verdicts, table and figures: per-task surfaces, the per-turn episodes, the
probe set's per-state correctness and the surface under error injection. A rerun of a finished run
reads them instead of evaluating again.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from bmrl.eval.decompose import Episodes

VERSION = 1


@dataclasses.dataclass(frozen=True)
class SavedEval:
    """The parts of an `EvalResult` the study's statistics read (the same attribute names)."""

    ks: tuple[int, ...]
    ts: tuple[int, ...]
    num_tasks: int
    attempts: int
    per_task: np.ndarray  # float64[N, K, T]
    episodes: Episodes
    probe_correct: np.ndarray | None = None  # float64[S]: 1 where the policy took the oracle's action
    injected: SavedEval | None = None  # the same evaluation with errors forced

    @classmethod
    def of(cls, result: Any) -> SavedEval:
        """An `EvalResult` (or a SavedEval, returned as is) reduced to what is saved."""
        if isinstance(result, SavedEval):
            return result
        return cls(tuple(result.ks), tuple(result.ts), int(result.num_tasks), int(result.attempts),
                   np.asarray(result.per_task, np.float64), result.episodes,
                   None if result.probe is None else np.asarray(result.probe.correct, np.float64),
                   None if result.injected is None else cls.of(result.injected))

    def to_dict(self) -> dict[str, Any]:
        ep = self.episodes
        return {
            "ks": list(self.ks), "ts": list(self.ts), "num_tasks": self.num_tasks, "attempts": self.attempts,
            "per_task": self.per_task.tolist(),
            "episodes": {f: {"dtype": str(np.asarray(getattr(ep, f)).dtype), "data": np.asarray(getattr(ep, f)).tolist()}
                         for f in Episodes.FIELDS},
            "probe_correct": None if self.probe_correct is None else self.probe_correct.tolist(),
            "injected": None if self.injected is None else self.injected.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SavedEval:
        ep = Episodes(**{f: np.asarray(v["data"], dtype=v["dtype"]) for f, v in d["episodes"].items()},
                      num_tasks=int(d["num_tasks"]), attempts=int(d["attempts"]))
        return cls(tuple(d["ks"]), tuple(d["ts"]), int(d["num_tasks"]), int(d["attempts"]),
                   np.asarray(d["per_task"], np.float64), ep,
                   None if d["probe_correct"] is None else np.asarray(d["probe_correct"], np.float64),
                   None if d["injected"] is None else cls.from_dict(d["injected"]))


def save_results(path: str | os.PathLike, results: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """{policy: EvalResult or SavedEval} and the config that produced them, to `path` (written atomically).
    On a multi-process run process 0 writes and every process returns only once the file is there
    (`bmrl.distributed.main_writes`), so any of them may `load_results` it next."""
    from bmrl.distributed import main_writes
    from bmrl.metrics import write_json_atomic

    def write() -> None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        write_json_atomic(path, {"version": VERSION, "config": normalised(config),
                                 "policies": {n: SavedEval.of(r).to_dict() for n, r in results.items()}})

    main_writes("bmrl-saved-results", write)


def load_results(path: str | os.PathLike, config: Mapping[str, Any] | None = None) -> dict[str, SavedEval] | None:
    """The saved {policy: SavedEval}, or None when `path` is missing, of another version, or was made
    with a config other than `config` (when given)."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data = json.load(f)
    if data.get("version") != VERSION or (config is not None and data.get("config") != normalised(config)):
        return None
    return {n: SavedEval.from_dict(d) for n, d in data["policies"].items()}


def normalised(obj: Any) -> Any:
    """`obj` as JSON would give it back (tuples as lists), for comparisons with a loaded one."""
    return json.loads(json.dumps(obj, default=str))
