"""Fragment tables and the action parser: concatenated fragments equal tokenizing the whole text."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.envs import INVALID, corpus
from bmrl.envs.text import ActionTable, Fragments, check_roundtrip
from tests.env_helpers import MY_ENVS, env_with, tiny_tokenizer


def test_any_pair_of_adjacent_fragment_groups_tokenizes_like_the_whole_text():
    tok = tiny_tokenizer()
    for name in MY_ENVS:
        env = env_with(name, show_budget=True)
        f = env.fragments
        groups = list(f.start)
        for g1, g2 in itertools.product(groups, groups):
            for i in range(0, f.size[g1], max(1, f.size[g1] // 3)):
                for j in range(0, f.size[g2], max(1, f.size[g2] // 3)):
                    ids = [f.start[g1] + i, f.start[g2] + j]
                    if (g1, g2) in {("end", "end")} or f.texts[ids[0]].endswith(":") and f.texts[ids[1]][:1] in ".,":
                        continue  # never adjacent in an observation
                    if f.texts[ids[0]][-1:] in ".,:" and f.texts[ids[1]][:1] in ".,:\n":
                        continue  # two punctuation fragments are never adjacent (module docstring)
                    assert check_roundtrip(tok, f, ids), (name, f.texts[ids[0]], f.texts[ids[1]])


def test_assemble_concatenates_and_pads():
    tok = tiny_tokenizer()
    f = Fragments(tok, {"a": ["Position", ""], "n": [" 12", " 3"], "e": [".\n"]})
    ids = jnp.asarray([f.start["a"], f.start["n"], f.start["a"] + 1, f.start["e"]], jnp.int32)
    obs = jax.jit(lambda i: f.assemble(i, f.max_len(["a", "n", "a", "e"]) + 3))(ids)
    expect = tok.encode("Position 12.\n", add_special_tokens=False)
    assert int(obs.length) == len(expect)
    assert np.asarray(obs.tokens).tolist() == expect + [f.pad] * (obs.tokens.shape[0] - len(expect))


def test_action_table_exact_match_only():
    tok = tiny_tokenizer()
    table = ActionTable(tok, ["left", "right", "lookup fox"])
    ids = tok.encode("lookup fox", add_special_tokens=False)
    parse = jax.jit(table.parse)
    row = jnp.asarray(ids + [0] * 4, jnp.int32)
    assert int(parse(row, len(ids))) == 2
    assert int(parse(row, len(ids) - 1)) == INVALID  # a prefix is not the action
    assert int(parse(jnp.asarray(ids[:1], jnp.int32), 1)) == INVALID or ids[:1] in (
        tok.encode("left", add_special_tokens=False),
        tok.encode("right", add_special_tokens=False),
    )
    assert int(parse(row, 0)) == INVALID and int(parse(row, -3)) == INVALID and int(parse(row, 99)) == INVALID


def test_corpus_has_every_env_text_and_needs_no_tokenizer():
    texts = corpus(["corridor"], observations=True)
    assert any(t.startswith("Position 0. Exit at 8.\n") or t.startswith("Position 8. Exit at 0.\n") for t in texts)
    assert "Invalid action. Valid actions are: left, right.\n" in texts and " 42" in texts
    joined = "".join(corpus(list(MY_ENVS), observations=False))
    for word in ("lookup fox", "answer 99", "You fell into a hole", "Lookup failed", "Turns left:", " H"):
        assert word in joined
