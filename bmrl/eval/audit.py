"""Plain-language reporting: the budget audit, the budget-visibility warning, markdown tables.

The audit answers the question a team deploying an agent at a turn cap must ask: does the success
(or the gain over a baseline) measured with a generous turn budget survive at the cap that will run
in production? Inputs are `SurfaceInterval`s (bmrl.eval.bootstrap); this module needs only numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bmrl.eval import markdown

if TYPE_CHECKING:
    from bmrl.eval.bootstrap import SurfaceInterval


def _check_cap(surface: SurfaceInterval, production_cap: int) -> int:
    largest = max(surface.ts)
    if production_cap not in surface.ts:
        raise ValueError(f"production cap T={production_cap} is not on the grid ts={list(surface.ts)}; add it.")
    return largest


def run_audit(name: str, surface: SurfaceInterval, production_cap: int, ks: Sequence[int] | None = None) -> list[str]:
    """One sentence per K: the run's Pass@(K,T) at the production cap against the largest logged T."""
    largest = _check_cap(surface, production_cap)
    pct = int(round(100 * surface.confidence))
    out = []
    for k in ks or surface.ks:
        big = surface.interval(k, largest)
        cap = surface.interval(k, production_cap)
        if production_cap >= largest:
            out.append(f"{name}: Pass@({k},T) is {cap.format()} at the production cap T={production_cap}, the largest logged T.")
            continue
        kept = f"keeps {100 * cap.mean / big.mean:.0f}% of it" if big.mean > 0 else "and it was 0 there anyway"
        lost = big.mean - cap.mean
        out.append(
            f"{name}: Pass@({k},T) is {big.format()} at the largest logged T={largest} and {cap.format()} at the "
            f"production cap T={production_cap} ({pct}% intervals); the cap {kept}"
            + (f", losing {lost:.3f} of success probability." if lost > 0 else ".")
        )
    return out


def paired_audit(
    name_a: str,
    name_b: str,
    difference: SurfaceInterval,
    production_cap: int,
    ks: Sequence[int] | None = None,
) -> list[str]:
    """Does the gain of run a over run b (difference = a - b) at the largest T survive at the cap?

    "Significant" means the bootstrap interval of the paired difference excludes zero and there
    are enough tasks to say so (`SurfaceInterval.significant`); otherwise the first sentence says why not.
    """
    largest = _check_cap(difference, production_cap)
    pct = int(round(100 * difference.confidence))
    sig = difference.significant()
    note = difference.significance_note()
    out = [note[0].upper() + note[1:]] if note else []
    for k in ks or difference.ks:
        big, cap = difference.interval(k, largest), difference.interval(k, production_cap)
        d_big, d_cap = big.mean, cap.mean
        sig_big = bool(sig[difference.ks.index(k), difference.ts.index(largest)])
        sig_cap = bool(sig[difference.ks.index(k), difference.ts.index(production_cap)])
        at_big = f"{big.format(signed=True)} at T={largest}"
        at_cap = f"{cap.format(signed=True)} at the production cap T={production_cap}"
        metric = f"Pass@({k},T)"
        if production_cap >= largest:
            verdict = "significant" if sig_big else "not significant"
            out.append(
                f"At the production cap T={production_cap}, the largest logged T, {name_a} - {name_b} in {metric} "
                f"is {big.format(signed=True)} ({verdict} at {pct}%); log longer runs to see what a larger cap would change."
            )
        elif sig_big:
            winner, loser = (name_a, name_b) if d_big > 0 else (name_b, name_a)
            sign = 1.0 if d_big > 0 else -1.0
            if sig_cap and sign * d_cap > 0:
                out.append(
                    f"The gain of {winner} over {loser} in {metric} survives at the production cap: "
                    f"{name_a} - {name_b} = {at_big} and {at_cap} ({pct}% intervals exclude 0)."
                )
            elif sig_cap:
                out.append(
                    f"The gain of {winner} over {loser} in {metric} reverses at the production cap: "
                    f"{name_a} - {name_b} = {at_big} but {at_cap}; at cap {production_cap}, {loser} is the better run."
                )
            else:
                out.append(
                    f"The gain of {winner} over {loser} in {metric} at T={largest} does not survive at the "
                    f"production cap: {name_a} - {name_b} = {at_big} but {at_cap}, which the {pct}% interval "
                    f"does not separate from 0. Do not count on this gain when running with cap {production_cap}."
                )
        elif sig_cap:
            better = name_a if d_cap > 0 else name_b
            out.append(
                f"{name_a} and {name_b} do not differ significantly in {metric} at T={largest} "
                f"({name_a} - {name_b} = {at_big}), but at the production cap {better} is better: {at_cap}."
            )
        else:
            out.append(
                f"{name_a} and {name_b} do not differ significantly in {metric} at T={largest} "
                f"({name_a} - {name_b} = {at_big}) nor at the production cap ({at_cap})."
            )
    return out


def budget_visibility_warning(names: Sequence[str]) -> str:
    """The validity warning for runs whose agent could see its turn budget."""
    who = ", ".join(names)
    return (
        f"Warning: the turn budget was visible to the agent in {who}. Truncating a logged run at T is then "
        "not the same as running it with cap T (an agent that sees its budget plans for it), so Pass@(K,T) "
        "below the logged cap is not a valid estimate. Rerun each T with its real cap (bmrl eval --mode exact)."
    )


def markdown_surface_table(surface: SurfaceInterval, ts: Sequence[int] | None = None, signed: bool = False) -> str:
    """A markdown table: one row per T, one column per K, cells 'estimate [lower, upper]'.

    Cells called significant (`SurfaceInterval.significant`) are bolded when `signed` (differences)."""
    ts = list(ts or surface.ts)
    sig = surface.significant()
    rows = []
    for t in ts:
        cells: list[object] = [t]
        for k in surface.ks:
            text = surface.interval(k, t).format(signed)
            cells.append(f"**{text}**" if signed and sig[surface.ks.index(k), surface.ts.index(t)] else text)
        rows.append(cells)
    return markdown.table(["T"] + [f"K={k}" for k in surface.ks], rows, align="right")


def markdown_key_values(items: Mapping[str, object]) -> str:
    """A two-column markdown table of facts (name, value)."""
    return markdown.key_values(items)


def surface_rows(surface: SurfaceInterval) -> list[tuple[int, int, float, float, float]]:
    """Long-format rows (k, t, estimate, lower, upper), the CSV layout of a surface."""
    est, lo, hi = (np.asarray(a) for a in (surface.estimate, surface.lower, surface.upper))
    return [
        (k, t, float(est[i, j]), float(lo[i, j]), float(hi[i, j]))
        for i, k in enumerate(surface.ks)
        for j, t in enumerate(surface.ts)
    ]
