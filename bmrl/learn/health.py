"""Is a training run still learning? A written rule over the step metrics, so a run that has lost its
signal says so in its log, its summary and the study's report instead of training on quietly.

    health = RunHealth(window=5, invalid_rise=0.3)
    for step, metrics in ...:
        flag = health.observe(step, success, signal, invalid_rate)   # a `Flag` the first time

The rule (`RULE`): a run is **dead** from the first step at which either held over the last `window`
steps in a row:
- *no signal*: every advantage of the batch was 0, so no update was taken (`bmrl.learn.step.keep_finite`;
  with outcome rewards alone: no group's rewards differed), and not every rollout succeeded (a run in which
  every rollout succeeds has nothing left to learn; it is *saturated*, not dead);
- *invalid actions*: the invalid-action rate of each of those steps was at least `invalid_rise` above
  the run's first step (the starting policy's own rate).
Once flagged, a run stays flagged (its later steps are recorded too: `still_at_end`), and goes on
training: the caller decides what a dead run means (the study checks each verdict without it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

RULE = ("A run is dead from the first step at which, for `train.dead_after` steps in a row, either every advantage "
        "of the batch was 0 (no group's rewards differed: no update taken) while not every rollout succeeded, or the "
        "invalid-action rate was at least `train.dead_invalid_rise` above the run's first step.")


@dataclasses.dataclass(frozen=True)
class Flag:
    """Why and since when a run is dead: `kind` is "no_signal" or "invalid_actions"."""

    kind: str
    step: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RunHealth:
    """The rule's state over a run's steps; `to_dict` / `from_dict` carry it through a checkpoint."""

    window: int = 5
    invalid_rise: float = 0.3
    first_invalid: float | None = None  # the invalid-action rate of the run's first step
    no_signal_run: list[int] = dataclasses.field(default_factory=list)  # steps of the current no-signal streak
    high_invalid_run: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (step, rate) streak
    saturated_steps: int = 0  # steps with no signal because every rollout succeeded
    flags: list[Flag] = dataclasses.field(default_factory=list)
    last_step: int = 0
    still_at_end: bool = False  # a condition held over the window ending at the last step observed

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ValueError(f"window must be >= 0 (0 = off), got {self.window}.")

    @property
    def dead(self) -> bool:
        return bool(self.flags)

    def observe(self, step: int, success: float, signal: bool | int, invalid_rate: float) -> Flag | None:
        """Record step `step`'s rollout success rate, whether its batch carried signal (any advantage not 0;
        a count of such groups or updates reads as its truth) and the invalid-action rate; returns a new `Flag`
        when the run is flagged at this step (else None)."""
        self.last_step = int(step)
        if self.first_invalid is None:
            self.first_invalid = float(invalid_rate)
        if self.window == 0:
            return None
        quiet = not signal
        if quiet and float(success) >= 1.0:
            self.saturated_steps += 1
        self.no_signal_run = self.no_signal_run + [int(step)] if quiet and float(success) < 1.0 else []
        high = float(invalid_rate) >= self.first_invalid + self.invalid_rise
        self.high_invalid_run = self.high_invalid_run + [(int(step), float(invalid_rate))] if high else []
        new = []
        if len(self.no_signal_run) >= self.window:
            s = self.no_signal_run
            new.append(Flag("no_signal", s[0], f"every advantage was 0 (no group's rewards differed, no update taken) "
                                               f"for {len(s)} steps in a row, steps {s[0]}-{s[-1]}, rollout success "
                                               f"{float(success):.3f} at step {step}"))
        if len(self.high_invalid_run) >= self.window:
            s = self.high_invalid_run
            new.append(Flag("invalid_actions", s[0][0], f"the invalid-action rate was {min(r for _, r in s):.2f}-"
                                                        f"{max(r for _, r in s):.2f} over steps {s[0][0]}-{s[-1][0]}, "
                                                        f"against {self.first_invalid:.2f} at the run's first step"))
        self.still_at_end = bool(new)
        fresh = [f for f in new if f.kind not in {g.kind for g in self.flags}]
        self.flags.extend(fresh)
        return fresh[0] if fresh else None

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `health`: dead or not, the flags (kind, first step, reason), the rule."""
        return {"dead": self.dead, "flags": [f.to_dict() for f in self.flags], "still_at_end": self.still_at_end,
                "saturated_steps": self.saturated_steps, "first_invalid_rate": self.first_invalid,
                "last_step": self.last_step, "window": self.window, "invalid_rise": self.invalid_rise,
                "no_signal_run": list(self.no_signal_run), "high_invalid_run": [list(x) for x in self.high_invalid_run],
                "rule": RULE}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, window: int, invalid_rise: float) -> RunHealth:
        """The state `to_dict` saved (a fresh one for None), under this run's window and rise."""
        if not d:
            return cls(window, invalid_rise)
        return cls(window, invalid_rise, d.get("first_invalid_rate"), [int(s) for s in d.get("no_signal_run", [])],
                   [(int(s), float(r)) for s, r in d.get("high_invalid_run", [])], int(d.get("saturated_steps", 0)),
                   [Flag(**f) for f in d.get("flags", [])], int(d.get("last_step", 0)), bool(d.get("still_at_end")))

    def describe(self) -> str:
        """One line for a log: dead since when and why, or healthy."""
        if not self.dead:
            return "learning (no step window without signal or with a raised invalid-action rate)"
        return "; ".join(f"dead since step {f.step}: {f.reason}" for f in self.flags)


__all__ = ["Flag", "RULE", "RunHealth"]
