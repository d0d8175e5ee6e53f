"""Shared fixtures: one tiny tokenizer trained on every environment's text, built once per session."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE trained on the environments' own text (`tests.tokenizers`)."""
    from tests.tokenizers import shared_tokenizer

    return shared_tokenizer()
