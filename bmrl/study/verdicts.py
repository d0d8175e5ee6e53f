"""Verdicts as data: each finding of the study is `as_study`, `opposite` or `inconclusive`, decided by a
written rule from bootstrap intervals; the sentences are generated from the verdicts, never the reverse.

The study: "What Does Multi-Turn Reinforcement Learning Really Improve in LLM Agents?". Its findings:
- F1: RL's gain over the base shrinks when the turn budget is tight.
- F2: RL improves recovery after errors more than single decisions in clean states.
- F3: training with BudgetMix (per-sequence turn caps) is robust across test budgets T.

The rules read `bmrl.eval.bootstrap.Interval`s (their significance rule: the interval excludes 0 and
rests on at least `MIN_UNITS_FOR_SIGNIFICANCE` tasks); with fewer tasks every verdict is
`inconclusive` and says why. The intervals themselves are measured in `bmrl.study.findings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bmrl.eval.bootstrap import MIN_UNITS_FOR_SIGNIFICANCE, Interval

VERDICTS = ("as_study", "opposite", "inconclusive")
STUDY = "What Does Multi-Turn Reinforcement Learning Really Improve in LLM Agents?"

RULES = {
    "F1": ("G = (RL - base Pass@(1,T) at the largest T) - (the same at the small T, reproduce.small_t; the smallest "
           "T of the grid in bmrl compare), per task. as_study if G's interval is above 0; opposite if below 0; else "
           "inconclusive."),
    "F2": ("dRec = change (RL - base) of accuracy P(action = oracle) in the states right after a first error, "
           "dClean = its change in clean states (no earlier error in the attempt), both on the states the two "
           "policies shared (same tasks and keys), pooled over tasks; D = dRec - dClean; intervals resample "
           "tasks. as_study if D's "
           "interval is above 0 and dClean's interval is not above 0 (clean decisions did not improve "
           "significantly); opposite if D's interval is below 0, or dClean's interval is above 0 and D's "
           "interval is not above 0 (the gain is in clean decisions); else inconclusive."),
    "F3": ("For each fixed budget, BudgetMix minus it on the worst case over the test budgets, min over T of "
           "Pass@(1,T) (robust across T: no test budget at which it falls behind). as_study if that interval is "
           "above 0 against every fixed budget; opposite if it is below 0 against some fixed budget; else "
           "inconclusive. Min over T of Pass@(4,T) and the area under the Pass@(K,T) surface are reported beside "
           "it and do not vote."),
}
F3_DECIDES = "min_pass1"  # the one F3 measure that votes (RULES["F3"])
DEAD_RUN_RULE = ("A verdict holds without the dead runs (RL runs flagged by bmrl.learn.health.RULE, and every RL run "
                 "of a seed whose SFT base RL cannot learn from, by UNTRAINABLE_BASE_RULE) when the same "
                 "finding, measured again on the seeds in which none of the RL runs it reads is dead (F1, F2: the "
                 "generous-budget run; F3: BudgetMix and both fixed budgets), gets the same verdict; when every seed "
                 "has such a dead run it cannot be checked, and the verdict rests on dead runs.")
UNTRAINABLE_BASE_RULE = ("An SFT base is one RL cannot learn from when a task group of G = train.group_size attempts "
                         "is more likely to carry no signal than some (every attempt failing, or every one "
                         "succeeding): 1 - p^G - (1 - p)^G < 0.5, with p its held-out Pass@(1,T) at the largest T.")


def group_signal_chance(p: float, group_size: int) -> float:
    """The chance that `group_size` independent attempts of success probability `p` do not all agree: the
    share of task groups whose outcome rewards differ (the only ones an outcome advantage learns from)."""
    return float(1.0 - p ** group_size - (1.0 - p) ** group_size)


def untrainable_base(p: float, group_size: int) -> bool:
    """`UNTRAINABLE_BASE_RULE`: fewer than half of the task groups are expected to carry signal."""
    return group_signal_chance(p, group_size) < 0.5
CLAIMS = {
    "F1": "RL's gain shrinks when the turn budget is tight",
    "F2": "RL improves recovery after errors more than decisions in clean states",
    "F3": "BudgetMix is robust across test budgets, ahead of fixed-budget training",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A finding's verdict, the rule that decided it, why, and the intervals it read."""

    finding: str
    verdict: str
    rule: str
    reason: str
    intervals: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sentence(self) -> str:
        """One sentence generated from the verdict: the claim, what this run says, and why."""
        claim = CLAIMS[self.finding]
        say = {"as_study": f"as the study found ({claim})", "opposite": f"the opposite of the study's finding ({claim})",
               "inconclusive": f"inconclusive on this run for the study's finding ({claim})"}[self.verdict]
        return f"{self.finding}: {say}: {self.reason}."


def _verdict(finding: str, verdict: str, reason: str, recs: Mapping[str, Interval]) -> Verdict:
    return Verdict(finding, verdict, RULES[finding], reason, {k: e.to_dict() for k, e in recs.items()})


def _too_few(finding: str, recs: dict[str, Interval], shown: str | None = None) -> Verdict | None:
    """`inconclusive` when an interval rests on fewer than MIN_UNITS_FOR_SIGNIFICANCE tasks; `shown`:
    the intervals in words (default: each by its name)."""
    n = min(e.num_tasks for e in recs.values())
    if n >= MIN_UNITS_FOR_SIGNIFICANCE:
        return None
    shown = shown or ", ".join(f"{k} {e.format(signed=True)}" for k, e in recs.items())
    why = (f"{shown}, but only {n} task(s) with the measure defined, fewer than {MIN_UNITS_FOR_SIGNIFICANCE}; an "
           "interval over so few tasks is not trusted")
    return _verdict(finding, "inconclusive", why, recs)


def f1_verdict(gain_large_minus_small: Any, t_small: int | None = None, t_large: int | None = None) -> Verdict:
    """F1 from the interval of G = gain at the largest T minus gain at the small T (RULES["F1"]);
    `t_small`, `t_large`: the two budgets, named in the reason."""
    g = Interval.of(gain_large_minus_small)
    recs = {"gain_large_minus_small": g}
    large = "the large-T gain" if t_large is None else f"the gain at T={t_large}"
    small = "the small-T gain" if t_small is None else f"the gain at T={t_small}"
    shown = f"{large} minus {small} is {g.format(signed=True)}"
    if (v := _too_few("F1", recs, shown)) is not None:
        return v
    verdict = "as_study" if g.above_zero else "opposite" if g.below_zero else "inconclusive"
    where = {"as_study": "above 0", "opposite": "below 0", "inconclusive": "includes 0"}[verdict]
    reason = f"{shown}, its interval {where}"
    return _verdict("F1", verdict, reason, recs)


def f2_verdict(delta_recovery: Any, delta_clean: Any, difference: Any) -> Verdict:
    """F2 from the intervals of dRec, dClean and D = dRec - dClean (RULES["F2"])."""
    dr, dc, d = Interval.of(delta_recovery), Interval.of(delta_clean), Interval.of(difference)
    recs = {"delta_recovery_accuracy": dr, "delta_clean_accuracy": dc, "recovery_minus_clean": d}
    if (v := _too_few("F2", recs)) is not None:
        return v
    if d.above_zero and not dc.above_zero:
        verdict, why = "as_study", "D's interval is above 0 and dClean's is not"
    elif d.below_zero:
        verdict, why = "opposite", "D's interval is below 0"
    elif dc.above_zero and not d.above_zero:
        verdict, why = "opposite", "dClean's interval is above 0 and D's is not"
    elif d.above_zero:
        verdict, why = "inconclusive", "both improved: D's interval is above 0 but so is dClean's"
    else:
        verdict, why = "inconclusive", "D's interval includes 0 and dClean's is not above 0"
    reason = (f"on the states both policies met, accuracy right after an error changed by {dr.format(signed=True)}, "
              f"in clean states by {dc.format(signed=True)}, their difference D = {d.format(signed=True)}; {why}")
    return _verdict("F2", verdict, reason, recs)


def f3_verdict(mix_minus: Mapping[str, Mapping[str, Any]]) -> Verdict:
    """F3 from {fixed budget: {measure: interval of BudgetMix minus it}} (RULES["F3"]: `F3_DECIDES` votes, the
    other measures are reported)."""
    if not mix_minus:
        raise ValueError("F3 needs at least one fixed budget to compare BudgetMix with.")
    missing = [b for b, ms in mix_minus.items() if F3_DECIDES not in ms]
    if missing:
        raise ValueError(f"F3 decides on {F3_DECIDES} (min over T of Pass@(1,T)), missing against {missing}: "
                         "the evaluation grid needs K=1 (eval.ks).")
    ivs = {b: {m: Interval.of(e) for m, e in ms.items()} for b, ms in mix_minus.items()}
    recs = {f"{b}/{m}": e for b, ms in ivs.items() for m, e in ms.items()}
    if (v := _too_few("F3", recs)) is not None:
        return v
    deciding = {b: ms[F3_DECIDES] for b, ms in ivs.items()}
    if all(e.above_zero for e in deciding.values()):
        verdict = "as_study"
    elif any(e.below_zero for e in deciding.values()):
        verdict = "opposite"
    else:
        verdict = "inconclusive"
    parts = [f"against {b}: " + ", ".join(f"{m} {e.format(signed=True)}" + (" (decides)" if m == F3_DECIDES else "")
                                          for m, e in ms.items()) for b, ms in ivs.items()]
    return _verdict("F3", verdict, "BudgetMix minus each fixed budget, " + "; ".join(parts), recs)
