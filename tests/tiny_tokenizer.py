"""The one tiny tokenizer of the test suite: a byte-level BPE trained on the environments' text.

Trained once per process (no network, ~1 s). Tests that need a tokenizer of another kind (a chat
template, special merges, a model directory's own texts) build it next to the behaviour they test.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def shared_tokenizer():
    from bmrl.envs import corpus
    from bmrl.model.tokenizer import train_tiny_tokenizer

    # The envs it was first trained on, in that order: a new env's texts still encode (byte-level), and
    # the tokens every other test was written against stay the same.
    return train_tiny_tokenizer(corpus(list(TRAINED_ON), observations=False), vocab_size=384)


TRAINED_ON = ("corridor", "frozenlake", "sokoban", "toolchain")
