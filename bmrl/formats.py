"""Conversation formats in tokens: how prompt, observations and replies are wrapped, and how a reply
is read back into an action.

A `Format` is a handful of token fragments, tokenized once on the host, that the compiled rollout
concatenates around each observation and reply:

    prefix  obs_open OBS_0 obs_close  REPLY_0 STOP  reply_close obs_open OBS_1 obs_close  REPLY_1 STOP ...

`prefix` holds the conversation start (system prompt with the task instructions and the reply
format); `obs_close` ends the observation and opens the agent's reply; `reply_close` is what follows
the stop token before the next observation. The plain format for template-less tiny models uses the
end-of-turn special token as the only separator, so fragment boundaries never change how text
tokenizes; chat formats derived from a tokenizer's chat template live in `bmrl.chat`.

Reply formats (how the action sits in a reply), parsed inside jit by `Format.extract_answer`:
- `action`: the whole reply is the action string.
- `think_answer`: free reasoning, then the action inside answer tags, RAGEN style:
  `<think>reasoning</think>\\n<answer>left</answer>`. The answer tags are found as token sequences
  (tokenized once on the host). A reply needs exactly one answer-open and one answer-close tag, in
  that order, a non-empty answer between them, and nothing after the close tag; anything else is a
  format error (the action is INVALID). Reasoning before the answer is not checked.

Tag detection is exact on tokens, so it relies on the tags tokenizing the same inside a reply as on
their own. Special tag tokens (`add_tag_tokens`) make that hold in any context; for tags that are
plain BPE text, `check_answer_layout` verifies that the canonical layout above tokenizes
compositionally for every action (docs/chat_formats.md explains when it does not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.model.tokenizer import END_OF_TURN

REPLY_FORMATS = ("action", "think_answer")
HISTORIES = ("whole", "template")  # format.history: earlier replies as sampled, or as the chat template renders them
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
ANSWER_SEP = "\n"  # between </think> and <answer>: keeps the tags apart for BPE pre-tokenizers
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_EMPTY = np.zeros((0,), np.int32)


def _empty() -> np.ndarray:
    return np.zeros((0,), np.int32)


def reply_instructions(reply_format: str) -> str:
    """The system-prompt sentence that tells the model how to lay out its reply."""
    _check_reply_format(reply_format)
    if reply_format == "action":
        return "Reply with exactly one action and nothing else."
    return (
        f"First think step by step inside {THINK_OPEN} {THINK_CLOSE}, then give exactly one action "
        f"inside {ANSWER_OPEN} {ANSWER_CLOSE}, and nothing after it: "
        f"{THINK_OPEN}your reasoning{THINK_CLOSE}{ANSWER_SEP}{ANSWER_OPEN}action{ANSWER_CLOSE}"
    )


def _check_reply_format(reply_format: str) -> None:
    if reply_format not in REPLY_FORMATS:
        raise ValueError(f"Unknown reply format {reply_format!r}; valid: {', '.join(REPLY_FORMATS)}.")


@dataclasses.dataclass(frozen=True, eq=False)
class Format:
    """Token fragments of a conversation format (int32 numpy arrays) and its stop tokens.

    `answer_open`/`answer_close` are the answer tag token sequences (`think_answer` only);
    `think_open`/`think_close`/`answer_sep` only serve `reply_tokens` (canonical replies for demos,
    scripted policies and benchmarks). `system` is the system prompt text and `notes` lists what
    the host found about the chat template (see `bmrl.chat.chat_format`).

    `history_cut` (empty: replies stay whole) is the chat template's rewrite of earlier replies that the
    rollout follows (`format.history: template`; Qwen3's template drops their reasoning): once the next
    observation follows, a reply keeps only what follows the last `history_cut` sequence in it, minus the
    leading tokens in `history_strip` (`kept_from`).
    """

    prefix: np.ndarray
    obs_open: np.ndarray
    obs_close: np.ndarray
    reply_close: np.ndarray
    stop_ids: tuple[int, ...]
    pad_id: int
    reply_format: str = "action"
    answer_open: np.ndarray = dataclasses.field(default_factory=_empty)
    answer_close: np.ndarray = dataclasses.field(default_factory=_empty)
    think_open: np.ndarray = dataclasses.field(default_factory=_empty)
    think_close: np.ndarray = dataclasses.field(default_factory=_empty)
    answer_sep: np.ndarray = dataclasses.field(default_factory=_empty)
    system: str = ""
    notes: tuple[str, ...] = ()
    history_cut: np.ndarray = dataclasses.field(default_factory=_empty)
    history_strip: tuple[int, ...] = ()

    @property
    def rewrites_history(self) -> bool:
        """Earlier replies are rewritten in the context (`history_cut`): each turn then sees a context of its own."""
        return len(self.history_cut) > 0

    def __post_init__(self) -> None:
        if not self.stop_ids:
            raise ValueError("A Format needs at least one stop token id.")
        _check_reply_format(self.reply_format)
        if self.reply_format == "think_answer":
            _check_tags(self.answer_open, self.answer_close, self.stop_ids)

    def extract_answer(self, reply: jax.Array, length: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The action part of one reply, inside jit.

        reply: int32[R] (the reply without its stop token, padded), length: int32[] ->
        (answer tokens int32[R] left-aligned, answer length int32[], format_ok bool[]). With the
        `action` reply format the whole reply is the answer and the format is always right; with
        `think_answer` the answer is the span between the only answer tags (module docstring).
        """
        if self.reply_format == "action":
            return reply, length, jnp.bool_(True)
        return _extract_tagged(reply, length, self.answer_open, self.answer_close, self.pad_id)

    def kept_from(self, reply: jax.Array, length: jax.Array) -> jax.Array:
        """Where the part of one reply that stays in the history starts, inside jit: after the last `history_cut`
        sequence in its first `length` tokens and the `history_strip` tokens that follow it; 0 (kept whole)
        without one. reply: int32[R] (stop token excluded, padded), length: int32[] -> int32[]."""
        if not self.rewrites_history:
            return jnp.int32(0)
        R, k = reply.shape[0], len(self.history_cut)
        at = _matches(reply, jnp.clip(length, 0, R), self.history_cut)  # [R]
        last = jnp.max(jnp.where(at, jnp.arange(R), -1))
        after = jnp.where(last >= 0, last + k, 0)
        idx = jnp.arange(R)
        strip = jnp.isin(reply, jnp.asarray(self.history_strip, jnp.int32)) if self.history_strip else idx < 0
        # the first token at or past `after` that is not stripped (or the reply's end)
        stop = (idx >= after) & (~strip | (idx >= length))
        return jnp.where(last >= 0, jnp.min(jnp.where(stop, idx, length)), 0).astype(jnp.int32)

    def reply_tokens(self, action: Sequence[int], reasoning: Sequence[int] = ()) -> np.ndarray:
        """Host side: the canonical reply (stop token excluded) that carries `action` tokens.

        `action`: the action string's tokens; `reasoning`: tokens of the think text (think_answer).
        """
        action = np.asarray(action, np.int32)
        if self.reply_format == "action":
            return action
        parts = [self.think_open, np.asarray(reasoning, np.int32), self.think_close, self.answer_sep,
                 self.answer_open, action, self.answer_close]
        return np.concatenate(parts).astype(np.int32)

    def min_reply_tokens(self, max_action_len: int) -> int:
        """Fewest reply tokens (stop included) that can hold the longest action in this format."""
        return max_action_len + 1 + len(self.answer_open) + len(self.answer_close)

    def first_chunk_len(self, max_obs_len: int) -> int:
        """Longest prompt before the first reply: prefix + wrapped first observation."""
        return len(self.prefix) + len(self.obs_open) + max_obs_len + len(self.obs_close)

    def turn_chunk_len(self, max_obs_len: int) -> int:
        """Longest chunk between two replies: stop token + reply_close + wrapped observation."""
        return 1 + len(self.reply_close) + len(self.obs_open) + max_obs_len + len(self.obs_close)

    def tokens_needed(self, turns: int, max_obs_len: int, max_reply_tokens: int) -> int:
        """Worst-case buffer length of a `turns`-turn conversation (the last stop token included)."""
        return (
            self.first_chunk_len(max_obs_len)
            + turns * max_reply_tokens
            + (turns - 1) * (self.turn_chunk_len(max_obs_len) - 1)
        )


# ---- think_answer parsing (inside jit) --------------------------------------------------------


def _matches(reply: jax.Array, length: jax.Array, pattern: np.ndarray) -> jax.Array:
    """bool[R]: True at i if pattern occurs at reply[i : i + k] entirely before `length`."""
    R, k = reply.shape[0], len(pattern)
    if k > R:
        return jnp.zeros((R,), bool)
    idx = jnp.arange(R)
    window = reply[jnp.clip(idx[:, None] + jnp.arange(k)[None, :], 0, R - 1)]  # [R, k]
    return jnp.all(window == jnp.asarray(pattern)[None, :], axis=1) & (idx + k <= length)


def _extract_tagged(reply, length, open_ids: np.ndarray, close_ids: np.ndarray, pad: int):
    """(answer int32[R], answer_len int32[], ok bool[]) for `... OPEN answer CLOSE` at the reply end."""
    R = reply.shape[0]
    length = jnp.clip(jnp.asarray(length, jnp.int32), 0, R)
    at_open = _matches(reply, length, open_ids)
    at_close = _matches(reply, length, close_ids)
    start = jnp.argmax(at_open).astype(jnp.int32) + len(open_ids)
    close = jnp.argmax(at_close).astype(jnp.int32)
    ok = (
        (at_open.sum() == 1)
        & (at_close.sum() == 1)
        & (close > start)  # non-empty, and the close tag after the open tag (no overlap)
        & (close + len(close_ids) == length)  # nothing after </answer>
    )
    n = jnp.where(ok, close - start, 0).astype(jnp.int32)
    j = jnp.arange(R)
    answer = jnp.where(j < n, reply[jnp.clip(start + j, 0, R - 1)], pad).astype(jnp.int32)
    return answer, n, ok


def _contains(seq: np.ndarray, sub: np.ndarray) -> bool:
    k = len(sub)
    return any(np.array_equal(seq[i : i + k], sub) for i in range(len(seq) - k + 1))


def _check_tags(open_ids: np.ndarray, close_ids: np.ndarray, stop_ids: Sequence[int]) -> None:
    if len(open_ids) == 0 or len(close_ids) == 0:
        raise ValueError("The think_answer format needs non-empty answer_open and answer_close tag tokens.")
    if _contains(close_ids, open_ids) or _contains(open_ids, close_ids):
        raise ValueError(
            f"Answer tag tokens overlap ({list(open_ids)} vs {list(close_ids)}): one tag's tokens contain "
            "the other's, so tags cannot be told apart. Add the tags as special tokens (add_tag_tokens)."
        )
    if set(stop_ids) & (set(open_ids.tolist()) | set(close_ids.tolist())):
        raise ValueError("An answer tag contains a stop token; the reply would end inside the tag.")


# ---- host-side construction --------------------------------------------------------------------


def encode(tokenizer, text: str) -> np.ndarray:
    """Token ids of `text`, no special tokens added (int32)."""
    return np.asarray(tokenizer.encode(text, add_special_tokens=False) if text else [], np.int32)


def add_tag_tokens(tokenizer) -> int:
    """Make the think/answer tags special tokens of `tokenizer` (in place; returns how many were new).

    Special tags are split off before BPE, so they tokenize the same in every context. For a
    from-scratch model only (the embedding grows by the new ids: build the model after this).
    """
    return tokenizer.add_special_tokens({"additional_special_tokens": list(TAGS)},
                                        replace_extra_special_tokens=False)


def tag_fields(tokenizer, reply_format: str) -> dict:
    """The tag token fields of a Format for `reply_format` (empty for `action`)."""
    _check_reply_format(reply_format)
    if reply_format == "action":
        return {}
    return dict(
        answer_open=encode(tokenizer, ANSWER_OPEN), answer_close=encode(tokenizer, ANSWER_CLOSE),
        think_open=encode(tokenizer, THINK_OPEN), think_close=encode(tokenizer, THINK_CLOSE),
        answer_sep=encode(tokenizer, ANSWER_SEP),
    )


def check_answer_layout(tokenizer, fmt: Format, action_strings: Sequence[str], reasoning: str = "I act.") -> list[str]:
    """Host check: does the canonical think_answer reply tokenize as its parts, for every action?

    Returns the actions whose reply `<think>reasoning</think>\\n<answer>ACTION</answer>` tokenizes
    differently from the concatenation of its parts' tokens (BPE merged a tag with its neighbours);
    the rollout could then not find the tags in the reply a model trained on that text produces.
    """
    if fmt.reply_format != "think_answer":
        return []
    bad = []
    for a in action_strings:
        text = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{ANSWER_SEP}{ANSWER_OPEN}{a}{ANSWER_CLOSE}"
        parts = fmt.reply_tokens(encode(tokenizer, a), encode(tokenizer, reasoning))
        if not np.array_equal(encode(tokenizer, text), parts):
            bad.append(a)
    return bad


def pad_token_id(tokenizer) -> int:
    """The pad id of `tokenizer` (its EOS id if it has no pad token, else 0)."""
    for pid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if pid is not None:
            return int(pid)
    return 0


def plain_format(tokenizer, instructions: str, reply_format: str = "action") -> Format:
    """The built-in format for models without a chat template.

    `instructions` newline, then observation and reply alternate, each ended by `<|end|>`. With
    `think_answer` the reply-format sentence follows the instructions on the first line.
    """
    _check_reply_format(reply_format)
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end is None or end == tokenizer.unk_token_id:
        raise ValueError(
            f"The plain format needs the {END_OF_TURN!r} special token in the tokenizer; "
            "train one with bmrl.model.tokenizer.train_tiny_tokenizer or use a chat format."
        )
    system = instructions if reply_format == "action" else f"{instructions} {reply_instructions(reply_format)}"
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return Format(
        prefix=np.concatenate([np.asarray(bos, np.int32), encode(tokenizer, system + "\n")]),
        obs_open=_EMPTY,
        obs_close=np.asarray([end], np.int32),
        reply_close=_EMPTY,
        stop_ids=(int(end),),
        pad_id=pad_token_id(tokenizer),
        reply_format=reply_format,
        system=system,
        **tag_fields(tokenizer, reply_format),
    )
