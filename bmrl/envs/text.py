"""Token tables: observation text and action strings tokenized once, on the host.

Inside jit nothing is detokenized. An observation is a sequence of *fragment ids*; `Fragments.assemble`
concatenates the fragments' tokens into a fixed-length buffer plus a length. Actions are parsed by an
exact token match against the tokenized action strings (`ActionTable.parse`).

Concatenating fragment tokens equals tokenizing the full text only if every fragment boundary is a
pre-tokenizer boundary. Fragments therefore start with a space plus a word or number (" left", " 12"),
with a word at the start of a line ("Position"), or are punctuation that ends a line (".\\n"); a
fragment never ends in a space, and two punctuation fragments are never adjacent. This holds for the
GPT-2, Llama-3 and Qwen2 pre-tokenizer regexes; `check_roundtrip` verifies it for a given tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

INVALID = -1


class Observation(NamedTuple):
    """Observation tokens `[max_obs_len]` int32, padded with the tokenizer's pad id, and their count."""

    tokens: jnp.ndarray
    length: jnp.ndarray


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` without special tokens."""
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def pad_id(tokenizer) -> int:
    """The tokenizer's pad id (its EOS id if it has no pad token, as many chat models)."""
    pid = tokenizer.pad_token_id
    if pid is None:
        pid = tokenizer.eos_token_id
    if pid is None:
        raise ValueError("The tokenizer has neither a pad nor an eos token; set tokenizer.pad_token first.")
    return int(pid)


def _table(token_lists: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(1, max((len(t) for t in token_lists), default=1))
    table = np.full((len(token_lists), width), pad, dtype=np.int32)
    for i, t in enumerate(token_lists):
        table[i, : len(t)] = t
    lengths = np.array([len(t) for t in token_lists], dtype=np.int32)
    return table, lengths


class Fragments:
    """Named groups of text fragments tokenized into one padded table `tokens: [num_fragments, width]`.

    `groups` maps a group name to its alternatives, e.g. {"num": [" 0", " 1", ...]}; `id(group, i)` is the
    global fragment id of alternative i (traced `i` allowed). `max_len(layout)` bounds the token count of
    an observation whose k-th fragment comes from group `layout[k]`.
    """

    def __init__(self, tokenizer, groups: Mapping[str, Sequence[str]]):
        self.pad = pad_id(tokenizer)
        self.texts: list[str] = []
        self.start: dict[str, int] = {}
        self.size: dict[str, int] = {}
        token_lists: list[list[int]] = []
        for name, alternatives in groups.items():
            self.start[name] = len(self.texts)
            self.size[name] = len(alternatives)
            for text in alternatives:
                self.texts.append(text)
                token_lists.append(encode(tokenizer, text))
        self.tokens, self.lengths = _table(token_lists, self.pad)
        self.group_max = {
            name: int(self.lengths[self.start[name] : self.start[name] + self.size[name]].max())
            for name in groups
        }

    def id(self, group: str, index=0):
        """Global fragment id of alternative `index` of `group`, clipped into the group."""
        if group not in self.start:
            raise KeyError(f"Unknown fragment group {group!r}; groups are {sorted(self.start)}.")
        clipped = jnp.clip(jnp.asarray(index, jnp.int32), 0, self.size[group] - 1)
        return self.start[group] + clipped

    def max_len(self, layout: Sequence[str | tuple[str, ...]]) -> int:
        """Most tokens an observation whose k-th fragment comes from `layout[k]` can have.

        An entry is a group name or a tuple of group names (the slot may hold any of them).
        """
        return sum(
            max(self.group_max[g] for g in ((e,) if isinstance(e, str) else e)) for e in layout
        )

    def assemble(self, ids: jnp.ndarray, max_len: int) -> Observation:
        """Concatenate fragments `ids: [n]` into `Observation(tokens [max_len], length)`.

        Tokens past `max_len` are dropped; `max_len` comes from `max_len(layout)` so that never happens.
        """
        table = jnp.asarray(self.tokens)
        lens = jnp.asarray(self.lengths)[ids]  # [n]
        ends = jnp.cumsum(lens)
        starts = ends - lens
        pos = jnp.arange(max_len, dtype=jnp.int32)
        k = jnp.sum(pos[:, None] >= ends[None, :], axis=1)  # fragment holding each position
        k = jnp.minimum(k, ids.shape[0] - 1)
        col = jnp.clip(pos - starts[k], 0, table.shape[1] - 1)
        tok = table[ids[k], col]
        length = jnp.minimum(ends[-1], max_len).astype(jnp.int32)
        return Observation(jnp.where(pos < length, tok, self.pad).astype(jnp.int32), length)

    def text(self, ids: Sequence[int]) -> str:
        """The plain text of fragment ids (host side, for documentation and tests)."""
        return "".join(self.texts[int(i)] for i in ids)


class ActionTable:
    """Action strings tokenized into `tokens: [num_actions, max_action_len]` for exact-match parsing."""

    def __init__(self, tokenizer, action_strings: Sequence[str]):
        self.strings = tuple(action_strings)
        token_lists = [encode(tokenizer, s) for s in self.strings]
        for s, t in zip(self.strings, token_lists):
            if not t:
                raise ValueError(f"Action string {s!r} tokenizes to nothing.")
        seen: dict[tuple[int, ...], str] = {}
        for s, t in zip(self.strings, token_lists):
            if tuple(t) in seen:
                raise ValueError(f"Action strings {seen[tuple(t)]!r} and {s!r} have the same tokens.")
            seen[tuple(t)] = s
        self.tokens, self.lengths = _table(token_lists, pad_id(tokenizer))
        self.max_len = int(self.tokens.shape[1])

    def parse(self, tokens: jnp.ndarray, length: jnp.ndarray) -> jnp.ndarray:
        """Action id whose tokens equal `tokens[:length]` exactly, else INVALID. Any input is safe."""
        tokens = jnp.asarray(tokens, jnp.int32)
        length = jnp.asarray(length, jnp.int32)
        width = self.max_len
        if tokens.shape[-1] < width:
            tokens = jnp.pad(tokens, (0, width - tokens.shape[-1]), constant_values=-1)
        fits = length <= width  # longer replies can never match
        head = tokens[:width]
        pos = jnp.arange(width)
        table = jnp.asarray(self.tokens)
        lens = jnp.asarray(self.lengths)
        same = (head[None, :] == table) | (pos[None, :] >= lens[:, None])  # [A, width]
        match = jnp.all(same, axis=1) & (lens == length) & fits
        return jnp.where(jnp.any(match), jnp.argmax(match), INVALID).astype(jnp.int32)


def check_roundtrip(tokenizer, fragments: Fragments, ids: Sequence[int]) -> bool:
    """True if the concatenated fragment tokens equal tokenizing their joined text (host side)."""
    concat = [t for i in ids for t in fragments.tokens[int(i), : fragments.lengths[int(i)]].tolist()]
    return concat == encode(tokenizer, fragments.text(ids))


def number_strings(n: int) -> list[str]:
    """Number fragments " 0", " 1", ..., " n-1" (a leading space keeps each a pre-token of its own)."""
    return [f" {i}" for i in range(n)]
