"""What a rollout takes and returns: its static shapes, the Trajectory, error injection, caps and keys."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bmrl.model.attention import BLOCK_SIZE
from bmrl.sampling import SamplingConfig

# Key derivation of one row (shared by every policy and the environment, so that a model rollout,
# a scripted run, a demonstration and a replay of the same row see the same environment randomness):
ENV_STREAM, TOKEN_STREAM, SCRIPT_STREAM = 0, 1, 2  # fold_in(row_key, stream)
INJECT_STREAM = 0x5EED  # fold_in(step_key, INJECT_STREAM): the injection coin and the wrong action


class RolloutError(ValueError):
    """A rollout configuration or input that cannot work (buffer too small, cap out of range...)."""


@struct.dataclass
class Trajectory:
    """A batch of multi-turn episodes. B = batch, L = context buffer, Tm = max turns.

    Scripted policies produce no tokens: their token arrays are [B, 0].
    """

    tokens: jax.Array  # int32[B, L]: prompt, observations, replies; pad after `length`
    length: jax.Array  # int32[B]
    loss_mask: jax.Array  # float32[B, L]: 1 on tokens the policy sampled (stop token included)
    logprobs: jax.Array  # float32[B, L]: sampling-policy log-prob of each sampled token
    turn_of_token: jax.Array  # int32[B, L]: 0-based turn of each token; -1 prompt prefix/padding
    action: jax.Array  # int32[B, Tm]: parsed action id (INVALID = -1); -1 where inactive
    reward: jax.Array  # float32[B, Tm]
    error: jax.Array  # bool[B, Tm]
    invalid: jax.Array  # bool[B, Tm]: the reply did not parse to an action
    format_error: jax.Array  # bool[B, Tm]: the reply broke the reply format (no parsable answer)
    injected: jax.Array  # bool[B, Tm]: the action was replaced by a forced wrong one (error injection)
    oracle_action: jax.Array  # int32[B, Tm]: best action in the state before the turn; -1 where inactive
    progress: jax.Array  # float32[B, Tm + 1]: index 0 after reset, t + 1 after turn t (carried when inactive)
    turn_active: jax.Array  # bool[B, Tm]: the sequence acted at turn t
    caps: jax.Array  # int32[B]
    turns_used: jax.Array  # int32[B]
    success: jax.Array  # bool[B]
    first_success_turn: jax.Array  # int32[B]: 1-based; 0 = never
    terminated: jax.Array  # bool[B]: the environment ended the episode (success included)
    truncated: jax.Array  # bool[B]: stopped by its turn cap
    overflow: jax.Array  # bool[B]: stopped because the next turn would not fit the buffer
    observations: Any = None  # optional (tokens int32[B, Tm, O], lengths int32[B, Tm]): the observation before turn t
    turn_samples: Any = None  # TurnSamples when each turn saw a context of its own (`per_turn_contexts`); None otherwise

    @property
    def outcome_reward(self) -> jax.Array:
        """float32[B]: the summed per-turn reward of each sequence."""
        return self.reward.sum(axis=-1)


@struct.dataclass
class TurnSamples:
    """What the learner trains on when the history is windowed: each played turn as its own sequence, the
    context the policy saw (prompt + the last H turns) and its reply. B = batch, Tm = max turns, L = buffer.
    Rows of inactive turns are empty (length 0, loss mask 0)."""

    tokens: jax.Array  # int32[B, Tm, L]
    length: jax.Array  # int32[B, Tm]
    loss_mask: jax.Array  # float32[B, Tm, L]: 1 on the tokens sampled in that turn's reply only
    logprobs: jax.Array  # float32[B, Tm, L]: sampling-policy log-prob of each of them
    turn_of_token: jax.Array  # int32[B, Tm, L]: 0-based turn of each token; -1 prompt prefix/padding

    @classmethod
    def empty(cls, batch: int, max_turns: int, width: int) -> "TurnSamples":
        ints, floats = jnp.zeros((batch, max_turns, width), jnp.int32), jnp.zeros((batch, max_turns, width), jnp.float32)
        return cls(tokens=ints, length=jnp.zeros((batch, max_turns), jnp.int32), loss_mask=floats, logprobs=floats,
                   turn_of_token=ints - 1)

    def rows(self) -> "TurnSamples":
        """The samples as B * Tm rows (row b * Tm + t is turn t of sequence b): [N, L] and [N]."""
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), self)


def held_turns(cap: int, history_turns: int | None) -> int:
    """The most turns one context holds at once in an episode of `cap` turns: all of them, or with a
    history window of H turns the current one and the H before it."""
    return cap if history_turns is None else min(cap, history_turns + 1)


def per_turn_contexts(cfg: "RolloutConfig", fmt: Any) -> bool:
    """Does each turn see a context of its own (a history window, or a format that rewrites earlier replies,
    `Format.rewrites_history`), so that the trajectory carries each turn as its own learning sample? Otherwise
    the episode is one append-only context."""
    return cfg.history_turns is not None or fmt.rewrites_history


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Static shapes of a rollout.

    max_turns: Tm, the largest cap the compiled loop supports (the per-turn arrays' width).
    max_reply_tokens: per-turn limit of sampled tokens, the stop token included; a reply that
      reaches it without a stop token gets one appended (not sampled, not trained on).
    max_len: L, the context buffer of each sequence (KV cache and token arrays).
    attention_block: keys per step of the blocked attention over the KV cache (static; the loop over
      blocks stops at the longest live row). 64 was fastest on CPU; an accelerator may want more
      (`bench/device.py` times several); 0 reads the whole buffer in one step.
    history_turns: H, a history window: each turn's context is the prompt (prefix and first
      observation) and the last H turns' replies and observations, so max_len need only hold H + 1
      turns whatever the budget; the trajectory then carries each turn as its own learning sample
      (`Trajectory.turn_samples`). None: the whole episode is one append-only context.
    learning_samples: whether such a rollout keeps the turn samples; an evaluation, which trains on
      nothing, does not ([B, Tm, L] arrays less to carry and compact).
    """

    max_turns: int
    max_reply_tokens: int
    max_len: int
    sampling: SamplingConfig = SamplingConfig()
    format_reward: float = 0.0  # added to a turn's reward when its reply breaks the format (< 0 penalises)
    compact_min_rows: int = 16  # live-row compaction: the smallest chunk of rows a turn is played in (0 = off)
    compact_steps: int = 4  # compaction splits the batch into at most this many chunks (see `compact_chunk`)
    attention_block: int = BLOCK_SIZE  # keys per attention block over the KV cache (0 = the whole buffer)
    history_turns: int | None = None  # turns of history in each context (None = all: append-only)
    learning_samples: bool = True  # keep each turn's sample when turns see contexts of their own (evaluation: no)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_reply_tokens", "max_len"):
            if getattr(self, name) < 1:
                raise RolloutError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.compact_min_rows < 0:
            raise RolloutError(f"RolloutConfig.compact_min_rows must be >= 0 (0 = off), got {self.compact_min_rows}.")
        if self.compact_steps < 1:
            raise RolloutError(f"RolloutConfig.compact_steps must be >= 1 (2 = halving), got {self.compact_steps}.")
        if self.history_turns is not None and self.history_turns < 1:
            raise RolloutError(f"RolloutConfig.history_turns must be >= 1 (turns of history each context keeps; "
                               f"None = the whole episode), got {self.history_turns}.")
        if self.attention_block < 0:
            raise RolloutError(f"RolloutConfig.attention_block must be >= 0 (keys per block; 0 = the whole buffer), "
                               f"got {self.attention_block}.")

    def compact_chunk(self, batch: int) -> int:
        """The rows a compacting rollout of `batch` rows plays a turn in at a time (`batch` when
        compaction is off): batch / k for the largest k <= compact_steps that divides the batch into
        chunks of at least compact_min_rows rows. 64 rows, min 16, 4 steps: chunks of 16; 256: 64;
        16 rows: 16 (no split: a small batch pays per op, not per row, on a CPU). Once a chunk's worth
        of rows has finished, each turn plays only the chunks that hold a live row: one more copy of
        the turn (at `chunk` rows) in the program, whatever the live-row count, which is data."""
        m = self.compact_min_rows
        if not m:
            return batch
        k = max(k for k in range(1, self.compact_steps + 1) if batch % k == 0 and batch // k >= min(m, batch))
        return batch // k


@struct.dataclass
class Injection:
    """Controlled error injection: at turns where `turns[t]`, with probability `prob`, the action is
    replaced by a uniformly random wrong one (not the oracle's). Data, not shapes."""

    prob: jax.Array  # float32[]
    turns: jax.Array  # bool[Tm]

    @classmethod
    def none(cls, max_turns: int) -> "Injection":
        return cls.at(max_turns, (), 0.0)

    @classmethod
    def at(cls, max_turns: int, turns, prob: float) -> "Injection":
        """Inject with probability `prob` at the 0-based turns listed in `turns`."""
        mask = np.zeros((max_turns,), bool)
        mask[list(turns)] = True
        # Built on the host and transferred: eager jnp ops would each compile a one-op program.
        return cls(prob=jax.device_put(np.float32(prob)), turns=jax.device_put(mask))


def check_caps(caps: Any, cfg: RolloutConfig) -> None:
    """Validate concrete caps on the host: integers in [1, max_turns]."""
    caps = np.asarray(caps)
    if caps.ndim != 1 or not np.issubdtype(caps.dtype, np.integer):
        raise RolloutError(f"caps must be a 1-D integer array [batch], got {caps.dtype}{list(caps.shape)}.")
    if caps.size and (caps.min() < 1 or caps.max() > cfg.max_turns):
        raise RolloutError(
            f"Every turn cap must be in [1, max_turns={cfg.max_turns}]; got caps from {caps.min()} "
            f"to {caps.max()}. Raise RolloutConfig.max_turns or lower the budget."
        )


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """One PRNG key per sequence: `key` split B ways, or `key` itself if it already holds B keys.

    Passing per-row keys makes a sequence's trajectory independent of the batch it runs in.
    """
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (1 if typed else 2):
        if key.shape[0] != batch:
            raise RolloutError(f"Got {key.shape[0]} per-row keys for a batch of {batch}.")
        return key
    return jax.random.split(key, batch)


def host_keys(keys: jax.Array) -> jax.Array | np.ndarray:
    """Per-row keys for the host loop: typed keys of the default implementation as their raw uint32 data
    in host memory (raw keys, evaluation's kind, as they are). The same bits (JAX reads raw data with
    the default implementation), but the host loop's jitted steps then compile once for training's
    typed keys and evaluation's raw ones alike (twice before), and selecting rows compiles nothing."""
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return np.asarray(keys)
    if str(jax.random.key_impl(keys)) != jax.config.jax_default_prng_impl:
        return keys  # another implementation's data would be read as the default's: keep it typed
    return np.asarray(jax.random.key_data(keys))


def stream(keys: jax.Array, which: int) -> jax.Array:
    """keys [B] -> fold_in(key, which) per row."""
    return jax.vmap(lambda k: jax.random.fold_in(k, which))(keys)
