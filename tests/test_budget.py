"""Budget samplers: distributions, group sharing, jit, and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl import budget
from bmrl.budget import BudgetError


def test_fixed_is_constant():
    caps = budget.fixed(7).sample(jax.random.key(0), 12)
    assert caps.dtype == jnp.int32 and caps.shape == (12,)
    assert np.all(np.asarray(caps) == 7)


def test_mix_frequencies_match_probs():
    b = budget.mix([2, 8, 32], [0.2, 0.3, 0.5])
    caps = np.asarray(jax.jit(lambda k: b.sample(k, 20000))(jax.random.key(1)))
    assert set(np.unique(caps)) == {2, 8, 32}
    for cap, p in zip([2, 8, 32], [0.2, 0.3, 0.5]):
        freq = np.mean(caps == cap)
        se = np.sqrt(p * (1 - p) / caps.size)
        assert abs(freq - p) < 4 * se, (cap, freq, p)


def test_uniform_covers_range_inclusive():
    caps = np.asarray(budget.uniform(3, 6).sample(jax.random.key(2), 8000))
    assert caps.min() == 3 and caps.max() == 6
    counts = np.bincount(caps, minlength=7)[3:]
    assert np.all(np.abs(counts / caps.size - 0.25) < 0.03)


def test_group_sharing():
    b = budget.uniform(1, 50)
    shared = np.asarray(b.sample(jax.random.key(3), 64, group_size=8, share_in_group=True)).reshape(8, 8)
    assert np.all(shared == shared[:, :1])
    assert len(np.unique(shared[:, 0])) > 1
    own = np.asarray(b.sample(jax.random.key(3), 64, group_size=8, share_in_group=False)).reshape(8, 8)
    assert any(len(np.unique(row)) > 1 for row in own)


def test_support_and_extremes():
    b = budget.mix([16, 4, 8], [0.5, 0.0, 0.5])
    assert b.support == (8, 16) and b.min_cap == 8 and b.max_cap == 16
    assert budget.uniform(2, 4).support == (2, 3, 4)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: budget.fixed(0), "integers >= 1"),
        (lambda: budget.mix([4, 8], [0.5, 0.6]), "sum to 1"),
        (lambda: budget.mix([4, 8], [0.5]), "one probability per cap"),
        (lambda: budget.mix([4, 8], [1.5, -0.5]), ">= 0"),
        (lambda: budget.uniform(5, 2), "lo <= hi"),
        (lambda: budget.make("gaussian", budgets=(4,)), "valid: fixed, mix, uniform"),
        (lambda: budget.mix([], []), "at least one"),
    ],
)
def test_invalid_budgets_raise(make, match):
    with pytest.raises(BudgetError, match=match):
        make()


def test_batch_not_multiple_of_group():
    with pytest.raises(BudgetError, match="multiple of group_size"):
        budget.fixed(4).sample(jax.random.key(0), 10, group_size=4)


def test_a_new_sampler_is_one_registered_class(monkeypatch):
    """A `@budget.sampler` class is a budget kind of the config: its own keys (`budget.options`) reach it,
    validation reads the registry (an unknown option, its own check and a key of another kind are refused,
    each naming its key), the study's report describes it, and its caps are drawn like every kind's."""
    import dataclasses

    from bmrl.config import ConfigError, build, make_budget

    monkeypatch.setattr(budget, "SAMPLERS", budget.SAMPLERS.copy())

    @budget.sampler("two_point")
    @dataclasses.dataclass(frozen=True)
    class TwoPoint(budget.Budget):
        budgets: tuple[int, ...]
        p_short: float = 0.5

        def __post_init__(self):
            if not 0 <= self.p_short <= 1:
                raise BudgetError(f"p_short must be in [0, 1], got {self.p_short}.", "p_short")

        @property
        def support(self):
            return tuple(sorted(set(self.budgets)))

        def describe(self):
            return f"two_point {list(self.budgets)} p_short={self.p_short}"

        def draw(self, key, n):
            short = jax.random.uniform(key, (n,)) < self.p_short
            return jnp.where(short, min(self.budgets), max(self.budgets)).astype(jnp.int32)

    base = ["budget.kind=two_point", "budget.budgets=[2,6]"]
    b = make_budget(build({}, base + ["budget.options={p_short: 0.25}"]).budget)
    assert isinstance(b, TwoPoint) and b.p_short == 0.25 and b.cap_range == (2, 6) and b.describe().startswith("two_point")
    caps = np.asarray(b.sample(jax.random.key(0), 4000, group_size=2))
    assert set(np.unique(caps)) == {2, 6} and abs((caps == 2).mean() - 0.25) < 0.03
    assert np.all(caps.reshape(-1, 2) == caps.reshape(-1, 2)[:, :1])  # shared in each group, as every kind
    for over, match in (("budget.options={q: 1}", "budget.options.q: is not an option of budget kind two_point; its options: p_short"),
                        ("budget.options={p_short: 2}", r"budget.options.p_short: p_short must be in \[0, 1\]"),
                        ("budget.probs=[0.5,0.5]", "budget.probs: applies to kind=mix only"),
                        ("budget.kind=gaussian", "budget.kind")):
        with pytest.raises(ConfigError, match=match):
            build({}, base + [over])
