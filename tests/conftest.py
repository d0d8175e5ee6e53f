"""Shared fixtures: one tiny tokenizer trained on every environment's text, built once per session."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE trained on the environments' own text (no network, ~1 s)."""
    from bmrl.envs import corpus
    from bmrl.model.tokenizer import train_tiny_tokenizer

    return train_tiny_tokenizer(corpus(observations=False), vocab_size=384)
