"""toolchain: a multi-hop lookup task with unreliable tool calls.

The seed draws a chain of k distinct keys and a value. `lookup <key>` on a chain key returns the key it
points to, or, for the last key, the value; `answer <value>` ends the task when the value is right.
Each lookup fails with probability p_fail and says so, so a retry recovers. Looking up a key that is
not in the chain, or a wrong answer, is an error the agent sees. The oracle looks up the next
undiscovered key, then answers: k + 1 turns when nothing fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from bmrl.envs.base import Env, Outcome

KEY_WORDS = (
    "fox", "owl", "cat", "dog", "elk", "bee", "ant", "cow", "pig", "hen", "yak", "emu",
    "red", "blue", "gold", "pink", "gray", "jade", "ruby", "teal",
    "oak", "elm", "fig", "ash", "ivy", "pine", "rose", "sage",
    "moon", "star", "sun", "rain",
)  # fmt: skip


@struct.dataclass
class ToolState:
    chain: jnp.ndarray  # int32[k]: key ids
    value: jnp.ndarray  # int32[]
    known: jnp.ndarray  # int32[]: chain keys discovered (the oracle looks up chain[known] next)
    solved: jnp.ndarray  # bool[]


class ToolChain(Env):
    """Follow `k` keys with `lookup <key>`, then `answer <value>`."""

    name = "toolchain"
    OPTIONS = {"k": 3, "num_keys": 16, "num_values": 100, "p_fail": 0.0}
    FEEDBACK = ("Lookup failed. Try again.\n", "Wrong answer.\n")

    def _validate(self):
        o = self.options
        if not (isinstance(o["num_keys"], int) and 2 <= o["num_keys"] <= len(KEY_WORDS)):
            raise ValueError(f"toolchain: num_keys must be an int in 2..{len(KEY_WORDS)}, got {o['num_keys']!r}.")
        if not (isinstance(o["k"], int) and 1 <= o["k"] <= o["num_keys"]):
            raise ValueError(f"toolchain: k (chain length) must be an int in 1..num_keys, got {o['k']!r}.")
        if not (isinstance(o["num_values"], int) and 2 <= o["num_values"] <= 1000):
            raise ValueError(f"toolchain: num_values must be an int in 2..1000, got {o['num_values']!r}.")
        if not 0.0 <= float(o["p_fail"]) < 1.0:
            raise ValueError(f"toolchain: p_fail must be in [0, 1), got {o['p_fail']!r}.")
        self.k, self.M, self.V = o["k"], o["num_keys"], o["num_values"]
        self.keys = KEY_WORDS[: self.M]

    def _num_range(self):
        return self.V

    def _action_strings(self):
        return [f"lookup {w}" for w in self.keys] + [f"answer {v}" for v in range(self.V)]

    def _action_summary(self):
        return "lookup <key>, answer <number>"

    def _instructions(self):
        return (
            f"Find the value at the end of a chain of {self.k} keys. lookup <key> returns the next key "
            "of the chain, or the value after its last key. Lookups can fail; then retry. "
            f"Finish with answer <number>. Keys: {', '.join(self.keys)}. "
            f"Values are 0 to {self.V - 1}. Reply with exactly one action."
        )

    def _groups(self):
        return {
            "startkey": ["Start key:"],
            "keyword": [f" {w}" for w in self.keys],
            "key": ["Key"],
            "rel": [" points to", " holds value", " not found"],
        }

    # ---- dynamics ---------------------------------------------------------------------------
    def _reset(self, key, task):
        k_chain, k_value = jax.random.split(jax.random.PRNGKey(task["seed"]))
        chain = jax.random.permutation(k_chain, self.M)[: self.k].astype(jnp.int32)
        value = jax.random.randint(k_value, (), 0, self.V, dtype=jnp.int32)
        return ToolState(chain=chain, value=value, known=jnp.int32(0), solved=jnp.bool_(False))

    def _lookup(self, state, key_id):
        """(found, index in the chain) of key `key_id`."""
        hit = state.chain == key_id
        return jnp.any(hit), jnp.argmax(hit).astype(jnp.int32)

    def _step(self, key, state, action):
        f = self.fragments
        is_lookup = action < self.M
        failed = is_lookup & jax.random.bernoulli(key, self.options["p_fail"])
        found, idx = self._lookup(state, action)
        answered = is_lookup & ~failed  # the tool returned something
        discovered = answered & found
        known = jnp.where(discovered, jnp.maximum(state.known, idx + 1), state.known)
        success = ~is_lookup & (action - self.M == state.value)
        wrong = ~is_lookup & ~success
        # Result line "Key fox points to owl." / "Key owl holds value 42." / "Key cat not found."
        last = idx == self.k - 1
        rel = jnp.where(found, jnp.where(last, 1, 0), 2)
        nxt = state.chain[jnp.minimum(idx + 1, self.k - 1)]
        target = jnp.where(~found, f.id("none"), jnp.where(last, self.num_id(state.value), f.id("keyword", nxt)))
        line = jnp.stack([f.id("key"), f.id("keyword", action), f.id("rel", rel), target, f.id("end")])
        head = f.id("feedback", 0)
        head = jnp.where(failed, self.feedback_id(self.FEEDBACK[0]), head)
        head = jnp.where(wrong, self.feedback_id(self.FEEDBACK[1]), head)
        feedback = jnp.concatenate([head[None], jnp.where(answered, line, f.id("none"))])
        error = failed | wrong | (answered & ~found)
        out = Outcome(success=success, error=error, feedback=feedback, terminated=success)
        return state.replace(known=known.astype(jnp.int32), solved=state.solved | success), out

    def _progress(self, state):
        return jnp.where(state.solved, 1.0, state.known / (self.k + 1))

    def oracle_action(self, state):
        nxt = state.chain[jnp.minimum(state.known, self.k - 1)]
        return jnp.where(state.known < self.k, nxt, self.M + state.value).astype(jnp.int32)

    def optimal_turns(self, task):
        return jnp.asarray(self.k + 1, jnp.int32) + 0 * jnp.asarray(task["seed"], jnp.int32)

    # ---- text -------------------------------------------------------------------------------
    def _reset_layout(self):
        return ("startkey", "keyword", "end")

    def _step_layout(self):
        return ("feedback", ("key", "none"), ("keyword", "none"), ("rel", "none"), ("keyword", "num", "none"), ("end", "none"))

    def _reset_frags(self, state):
        f = self.fragments
        return jnp.stack([f.id("startkey"), f.id("keyword", state.chain[0]), f.id("end")])

    def _step_frags(self, state, feedback):
        return feedback
