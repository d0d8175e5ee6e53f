"""How policies are evaluated beyond the Pass@(K,T) grid, in one object.

    settings = EvalSettings.from_config(cfg)                      # the config's (eval, reproduce sections)
    settings = EvalSettings.from_config(cfg, inject_turns=())     # the same without the injection run

The probe set of decision accuracy, the error-injection run and the back-on-track window are read
from the config once and passed down (`bmrl.eval.run.evaluate_policies`, `bmrl eval`, `bmrl reproduce`).
Turns are 1-based wherever a user or caller sees them (config, flags, reports, this object); they
become 0-based only where the compiled engine gets its injection mask (`bmrl.eval.evaluate.injection_at`).
Numpy-free on purpose: the config schema reads its defaults from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """probe_states: size of the decision-accuracy probe set (0 = none), reached by an oracle with
    `probe_noise`; inject_turns: 1-based turns of the error-injection run (() = none), each error
    forced with probability `inject_prob`; window: turns allowed to get back on track after an error."""

    probe_states: int = 256
    probe_noise: float = 0.25
    inject_turns: tuple[int, ...] = (1,)
    inject_prob: float = 1.0
    window: int = 3

    def __post_init__(self) -> None:
        turns = tuple(sorted({int(t) for t in self.inject_turns}))
        if turns and turns[0] < 1:
            raise ValueError(f"inject_turns {list(self.inject_turns)}: turns are 1-based (1 = the first turn).")
        object.__setattr__(self, "inject_turns", turns)

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> EvalSettings:
        """The settings of a `bmrl.config.Config` (eval.probe_states, reproduce.probe_noise,
        inject_turns, inject_prob, window), with `overrides` by field name (e.g. a command's flags)."""
        rep = cfg.reproduce
        read = dict(probe_states=cfg.eval.probe_states, probe_noise=rep.probe_noise,
                    inject_turns=tuple(rep.inject_turns), inject_prob=rep.inject_prob, window=rep.window)
        return cls(**{**read, **overrides})

    @property
    def injects(self) -> bool:
        """Whether an error-injection run is made (some turn, a probability above 0)."""
        return bool(self.inject_turns) and self.inject_prob > 0
