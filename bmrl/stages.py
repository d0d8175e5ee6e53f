"""Stage progress of a job made of stages (`bmrl reproduce`): one line per event on stderr, TTY or not.

    stages = StageProgress(total=6)
    run_stage(stages, "seed 0 - SFT", "sft", run_sft, cfg)          # skipped if cfg.out_dir/summary.json exists
    stages.start("seed 0 - RL budgetmix", "rl"); stages.step(12, 30); stages.finish()

prints lines like `[stage 4/19] seed 2 - RL budgetmix - step 12/30 - eta 14 min`.

ETA rule: a stage is expected to cost what the last finished (run, not skipped) stage of its kind
("sft", "rl", "eval") cost, where that one was the first of its kind less the seconds it spent compiling
(`bmrl.compiles.compile_seconds`: later stages load those programs from the compile cache). A kind with
no finished stage yet: the stage under way, if of that kind, projects its own step progress (`step(n,
total)`: elapsed * total / n); otherwise the cheapest expectation of the kinds seen so far (a stage that
has not finished cannot say it is cheap); before any stage has finished, the stage under way's own
projection. The ETA is what the current stage has left of its expectation (never below 0) plus the
expectation of every stage not yet started (those that will turn out to be skipped included). With
neither a finished stage nor a step of the current one it is `eta ?`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bmrl import compiles


class StageProgress:
    """Counts the stages of a run (started or skipped) and writes one line per event."""

    def __init__(self, total: int, *, write: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 compile_clock: Callable[[], float] = compiles.compile_seconds):
        self.total = int(total)
        self.index = 0
        self.label = ""
        self.kind = ""
        self.started = 0.0
        self.compiled_at_start = 0.0
        self.done: list[tuple[str, float, float]] = []  # (kind, seconds, compile seconds) of stages run to the end
        self.skipped = 0
        self.progress = (0, 0)  # (steps done, steps) of the stage under way, from `step`
        self._kinds: list[str] = []  # kinds of the stages not yet started, when known (`plan`)
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._clock = clock
        self._compile_clock = compile_clock

    def plan(self, kinds: list[str]) -> None:
        """The kinds of all stages in order (sharpens the ETA; the total is len(kinds))."""
        self.total, self._kinds = len(kinds), list(kinds)

    def _own(self) -> float | None:
        """The stage under way's projection from its own step rate (None before its first step)."""
        n, total = self.progress
        return (self._clock() - self.started) * total / n if self.kind and n > 0 else None

    def _last(self, kind: str) -> float | None:
        """What the next stage of `kind` should cost, from the last finished one of its kind."""
        same = [(s, c) for k, s, c in self.done if k == kind]
        if not same:
            return None
        seconds, compiled = same[-1]
        return max(0.0, seconds - compiled) if len(same) == 1 else seconds

    def _expect(self, kind: str) -> float | None:
        last = self._last(kind)
        if last is not None:
            return last
        own = self._own()
        if kind and kind == self.kind and own is not None:
            return own
        seen = [self._last(k) for k in {k for k, _, _ in self.done}]
        return min(seen) if seen else own

    def eta(self) -> str:
        """`eta N min` by the module's rule, or `eta ?` with nothing to project from."""
        if self._expect(self.kind) is None:
            return "eta ?"
        left = 0.0
        if self.kind:  # the stage under way
            left += max(0.0, (self._expect(self.kind) or 0.0) - (self._clock() - self.started))
        for kind in self._kinds[self.index:] if self._kinds else [""] * (self.total - self.index):
            left += self._expect(kind) or 0.0
        minutes = left / 60
        return "eta <1 min" if minutes < 1 else f"eta {minutes:.0f} min"

    def line(self, *parts: str) -> str:
        return " - ".join([f"[stage {self.index}/{self.total}] {self.label}", *parts])

    def _emit(self, *parts: str) -> None:
        self._write(self.line(*parts))

    def say(self, text: str) -> None:
        """A plain line about the whole run (no stage prefix)."""
        self._write(text)

    def start(self, label: str, kind: str) -> None:
        self.index, self.label, self.kind, self.started = self.index + 1, label, kind, self._clock()
        self.compiled_at_start = self._compile_clock()
        self.progress = (0, 0)
        self._emit("started", self.eta())

    def skip(self, label: str, why: str = "done already") -> None:
        self.index, self.label, self.kind = self.index + 1, label, ""
        self.skipped += 1
        self._emit(f"skipped ({why})")

    def advance(self, n: int, total: int) -> None:
        """Record the stage's step progress without a line (its own log lines then carry the ETA)."""
        self.progress = (int(n), int(total))

    def step(self, n: int, total: int) -> None:
        """Step progress of the stage under way (e.g. from `bmrl.metrics.Progress`'s `on_step`)."""
        self.advance(n, total)
        self._emit(f"step {n}/{total}", self.eta())

    def note(self, text: str) -> None:
        """A message of the stage under way, e.g. which policy is being evaluated."""
        self._emit(text, self.eta())

    def finish(self) -> None:
        seconds = self._clock() - self.started
        self.done.append((self.kind, seconds, self._compile_clock() - self.compiled_at_start))
        self.kind = ""
        self._emit(f"done in {seconds / 60:.1f} min", self.eta())


def check_stage_config(out_dir: str, cfg: Any, kind: str) -> None:
    """Refuse to reuse a finished stage in `out_dir` whose config.yaml differs from `cfg` in a setting the
    stage's result depends on (`bmrl.rundir.SECTIONS`, every key of them: unlike a resumable run, a
    finished stage with other `train.steps` is not reused); raises ConfigError naming the keys and the fix."""
    from bmrl.config import ConfigError, changed_keys, read_yaml, to_dict
    from bmrl.rundir import SECTIONS

    path = os.path.join(out_dir, "config.yaml")
    if kind not in SECTIONS or not os.path.isfile(path):
        return
    changed = changed_keys(read_yaml(path), to_dict(cfg), SECTIONS[kind])
    if changed:
        shown = ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")
        raise ConfigError(changed[0], f"the finished stage in {out_dir} was made with other settings ({shown}); "
                          f"delete {out_dir} to redo it with these, or choose another out_dir.")


def run_stage(stages: StageProgress, label: str, kind: str, fn: Callable[[Any], dict], cfg: Any,
              marker: str = "summary.json") -> dict:
    """`fn(cfg)` as one stage; skipped (its saved summary returned) when `cfg.out_dir/marker` exists and
    was made with the same settings (`check_stage_config`; other settings are refused, not reused)."""
    path = os.path.join(cfg.out_dir, marker)
    if os.path.isfile(path):
        check_stage_config(cfg.out_dir, cfg, kind)
        stages.skip(label, f"done already: {path}")
        with open(path) as f:
            return json.load(f)
    stages.start(label, kind)
    out = fn(cfg)
    stages.finish()
    return out
