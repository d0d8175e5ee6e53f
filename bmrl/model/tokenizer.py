"""Tiny byte-level BPE tokenizers for models trained from scratch.

A tiny model and a real Hugging Face model go through the same code: both are driven by a
`transformers.PreTrainedTokenizerFast` loaded from a local directory. This module trains the tiny
one with `tokenizers` on the environments' own text and saves it as such a directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, END_OF_TURN)


def train_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`; ids 0..3 are PAD, BOS, EOS and END_OF_TURN.

    Deterministic: the same texts in the same order give the same vocabulary.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("train_tiny_tokenizer needs at least one text to learn merges from.")
    min_vocab = len(SPECIAL_TOKENS) + 256
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs the 256 byte symbols "
            f"plus {len(SPECIAL_TOKENS)} special tokens, so at least {min_vocab}."
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[END_OF_TURN],
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | os.PathLike) -> None:
    """Write `tokenizer` as a Hugging Face tokenizer directory (tokenizer.json and configs)."""
    os.makedirs(path, exist_ok=True)
    tokenizer.save_pretrained(str(path))


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a tokenizer from a local directory; never touches the network, never runs remote code."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Tokenizer directory {str(path)!r} does not exist.")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
