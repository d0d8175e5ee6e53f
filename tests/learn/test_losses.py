"""Policy-gradient losses and per-token log-probs against hand-computed references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.learn import logprobs as lp
from bmrl.learn import losses


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# One sequence, 4 positions; position 0 is a prompt token (mask 0). Ratios 1.5, 0.9, 0.5.
MASK = jnp.array([[0.0, 1.0, 1.0, 1.0]])
OLD = jnp.array([[0.0, -1.0, -1.0, -1.0]])
NEW = OLD + jnp.log(jnp.array([[1.0, 1.5, 0.9, 0.5]]))
ADV = jnp.array([[0.0, 2.0, 1.0, -1.0]])


def test_ppo_hand_example():
    loss, m = losses.ppo_loss(NEW, OLD, ADV, MASK, clip_eps=0.2)
    # token 1: A=2, r=1.5: max(-3, -2*1.2) = -2.4 (clipped); token 2: A=1, r=.9 -> -.9;
    # token 3: A=-1, r=.5: max(.5, .8) = .8 (clipped).
    close(loss, (-2.4 - 0.9 + 0.8) / 3)
    close(m["pg_loss"], (-2.4 - 0.9 + 0.8) / 3)
    close(m["clip_fraction"], 2 / 3)
    close(m["ratio_mean"], (1.5 + 0.9 + 0.5) / 3)
    close(m["ratio_max"], 1.5)
    close(m["num_tokens"], 3)
    # approx_kl: mean of r - 1 - log r.
    r = np.array([1.5, 0.9, 0.5])
    close(m["approx_kl"], np.mean(r - 1 - np.log(r)))
    close(m["kl"], 0.0)
    # Separate upper clip: 1.5 is inside [0.8, 1.6], token 1 is now -3 and unclipped.
    loss, m = losses.ppo_loss(NEW, OLD, ADV, MASK, clip_eps=0.2, clip_eps_high=0.6)
    close(loss, (-3.0 - 0.9 + 0.8) / 3)
    close(m["clip_fraction"], 1 / 3)


def test_pg_is_unclipped():
    loss, m = losses.get_loss("pg")(NEW, OLD, ADV, MASK, clip_eps=0.2)
    close(loss, (-3.0 - 0.9 + 0.5) / 3)
    close(m["clip_fraction"], 0.0)


def test_registry_errors():
    assert set(losses.LOSSES) == {"ppo", "pg"}
    with pytest.raises(ValueError, match="pg, ppo"):
        losses.get_loss("grpo")
    with pytest.raises(ValueError, match="token_mean"):
        losses.ppo_loss(NEW, OLD, ADV, MASK, aggregation="sum")


@jax.jit
def _grad_of_one_token(log_ratio, a):
    one = jnp.ones((1, 1))
    f = lambda new: losses.ppo_loss(new, 0 * one, a * one, one, clip_eps=0.2)[0]
    return jax.grad(f)(log_ratio * one)[0, 0]


def _grad_at_ratio(ratio, a):
    """d loss / d logp_new of a single token with the given ratio and advantage (clip_eps .2)."""
    return float(_grad_of_one_token(np.float32(np.log(ratio)), np.float32(a)))


def test_clipping_at_boundaries():
    # Inside the trust region the gradient is -A * r; past it (in the direction the advantage
    # pushes) the clipped term is active and the gradient is zero.
    close(_grad_at_ratio(1.19, 1.0), -1.19)
    close(_grad_at_ratio(1.21, 1.0), 0.0)
    close(_grad_at_ratio(0.81, -1.0), 0.81)
    close(_grad_at_ratio(0.79, -1.0), 0.0)
    # Past the region in the other direction, the unclipped term is larger: not clipped.
    close(_grad_at_ratio(1.5, -1.0), 1.5)
    close(_grad_at_ratio(0.5, 1.0), -0.5)
    # clip_fraction counts only tokens strictly past the boundary.
    one = jnp.ones((1, 1))
    for r, expected in [(1.2, 0.0), (1.2001, 1.0), (0.8, 0.0), (0.7999, 0.0)]:
        m = losses.ppo_loss(jnp.log(jnp.full((1, 1), r)), 0 * one, one, one, clip_eps=0.2)[1]
        close(m["clip_fraction"], expected)
    m = losses.ppo_loss(jnp.log(jnp.full((1, 1), 0.7999)), 0 * one, -one, one, clip_eps=0.2)[1]
    close(m["clip_fraction"], 1.0)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("name", ["ppo", "pg"])
def test_on_policy_gradient_is_reinforce(name, aggregation):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 6, 7)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 7, (3, 6)), jnp.int32)
    mask = jnp.array([[0, 1, 1, 0, 1, 1], [0, 0, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1]], jnp.float32)
    a = jnp.array([1.5, -2.0, 0.5])[:, None] * mask

    def surrogate(lg):
        new = lp.token_logprobs(lg, tokens)
        return losses.get_loss(name)(new, jax.lax.stop_gradient(new), a, mask,
                                     aggregation=aggregation, clip_eps=0.2)[0]

    def reinforce(lg):
        new = lp.token_logprobs(lg, tokens)
        m = np.asarray(mask)
        if aggregation == "token_mean":
            return -(a * new * mask).sum() / m.sum()
        return (-(a * new * mask).sum(1) / m.sum(1)).mean()

    close(jax.jit(jax.grad(surrogate))(logits), jax.jit(jax.grad(reinforce))(logits), tol=1e-6)
    # On policy every ratio is 1, so the loss is minus the aggregated advantage.
    if aggregation == "token_mean":
        expected = -(1.5 * 4 - 2.0 + 0.5 * 5) / 10
    else:
        expected = -(1.5 - 2.0 + 0.5) / 3
    close(surrogate(logits), expected)


def test_masked_tokens_change_nothing():
    rng = np.random.default_rng(2)
    shape = (2, 5)
    new, old, ref = (jnp.asarray(rng.normal(size=shape) * 0.3 - 1, jnp.float32) for _ in range(3))
    adv = jnp.asarray(rng.normal(size=shape), jnp.float32)
    ent = jnp.asarray(rng.uniform(size=shape), jnp.float32)
    mask = jnp.array([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0]], jnp.float32)
    off = mask == 0
    junk = [jnp.where(off, v, x) for v, x in zip([jnp.nan, 1e4, -1e4, jnp.inf, jnp.nan],
                                                   [new, old, ref, adv, ent])]

    @jax.jit
    def run(n, o, r, a, e):
        def f(n):
            return losses.ppo_loss(n, o, a, mask, logp_ref=r, entropy=e, kl_coef=0.1,
                                   entropy_coef=0.01, aggregation="seq_mean")
        (loss, m), g = jax.value_and_grad(f, has_aux=True)(n)
        return loss, m, g

    loss1, m1, g1 = run(new, old, ref, adv, ent)
    loss2, m2, g2 = run(*junk)
    close(loss1, loss2)
    for k in m1:
        close(m1[k], m2[k])
    close(g1, g2)
    assert (np.asarray(g2)[np.asarray(off)] == 0).all()


def test_token_mean_vs_seq_mean():
    values = jnp.array([[1.0, 1.0, 1.0, 1.0], [3.0, 9.0, 9.0, 9.0], [5.0, 5.0, 5.0, 5.0]])
    mask = jnp.array([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], jnp.float32)
    close(losses.aggregate(values, mask, "token_mean"), (4 + 3) / 5)
    # Row 2 has no tokens and is left out of the sequence mean.
    close(losses.aggregate(values, mask, "seq_mean"), (1 + 3) / 2)
    close(losses.aggregate(values, 0 * mask, "seq_mean"), 0.0)
    close(losses.aggregate(values, 0 * mask, "token_mean"), 0.0)
    # Through the loss: on-policy ratio 1, loss = -mean advantage under each aggregation.
    z = jnp.zeros_like(values)
    close(losses.ppo_loss(z, z, values, mask, aggregation="token_mean")[0], -1.4)
    close(losses.ppo_loss(z, z, values, mask, aggregation="seq_mean")[0], -2.0)


def test_kl_and_entropy_terms():
    mask = jnp.array([[1.0, 1.0, 0.0]])
    new = jnp.array([[-1.0, -2.0, -3.0]])
    zero_adv = jnp.zeros_like(new)
    _, m = losses.ppo_loss(new, new, zero_adv, mask, logp_ref=new, kl_coef=1.0)
    close(m["kl"], 0.0)
    # ref - new = log 2 on token 0 and 0 on token 1: k3 = (2 - log 2 - 1) / 2.
    ref = new + jnp.array([[np.log(2.0), 0.0, 5.0]])
    ent = jnp.array([[0.5, 1.5, 100.0]])
    loss, m = losses.ppo_loss(new, new, zero_adv, mask, logp_ref=ref, entropy=ent,
                              kl_coef=0.5, entropy_coef=0.1)
    kl = (1.0 - np.log(2.0)) / 2
    close(m["kl"], kl)
    close(m["entropy"], 1.0)
    close(loss, 0.5 * kl - 0.1 * 1.0)
    # k3 gradient at equal policies is zero.
    kl_only = lambda n: losses.ppo_loss(n, new, zero_adv, mask, logp_ref=new, kl_coef=1.0)[0]
    g = jax.jit(jax.grad(kl_only))(new)
    close(g, np.zeros((1, 3)))


# --------------------------------------------------------------------------- logprobs


def _manual(logits, tokens):
    logits = np.asarray(logits, np.float64)
    tokens = np.asarray(tokens)
    b, l, _ = logits.shape
    logp = np.zeros((b, l))
    ent = np.zeros((b, l))
    for i in range(b):
        for t in range(1, l):
            x = logits[i, t - 1]
            ls = x - x.max() - np.log(np.exp(x - x.max()).sum())
            logp[i, t] = ls[tokens[i, t]]
            ent[i, t] = -(np.exp(ls) * ls).sum()
    return logp, ent


def test_logprob_alignment():
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(2, 5, 11)) * 3, jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 11, (2, 5)), jnp.int32)
    ref_logp, ref_ent = _manual(logits, tokens)
    close(lp.token_logprobs(logits, tokens), ref_logp)
    close(lp.token_entropy(logits), ref_ent)
    logp, ent = lp.token_logprobs_and_entropy(logits, tokens)
    close(logp, ref_logp)
    close(ent, ref_ent)
    assert logp.dtype == jnp.float32 and float(logp[0, 0]) == 0.0
    # The last position's logits predict nothing: changing them changes nothing.
    close(lp.token_logprobs(logits.at[:, -1].set(99.0), tokens), ref_logp)


def test_logprobs_stable_and_bf16():
    logits = jnp.array([[[1e4, 0.0, -1e4], [0.0, 0.0, 0.0]]])
    tokens = jnp.array([[0, 1]])
    logp, ent = lp.token_logprobs_and_entropy(logits, tokens)
    close(logp, [[0.0, -1e4]])
    assert np.isfinite(np.asarray(ent)).all()
    bf = jnp.asarray(np.random.default_rng(5).normal(size=(1, 4, 6)), jnp.bfloat16)
    t = jnp.array([[1, 2, 3, 4]])
    out = lp.token_logprobs(bf, t)
    assert out.dtype == jnp.float32
    close(out, _manual(np.asarray(bf.astype(jnp.float32)), t)[0], tol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_chunked_matches_full(chunk_size):
    rng = np.random.default_rng(6)
    hidden = jnp.asarray(rng.normal(size=(2, 8, 4)), jnp.float32)
    unembed = jnp.asarray(rng.normal(size=(4, 13)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 13, (2, 8)), jnp.int32)
    full = jax.jit(lp.token_logprobs_and_entropy)(hidden @ unembed, tokens)
    chunked = jax.jit(lp.chunked_token_logprobs, static_argnames="chunk_size")(
        hidden, unembed, tokens, chunk_size=chunk_size)
    close(chunked[0], full[0])
    close(chunked[1], full[1])

    def loss_full(h, w):
        a, e = lp.token_logprobs_and_entropy(h @ w, tokens)
        return a.sum() + 0.3 * e.sum()

    def loss_chunked(h, w):
        a, e = lp.chunked_token_logprobs(h, w, tokens, chunk_size=chunk_size)
        return a.sum() + 0.3 * e.sum()

    g_full = jax.jit(jax.grad(loss_full, argnums=(0, 1)))(hidden, unembed)
    g_chunk = jax.jit(jax.grad(loss_chunked, argnums=(0, 1)))(hidden, unembed)
    close(g_chunk[0], g_full[0], tol=1e-4)
    close(g_chunk[1], g_full[1], tol=1e-4)


def test_chunked_policy_logprobs_apply_the_final_softcap(monkeypatch):
    """The learner's chunked path (large vocabularies) caps the logits as the model does (Gemma 2),
    then divides by the temperature: the same log-probs as the full forward."""
    from flax import nnx

    from bmrl.learn import step
    from bmrl.model import ModelConfig, init_model

    model = init_model(ModelConfig.tiny(13, model_type="gemma2", hidden_size=16, num_hidden_layers=1,
                                        final_logit_softcapping=0.05, sliding_window=3), seed=1)
    tokens = jnp.asarray(np.random.default_rng(7).integers(0, 13, (2, 6)), jnp.int32)
    graphdef, params = nnx.split(model)
    want = jax.jit(lambda p: lp.token_logprobs_and_entropy(nnx.merge(graphdef, p)(tokens) / 0.7, tokens))(params)
    monkeypatch.setattr(step, "CHUNKED_VOCAB", 8)
    got = jax.jit(lambda p: step.policy_token_logprobs(graphdef, p, tokens, jnp.asarray([6, 6]), 0.7))(params)
    close(got[0], want[0])
    close(got[1], want[1])


def test_logprob_shape_errors():
    with pytest.raises(ValueError, match="disagree"):
        lp.token_logprobs(jnp.zeros((2, 5, 3)), jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="transpose"):
        lp.chunked_token_logprobs(
            jnp.zeros((2, 5, 3)), jnp.zeros((7, 3)), jnp.zeros((2, 5), jnp.int32)
        )


def test_losses_jit_with_traced_coefficients():
    @jax.jit
    def f(new, eps, kl_coef):
        return losses.ppo_loss(new, OLD, ADV, MASK, logp_ref=OLD, clip_eps=eps, kl_coef=kl_coef)[0]

    close(f(NEW, 0.2, 0.0), (-2.4 - 0.9 + 0.8) / 3)
