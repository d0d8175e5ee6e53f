"""The jitted update (bmrl.learn.step) and the training loop (bmrl.train).

Update paths are checked on a tiny decoder and a synthetic Trajectory against independent
computations; the loop is run for a few steps on a tiny corridor config.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bmrl import budget as budget_lib
from bmrl import config as config_lib
from bmrl.learn import make_optimizer, optimizer_from_config, skip_nonfinite
from bmrl.learn import step as step_lib
from bmrl.model import ModelConfig, init_model
from bmrl.rollout import Trajectory

V, B, L, TM = 24, 8, 12, 3


def tiny_model(seed=0):
    return init_model(ModelConfig.tiny(V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1), seed)


def train_cfg(**kw):
    base = dict(group_size=4, tasks_per_step=B // 4, epochs=1, minibatches=1, loss="ppo", advantage="grpo",
                clip_eps=0.2, kl_coef=0.0, entropy_coef=0.0, aggregation="token_mean", process_coef=0.0, gamma=1.0)
    base.update(kw)
    return config_lib.TrainCfg(**base)


def fake_traj(seed=0, logprobs=None, rows=B, width=L):
    """A synthetic batch: random tokens, a prompt of 3 tokens, then policy tokens (mask 1) up to length.
    `rows` x `width` tokens (B x L unless asked: tests/test_memory.py runs one of its compiled shapes)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, V, size=(rows, width)).astype(np.int32)
    length = rng.integers(6, width + 1, size=rows).astype(np.int32)
    pos = np.arange(width)[None, :]
    loss_mask = ((pos >= 3) & (pos < length[:, None]) & (rng.random((rows, width)) < 0.8)).astype(np.float32)
    tokens = np.where(pos < length[:, None], tokens, 0)
    turn = np.where(pos < 3, -1, np.minimum((pos - 3) // 3, TM - 1))
    turn = np.where(pos < length[:, None], turn, -1).astype(np.int32)
    reward = np.zeros((rows, TM), np.float32)
    reward[:, -1] = rng.integers(0, 2, size=rows)
    progress = np.cumsum(rng.random((rows, TM + 1)) * 0.3, axis=1).astype(np.float32)
    # Every field built in numpy and transferred: jnp.zeros / jnp.full, and jnp.asarray of a numpy array (its
    # "stage"), would each compile a one-op program per shape.
    f = host
    zb = lambda shape: f(np.zeros(shape, bool))  # noqa: E731
    zi = lambda shape: f(np.zeros(shape, np.int32))  # noqa: E731
    return Trajectory(
        tokens=f(tokens), length=f(length), loss_mask=f(loss_mask),
        logprobs=f(np.zeros((rows, width), np.float32) if logprobs is None else logprobs), turn_of_token=f(turn),
        action=zi((rows, TM)), reward=f(reward), error=zb((rows, TM)), invalid=zb((rows, TM)),
        format_error=zb((rows, TM)), injected=zb((rows, TM)), oracle_action=zi((rows, TM)), progress=f(progress),
        turn_active=f(np.ones((rows, TM), bool)),
        caps=f(np.full((rows,), TM, np.int32)), turns_used=f(np.full((rows,), TM, np.int32)),
        success=f(reward[:, -1] > 0), first_success_turn=zi((rows,)),
        terminated=zb((rows,)), truncated=zb((rows,)), overflow=zb((rows,)),
    )


def host(x):
    """A device array of the numpy value `x`, transferred (`jnp.asarray` compiles a program per shape to stage
    it)."""
    return jax.device_put(np.asarray(x))


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens, mask):
    """The model's plain forward behind one jit (eager NNX compiles a program per op): one program per model
    graph and shape, shared by every test of the module."""
    return nnx.merge(graphdef, state)(tokens, attention_mask=mask)


def reference_logp(model, tokens, length, temperature=1.0):
    """Independent per-token log-probs: a plain forward, log_softmax(logits / T), gathered by hand."""
    mask = np.arange(L)[None, :] < np.asarray(length)[:, None]
    logits = np.asarray(_logits(*nnx.split(model), tokens, mask), np.float64) / temperature
    logits = logits - logits.max(-1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    out = np.zeros((B, L))
    tok = np.asarray(tokens)
    for b in range(B):
        for i in range(1, L):
            out[b, i] = logp_all[b, i - 1, tok[b, i]]
    return out


def on_policy_traj(model, seed=0, temperature=1.0):
    tr = fake_traj(seed)
    lp = reference_logp(model, tr.tokens, tr.length, temperature)
    return tr.replace(logprobs=host((lp * np.asarray(tr.loss_mask)).astype(np.float32)))


def run_update(model, tr, cfg, lr=0.1, ref=None, temperature=1.0, key=0):
    graphdef, params = nnx.split(model)
    tx = skip_nonfinite(optax.sgd(lr))
    opt_state = step_lib.init_opt_state(tx, params)
    update = step_lib.make_update(graphdef, tx, cfg, temperature, donate=False)
    p, s, m = update(params, opt_state, ref, tr, jax.random.key(key))
    return params, p, s, jax.device_get(m), update


def flat(state):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(state)])


# ------------------------------------------------------------------------------- the update
@functools.partial(jax.jit, static_argnums=0)
def _pg_grad(graphdef, params, tokens, length, adv, mask, temperature):
    """The gradient of the plain policy-gradient objective -sum(A * logp) / n (log_softmax(logits / T) by
    hand), the temperature data: one program for every temperature."""

    def objective(p):
        logits = nnx.merge(graphdef, p)(tokens, attention_mask=jnp.arange(L)[None] < length[:, None])
        logp_all = jax.nn.log_softmax(logits / temperature, -1)[:, :-1]
        logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], -1)[..., 0]
        return -jnp.sum(adv[:, None] * logp * mask[:, 1:]) / mask.sum()

    return jax.grad(objective)(params)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_update_is_plain_policy_gradient_step(temperature):
    """One epoch, one minibatch, logp_old == logp_new: the update is SGD on -sum(A * logp)/n, computed
    independently (own advantages, own log-softmax) with jax.grad."""
    model = tiny_model()
    tr = on_policy_traj(model, temperature=temperature)
    cfg = train_cfg()
    params, new, _, m, _ = run_update(model, tr, cfg, temperature=temperature)

    r = np.asarray(tr.outcome_reward).reshape(-1, 4)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)).reshape(-1)
    mask = np.asarray(tr.loss_mask)
    grads = _pg_grad(nnx.graphdef(model), params, tr.tokens, tr.length, adv.astype(np.float32), mask,
                     np.float32(temperature))
    expected = flat(params) - np.float32(0.1) * flat(grads)  # one SGD step, leaf by leaf in flat's order
    np.testing.assert_allclose(flat(new), expected, rtol=2e-5, atol=2e-6)
    assert abs(m["loss"] + float(np.sum(adv[:, None] * mask) / mask.sum())) < 1e-5  # -A * ratio, ratio = 1
    assert m["clip_fraction"] == 0.0 and abs(m["ratio_mean"] - 1.0) < 1e-5
    assert m["skipped_updates"] == 0 and m["grad_norm"] > 0


def test_epochs_and_minibatches_touch_every_row_and_take_every_step():
    model = tiny_model()
    tr = on_policy_traj(model)
    cfg = train_cfg(epochs=3, minibatches=4)
    _, _, s, m, _ = run_update(model, tr, cfg, lr=0.01)
    assert m["rows_trained_min"] == 3  # 3 epochs x all 8 rows = 24 row visits, each row 3 times
    assert m["clip_fraction"] >= 0.0 and m["skipped_updates"] == 0
    # later minibatches are off-policy: ratios move away from 1
    assert m["ratio_max"] > 1.0


def test_minibatch_order_depends_on_key_only():
    model = tiny_model()
    tr = on_policy_traj(model)
    cfg = train_cfg(epochs=2, minibatches=2)
    _, a, *_ = run_update(model, tr, cfg, key=1)
    _, b, *_ = run_update(model, tr, cfg, key=1)
    _, c, *_ = run_update(model, tr, cfg, key=2)
    assert np.array_equal(flat(a), flat(b))
    assert not np.array_equal(flat(a), flat(c))


def test_loss_mask_respected():
    """Tokens outside the loss mask, even with nan old log-probs, change nothing; padding neither."""
    model = tiny_model()
    tr = on_policy_traj(model)
    cfg = train_cfg(epochs=2, minibatches=2)
    _, base, *_ = run_update(model, tr, cfg)
    mask = np.asarray(tr.loss_mask) > 0
    pad = np.arange(L)[None, :] >= np.asarray(tr.length)[:, None]
    noisy = tr.replace(
        logprobs=host(np.where(mask, np.asarray(tr.logprobs), np.float32(np.nan))),
        tokens=host(np.where(pad, np.int32(7), np.asarray(tr.tokens))),
    )
    _, other, _, m, _ = run_update(model, noisy, cfg)
    np.testing.assert_array_equal(flat(base), flat(other))
    assert m["skipped_updates"] == 0


def test_advantage_registry_and_process_advantages():
    from bmrl.learn import process_advantages, rloo_advantages

    def advantages(cfg):  # jitted, as the update computes them (eagerly each op would be its own program)
        return np.asarray(jax.jit(functools.partial(step_lib.compute_advantages, cfg=cfg))(tr))

    tr = fake_traj(3)
    mask = np.asarray(tr.loss_mask)
    r = np.asarray(tr.outcome_reward)
    got = advantages(train_cfg(advantage="rloo"))
    rloo = jax.jit(rloo_advantages, static_argnums=1)(r, 4)
    np.testing.assert_allclose(got, np.asarray(rloo)[:, None] * mask, atol=1e-6)
    got = advantages(train_cfg(advantage="reinforce"))
    np.testing.assert_allclose(got, (r - r.mean())[:, None] * mask, atol=1e-6)
    got = advantages(train_cfg(advantage="reinforce", process_coef=0.5, gamma=0.9))
    proc = np.asarray(jax.jit(functools.partial(process_advantages, gamma=0.9))(
        tr.progress, tr.turn_active, tr.turn_of_token, tr.loss_mask))
    np.testing.assert_allclose(got, (r - r.mean())[:, None] * mask + 0.5 * proc, atol=1e-6)
    assert np.abs(proc).sum() > 0


def test_kl_to_identical_reference_is_zero_and_entropy_bonus_changes_the_step():
    model = tiny_model()
    tr = on_policy_traj(model)
    _, plain, _, m0, _ = run_update(model, tr, train_cfg())
    params = nnx.state(model)
    _, with_kl, _, m1, _ = run_update(model, tr, train_cfg(kl_coef=0.5), ref=params)
    assert abs(m1["kl"]) < 1e-6
    np.testing.assert_allclose(flat(with_kl), flat(plain), rtol=1e-5, atol=1e-7)  # k3 gradient is 0 at ratio 1
    _, with_kl, _, m2, _ = run_update(model, tr, train_cfg(kl_coef=0.5), ref=nnx.state(tiny_model(1)))
    assert m2["kl"] > 0 and not np.allclose(flat(with_kl), flat(plain))
    _, with_ent, _, m3, _ = run_update(model, tr, train_cfg(entropy_coef=0.1))
    assert m3["entropy"] > 0 and abs(m3["entropy"] - m0["entropy"]) < 1e-5
    assert not np.allclose(flat(with_ent), flat(plain))


def test_nonfinite_update_is_skipped_and_counted():
    model = tiny_model()
    tr = on_policy_traj(model)
    logprobs, loss_mask = np.array(tr.logprobs), np.array(tr.loss_mask)
    logprobs[0, 5], loss_mask[0, 5] = np.nan, 1.0
    bad = tr.replace(logprobs=host(logprobs), loss_mask=host(loss_mask))
    params, new, s, m, _ = run_update(model, bad, train_cfg(epochs=2))
    np.testing.assert_array_equal(flat(new), flat(params))
    assert m["skipped_updates"] == 2 and m["consecutive_skips"] == 2 and m["skipped_total"] == 2
    assert step_lib.consecutive_skips(s) == 2


def test_adam_keeps_moving_the_weights_on_zero_gradients():
    """The mechanism behind runs that kept drifting after every group went constant (docs/training_stability.md):
    plain AdamW steps on a zero gradient by lr * m_hat / sqrt(v_hat), independent of the last gradient's size."""
    lr, b1, b2 = 1e-2, 0.9, 0.999
    tx = make_optimizer(lr, total_steps=100, schedule="constant", b1=b1, b2=b2, max_grad_norm=None)
    params = {"w": np.ones(3, np.float32)}
    state = tx.init(params)
    tx_update, apply_updates = jax.jit(tx.update), jax.jit(optax.apply_updates)  # one program each, 21 steps
    u, state = tx_update({"w": np.array([1.0, -2.0, 0.5], np.float32)}, state, params)
    params = apply_updates(params, u)
    for k in range(1, 21):
        u, state = tx_update({"w": np.zeros(3, np.float32)}, state, params)
        m_hat = b1 ** k * (1 - b1) / (1 - b1 ** (k + 1))
        v_hat = b2 ** k * (1 - b2) / (1 - b2 ** (k + 1))
        np.testing.assert_allclose(np.asarray(u["w"]), -lr * m_hat / np.sqrt(v_hat) * np.array([1, -1, 1]), rtol=1e-4)
        params = apply_updates(params, u)
    # 20 empty steps moved each weight by 4.4 real steps' worth (lr each), all in the last real step's direction.
    assert 4.3 * lr < float(params["w"][0] - 1.0) * -1 - lr < 4.5 * lr


def test_batch_without_signal_changes_nothing():
    """Every group's rewards equal (so every advantage 0), several steps in a row, right after a real step
    (Adam's moments non-zero): parameters and optimizer state stay bitwise as they were, and it is counted.
    The update of test_update_compiles_once_and_donates below (optimizer, config, donation): one program."""
    model = tiny_model()
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1e-3, total_steps=10)
    opt_state = step_lib.init_opt_state(tx, params)
    update = step_lib.make_update(graphdef, tx, train_cfg(epochs=2, minibatches=2), 1.0)
    tr = on_policy_traj(model)  # before the model's buffers are donated
    params, opt_state, m = update(params, opt_state, None, tr, jax.random.key(0))
    assert m["no_signal_updates"] == 0 and m["groups_with_signal"] == 1
    reward = np.zeros(tr.reward.shape, np.float32)
    reward[:4, -1] = 1.0  # group 0 all succeed, group 1 all fail
    dead = tr.replace(reward=host(reward), success=host(reward[:, -1] > 0))
    before = flat((params, opt_state))
    for i in range(3):
        params, opt_state, m = update(params, opt_state, None, dead, jax.random.key(i + 1))
        assert m["no_signal_updates"] == 4 and m["groups_with_signal"] == 0 and m["skipped_updates"] == 0
    np.testing.assert_array_equal(flat((params, opt_state)), before)


def test_update_compiles_once_and_donates():
    model = tiny_model()
    graphdef, params = nnx.split(model)
    tx = make_optimizer(1e-3, total_steps=10)
    opt_state = step_lib.init_opt_state(tx, params)
    update = step_lib.make_update(graphdef, tx, train_cfg(epochs=2, minibatches=2), 1.0)
    trajs = [on_policy_traj(model, seed=i) for i in range(3)]  # before the model's buffers are donated
    for i in range(3):
        old = params
        params, opt_state, m = update(params, opt_state, None, trajs[i], jax.random.key(i))
    assert update.trace_count() == 1
    assert jax.tree.leaves(old)[0].is_deleted()  # params buffers were donated


# ------------------------------------------------------------------------------- the loop
TINY = dict(
    seed=0,
    env={"name": "corridor", "options": {"length": 2, "eps": 0.1}},
    budget={"kind": "mix", "budgets": [1, 2, 3], "probs": [0.3, 0.3, 0.4]},
    rollout={"max_turns": 12, "max_reply_tokens": 4, "max_len": 160},  # caps stay <= 3
    model={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
    train={"steps": 3, "tasks_per_step": 2, "group_size": 2, "epochs": 1, "minibatches": 2},
    eval={"ts": [1, 4], "ks": [1], "attempts": 1, "num_tasks": 2, "every": 2},  # 4 rows: the train batch
    data={"train_size": 16, "test_size": 8},
    checkpoint={"every": 2, "keep": 2},
)


def tiny_cfg(tmp_path, **over):
    data = json.loads(json.dumps(TINY))
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    data["out_dir"] = str(tmp_path)
    return config_lib.build(data)


def test_compile_count_constant_whatever_budgets(tmp_path):
    """One train run with a mix budget (3 steps), then the same compiled rollout + update fed caps from
    fixed, mix and uniform budgets: no recompilation."""
    from bmrl.train import train

    summary = train(tiny_cfg(tmp_path), progress=False)
    hist = summary["compile_history"]
    assert len(hist) == 3 and len(set(hist)) == 1, hist
    out = tmp_path
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "policy/config.json", "policy/model.safetensors"):
        assert (out / name).exists(), name
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    assert {r["step"] for r in records if "eval/pass1_T4" in r} == {0, 3}  # the test split: first and last step
    assert {r["step"] for r in records if "val/pass1_T4" in r} == {2}  # eval.every: the validation split
    assert set(summary["eval"]) == {"1", "4"} and summary["skipped_updates"] == 0
    assert sorted(os.listdir(out / "checkpoints")) == ["2", "3"]
    assert (out / "tb").is_dir() and os.listdir(out / "tb")

    # Caps are data: fixed, mix and uniform budgets through the same compiled programs. The rollout and
    # the update are built and placed as the loop builds them (bmrl.train's optimizer, bmrl.loop's `place_learner`
    # on its 1-device mesh), so their XLA programs are the run's own, loaded from the session's compile cache.
    from bmrl import assembly as policy_lib
    from bmrl.parallel import make_mesh, shard_batch
    from bmrl.rollout import Injection, default_format, make_rollout
    from bmrl.loop import place_learner

    cfg = tiny_cfg(tmp_path)
    t = cfg.train
    model, tok = policy_lib.load_policy(str(out / "policy"))
    env = policy_lib.player_class(cfg).make_env(cfg, tok)
    rcfg = policy_lib.rollout_config(cfg)
    mesh = make_mesh(policy_lib.mesh_config(cfg))
    graphdef, params = nnx.split(model)
    run = make_rollout(graphdef, env, default_format(env), rcfg)
    tx = optimizer_from_config(t.optim, t.steps * t.epochs * t.minibatches, master_f32=t.f32_master)
    params, opt_state, shardings = place_learner(tx, params, mesh)
    update = step_lib.make_update(graphdef, tx, t, rcfg.sampling.temperature, shardings=shardings)
    tasks = shard_batch({"seed": jnp.arange(4, dtype=jnp.int32) * 2}, mesh)
    for i, b in enumerate([budget_lib.fixed(1), budget_lib.mix([1, 3], [0.5, 0.5]), budget_lib.uniform(1, 3)]):
        caps = shard_batch(b.sample(jax.random.key(i), 4, 2), mesh)
        traj = run(params, tasks, caps, jax.random.key(i), Injection.none(rcfg.max_turns))
        params, opt_state, _ = update(params, opt_state, None, traj, jax.random.key(i))
    assert run.trace_count() == 1 and update.trace_count() == 1


def test_select_groups_keeps_groups_with_signal_first():
    """Dynamic sampling: of 2 groups of 4 keep 1; the group whose rewards differ wins wherever it is."""
    from bmrl.train import select_groups

    select_groups = jax.jit(select_groups, static_argnames=("group_size", "keep"))  # jitted, as the loop runs it
    tr = fake_traj(0)
    for signal_group in (0, 1):
        r = np.zeros((B, TM), np.float32)
        r[signal_group * 4, -1] = 1.0  # one success in that group; the other group all 0
        t = tr.replace(reward=host(r))
        got = select_groups(t, group_size=4, keep=1)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(tr.tokens)[signal_group * 4:(signal_group + 1) * 4])
        assert np.asarray(got.outcome_reward).tolist() == [1.0, 0.0, 0.0, 0.0]
    both = select_groups(tr.replace(reward=host(np.zeros((B, TM), np.float32))), group_size=4,
                         keep=2)  # none: stream order
    np.testing.assert_array_equal(np.asarray(both.tokens), np.asarray(tr.tokens))


def test_planted_dead_run_is_flagged_in_log_metrics_and_summary(tmp_path, monkeypatch, capsys):
    """Every reward the update sees is 0 (a run whose rollouts all fail): after train.dead_after
    steps in a row the run says it is dead on stderr, in metrics.jsonl and in summary.json, and its
    parameters stop changing (no update is taken without signal). Dynamic sampling plays 3 tasks a step.
    8 steps, as the non-finite run below: the same optimizer schedule, so the two runs share one update program."""
    from bmrl.train import train

    real = step_lib.make_update

    def poisoned(*args, **kwargs):
        upd = real(*args, **kwargs)

        def run(params, opt_state, ref, traj, key):
            traj = traj.replace(reward=jnp.zeros_like(traj.reward))
            return upd(params, opt_state, ref, traj, key)

        run.trace_count = upd.trace_count
        return run

    monkeypatch.setattr(step_lib, "make_update", poisoned)
    cfg = tiny_cfg(tmp_path, train={"steps": 8, "minibatches": 1, "dead_after": 3, "oversample": 1},
                   checkpoint={"every": 5, "keep": 1}, eval={"every": 0})
    summary = train(cfg, progress=False, evaluate=False)
    err = capsys.readouterr().err
    assert "the run has lost its signal: dead since step 1" in err and "finished 8 steps as a dead run" in err
    h = summary["health"]
    assert h["dead"] and h["still_at_end"] and [(f["kind"], f["step"]) for f in h["flags"]] == [("no_signal", 1)]
    assert json.loads((tmp_path / "summary.json").read_text())["health"] == h
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if "health/dead" in line]
    assert [r["health/dead"] for r in records] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert [r["train/no_signal_updates"] for r in records] == [1] * 8
    assert [r["data_position"] for r in records] == [3 * s for s in range(1, 9)]  # tasks_per_step 2 + oversample 1


def test_nonfinite_run_stops_with_message_and_clean_checkpoints(tmp_path, monkeypatch, capsys):
    """From step 3 on every update sees nan log-probs: skipped, counted, and after
    train.max_nonfinite in a row the CLI stops with status 3; checkpoints hold the finite params."""
    from bmrl.checkpoint import Checkpointer
    from bmrl.cli import main

    real = step_lib.make_update

    def poisoned(*args, **kwargs):
        upd = real(*args, **kwargs)
        calls = [0]

        def run(params, opt_state, ref, traj, key):
            calls[0] += 1
            if calls[0] >= 3:
                traj = traj.replace(logprobs=traj.logprobs * jnp.nan)
            return upd(params, opt_state, ref, traj, key)

        run.trace_count = upd.trace_count
        return run

    monkeypatch.setattr(step_lib, "make_update", poisoned)
    cfg_path = tmp_path / "cfg.yaml"
    cfg = tiny_cfg(tmp_path / "run", train={"steps": 8, "minibatches": 1, "max_nonfinite": 3},
                   checkpoint={"every": 1, "keep": 10}, eval={"every": 0})
    cfg_path.write_text(config_lib.to_yaml(cfg))
    status = main(["train", "--config", str(cfg_path), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 3
    assert "3 non-finite updates in a row" in err and "train.max_nonfinite=3" in err
    assert "Last good checkpoint: step 4" in err
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    skipped = [r["train/skipped_total"] for r in records if "train/skipped_total" in r]
    assert skipped == [0, 0, 1, 2, 3]
    ck = Checkpointer(tmp_path / "run" / "checkpoints")
    assert ck.all_steps() == [1, 2, 3, 4]  # the run stopped at step 5, before saving it
    import orbax.checkpoint as ocp

    for s in ck.all_steps():
        raw = ck.manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(raw))
    p2 = ck.manager.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]
    p4 = ck.manager.restore(4, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]
    np.testing.assert_array_equal(flat(p2), flat(p4))  # skipped updates left the params untouched
    ck.close()
