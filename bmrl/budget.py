"""Turn-budget samplers for BudgetMix: caps drawn per rollout, inside jit, as data.

A `Budget` describes a distribution over turn caps. `Budget.sample(key, batch)` draws an int32 cap
per sequence inside jit, so a fixed budget, a mixture, a uniform range and an evaluation grid all run
through the same compiled rollout (caps are data, not shapes).

Samplers are a registry (`SAMPLERS`, kind -> class): a new one is one `@sampler("name")` class here.
Its dataclass fields are the keys it reads from its config section (`budget`, or a reproduce variant):
`budgets`, `probs`, `lo`, `hi` at the section's top level, any other under the section's `options`;
it checks itself in `__post_init__` (raising `BudgetError` naming the field) and draws its caps in
`draw`. Config validation (`bmrl.config.make_budget`) and the study's report read the registry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bmrl.registry import Registry, UnknownName

SAMPLERS: Registry[type["Budget"]] = Registry("budget kind")  # kind -> its Budget class (`@sampler`)


class BudgetError(ValueError):
    """An invalid turn budget (non-positive cap, probabilities that do not sum to 1, ...); `field`
    names the config key at fault."""

    def __init__(self, message: str, field: str = "budgets"):
        super().__init__(message)
        self.field = field


def sampler(kind: str):
    """Register a `Budget` subclass (a frozen dataclass) as budget kind `kind`."""

    def register(cls: type[Budget]) -> type[Budget]:
        cls.kind = kind
        return SAMPLERS.add(kind, cls)

    return register


@dataclasses.dataclass(frozen=True)
class Budget:
    """A distribution over per-sequence turn caps; subclasses (`SAMPLERS`) give `support` and `draw`."""

    kind: ClassVar[str] = ""

    @property
    def support(self) -> tuple[int, ...]:
        """Every cap this budget can draw, in increasing order."""
        raise NotImplementedError

    @property
    def cap_range(self) -> tuple[int, int]:
        """(smallest, largest) cap, without listing the whole support."""
        return self.support[0], self.support[-1]

    @property
    def min_cap(self) -> int:
        return self.cap_range[0]

    @property
    def max_cap(self) -> int:
        return self.cap_range[1]

    def describe(self) -> str:
        """The budget as reports name it, e.g. `mix [4, 8]`."""
        raise NotImplementedError

    def draw(self, key: jax.Array, n: int) -> jax.Array:
        """int32[n] caps, one per group (or per sequence); jittable, `n` static."""
        raise NotImplementedError

    def sample(
        self, key: jax.Array, batch: int, group_size: int = 1, share_in_group: bool = True
    ) -> jax.Array:
        """Draw caps: int32[batch]. Jittable; `batch`, `group_size` and `share_in_group` are static.

        With `share_in_group`, the `group_size` contiguous members of each group (one task's attempts)
        share one cap; otherwise every sequence draws its own.
        """
        if batch % group_size:
            raise BudgetError(f"batch {batch} is not a multiple of group_size {group_size}.")
        caps = self.draw(key, batch // group_size if share_in_group else batch)
        if share_in_group:
            caps = jnp.repeat(caps, group_size)
        return caps


def _check_caps(kind: str, budgets: tuple[int, ...]) -> None:
    if not budgets:
        raise BudgetError(f"{kind} budget needs at least one turn cap in `budgets`.")
    if any(int(b) != b or b < 1 for b in budgets):
        raise BudgetError(f"Turn caps must be integers >= 1; got {list(budgets)}.")


@sampler("fixed")
@dataclasses.dataclass(frozen=True)
class Fixed(Budget):
    """Always `budgets[0]` (exactly one cap)."""

    budgets: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_caps(self.kind, self.budgets)
        if len(self.budgets) != 1:
            raise BudgetError(f"a fixed budget takes exactly one cap, got {list(self.budgets)}.")

    @property
    def support(self) -> tuple[int, ...]:
        return (self.budgets[0],)

    def describe(self) -> str:
        return f"fixed {list(self.budgets)}"

    def draw(self, key: jax.Array, n: int) -> jax.Array:
        return jnp.full((n,), self.budgets[0], jnp.int32)


@sampler("mix")
@dataclasses.dataclass(frozen=True)
class Mix(Budget):
    """`budgets` drawn with probabilities `probs` (uniform over `budgets` when null)."""

    budgets: tuple[int, ...]
    probs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_caps(self.kind, self.budgets)
        if self.probs is None:
            object.__setattr__(self, "probs", (1.0 / len(self.budgets),) * len(self.budgets))
        if len(self.probs) != len(self.budgets):
            raise BudgetError(f"mix budget has {len(self.budgets)} caps but {len(self.probs)} probabilities; "
                              "give one probability per cap.", "probs")
        if any(not p >= 0 for p in self.probs) or not math.isclose(sum(self.probs), 1.0, abs_tol=1e-6):
            raise BudgetError(f"mix probabilities must be >= 0 and sum to 1; got {list(self.probs)} "
                              f"(sum {sum(self.probs):.6g}).", "probs")

    @property
    def support(self) -> tuple[int, ...]:
        return tuple(sorted({b for b, p in zip(self.budgets, self.probs) if p > 0}))

    def describe(self) -> str:
        uniform = len(set(self.probs)) == 1
        return f"mix {list(self.budgets)}" + ("" if uniform else f" p={list(self.probs)}")

    def draw(self, key: jax.Array, n: int) -> jax.Array:
        values = jnp.asarray(self.budgets, jnp.int32)
        logits = jnp.log(jnp.asarray(self.probs, jnp.float32))
        return values[jax.random.categorical(key, logits, shape=(n,))]


@sampler("uniform")
@dataclasses.dataclass(frozen=True)
class Uniform(Budget):
    """Every integer cap in [lo, hi] equally likely."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (1 <= self.lo <= self.hi):
            raise BudgetError(f"uniform budget needs 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}.", "lo")

    @property
    def support(self) -> tuple[int, ...]:
        return tuple(range(self.lo, self.hi + 1))

    @property
    def cap_range(self) -> tuple[int, int]:
        return self.lo, self.hi

    def describe(self) -> str:
        return f"uniform [{self.lo}, {self.hi}]"

    def draw(self, key: jax.Array, n: int) -> jax.Array:
        return jax.random.randint(key, (n,), self.lo, self.hi + 1, dtype=jnp.int32)


def fields(kind: str) -> tuple[str, ...]:
    """The config keys budget kind `kind` reads (its dataclass fields)."""
    return tuple(f.name for f in dataclasses.fields(SAMPLERS[kind]))


def make(kind: str, **values: Any) -> Budget:
    """The budget of kind `kind` from its keys (`fields(kind)`); lists become tuples."""
    try:
        cls = SAMPLERS.lookup(kind)
    except UnknownName as err:
        raise BudgetError(str(err), "kind") from None
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def cap_range(budget: Budget) -> tuple[int, int]:
    """(smallest, largest) cap of a `Budget`, without listing a uniform budget's whole range."""
    return budget.cap_range


def fixed(t: int) -> Budget:
    """Always cap at `t` turns."""
    return Fixed(budgets=(int(t),))


def mix(budgets: Sequence[int], probs: Sequence[float] | None = None) -> Budget:
    """Draw the cap from `budgets` with `probs` (uniform over `budgets` when omitted)."""
    return Mix(budgets=tuple(int(b) for b in budgets), probs=None if probs is None else tuple(float(p) for p in probs))


def uniform(lo: int, hi: int) -> Budget:
    """Draw the cap uniformly from the integers lo..hi (inclusive)."""
    return Uniform(lo=int(lo), hi=int(hi))
