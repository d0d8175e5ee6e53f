"""Turn-budget samplers for BudgetMix: caps drawn per rollout, inside jit, as data.

A `Budget` describes a distribution over turn caps. `Budget.sample(key, batch)` draws an int32 cap
per sequence inside jit, so a fixed budget, a mixture, a uniform range and an evaluation grid all run
through the same compiled rollout (caps are data, not shapes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

KINDS = ("fixed", "mix", "uniform")


class BudgetError(ValueError):
    """An invalid turn budget (non-positive cap, probabilities that do not sum to 1, ...)."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """A distribution over per-sequence turn caps.

    kind: "fixed" (always `budgets[0]`), "mix" (`budgets` with probabilities `probs`) or "uniform"
    (every integer in [lo, hi] equally likely).
    """

    kind: str
    budgets: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    lo: int = 0
    hi: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BudgetError(f"Unknown budget kind {self.kind!r}; valid kinds: {', '.join(KINDS)}.")
        if self.kind == "uniform":
            if not (1 <= self.lo <= self.hi):
                raise BudgetError(
                    f"uniform budget needs 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}."
                )
            return
        if not self.budgets:
            raise BudgetError(f"{self.kind} budget needs at least one turn cap in `budgets`.")
        bad = [b for b in self.budgets if int(b) != b or b < 1]
        if bad:
            raise BudgetError(f"Turn caps must be integers >= 1; got {list(self.budgets)}.")
        if self.kind == "fixed" and len(self.budgets) != 1:
            raise BudgetError(f"fixed budget takes exactly one cap, got {list(self.budgets)}.")
        if self.kind == "mix":
            if len(self.probs) != len(self.budgets):
                raise BudgetError(
                    f"mix budget has {len(self.budgets)} caps but {len(self.probs)} probabilities; "
                    "give one probability per cap."
                )
            if any(p < 0 for p in self.probs) or not math.isclose(sum(self.probs), 1.0, abs_tol=1e-6):
                raise BudgetError(
                    f"mix probabilities must be >= 0 and sum to 1; got {list(self.probs)} "
                    f"(sum {sum(self.probs):.6g})."
                )

    @property
    def support(self) -> tuple[int, ...]:
        """Every cap this budget can draw, in increasing order."""
        if self.kind == "uniform":
            return tuple(range(self.lo, self.hi + 1))
        if self.kind == "mix":
            return tuple(sorted({b for b, p in zip(self.budgets, self.probs) if p > 0}))
        return (self.budgets[0],)

    @property
    def min_cap(self) -> int:
        return self.support[0]

    @property
    def max_cap(self) -> int:
        return self.support[-1]

    def sample(
        self, key: jax.Array, batch: int, group_size: int = 1, share_in_group: bool = True
    ) -> jax.Array:
        """Draw caps: int32[batch]. Jittable; `batch`, `group_size` and `share_in_group` are static.

        With `share_in_group`, the `group_size` contiguous members of each group (one task's attempts)
        share one cap; otherwise every sequence draws its own.
        """
        if batch % group_size:
            raise BudgetError(f"batch {batch} is not a multiple of group_size {group_size}.")
        n = batch // group_size if share_in_group else batch
        if self.kind == "fixed":
            caps = jnp.full((n,), self.budgets[0], jnp.int32)
        elif self.kind == "uniform":
            caps = jax.random.randint(key, (n,), self.lo, self.hi + 1, dtype=jnp.int32)
        else:
            values = jnp.asarray(self.budgets, jnp.int32)
            logits = jnp.log(jnp.asarray(self.probs, jnp.float32))
            caps = values[jax.random.categorical(key, logits, shape=(n,))]
        if share_in_group:
            caps = jnp.repeat(caps, group_size)
        return caps


def cap_range(budget: Budget) -> tuple[int, int]:
    """(smallest, largest) cap of a `Budget`, without listing a uniform budget's whole range."""
    return (budget.lo, budget.hi) if budget.kind == "uniform" else (budget.min_cap, budget.max_cap)


def fixed(t: int) -> Budget:
    """Always cap at `t` turns."""
    return Budget("fixed", budgets=(int(t),))


def mix(budgets: Sequence[int], probs: Sequence[float] | None = None) -> Budget:
    """Draw the cap from `budgets` with `probs` (uniform over `budgets` when omitted)."""
    budgets = tuple(int(b) for b in budgets)
    if probs is None:
        probs = (1.0 / len(budgets),) * len(budgets) if budgets else ()
    return Budget("mix", budgets=budgets, probs=tuple(float(p) for p in probs))


def uniform(lo: int, hi: int) -> Budget:
    """Draw the cap uniformly from the integers lo..hi (inclusive)."""
    return Budget("uniform", lo=int(lo), hi=int(hi))
