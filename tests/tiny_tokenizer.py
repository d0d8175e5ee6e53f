"""The one tiny tokenizer of the test suite: a byte-level BPE trained on every environment's text.

Trained once per process (no network, ~1 s). Tests that need a tokenizer of another kind (a chat
template, special merges, a model directory's own texts) build it next to the behaviour they test.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def shared_tokenizer():
    from bmrl.envs import corpus
    from bmrl.model.tokenizer import train_tiny_tokenizer

    return train_tiny_tokenizer(corpus(observations=False), vocab_size=384)
