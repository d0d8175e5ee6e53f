"""The compiled multi-turn rollout: equality with the Python loop, caps, compiles, keys, overflow."""

import collections
import dataclasses
import functools
import math
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl import budget
from bmrl.envs import make
from bmrl.rollout import Injection, RolloutConfig, RolloutError, default_format, rollout
from bmrl.generate import generate
from bmrl.rollout.baseline import python_loop_rollout
from bmrl.sampling import SamplingConfig
from tests.paths import ROOT
from tests.rollout_helpers import steered_policy
from tests.xla import EIGHT_CPU_DEVICES

ENV_OPTIONS = {
    # The corridor shows each row its turns left (`show_budget`): every corridor rollout here renders the caps,
    # and one env object keeps the file's corridor tests on shared programs.
    "corridor": dict(length=4, eps=0.3, show_budget=True),
    "frozenlake": dict(size=4, eps=0.2),
    "toolchain": dict(k=2, num_keys=8, p_fail=0.3),
    "sokoban": dict(size=5, boxes=1),
    "keypad": dict(length=5, digits=5, eps=0.1),
}
FIELDS = (
    "tokens", "length", "loss_mask", "turn_of_token", "action", "reward", "error", "invalid", "format_error",
    "oracle_action", "progress", "turn_active", "caps", "turns_used", "success",
    "first_success_turn", "terminated", "truncated", "overflow",
)


@functools.lru_cache(maxsize=None)
def _env(name, tok, **extra):
    """One env object per setting for the whole file, and one format per env (`_fmt`): a compiled rollout is
    cached by its env and format objects, so tests of the same shapes share one program."""
    return make(name, tok, **ENV_OPTIONS[name], **extra)


@functools.lru_cache(maxsize=None)
def _fmt(env):
    return default_format(env)


# The file's shapes: every rollout runs RolloutConfig `_cfg(...)` (6 turns, 512 tokens, replies of 6 tokens) on a
# batch of 8 rows (`CAPS`), unless its behaviour needs another shape (a per-row-key batch of 64, a tight
# buffer, an attention block, a compacting chunk): each distinct shape, env and format is an XLA program.
def _cfg(max_turns=6, max_len=512, temperature=0.0, reply=6):
    return RolloutConfig(max_turns=max_turns, max_reply_tokens=reply, max_len=max_len,
                         sampling=SamplingConfig(temperature=temperature))


CAPS = [1, 3, 6, 5, 2, 6, 6, 4]  # the batch of 8 rows: rows finish at every turn
WINDOW_CAPS, WINDOW_TASKS = CAPS, {"seed": np.arange(8, dtype=np.int32) + 100}


@functools.lru_cache(maxsize=None)
def _windowed_rows():
    """`bmrl.learn.demos.windowed_rows` as one program per window (its eager form compiles an XLA program
    per operation)."""
    from bmrl.learn.demos import windowed_rows

    return jax.jit(windowed_rows, static_argnums=(1, 2))


def _assert_same(a, b):
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-4)


# The compacting rollouts: the file's batch of 8 rows in chunks of 2 (compaction on with the smallest chunks).
COMPACTING = dict(compact_min_rows=2, compact_steps=4)


@pytest.mark.parametrize(
    "name, temperature, compacting",
    # Every env but keypad greedy, and sampled on two (corridor only sampled: each case costs a compile).
    # Keypad sampled only, and not held to acting: the suite's tokenizer spells "press"/"delete" letter by
    # letter, and a bigram-steered policy cannot spell repeated letters (its replies mostly fail to parse; its
    # state is gathered all the same); keypad's episodes are checked by scripted policies (test_envs_keypad.py).
    # Compacting (8 rows in chunks of 2): each kind of environment state (a grid, a tool chain, a code, the
    # corridor's: pytrees of their own shapes) is gathered when the batch compacts; frozenlake's grid state is
    # sokoban's kind. One program per case, shared: the greedy toolchain is the windowed fixture's whole-history
    # run, the sampled corridor every other sampled corridor rollout of 8 rows in the file.
    [("frozenlake", 0.0, False), ("sokoban", 0.0, True), ("toolchain", 0.0, False), ("corridor", 1.0, True),
     ("toolchain", 1.0, True), ("keypad", 1.0, True)],
    ids=["frozenlake-greedy", "sokoban-greedy-compacting", "toolchain-greedy", "corridor-sampled-compacting",
         "toolchain-sampled-compacting", "keypad-sampled-compacting"],
)
def test_rollout_equals_python_loop(name, temperature, compacting, tiny_tokenizer):
    """Token for token, with the same per-row keys: greedy and sampled replies alike. A compacting rollout
    (finished rows leave the batch: live rows packed first, turns played in chunks of 2 rows while a chunk
    holds a live row) gives every row the trajectory the Python loop plays for it (which never compacts),
    rows finishing at different turns."""
    env = _env(name, tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=1, scale=3.0 if temperature else 12.0)
    caps = jnp.array(CAPS, jnp.int32)
    tasks = {"seed": np.arange(8, dtype=np.int32) + 100}
    cfg = _cfg(temperature=temperature)
    assert cfg.compact_chunk(8) == 8  # the default's 16-row chunks: the whole batch
    if compacting:
        cfg = dataclasses.replace(cfg, **COMPACTING)
        assert cfg.compact_chunk(8) == 2
    a = rollout(policy, env, tasks, caps, jax.random.key(3), cfg)
    b = python_loop_rollout(policy, env, tasks, caps, jax.random.key(3), cfg)
    _assert_same(a, b)
    used = np.asarray(a.turns_used)
    assert (used <= np.asarray(caps)).all() and used.max() > 1
    if compacting:
        assert used.min() < used.max()  # rows really finished at different turns
    if name == "keypad":
        return
    # The steered policy really acts: valid actions step the environment; sampling varies them.
    actions = np.asarray(a.action)[np.asarray(a.turn_active)]
    assert (actions >= 0).any(), actions
    if temperature:
        assert len(set(actions.tolist())) > 1, actions


@pytest.fixture(scope="module")
def windowed(tiny_tokenizer):
    """Toolchain, greedy, a history window of 2 turns: the engine's rollout, the naive Python loop's, and the
    same batch with the whole history (the shapes of `test_rollout_equals_python_loop`: its program)."""
    env = _env("toolchain", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=1, scale=12.0)
    full_cfg = _cfg(max_turns=6, max_len=512)
    cfg = dataclasses.replace(full_cfg, history_turns=2)
    def run(play, cfg):
        return play(policy, env, WINDOW_TASKS, jnp.array(WINDOW_CAPS), jax.random.key(3), cfg)

    return dict(policy=policy, env=env, engine=run(rollout, cfg), naive=run(python_loop_rollout, cfg),
                full=run(rollout, full_cfg))


def test_windowed_rollout_equals_reprompting_from_scratch(windowed):
    """Each turn's context rebuilt from the prompt and the last 2 turns: the engine (window re-prefilled in the
    compiled loop) equals the Python loop that re-prompts from scratch, and `bmrl.generate` on each rebuilt
    context gives the same greedy replies and log-probs."""
    win, naive, env = windowed["engine"], windowed["naive"], windowed["env"]
    _assert_same(win, naive)
    a, b = win.turn_samples, naive.turn_samples
    for f in ("tokens", "length", "loss_mask", "turn_of_token"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    used = np.asarray(win.turns_used)
    assert used.max() == 6 and (np.asarray(win.length)[used > 3] < np.asarray(windowed["full"].length)[used > 3]).all()

    rows = [(b, t) for b in range(8) for t in range(used[b])]
    tokens, mask, lps = (np.asarray(x) for x in (a.tokens, a.loss_mask, a.logprobs))
    starts = [int(np.argmax(mask[b, t] > 0)) for b, t in rows]  # each reply's first sampled token
    out = generate(windowed["policy"], [tokens[b, t, :s].tolist() for (b, t), s in zip(rows, starts)],
                   max_new_tokens=6, key=jax.random.key(0), sampling=SamplingConfig(temperature=0.0),
                   stop_tokens=_fmt(env).stop_ids, pad_id=_fmt(env).pad_id)
    for i, ((b, t), s) in enumerate(zip(rows, starts)):
        sampled = mask[b, t, s:s + 6] > 0
        np.testing.assert_array_equal(np.asarray(out.tokens[i])[sampled], tokens[b, t, s:s + 6][sampled])
        np.testing.assert_allclose(np.asarray(out.logprobs[i])[sampled], lps[b, t, s:s + 6][sampled], atol=1e-5)


def test_windowed_samples_are_the_history_until_the_window_fills(windowed):
    """Turns 0-2 saw at most 2 earlier turns: their samples are the whole-history buffer up to their reply
    (loss on that reply only); later turns' contexts are shorter than the whole history."""
    win, full = windowed["engine"], windowed["full"]
    s = jax.tree.map(np.asarray, win.turn_samples)
    tags, mask = np.asarray(full.turn_of_token), np.asarray(full.loss_mask)
    np.testing.assert_array_equal(np.asarray(win.action)[:, :3], np.asarray(full.action)[:, :3])
    for b in range(8):
        for t in range(int(np.asarray(win.turns_used)[b])):
            n, own = s.length[b, t], s.turn_of_token[b, t, : s.length[b, t]]
            if t < 3:  # the whole history up to the end of reply t (its stop token: the last token tagged t)
                assert n == np.flatnonzero(tags[b] == t).max() + 1, (b, t)
                np.testing.assert_array_equal(s.tokens[b, t, :n], np.asarray(full.tokens)[b, :n])
                np.testing.assert_array_equal(s.loss_mask[b, t, :n], mask[b, :n] * (tags[b, :n] == t))
            else:  # the prompt (turn ids -1 and 0) and turns t-2 .. t only
                assert set(own.tolist()) == {-1, 0, t - 2, t - 1, t}, (b, t, set(own.tolist()))
            assert s.loss_mask[b, t].sum() > 0 and (s.turn_of_token[b, t][s.loss_mask[b, t] > 0] == t).all()
    assert (s.length[~np.asarray(win.turn_active)] == 0).all() and s.loss_mask[~np.asarray(win.turn_active)].sum() == 0


def test_sft_windows_demonstrations_as_the_rollout_windows_its_turns(windowed):
    """The rollout's episodes laid out as demonstrations (their actions replayed, `make_demos`) and cut into
    windows (`windowed_rows`, what SFT trains on with a history window) are the rollout's own turn samples."""
    from bmrl.learn.demos import demo_tokens_needed, make_demos

    win, env = windowed["engine"], windowed["env"]
    fmt = _fmt(env)
    actions = np.asarray(win.action)
    valid = ((actions >= 0) | ~np.asarray(win.turn_active)).all(1)  # rows with an invalid reply cannot be replayed
    assert valid.sum() >= 4
    demos = make_demos(env, fmt, WINDOW_TASKS, jax.random.key(3), num_turns=6, noise=0.0, cut_after_error=False,
                       max_len=demo_tokens_needed(env, fmt, 6), caps=jnp.array(WINDOW_CAPS),
                       actions=np.where(actions >= 0, actions, 0))
    tokens, length, mask = (np.asarray(x) for x in _windowed_rows()(demos, 2, 512))
    s = jax.tree.map(np.asarray, win.turn_samples.rows())
    rows = np.repeat(valid, 6)
    np.testing.assert_array_equal(length[rows], s.length[rows])
    width = tokens.shape[1]
    for i in np.flatnonzero(rows):
        n = length[i]
        np.testing.assert_array_equal(tokens[i, :n], s.tokens[i, :n])
        np.testing.assert_array_equal(mask[i, :width], s.loss_mask[i, :width])
    assert length[rows].max() < length[rows].sum() and mask[rows].sum() == s.loss_mask[rows].sum() > 0


def test_learner_trains_each_windowed_turn_on_its_own_sample(windowed):
    """The learner's log-probs of every sample's reply equal the rollout's sampling log-probs under the same
    parameters; an update runs over the samples (each reply trained once per epoch) and moves the policy."""
    from flax import nnx

    from bmrl.config.schema import TrainCfg
    from bmrl.learn import make_optimizer
    from bmrl.learn.step import compute_advantages, init_opt_state, learning_rows, make_update, policy_token_logprobs

    win = windowed["engine"]
    graphdef, params = nnx.split(windowed["policy"])
    rows = learning_rows(win)
    assert rows["tokens"].shape == (8 * 6, 512)
    logp, _ = jax.jit(lambda p, x, n: policy_token_logprobs(graphdef, p, x, n, 0.0))(params, rows["tokens"], rows["length"])
    sampled = np.asarray(rows["loss_mask"]) > 0
    np.testing.assert_allclose(np.asarray(logp)[sampled], np.asarray(rows["logp_old"])[sampled], atol=1e-5)

    cfg = TrainCfg(group_size=2, tasks_per_step=4, minibatches=2, advantage="grpo")
    odd = (np.arange(8) % 2)[:, None].astype(np.float32)
    win = win.replace(reward=np.asarray(win.turn_active) * odd)  # odd rows win
    adv = np.asarray(jax.jit(lambda w: compute_advantages(w, cfg))(win)).reshape(8, 6, -1)
    assert np.abs(adv).sum() > 0
    for b, t in zip(*np.nonzero(np.asarray(win.turn_active))):  # the turn's advantage on its reply, once
        m = sampled.reshape(8, 6, -1)[b, t]
        assert len(set(adv[b, t][m].tolist())) == 1 and (adv[b, t][~m] == 0).all()
    optimizer = make_optimizer(lr=1e-2)
    update = make_update(graphdef, optimizer, cfg, 0.0, donate=False)
    new, _, metrics = update(params, jax.jit(functools.partial(init_opt_state, optimizer))(params), None, win,
                             jax.random.key(0))
    assert float(metrics["num_tokens"]) == sampled.sum() and np.isfinite(float(metrics["loss"]))
    assert int(metrics["rows_trained_min"]) == 1 and int(metrics["no_signal_updates"]) < 12
    assert any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(new), jax.tree.leaves(params)))

    # A KL term: the reference's log-probs, computed a minibatch of samples at a time, are the policy's on every
    # row (the policy left in place, lr 0: KL exactly 0, the ratio 1 on every sampled token).
    frozen_lr = make_optimizer(lr=0.0)
    kl_update = make_update(graphdef, frozen_lr, dataclasses.replace(cfg, kl_coef=0.5), 0.0, donate=False)
    _, _, m = kl_update(params, jax.jit(functools.partial(init_opt_state, frozen_lr))(params), params, win,
                        jax.random.key(0))
    assert abs(float(m["kl"])) < 1e-6 and float(m["ratio_max"]) < 1 + 1e-5 and np.isfinite(float(m["loss"]))


@pytest.fixture(scope="module")
def rewritten(windowed):
    """The windowed fixture's policy and tasks with a format that rewrites earlier replies, as `format.history:
    template` does for Qwen3 (which drops what precedes `</think>`): here a reply keeps what follows the last
    occurrence of the token that most replies hold past their first token, minus a following token that is
    stripped; whole histories and a window of 2 turns, engine and naive loop."""
    full, env = windowed["full"], windowed["env"]
    tokens, mask, tags = (np.asarray(x) for x in (full.tokens, full.loss_mask, full.turn_of_token))
    stops = set(_fmt(env).stop_ids)
    replies = [[int(x) for x in tokens[b][(tags[b] == t) & (mask[b] > 0)] if int(x) not in stops]
               for b in range(8) for t in range(int(np.asarray(full.turns_used)[b]))]
    cut = collections.Counter(x for r in replies for x in r[1:]).most_common(1)[0][0]
    after = collections.Counter(r[i + 1] for r in replies for i in range(len(r) - 1) if r[i] == cut)
    fmt = dataclasses.replace(_fmt(env), history_cut=np.asarray([cut], np.int32),
                              history_strip=(after.most_common(1)[0][0],) if after else ())
    out = dict(fmt=fmt, replies=replies)
    for H in (None, 2):
        cfg = dataclasses.replace(_cfg(max_turns=6, max_len=512), history_turns=H)
        for name, play in (("engine", rollout), ("naive", python_loop_rollout)):
            out[name, H] = play(windowed["policy"], env, WINDOW_TASKS, jnp.array(WINDOW_CAPS), jax.random.key(3), cfg, fmt)
    out["unkept"] = rollout(windowed["policy"], env, WINDOW_TASKS, jnp.array(WINDOW_CAPS), jax.random.key(3),
                            dataclasses.replace(cfg, learning_samples=False), fmt)  # as an evaluation plays
    return out


@pytest.mark.parametrize("H", [None, 2], ids=["whole", "window2"])
def test_rewritten_history_equals_reprompting_from_scratch(rewritten, windowed, H):
    """With a format that rewrites earlier replies (`Format.history_cut`), each turn's context is the prompt and
    the earlier turns (the last 2 with a window), every earlier reply cut to what the history keeps: the engine
    (the cut span removed and the context re-prefilled in the compiled loop) equals the Python loop that rebuilds
    each context from scratch, trajectories and turn samples alike; the cut really removes tokens; the rollout's
    turn samples are what SFT lays out from the same episodes (`windowed_rows`); a rollout that keeps no samples
    (`learning_samples=False`, an evaluation's) plays the same episodes."""
    from bmrl.learn.demos import demo_tokens_needed, make_demos

    eng, naive, fmt = rewritten["engine", H], rewritten["naive", H], rewritten["fmt"]
    _assert_same(eng, naive)
    if H == 2:  # an evaluation keeps no samples and plays the same episodes
        assert rewritten["unkept"].turn_samples is None
        _assert_same(rewritten["unkept"], eng)
    a, b = eng.turn_samples, naive.turn_samples
    for f in ("tokens", "length", "loss_mask", "turn_of_token"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    width = 1 + max(map(len, rewritten["replies"]))  # each reply padded: one program for all of them
    kept_from = jax.jit(fmt.kept_from)
    cuts = [int(kept_from(np.asarray(r + [fmt.pad_id] * (width - len(r)), np.int32), np.int32(len(r))))
            for r in rewritten["replies"]]
    assert sum(c > 0 for c in cuts) >= 4, cuts  # replies that lose tokens in the history
    used = np.asarray(eng.turns_used)
    s = jax.tree.map(np.asarray, a)
    ref = windowed["engine"] if H == 2 else windowed["full"]  # the same history, replies kept whole
    if H is None:  # the last reply is whole in the final buffer, the earlier ones cut: shorter than the whole history
        assert (np.asarray(eng.length)[used > 1] <= np.asarray(ref.length)[used > 1]).all()
        assert (np.asarray(eng.length) < np.asarray(ref.length)).any()
    for row in range(8):
        for t in range(int(used[row])):  # loss on reply t alone, every earlier reply's tokens context
            assert s.loss_mask[row, t].sum() > 0 and (s.turn_of_token[row, t][s.loss_mask[row, t] > 0] == t).all()

    actions = np.asarray(eng.action)
    valid = ((actions >= 0) | ~np.asarray(eng.turn_active)).all(1)  # rows with an invalid reply cannot be replayed
    assert valid.sum() >= 4
    env = windowed["env"]
    demos = make_demos(env, fmt, WINDOW_TASKS, jax.random.key(3), num_turns=6, noise=0.0, cut_after_error=False,
                       max_len=demo_tokens_needed(env, fmt, 6), caps=jnp.array(WINDOW_CAPS),
                       actions=np.where(actions >= 0, actions, 0))
    tokens, length, mask = (np.asarray(x) for x in _windowed_rows()(demos, H, 512))
    rows = np.repeat(valid, 6)
    flat = jax.tree.map(np.asarray, a.rows())
    np.testing.assert_array_equal(length[rows], flat.length[rows])
    for i in np.flatnonzero(rows):
        np.testing.assert_array_equal(tokens[i, : length[i]], flat.tokens[i, : length[i]])
        np.testing.assert_array_equal(mask[i], flat.loss_mask[i, : mask.shape[1]])


def test_caps_hold_exactly(tiny_tokenizer):
    """64 rows of mixed caps (up to max_turns), the cap shown in each observation, played as 8 batches of 8
    (the program of test_rollout_equals_python_loop[corridor-sampled-compacting]: compaction on)."""
    env = _env("corridor", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=3, scale=3.0)
    cfg = dataclasses.replace(_cfg(temperature=1.0), **COMPACTING)
    batch = 64
    caps = np.asarray(jax.jit(lambda k: budget.mix([2, 5, 6], [0.3, 0.3, 0.4]).sample(k, batch, group_size=8))(
        jax.random.key(0)))  # jitted: one program, not one per operation
    tasks = {"seed": np.arange(batch, dtype=np.int32)}
    parts = [jax.tree.map(np.asarray, rollout(policy, env, {"seed": tasks["seed"][i:i + 8]}, caps[i:i + 8],
                                              jax.random.key(1 + i), cfg)) for i in range(0, batch, 8)]
    tr = jax.tree.map(lambda *x: np.concatenate(x), *parts)
    assert np.all(tr.turns_used <= tr.caps)
    assert np.all(tr.turn_active.sum(1) == tr.turns_used)
    # No token of a turn at or past the cap; no policy token outside acted turns.
    assert np.all(tr.turn_of_token < tr.caps[:, None])
    for b in range(batch):
        assert np.all(tr.turn_active[b, : tr.turns_used[b]]) and not tr.turn_active[b, tr.turns_used[b]:].any()
    # Early success stops early; otherwise the cap (or the buffer) stopped the sequence.
    won = tr.success
    assert won.any() and (~won).any()
    np.testing.assert_array_equal(tr.turns_used[won], tr.first_success_turn[won])
    assert np.all(tr.truncated[~won & ~tr.overflow] == (tr.turns_used[~won & ~tr.overflow] == tr.caps[~won & ~tr.overflow]))
    assert not tr.truncated[won].any()
    # The loss mask marks sampled tokens only, all inside acted turns.
    assert np.all(tr.turn_of_token[tr.loss_mask > 0] >= 0)
    assert np.all(tr.logprobs[tr.loss_mask == 0] == 0)


def test_one_compile_across_budgets(tiny_tokenizer):
    """Fixed, mixed and uniform caps, shared in a group or not, run in one program (the caps are data); the
    program is test_rollout_equals_python_loop[corridor-sampled-compacting]'s (the same shapes)."""
    env = _env("corridor", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=4, scale=3.0)
    cfg = dataclasses.replace(_cfg(temperature=1.0), **COMPACTING)
    from flax import nnx

    from bmrl.rollout import make_rollout

    graphdef, _ = nnx.split(policy)
    run = make_rollout(graphdef, env, _fmt(env), cfg)
    before = run.trace_count()
    tasks = {"seed": np.arange(8, dtype=np.int32)}
    samplers = [budget.fixed(3), budget.fixed(6), budget.mix([2, 4, 6], [0.2, 0.3, 0.5]),
                budget.uniform(1, 6), budget.mix([4, 6])]
    draws = jax.jit(lambda: [b.sample(jax.random.key(i), 8, group_size=4, share_in_group=i % 2 == 0)
                             for i, b in enumerate(samplers)])()  # every sampler's caps in one program
    used = []
    for i, caps in enumerate(draws):
        tr = rollout(policy, env, tasks, caps, jax.random.key(10 + i), cfg)
        used.append(np.asarray(tr.turns_used))
    assert run.trace_count() - before <= 1, "the rollout recompiled for new caps"
    assert len({u.tobytes() for u in used}) > 1


def test_same_key_same_trajectory_and_neighbours_do_not_matter(tiny_tokenizer):
    """Sampled (temperature 1), with a key per row: the same keys give the same trajectories, and a row's
    trajectory does not depend on its neighbours' tasks, caps or keys (the batch compacts as they finish).
    The program is test_error_injection_forces_wrong_actions's (the same shapes)."""
    env = _env("frozenlake", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=5, scale=3.0)
    cfg = _cfg(temperature=1.0)
    keys = jax.random.split(jax.random.key(7), 64)
    tasks = {"seed": np.arange(64, dtype=np.int32)}
    caps = np.full((64,), 5, np.int32)  # 6 turns of frozenlake outgrow the buffer (the refusal: min cap)
    a = rollout(policy, env, tasks, caps, keys, cfg)
    b = rollout(policy, env, tasks, caps, keys, cfg)
    _assert_same(a, b)
    assert len({row.tobytes() for row in np.asarray(a.tokens)[:, :200]}) > 32  # sampled: rows differ
    # Different neighbours (tasks, caps, keys of rows 1..63): row 0 is unchanged.
    tasks2 = {"seed": np.arange(64, dtype=np.int32) + np.int32(50) * (np.arange(64) > 0)}
    caps2 = np.where(np.arange(64) > 0, 3, caps).astype(np.int32)
    keys2 = keys.at[1:].set(jax.random.split(jax.random.key(99), 63))
    c = rollout(policy, env, tasks2, caps2, keys2, cfg)
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, f))[0], np.asarray(getattr(c, f))[0], err_msg=f)


def test_group_members_sample_differently(tiny_tokenizer):
    """Two groups of 4 rows on one task each (test_rollout_equals_python_loop[corridor-sampled-compacting]'s
    program)."""
    env = _env("corridor", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=6, scale=3.0)
    cfg = dataclasses.replace(_cfg(temperature=1.0), **COMPACTING)
    tasks = {"seed": np.repeat(np.arange(2, dtype=np.int32), 4)}
    tr = rollout(policy, env, tasks, np.full((8,), 4, np.int32), jax.random.key(0), cfg)
    tokens = np.asarray(tr.tokens).reshape(2, 4, -1)
    for g in range(2):
        assert len({row.tobytes() for row in tokens[g]}) > 1


def test_overflow_is_flagged_and_corrupts_nothing(tiny_tokenizer):
    """A buffer that holds 2 turns against one that holds them all (the file's shapes: the greedy corridor
    program of test_attention_block_changes_only_the_work)."""
    env = _env("corridor", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=7)
    fmt = _fmt(env)
    small = fmt.tokens_needed(2, env.max_obs_len, 6)
    tasks = {"seed": np.arange(8, dtype=np.int32)}
    caps = jnp.array([2, 6, 6, 6, 2, 6, 6, 6], jnp.int32)
    tight = rollout(policy, env, tasks, caps, jax.random.key(0), _cfg(max_len=small))
    roomy = rollout(policy, env, tasks, caps, jax.random.key(0), _cfg())
    t, r = jax.tree.map(np.asarray, tight), jax.tree.map(np.asarray, roomy)
    assert fmt.tokens_needed(6, env.max_obs_len, 6) <= 512 and not r.overflow.any()  # the roomy run holds every turn
    assert t.length.max() <= small
    stopped = t.turns_used < r.turns_used
    assert stopped.any()
    np.testing.assert_array_equal(t.overflow, stopped)
    assert not t.truncated[t.overflow].any()
    for b in range(8):  # what the tight run holds is exactly the start of the roomy run
        n = t.length[b]
        np.testing.assert_array_equal(t.tokens[b, :n], r.tokens[b, :n])
        np.testing.assert_array_equal(t.loss_mask[b, :n], r.loss_mask[b, :n])


def test_bad_inputs_are_refused(tiny_tokenizer):
    env = _env("corridor", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env))
    tasks = {"seed": np.arange(2, dtype=np.int32)}
    key = jax.random.key(0)
    with pytest.raises(RolloutError, match=r"in \[1, max_turns=6\]"):
        rollout(policy, env, tasks, jnp.array([3, 7]), key, _cfg())
    with pytest.raises(RolloutError, match=r"in \[1, max_turns=6\]"):
        rollout(policy, env, tasks, jnp.array([0, 2]), key, _cfg())
    with pytest.raises(RolloutError, match="cannot hold even the smallest budget.*need up to"):
        rollout(policy, env, tasks, jnp.array([4, 4]), key, _cfg(max_len=64))
    with pytest.raises(RolloutError, match="max_reply_tokens=1 cannot hold"):
        rollout(policy, env, tasks, jnp.array([4, 4]), key, _cfg(reply=1))
    with pytest.raises(RolloutError, match="must be >= 1"):
        RolloutConfig(max_turns=0, max_reply_tokens=4, max_len=128)


def test_sharded_rollout_matches_single_device(tmp_path):
    """8 simulated CPU devices (data x tensor mesh) give the same greedy tokens as one device."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from bmrl.envs import make
        from tests.tiny_tokenizer import shared_tokenizer
        from bmrl.parallel import MeshConfig, make_mesh, shard_batch, shard_model
        from bmrl.rollout import RolloutConfig, default_format, rollout
        from bmrl.sampling import SamplingConfig
        from tests.rollout_helpers import steered_policy
        assert jax.device_count() == 8, jax.devices()
        tok = shared_tokenizer()
        env = make("corridor", tok, length=4, eps=0.3)
        policy = steered_policy(env, default_format(env), seed=1, noise=0.5)  # noise: no exact argmax ties
        cfg = RolloutConfig(max_turns=6, max_reply_tokens=6, max_len=512, sampling=SamplingConfig(0.0))
        tasks = {"seed": jnp.arange(16, dtype=jnp.int32)}
        caps = jnp.array([1, 2, 3, 4, 5, 6, 6, 5] * 2, jnp.int32)
        one = rollout(policy, env, tasks, caps, jax.random.key(0), cfg)
        mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
        sharded_policy = shard_model(policy, mesh)
        sh_tasks, sh_caps = shard_batch((tasks, caps), mesh)
        many = rollout(sharded_policy, env, sh_tasks, sh_caps, jax.random.key(0), cfg)
        assert len(many.tokens.sharding.device_set) == 8, many.tokens.sharding
        q = sharded_policy.layers[0].self_attn.q_proj.kernel[...]
        assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), q.sharding
        for f in ("tokens", "length", "action", "turns_used", "success"):
            np.testing.assert_array_equal(np.asarray(getattr(one, f)), np.asarray(getattr(many, f)), err_msg=f)
        print("SHARDED_OK")
        """
    )
    env = dict(os.environ, XLA_FLAGS=EIGHT_CPU_DEVICES, JAX_PLATFORMS="cpu")
    root = ROOT
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert "SHARDED_OK" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]


def test_error_injection_forces_wrong_actions(tiny_tokenizer):
    env = _env("frozenlake", tiny_tokenizer)
    policy = steered_policy(env, _fmt(env), seed=8, scale=3.0)
    cfg = _cfg(temperature=1.0)
    tasks = {"seed": np.arange(64, dtype=np.int32)}
    caps = np.full((64,), 5, np.int32)  # test_same_key_...'s caps: 6 turns of frozenlake outgrow the buffer
    assert cfg.max_turns == 6
    inject = Injection.at(cfg.max_turns, turns=[1, 3], prob=0.5)
    keys = jax.random.split(jax.random.key(0), 64)  # a key per row: test_same_key_...'s program
    tr = jax.tree.map(np.asarray, rollout(policy, env, tasks, caps, keys, cfg, inject=inject))
    inj = tr.injected
    assert not inj[:, [0, 2, 4, 5]].any()
    assert np.all(tr.turn_active[inj])
    rate = inj[:, 1][tr.turn_active[:, 1]].mean()
    assert 0.3 < rate < 0.7, rate
    # A forced action is valid and never the oracle's.
    assert np.all(tr.action[inj] >= 0) and np.all(tr.action[inj] != tr.oracle_action[inj])
    none = jax.tree.map(np.asarray, rollout(policy, env, tasks, caps, keys, cfg))
    assert not none.injected.any()


def test_compaction_chunks_divide_the_batch():
    """A turn is played in chunks of batch / k rows (k <= compact_steps, dividing the batch, chunks of
    at least compact_min_rows); compaction off (or a batch too small to split) is the whole batch;
    on by default on CPU (the config's platform default and RolloutConfig agree); a step count below 1
    is refused with the fix."""
    from bmrl.assembly.settings import platform_default
    from bmrl.config.schema import RolloutCfg

    def chunk(batch, min_rows, steps=4):
        return RolloutConfig(4, 2, 8, compact_min_rows=min_rows, compact_steps=steps).compact_chunk(batch)

    assert chunk(64, 8) == 16 and chunk(256, 8) == 64 and chunk(16, 8) == 8 and chunk(12, 8) == 12
    assert chunk(64, 8, steps=8) == 8 and chunk(10, 3, steps=3) == 5 and chunk(7, 2) == 7 and chunk(64, 0) == 64
    assert RolloutConfig(4, 2, 8).compact_chunk(64) == 16 and RolloutConfig(4, 2, 8).compact_chunk(16) == 16
    assert jax.default_backend() == "cpu"
    assert ((platform_default("compact_min_rows", RolloutCfg().compact_min_rows), RolloutCfg().compact_steps,
             platform_default("attention_block", RolloutCfg().attention_block))
            == (RolloutConfig(4, 2, 8).compact_min_rows, RolloutConfig(4, 2, 8).compact_steps,
                RolloutConfig(4, 2, 8).attention_block))
    with pytest.raises(RolloutError, match="compact_steps must be >= 1"):
        RolloutConfig(4, 2, 8, compact_min_rows=8, compact_steps=0)


def test_rollout_speed_knobs_take_the_platform_default_only_when_null(monkeypatch):
    """Left null, compaction and the cache's attention block follow the platform (on by default and 64
    keys on CPU; off and 256 keys on GPU/TPU, measured on an H200); a value in the config always wins."""
    from bmrl import config as config_lib
    from bmrl.assembly import settings as env_build

    def resolved(backend, **rollout):
        monkeypatch.setattr(env_build.jax, "default_backend", lambda: backend)
        r = env_build.rollout_config(config_lib.build({"rollout": rollout}))
        return r.compact_min_rows, r.attention_block

    assert resolved("cpu") == (16, 64)
    assert resolved("gpu") == resolved("tpu") == (0, 256)
    assert resolved("gpu", compact_min_rows=8, attention_block=32) == (8, 32)
    assert resolved("cpu", compact_min_rows=0, attention_block=0) == (0, 0)


def test_attention_block_changes_only_the_work(tiny_tokenizer, monkeypatch):
    """`attention_block` (config `rollout.attention_block`) sets how many cache keys a step of the
    blocked attention reads: every attention over the cache in the traced rollout gets it, and blocks
    of 16 (a context of several blocks; also through the Python-driven baseline), the default 64 and
    the whole buffer at once (0) give the same greedy trajectories, log-probs within float tolerance;
    a negative block is refused with the fix. The default block's program is the file's greedy corridor
    (test_overflow_is_flagged_and_corrupts_nothing's roomy run)."""
    from flax import nnx

    from bmrl.model import decoder
    from bmrl.rollout.engine import make_episode
    from bmrl.rollout.model_policy import ModelPolicy

    env = _env("corridor", tiny_tokenizer)
    fmt = _fmt(env)
    policy = steered_policy(env, fmt, seed=2, scale=3.0)
    tasks, key = {"seed": np.arange(8, dtype=np.int32)}, jax.random.key(3)
    caps = jnp.asarray([2, 4, 4, 3, 2, 4, 3, 4], jnp.int32)  # up to 4 turns: few context widths for the baseline
    graphdef, params = nnx.split(policy)
    runs, seen = {}, []
    real = decoder.attend_cache
    monkeypatch.setattr(decoder, "attend_cache", lambda *a: seen.append(a[5]) or real(*a))
    for block in (16, 64, 0):
        cfg = dataclasses.replace(_cfg(), attention_block=block)  # a program of its own
        # A fresh trace of the rollout at this block (lowered, not compiled: the cached program may be traced).
        seen.clear()
        make_episode(ModelPolicy(graphdef, fmt, cfg), env, cfg, False, "rollout").lower(
            params, tasks, caps, key, Injection.none(cfg.max_turns))
        assert seen and set(seen) == {block}, (block, set(seen))
        runs[block] = rollout(policy, env, tasks, caps, key, cfg)
        if block == 16:  # the Python-driven loop at the same block
            _assert_same(runs[block], python_loop_rollout(policy, env, tasks, caps, key, cfg))
    assert _cfg().attention_block == 64  # the file's greedy corridor program
    assert int(np.asarray(runs[64].length).max()) > 3 * 16  # the 16-key blocks really loop
    _assert_same(runs[16], runs[64])
    _assert_same(runs[0], runs[64])
    with pytest.raises(RolloutError, match="attention_block must be >= 0"):
        RolloutConfig(4, 2, 8, attention_block=-1)
    from bmrl.config.schema import RolloutCfg
    from bmrl.model.attention import BLOCK_SIZE

    assert RolloutCfg().attention_block is None  # the platform's (test_rollout_speed_knobs_take_the_platform_default...)
    assert RolloutConfig(4, 2, 8).attention_block == BLOCK_SIZE  # the CPU's default, one constant


def test_rollout_program_never_copies_the_kv_cache(tiny_tokenizer):
    """The compiled rollout (compaction on: live rows packed first, a turn played chunk by chunk) holds
    no instruction that copies or transposes a cache-sized array: per-turn prefill, decode and the
    compaction all update the cache in place (XLA copied it whole, twice a turn, when the prefill ran
    under `lax.cond`). The program is the file's sampled corridor one (test_rollout_equals_python_loop
    [corridor-sampled-compacting], where the compacting rollout equals the Python loop)."""
    from flax import nnx

    from bmrl.rollout.engine import make_rollout
    from tests.model.test_attention import _cache_sized_copies

    env = _env("corridor", tiny_tokenizer)
    fmt = _fmt(env)
    policy = steered_policy(env, fmt, seed=2, scale=3.0)
    cfg = dataclasses.replace(_cfg(temperature=1.0), **COMPACTING)
    graphdef, params = nnx.split(policy)
    run = make_rollout(graphdef, env, fmt, cfg)
    batch = 8
    assert cfg.compact_chunk(batch) == 2
    args = (params, {"seed": np.arange(batch, dtype=np.int32)}, np.full((batch,), 4, np.int32),
            jax.random.key(0), Injection.none(cfg.max_turns))
    hlo = run.lower(*args).compile().as_text()
    cache = policy.init_cache(batch, cfg.max_len)[0][0]
    assert cache.size in [math.prod(int(d) for d in dims.split(",")) for dims in re.findall(r"f32\[([\d,]+)\]", hlo)]
    assert _cache_sized_copies(hlo, cache.size) == []


def test_unrolled_threefry_draws_the_same_bits():
    """`bmrl.sampling` lowers threefry unrolled on CPU (the suite runs the rolled lowering,
    BMRL_ROLLED_THREEFRY=1, which compiles faster): both give the same keys, bits and samples; the unrolled
    program really has no loop."""
    script = textwrap.dedent(
        """
        import os
        assert os.environ["BMRL_ROLLED_THREEFRY"] == "1"
        import jax, jax.numpy as jnp, numpy as np
        from bmrl import sampling

        def draws(key):
            a, b = jax.random.split(key)
            return (jax.random.bits(a, (64,)), jax.random.categorical(b, jnp.log(jnp.array([0.2, 0.3, 0.5])), shape=(256,)),
                    jax.random.randint(jax.random.fold_in(key, 3), (64,), 1, 9), jax.random.key_data(jax.random.split(b, 4)))

        key = jax.random.key(7)
        assert not sampling.UNROLLED_THREEFRY
        rolled_hlo = jax.jit(draws).lower(key).as_text()
        rolled = jax.device_get(jax.jit(draws)(key))
        assert sampling.unroll_threefry_on_cpu()
        jax.clear_caches()
        unrolled_hlo = jax.jit(draws).lower(key).as_text()
        unrolled = jax.device_get(jax.jit(draws)(key))
        assert "stablehlo.while" in rolled_hlo and "stablehlo.while" not in unrolled_hlo
        for x, y in zip(rolled, unrolled):
            np.testing.assert_array_equal(x, y)
        print("SAME_BITS")
        """
    )
    env = dict(os.environ, BMRL_ROLLED_THREEFRY="1", JAX_PLATFORMS="cpu")
    root = ROOT
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert "SAME_BITS" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
