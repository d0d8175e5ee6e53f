"""Python environments (text in, text out) on the engine's compiled model turn, driven from the host.

Per turn, for a batch of rows each with its own environment object (`bmrl.envs.python.protocol`):

    act      one jitted program: every active row decodes its reply into its persistent KV cache
             (`ModelPolicy.decode_reply`: stop tokens, per-turn limit, sampling) and the format
             extracts its answer span; nothing before the reply is prefilled again
    host     answers are decoded to text and handed to the environments, stepped concurrently in a
             thread pool with a timeout; faults become "tool error: ..." observations (a reply that
             breaks the reply format has no answer: its environment gets the empty action "")
    observe  the observation texts are tokenized on the host, padded to one of a few static widths,
             and one jitted program prefills them at each row's offset (`ModelPolicy.observe`)
    active = ~done & (turn < caps) & fits       (caps are data: host arrays, never shapes)

A model's batch plays as a few equal groups in as many host threads (`HostConfig.pipeline`,
`groups`): while some groups' environments step, the others' device work runs; the groups share one
compile and give bitwise the trajectory of the whole batch played at once. One compile per batch
shape and observation width. The result is the engine's `Trajectory`, so the learner and the
evaluator consume it unchanged; `HostRollout.faults` lists what user code broke.

Scripted (`script=`, `bmrl.rollout.scripts`): a script picks each turn's action text from the envs'
infos instead of decoding. With a model, its replies (`Format.reply_tokens` of the text's tokens, then
the stop id) are teacher-forced into the cache (`ModelPolicy.force_reply`): the trajectory is the one
decoding those tokens would have made. With `policy=None` no model runs (no tokens; the observations
shown are kept in `HostRollout.observations`): SFT demonstrations lay them out (`bmrl.learn.host_demos`).
Keys follow the engine: row keys `row_keys(key, B)`, the model samples from the TOKEN stream, and the
environment of row b gets `reset(seed=key_seed(fold_in(row_key_b, ENV_STREAM)))`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl import compiles
from bmrl.envs.python.protocol import Fault, Stepper, StepResult, action_index, key_seed
from bmrl.envs.text import INVALID, Observation, encode
from bmrl.formats import Format
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.types import (
    ENV_STREAM,
    RolloutConfig,
    RolloutError,
    Trajectory,
    check_caps,
    host_keys,
    row_keys,
    stream,
)

ON_FAULT = ("observe", "end")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HostConfig:
    """How the host drives Python environments.

    step_timeout_s: a reset or step slower than this is a fault (timeout) for its row.
    workers: threads stepping environments concurrently (in each pipeline group).
    obs_widths: static observation widths (tokens); an observation is padded to the smallest that
      holds the longest one of its turn (plus `max_len`, the last resort): one compile per width used.
    on_fault: "observe" (the row sees "tool error: ..." and goes on) or "end" (the row stops there).
    pipeline: a model's batch plays as `groups` equal groups in as many host threads, so some groups'
      device steps run while the others' environments step (results identical: rows are independent
      and keep their own keys).
    groups: the most groups a pipelined batch is split into (the largest divisor of the batch up to
      this; 1 or no divisor: one group). 4, not 2: two halves fell into step (both on the device, then
      both waiting for their environments: no latency hidden), four drift apart (on 2 CPU cores, 256 x
      16 turns with 20 ms per step, interleaved best of 4: 1.37 s, halves 1.62 s, one batch 1.84 s).
    """

    step_timeout_s: float = 30.0
    workers: int = 32
    obs_widths: tuple[int, ...] = (32, 128, 512)
    on_fault: str = "observe"
    pipeline: bool = True
    groups: int = 4

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"HostConfig.groups must be >= 1 (1 = no pipeline), got {self.groups}.")
        if self.on_fault not in ON_FAULT:
            raise ValueError(f"HostConfig.on_fault must be one of {ON_FAULT}, got {self.on_fault!r}.")
        if self.step_timeout_s <= 0 or self.workers < 1 or not self.obs_widths or min(self.obs_widths) < 1:
            raise ValueError("HostConfig needs step_timeout_s > 0, workers >= 1 and positive obs_widths.")


@dataclasses.dataclass
class HostRollout:
    """A host rollout: the Trajectory, the faults of user code (row, turn, kind, message) and the
    observation tokens each row was shown (`observations[b][t]`: before turn t)."""

    trajectory: Trajectory
    faults: list[Fault]
    observations: list[list[list[int]]] = dataclasses.field(default_factory=list)


class _Width:
    """What `ModelPolicy.start/observe` read from an environment: the observation width."""

    def __init__(self, width: int):
        self.max_obs_len = width


def _programs(policy: ModelPolicy) -> dict[str, Callable]:
    """The jitted start, act, observe and outputs programs of a model policy (cached, counted)."""

    def build() -> dict[str, Callable]:
        fmt = policy.fmt

        def start(params, obs_tokens, obs_len, keys):
            return policy.bind(params).start(_Width(obs_tokens.shape[1]), Observation(obs_tokens, obs_len), keys)

        def act(params, s, t, active):
            bound = policy.bind(params)
            reply_start = s.n_tok
            s = bound.decode_reply(s, t, active)
            reply, reply_len = bound.reply(s, reply_start)
            answer, answer_len, ok = jax.vmap(fmt.extract_answer)(reply, reply_len)
            return s, answer, answer_len, ok

        def force(params, s, reply, reply_len, t, active):
            bound = policy.bind(params)
            reply_start = s.n_tok
            s = bound.force_reply(s, reply, reply_len, t, active)
            reply, reply_len = bound.reply(s, reply_start)
            answer, answer_len, ok = jax.vmap(fmt.extract_answer)(reply, reply_len)
            return s, answer, answer_len, ok

        def observe(params, s, obs_tokens, obs_len, t, nxt):
            bound = policy.bind(params)
            return bound.observe(s, _Width(obs_tokens.shape[1]), Observation(obs_tokens, obs_len), t, nxt)

        def outputs(params, s):
            return policy.bind(params).outputs(s)

        return {
            "start": compiles.counted_jit(start, name="host_start"),
            "act": compiles.counted_jit(act, name="host_act", donate_argnums=(1,)),
            "force": compiles.counted_jit(force, name="host_force", donate_argnums=(1,)),
            "observe": compiles.counted_jit(observe, name="host_observe", donate_argnums=(1,)),
            "outputs": compiles.counted_jit(outputs, name="host_outputs"),
        }

    return compiles.program("host_rollout", policy, build)


def _widths(hcfg: HostConfig, cfg: RolloutConfig, wrap: int) -> list[int]:
    """The static observation widths: those of `hcfg` below the most that can still fit the buffer
    (`max_len` less the `wrap` tokens around an observation and one reply), and that most."""
    most = cfg.max_len - wrap - cfg.max_reply_tokens
    if most < 1:
        raise RolloutError(f"max_len={cfg.max_len} leaves no room for an observation; raise RolloutConfig.max_len.")
    return sorted({w for w in hcfg.obs_widths if w < most} | {most})


def _pad_obs(token_lists: Sequence[list[int]], widths: list[int], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows' observation tokens -> ([B, W] at the smallest static width W holding them, lengths [B])."""
    longest = max((len(t) for t in token_lists), default=0)
    width = next((w for w in widths if w >= longest), widths[-1])
    out = np.full((len(token_lists), width), pad, np.int32)
    lens = np.zeros((len(token_lists),), np.int32)
    for b, toks in enumerate(token_lists):
        toks = toks[:width]
        out[b, : len(toks)] = toks
        lens[b] = len(toks)
    return out, lens


def host_rollout(
    policy: nnx.Module | None,
    envs: Sequence[Any],
    tokenizer,
    caps: Any,
    key: jax.Array,
    cfg: RolloutConfig,
    fmt: Format,
    tasks: Sequence[dict | None] | None = None,
    hcfg: HostConfig = HostConfig(),
    script: Any = None,
) -> HostRollout:
    """Play one batch of Python environments (one object per row) with a model, per-row turn caps.

    tasks: row b's task is passed to `envs[b].reset(seed=..., options=tasks[b])`. caps: int[B] in
    [1, max_turns]. key: one PRNG key or one per row (as `bmrl.rollout.rollout`). script: play its
    action texts instead of decoding (module docstring); `policy` may then be None (no tokens).
    With `hcfg.pipeline`, a model's batch plays as up to `hcfg.groups` equal groups overlapped in threads.
    """
    caps = np.asarray(caps)
    check_caps(caps, cfg)
    if cfg.history_turns is not None:
        raise RolloutError(f"RolloutConfig.history_turns={cfg.history_turns}: a history window runs in the compiled "
                           "loop of JAX environments only; a Python environment keeps the whole episode "
                           "(history_turns=None).")
    if fmt.rewrites_history:
        raise RolloutError("The format follows its chat template's history rewrite (Format.history_cut): that runs in "
                           "the compiled loop of JAX environments only; a Python environment keeps every reply whole "
                           "(format history 'whole').")
    batch = caps.shape[0]
    tasks = list(tasks) if tasks is not None else [None] * batch
    if len(envs) != batch or len(tasks) != batch:
        raise RolloutError(f"host_rollout needs one environment (and task) per row: {batch} caps, {len(envs)} envs.")
    if policy is None and script is None:
        raise RolloutError("host_rollout needs a policy (a model), a script, or both (teacher forcing).")
    keys = host_keys(row_keys(key, batch))
    groups = pipeline_groups(batch, hcfg) if policy is not None and script is None else 1
    if groups > 1:
        out = _pipelined(policy, envs, tokenizer, caps, keys, cfg, fmt, tasks, hcfg, groups)
    else:
        out = _play(policy, envs, tokenizer, caps, keys, cfg, fmt, tasks, hcfg, script)
    for f in out.faults:
        log.warning("env fault in row %d (task %r), turn %d: %s: %s", f.row, tasks[f.row], f.turn, f.kind, f.message)
    return out


def pipeline_groups(batch: int, hcfg: HostConfig) -> int:
    """How many equal groups a pipelined batch of `batch` rows plays as: the largest divisor of `batch`
    in [2, hcfg.groups] (equal groups: one compile), 1 when pipelining is off or none divides it."""
    if not hcfg.pipeline:
        return 1
    return max((g for g in range(2, hcfg.groups + 1) if batch % g == 0), default=1)


def _pipelined(policy, envs, tokenizer, caps, keys, cfg, fmt, tasks, hcfg, groups: int) -> HostRollout:
    """`groups` equal parts of the batch, each played by `_play` in its own thread: while some wait for
    their environments (host threads, a tool's latency), the others' jitted decode or prefill runs
    (JAX releases the GIL on device work). Parts have the same shape (one compile) and are joined in
    row order; faults keep their rows in the whole batch."""
    import concurrent.futures as cf

    n = caps.shape[0] // groups
    parts = [slice(i * n, (i + 1) * n) for i in range(groups)]
    with cf.ThreadPoolExecutor(max_workers=groups, thread_name_prefix="bmrl-group") as pool:
        futures = [pool.submit(_play, policy, envs[p], tokenizer, caps[p], keys[p], cfg, fmt, tasks[p], hcfg, None)
                   for p in parts]
        outs = [f.result() for f in futures]
    faults = [dataclasses.replace(f, row=f.row + p.start) for o, p in zip(outs, parts) for f in o.faults]
    trajectory = jax.tree.map(lambda *x: jnp.concatenate(x), *[o.trajectory for o in outs])
    return HostRollout(trajectory, faults, [obs for o in outs for obs in o.observations])


def _play(policy, envs, tokenizer, caps, keys, cfg, fmt, tasks, hcfg, script) -> HostRollout:
    """The host loop over one batch (module docstring); `keys`: one per row."""
    batch, Tm = caps.shape[0], cfg.max_turns
    model = _Model(policy, fmt, cfg, hcfg) if policy is not None else None
    seeds = [key_seed(k) for k in stream(keys, ENV_STREAM)]
    stepper = Stepper(min(hcfg.workers, batch), hcfg.step_timeout_s)
    rec = _Records(batch, Tm, caps)
    try:
        first = stepper.run({b: (lambda b=b: envs[b].reset(seed=seeds[b], options=tasks[b])) for b in range(batch)},
                            -1, is_reset=True)
        infos = [first[b].info for b in range(batch)]
        obs_toks = [encode(tokenizer, first[b].obs) for b in range(batch)]
        for b in range(batch):
            rec.reset(b, first[b], obs_toks[b])
        if model is not None:
            model.start(obs_toks, keys, rec)
        for t in range(Tm):
            active = rec.active.copy()
            if script is not None:
                chosen = script.act(t, [int(b) for b in np.flatnonzero(active)], infos)
                active &= np.array([chosen.get(b) is not None for b in range(batch)])
                rec.active = active
            if not active.any():
                break
            if model is None:
                texts, ok = {b: chosen[b] for b in np.flatnonzero(active).tolist()}, np.ones((batch,), bool)
            elif script is None:
                texts, ok = model.act(t, active, tokenizer)
            else:
                texts, ok = model.force(t, active, chosen, tokenizer)
            results = stepper.run({b: (lambda b=b, a=a: envs[b].step(a)) for b, a in texts.items()}, t)
            nxt = np.zeros((batch,), bool)
            obs_toks = [[] for _ in range(batch)]
            for b, text in texts.items():
                infos[b] = results[b].info
                nxt[b] = rec.turn(b, t, results[b], envs[b], text, bool(ok[b]), cfg.format_reward, hcfg)
                if nxt[b]:
                    obs_toks[b] = encode(tokenizer, results[b].obs)
                    rec.observations[b].append(obs_toks[b])
            rec.active = model.observe(t, nxt, obs_toks, rec) if model is not None else nxt
        out = model.outputs() if model is not None else _no_tokens(batch)
    finally:
        stepper.close()
    return HostRollout(rec.trajectory(out, caps), rec.faults, rec.observations)


class _Model:
    """A model's side of the host loop: the jitted programs, its state and the static widths."""

    def __init__(self, policy: nnx.Module, fmt: Format, cfg: RolloutConfig, hcfg: HostConfig):
        graphdef, self.params = nnx.split(policy)
        self.prog = _programs(ModelPolicy(graphdef, fmt, cfg))
        self.fmt, self.cfg = fmt, cfg
        self.widths = _widths(hcfg, cfg, fmt.turn_chunk_len(0))
        self.first_widths = _widths(hcfg, cfg, fmt.first_chunk_len(0))
        self.state = None

    def start(self, obs_toks: list[list[int]], keys: jax.Array, rec: "_Records") -> None:
        too_long = np.array([len(x) > self.first_widths[-1] for x in obs_toks])  # cannot play: overflow, no turn
        rec.overflow |= too_long
        rec.active &= ~too_long
        tok, lens = _pad_obs(obs_toks, self.first_widths, self.fmt.pad_id)
        self.state = self.prog["start"](self.params, jnp.asarray(tok), jnp.asarray(lens), keys)

    def _answers(self, out, active: np.ndarray, tokenizer) -> tuple[dict[int, str], np.ndarray]:
        self.state, answer, answer_len, ok = out
        answer, answer_len, ok = jax.device_get((answer, answer_len, ok))
        texts = {int(b): tokenizer.decode([int(x) for x in answer[b, : answer_len[b]]]) if ok[b] else ""
                 for b in np.flatnonzero(active)}
        return texts, ok

    def act(self, t: int, active: np.ndarray, tokenizer) -> tuple[dict[int, str], np.ndarray]:
        """Decode every active row's reply; its answer as text (empty when the reply breaks the format)."""
        return self._answers(self.prog["act"](self.params, self.state, jnp.int32(t), jnp.asarray(active)),
                             active, tokenizer)

    def force(self, t: int, active: np.ndarray, chosen: dict, tokenizer) -> tuple[dict[int, str], np.ndarray]:
        """Teacher-force the reply of each active row's chosen text; its answer as the model path reads it."""
        R = self.cfg.max_reply_tokens
        replies = {b: self.fmt.reply_tokens(encode(tokenizer, chosen[b])) for b in np.flatnonzero(active).tolist()}
        longest = max(len(r) for r in replies.values())
        if longest + 1 > R:
            raise RolloutError(f"a forced reply of {longest} tokens and its stop token exceed "
                               f"max_reply_tokens={R}; raise RolloutConfig.max_reply_tokens.")
        reply = np.full((len(active), R), self.fmt.pad_id, np.int32)
        lens = np.zeros((len(active),), np.int32)
        for b, r in replies.items():
            reply[b, : len(r)], lens[b] = r, len(r)
        out = self.prog["force"](self.params, self.state, jnp.asarray(reply), jnp.asarray(lens), jnp.int32(t),
                                 jnp.asarray(active))
        return self._answers(out, active, tokenizer)

    def observe(self, t: int, nxt: np.ndarray, obs_toks: list[list[int]], rec: "_Records") -> np.ndarray:
        """Prefill the next observations of the rows going on; returns the rows that still fit."""
        too_long = np.array([len(x) > self.widths[-1] for x in obs_toks])
        rec.overflow |= nxt & too_long
        nxt = nxt & ~too_long
        tok, lens = _pad_obs(obs_toks, self.widths, self.fmt.pad_id)
        self.state, fits = self.prog["observe"](self.params, self.state, jnp.asarray(tok), jnp.asarray(lens),
                                                jnp.int32(t), jnp.asarray(nxt))
        fits = np.asarray(fits)
        rec.overflow |= nxt & ~fits
        return nxt & fits

    def outputs(self) -> dict:
        return self.prog["outputs"](self.params, self.state)


def _no_tokens(batch: int) -> dict[str, jax.Array]:
    """The token fields of a trajectory played without a model: empty."""
    return dict(tokens=jnp.zeros((batch, 0), jnp.int32), length=jnp.zeros((batch,), jnp.int32),
                loss_mask=jnp.zeros((batch, 0), jnp.float32), logprobs=jnp.zeros((batch, 0), jnp.float32),
                turn_of_token=jnp.zeros((batch, 0), jnp.int32))


class _Records:
    """Host-side per-row records of a batch (numpy), laid out as the engine's `Turns` and flags."""

    def __init__(self, batch: int, max_turns: int, caps: np.ndarray):
        none = np.full((batch, max_turns), INVALID, np.int32)
        false = np.zeros((batch, max_turns), bool)
        self.caps, self.Tm = caps.astype(np.int32), max_turns
        self.action, self.oracle_action = none.copy(), none.copy()
        self.reward = np.zeros((batch, max_turns), np.float32)
        self.error, self.invalid, self.format_error, self.turn_active = false.copy(), false.copy(), false.copy(), false.copy()
        self.progress = np.zeros((batch, max_turns + 1), np.float32)
        self.turns_used = np.zeros((batch,), np.int32)
        self.first_success_turn = np.zeros((batch,), np.int32)
        self.success, self.terminated, self.env_truncated, self.overflow = (np.zeros((batch,), bool) for _ in range(4))
        self.active = np.ones((batch,), bool)
        self.faults: list[Fault] = []
        self.observations: list[list[list[int]]] = [[] for _ in range(batch)]

    def reset(self, b: int, r: StepResult, obs_tokens: list[int]) -> None:
        self.progress[b, 0] = _progress(r.info, 0.0)
        self.observations[b].append(obs_tokens)
        if r.fault is not None:  # no first observation: the row cannot play
            self.faults.append(r.fault)
            self.active[b] = False

    def turn(self, b: int, t: int, r: StepResult, env: Any, text: str, format_ok: bool, format_reward: float,
             hcfg: HostConfig) -> bool:
        """Record row b's turn t; returns whether the row goes on."""
        info = r.info
        act = action_index(env, text) if format_ok else INVALID
        self.action[b, t] = act
        self.reward[b, t] = r.reward + (0.0 if format_ok else format_reward)
        has_list = bool(getattr(env, "action_strings", None))
        self.invalid[b, t] = bool(info.get("invalid", has_list and act == INVALID))
        self.error[b, t] = bool(info.get("error", False)) or r.fault is not None
        self.format_error[b, t] = not format_ok
        self.oracle_action[b, t] = action_index(env, info.get("oracle_action"))
        self.turn_active[b, t] = True
        self.progress[b, t + 1] = _progress(info, self.progress[b, t])
        self.turns_used[b] += 1
        won = bool(info.get("success", False)) and r.fault is None
        if won and not self.success[b]:
            self.first_success_turn[b] = t + 1
        self.success[b] |= won
        self.terminated[b] |= r.terminated
        self.env_truncated[b] |= r.truncated
        if r.fault is not None:
            self.faults.append(r.fault)
            if hcfg.on_fault == "end":
                return False
        return not (r.terminated or r.truncated or won) and t + 1 < self.caps[b]

    def trajectory(self, out: dict, caps: np.ndarray) -> Trajectory:
        last = np.minimum(np.arange(self.Tm + 1)[None, :], self.turns_used[:, None])
        progress = np.take_along_axis(self.progress, last, axis=1)
        done = self.terminated | self.success
        truncated = ~done & ~self.overflow & ((self.turns_used >= caps) | self.env_truncated)
        j = jnp.asarray
        return Trajectory(
            **out, action=j(self.action), reward=j(self.reward), error=j(self.error), invalid=j(self.invalid),
            format_error=j(self.format_error), injected=j(np.zeros_like(self.error)),
            oracle_action=j(self.oracle_action), progress=j(progress), turn_active=j(self.turn_active),
            caps=j(self.caps), turns_used=j(self.turns_used), success=j(self.success),
            first_success_turn=j(self.first_success_turn), terminated=j(done), truncated=j(truncated),
            overflow=j(self.overflow),
        )


def _progress(info: dict, default: float) -> float:
    try:
        return float(info.get("progress", default))
    except (TypeError, ValueError):
        return default


__all__ = ["HostConfig", "HostRollout", "host_rollout", "pipeline_groups"]
