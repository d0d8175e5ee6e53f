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
from bmrl.rollout.records import Records, Turn, goes_on, record_turn
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
    caps = caps.astype(np.int32)
    model = _Model(policy, fmt, cfg, hcfg) if policy is not None else None
    seeds = [key_seed(k) for k in stream(keys, ENV_STREAM)]
    stepper = Stepper(min(hcfg.workers, batch), hcfg.step_timeout_s)
    faults: list[Fault] = []
    observations: list[list[list[int]]] = [[] for _ in range(batch)]
    try:
        first = stepper.run({b: (lambda b=b: envs[b].reset(seed=seeds[b], options=tasks[b])) for b in range(batch)},
                            -1, is_reset=True)
        infos = [first[b].info for b in range(batch)]
        obs_toks = [encode(tokenizer, first[b].obs) for b in range(batch)]
        rec = Records.empty(batch, Tm, np.array([_progress(first[b].info, 0.0) for b in range(batch)]), np)
        active = np.array([first[b].fault is None for b in range(batch)])  # no first observation: the row cannot play
        for b in range(batch):
            observations[b].append(obs_toks[b])
            if first[b].fault is not None:
                faults.append(first[b].fault)
        if model is not None:
            too_long = model.start(obs_toks, keys)  # cannot play: overflow, no turn
            rec, active = rec.overflowed(too_long), active & ~too_long
        for t in range(Tm):
            if script is not None:
                chosen = script.act(t, [int(b) for b in np.flatnonzero(active)], infos)
                active = active & np.array([chosen.get(b) is not None for b in range(batch)])
            if not active.any():
                break
            if model is None:
                texts, ok = {b: chosen[b] for b in np.flatnonzero(active).tolist()}, np.ones((batch,), bool)
            elif script is None:
                texts, ok = model.act(t, active, tokenizer)
            else:
                texts, ok = model.force(t, active, chosen, tokenizer)
            results = stepper.run({b: (lambda b=b, a=a: envs[b].step(a)) for b, a in texts.items()}, t)
            for b in texts:
                infos[b] = results[b].info
            played, ended = _turn(rec, t, results, envs, texts, ok, hcfg)
            faults += [results[b].fault for b in texts if results[b].fault is not None]
            rec = record_turn(rec, t, active, played, cfg.format_reward)
            nxt = goes_on(t, active, played, caps) & ~ended
            obs_toks = [[] for _ in range(batch)]
            for b in np.flatnonzero(nxt):
                obs_toks[b] = encode(tokenizer, results[b].obs)
                observations[b].append(obs_toks[b])
            if model is not None:
                stopped, nxt = model.observe(t, nxt, obs_toks)
                rec = rec.overflowed(stopped)
            active = nxt
        out = model.outputs() if model is not None else _no_tokens(batch)
    finally:
        stepper.close()
    return HostRollout(Trajectory(**out, **{k: jnp.asarray(v) for k, v in rec.fields(caps).items()}), faults,
                       observations)


def _turn(rec: Records, t: int, results: dict[int, StepResult], envs: Sequence[Any], texts: dict[int, str],
          ok: np.ndarray, hcfg: HostConfig) -> tuple[Turn, np.ndarray]:
    """What turn t gave the rows that played it (`texts`), read from their environments' step results
    and infos, and the rows a fault ends (`hcfg.on_fault == "end"`)."""
    batch = rec.action.shape[0]
    action, oracle = np.full((batch,), INVALID, np.int32), np.full((batch,), INVALID, np.int32)
    reward, progress = np.zeros((batch,), np.float64), np.zeros((batch,), np.float64)
    error, invalid, success, terminated, truncated, ended = (np.zeros((batch,), bool) for _ in range(6))
    format_ok = np.asarray(ok, bool)
    for b, text in texts.items():
        r, info, env = results[b], results[b].info, envs[b]
        action[b] = action_index(env, text) if format_ok[b] else INVALID
        reward[b] = r.reward
        has_list = bool(getattr(env, "action_strings", None))
        invalid[b] = bool(info.get("invalid", has_list and action[b] == INVALID))
        error[b] = bool(info.get("error", False)) or r.fault is not None
        oracle[b] = action_index(env, info.get("oracle_action"))
        progress[b] = _progress(info, rec.progress[b, t])
        success[b] = bool(info.get("success", False)) and r.fault is None
        terminated[b], truncated[b] = r.terminated, r.truncated
        ended[b] = r.fault is not None and hcfg.on_fault == "end"
    played = Turn(action=action, reward=reward, format_ok=format_ok, error=error, invalid=invalid,
                  injected=np.zeros((batch,), bool), oracle_action=oracle, progress=progress, success=success,
                  terminated=terminated, truncated=truncated)
    return played, ended


class _Model:
    """A model's side of the host loop: the jitted programs, its state and the static widths."""

    def __init__(self, policy: nnx.Module, fmt: Format, cfg: RolloutConfig, hcfg: HostConfig):
        graphdef, self.params = nnx.split(policy)
        self.prog = _programs(ModelPolicy(graphdef, fmt, cfg))
        self.fmt, self.cfg = fmt, cfg
        self.widths = _widths(hcfg, cfg, fmt.turn_chunk_len(0))
        self.first_widths = _widths(hcfg, cfg, fmt.first_chunk_len(0))
        self.state = None

    def start(self, obs_toks: list[list[int]], keys: jax.Array) -> np.ndarray:
        """Prefill the prompts and first observations; returns the rows whose first observation is too long."""
        too_long = np.array([len(x) > self.first_widths[-1] for x in obs_toks])
        tok, lens = _pad_obs(obs_toks, self.first_widths, self.fmt.pad_id)
        self.state = self.prog["start"](self.params, jnp.asarray(tok), jnp.asarray(lens), keys)
        return too_long

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

    def observe(self, t: int, nxt: np.ndarray, obs_toks: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Prefill the next observations of the rows going on; returns (the rows stopped by the buffer, the
        rows that still fit)."""
        too_long = np.array([len(x) > self.widths[-1] for x in obs_toks])
        stopped = nxt & too_long
        nxt = nxt & ~too_long
        tok, lens = _pad_obs(obs_toks, self.widths, self.fmt.pad_id)
        self.state, fits = self.prog["observe"](self.params, self.state, jnp.asarray(tok), jnp.asarray(lens),
                                                jnp.int32(t), jnp.asarray(nxt))
        fits = np.asarray(fits)
        return stopped | (nxt & ~fits), nxt & fits

    def outputs(self) -> dict:
        return self.prog["outputs"](self.params, self.state)


def _no_tokens(batch: int) -> dict[str, jax.Array]:
    """The token fields of a trajectory played without a model: empty."""
    return dict(tokens=jnp.zeros((batch, 0), jnp.int32), length=jnp.zeros((batch,), jnp.int32),
                loss_mask=jnp.zeros((batch, 0), jnp.float32), logprobs=jnp.zeros((batch, 0), jnp.float32),
                turn_of_token=jnp.zeros((batch, 0), jnp.int32))


def _progress(info: dict, default: float) -> float:
    try:
        return float(info.get("progress", default))
    except (TypeError, ValueError):
        return default


__all__ = ["HostConfig", "HostRollout", "host_rollout", "pipeline_groups"]
