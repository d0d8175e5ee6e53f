"""Budget samplers: distributions, group sharing, jit, and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl import budget
from bmrl.budget import Budget, BudgetError


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
        (lambda: Budget("gaussian", budgets=(4,)), "valid kinds: fixed, mix, uniform"),
        (lambda: budget.mix([], []), "at least one"),
    ],
)
def test_invalid_budgets_raise(make, match):
    with pytest.raises(BudgetError, match=match):
        make()


def test_batch_not_multiple_of_group():
    with pytest.raises(BudgetError, match="multiple of group_size"):
        budget.fixed(4).sample(jax.random.key(0), 10, group_size=4)
