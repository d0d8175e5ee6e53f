"""Conversation formats in tokens: how prompt, observations and replies are wrapped.

A `Format` is a handful of token fragments, tokenized once on the host, that the compiled rollout
concatenates around each observation and reply:

    prefix  obs_open OBS_0 obs_close  REPLY_0 STOP  reply_close obs_open OBS_1 obs_close  REPLY_1 STOP ...

`prefix` holds the conversation start (system prompt with the task instructions); `obs_close` ends
the observation and opens the agent's reply; `reply_close` is what follows the stop token before the
next observation. The plain format for template-less tiny models uses the end-of-turn special token
as the only separator, so fragment boundaries never change how text tokenizes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bmrl.model.tokenizer import END_OF_TURN

REPLY_FORMATS = ("action",)


@dataclasses.dataclass(frozen=True, eq=False)
class Format:
    """Token fragments of a conversation format (int32 numpy arrays) and its stop tokens."""

    prefix: np.ndarray
    obs_open: np.ndarray
    obs_close: np.ndarray
    reply_close: np.ndarray
    stop_ids: tuple[int, ...]
    pad_id: int
    reply_format: str = "action"

    def __post_init__(self) -> None:
        if not self.stop_ids:
            raise ValueError("A Format needs at least one stop token id.")
        if self.reply_format not in REPLY_FORMATS:
            raise ValueError(
                f"Unknown reply format {self.reply_format!r}; valid: {', '.join(REPLY_FORMATS)}."
            )

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


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32)


def plain_format(tokenizer, instructions: str) -> Format:
    """The built-in format for models without a chat template.

    `instructions` newline, then observation and reply alternate, each ended by `<|end|>`.
    """
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end is None or end == tokenizer.unk_token_id:
        raise ValueError(
            f"The plain format needs the {END_OF_TURN!r} special token in the tokenizer; "
            "train one with bmrl.model.tokenizer.train_tiny_tokenizer or use a chat format."
        )
    empty = np.zeros((0,), np.int32)
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return Format(
        prefix=np.concatenate([np.asarray(bos, np.int32), _encode(tokenizer, instructions + "\n")]),
        obs_open=empty,
        obs_close=np.asarray([end], np.int32),
        reply_close=empty,
        stop_ids=(int(end),),
        pad_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
    )
