"""think_answer replies parsed in tokens inside jit: valid answers, every kind of format error, fuzzing.

Two tokenizers: one with the think/answer tags as special tokens (robust in any context) and the plain
tiny BPE where the tags are ordinary text (canonical tokenization; the named merge case is tested).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmrl.chat import ChatFormatError, make_format
from bmrl.envs import INVALID, make
from bmrl.formats import Format, add_tag_tokens, check_answer_layout, encode, plain_format
from bmrl.model.tokenizer import train_tiny_tokenizer
from bmrl.rollout import parse_replies
from tests.chat_helpers import chat_tokenizer

R = 24


def _setup(tags: bool):
    tok = chat_tokenizer(None, tags=tags)
    env = make("corridor", tok, length=3)
    fmt = plain_format(tok, env.instructions, "think_answer")
    return tok, env, fmt


SETUPS = {tags: _setup(tags) for tags in (True, False)}
_PARSERS = {}


def _parse(fmt, replies):
    """Run the jitted, vmapped extract_answer on a list of token lists (one compile per format)."""
    if id(fmt) not in _PARSERS:
        _PARSERS[id(fmt)] = jax.jit(jax.vmap(fmt.extract_answer))
    batch = max(16, len(replies))  # a fixed batch: one compile
    arr = np.full((batch, R), fmt.pad_id, np.int32)
    lens = np.zeros(batch, np.int32)
    for i, r in enumerate(replies):
        arr[i, : min(len(r), R)] = r[:R]
        lens[i] = min(len(r), R)
    ans, n, ok = (np.asarray(x)[: len(replies)] for x in _PARSERS[id(fmt)](jnp.asarray(arr), jnp.asarray(lens)))
    return [a[:k].tolist() for a, k in zip(ans, n)], n, ok


def _enc(tok, text):
    return encode(tok, text).tolist()


@pytest.mark.parametrize("tags", [True, False], ids=["special_tags", "bpe_tags"])
def test_valid_and_broken_replies(tags):
    tok, env, fmt = SETUPS[tags]
    left, right = _enc(tok, "left"), _enc(tok, "right")
    A, C = fmt.answer_open.tolist(), fmt.answer_close.tolist()
    cases = {  # reply -> expected answer tokens (None = format error)
        "think+answer": (fmt.reply_tokens(left, _enc(tok, "I go.")).tolist(), left),
        "answer only": (A + right + C, right),
        "text form": (_enc(tok, "<think>The exit is right.</think>\n<answer>right</answer>"), right),
        "no tags": (left, None),
        "missing open": (_enc(tok, "<think>x</think>\n") + right + C, None),
        "unterminated": (_enc(tok, "<think>x</think>\n") + A + right, None),
        "empty": (A + C, None),
        "repeated": (A + left + C + A + right + C, None),
        "two opens": (A + A + left + C, None),
        "close first": (C + left + A, None),
        "text after": (A + left + C + _enc(tok, " ok"), None),
        "empty reply": ([], None),
    }
    answers, n, ok = _parse(fmt, [r for r, _ in cases.values()])
    for (name, (_, want)), got, good in zip(cases.items(), answers, ok):
        assert bool(good) == (want is not None), name
        if want is not None:
            assert got == want, name
    # parse_replies: a well-formed reply with a non-action answer is INVALID but not a format error.
    replies = [fmt.reply_tokens(left), A + _enc(tok, "jump") + C, A + C, fmt.reply_tokens(right)]
    arr = np.full((4, R), fmt.pad_id, np.int32)
    for i, r in enumerate(replies):
        arr[i, : len(r)] = r
    act, fok = parse_replies(env, fmt, jnp.asarray(arr), jnp.asarray([len(r) for r in replies]))
    assert np.asarray(act).tolist() == [0, INVALID, INVALID, 1]
    assert np.asarray(fok).tolist() == [True, True, False, True]


@pytest.fixture(scope="module")
def merging():
    """A BPE that learned the merges "><" and ">!" (as GPT-2's vocabulary has), tags as plain text."""
    from tests.chat_helpers import _texts

    tok = train_tiny_tokenizer(list(_texts()) + ["</think><answer>left</answer>", "<answer>!go</answer>"] * 50,
                               vocab_size=400)
    return tok, plain_format(tok, "x", "think_answer")


def test_bpe_tags_merged_with_neighbours_are_a_format_error(merging):
    """Named case: with the tags as plain BPE text, "</think><answer>" tokenizes with "><" merged, so the
    answer-open tag's tokens are not in the reply: a format error. The canonical layout puts a newline
    between the tags (the prompt shows it) and parses; special tag tokens make both forms parse."""
    tok, fmt = merging
    merged, canonical = "<think>x</think><answer>left</answer>", "<think>x</think>\n<answer>left</answer>"
    assert "><" in tok.convert_ids_to_tokens(_enc(tok, merged))
    _, _, ok = _parse(fmt, [_enc(tok, merged), _enc(tok, canonical)])
    assert ok.tolist() == [False, True]
    special_tok, _, special_fmt = SETUPS[True]
    assert _parse(special_fmt, [_enc(special_tok, merged)])[2][0]


def test_answer_layout_check(merging):
    tok, fmt = merging
    assert check_answer_layout(tok, fmt, ["left", "right"]) == []
    assert check_answer_layout(tok, fmt, ["left", "!go"]) == ["!go"]  # ">!" is one token after the tag
    with pytest.raises(ChatFormatError, match="merge"):
        make_format(tok, "x", "think_answer", action_strings=("left", "!go"))
    special_tok, _, special_fmt = SETUPS[True]
    assert check_answer_layout(special_tok, special_fmt, ["!go"]) == []  # special tags: robust


def test_add_tag_tokens_and_format_checks():
    fresh = train_tiny_tokenizer(["go left", "go right"], vocab_size=300)
    assert add_tag_tokens(fresh) == 4 and len(encode(fresh, "<answer>")) == 1
    ids = encode(fresh, "x<answer>left</answer>").tolist()
    assert ids[1] == fresh.convert_tokens_to_ids("<answer>") and ids[-1] == fresh.convert_tokens_to_ids("</answer>")
    tok = chat_tokenizer(None, tags=False)
    with pytest.raises(ValueError, match="reply format"):
        plain_format(tok, "x", "json")
    empty = np.zeros(0, np.int32)
    with pytest.raises(ValueError, match="non-empty"):
        Format(empty, empty, empty, empty, (3,), 0, "think_answer")
    with pytest.raises(ValueError, match="overlap"):
        Format(empty, empty, empty, empty, (3,), 0, "think_answer", answer_open=np.array([5, 6]),
               answer_close=np.array([5, 6, 7]))


# ---- fuzzing ------------------------------------------------------------------------------------

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("tags", [True, False], ids=["special_tags", "bpe_tags"])
@FUZZ
@given(data=st.data())
def test_arbitrary_tokens_never_crash(tags, data):
    """Any tokens and any length: a well-typed result, and an accepted answer is a slice of the reply."""
    tok, env, fmt = SETUPS[tags]
    tag_ids = sorted(set(fmt.answer_open.tolist() + fmt.answer_close.tolist()))
    token = st.one_of(st.integers(0, len(tok) - 1), st.sampled_from(tag_ids))
    replies = data.draw(st.lists(st.lists(token, max_size=R), min_size=1, max_size=8))
    answers, n, ok = _parse(fmt, replies)
    assert n.dtype == np.int32 and ok.dtype == bool and ((n >= 0) & (n <= R)).all()
    for r, a, k, good in zip(replies, answers, n, ok):
        assert (k > 0) == bool(good)
        if good:
            close = fmt.answer_close.tolist()
            assert r[len(r) - len(close) :] == close and r[len(r) - len(close) - k : len(r) - len(close)] == a
            assert _count(r, fmt.answer_open.tolist()) == 1 and _count(r, close) == 1


def _count(seq, pattern):
    k = len(pattern)
    return sum(seq[i : i + k] == pattern for i in range(len(seq) - k + 1))


@pytest.mark.parametrize("tags", [True, False], ids=["special_tags", "bpe_tags"])
@FUZZ
@given(data=st.data())
def test_valid_answer_in_arbitrary_thinking_parses(tags, data):
    """Arbitrary think tokens (free of answer tags) + <answer>ACTION</answer> -> ACTION."""
    tok, env, fmt = SETUPS[tags]
    A, C = fmt.answer_open.tolist(), fmt.answer_close.tolist()
    action = data.draw(st.sampled_from(range(env.num_actions)))
    act = env.actions.tokens[action, : env.actions.lengths[action]].tolist()
    think = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=R - len(A + act + C)))
    reply = think + A + act + C
    if _count(reply, A) != 1 or _count(reply, C) != 1:  # the think tokens spelled a tag themselves
        return
    (answer,), _, (good,) = _parse(fmt, [reply])
    assert good and answer == act


@FUZZ
@given(text=st.text(alphabet=st.characters(codec="ascii"), max_size=30))
def test_valid_answer_in_arbitrary_think_text_parses(text):
    """Text level, BPE tags: `<think>TEXT</think>\\n<answer>ACTION</answer>` tokenized whole parses for
    any think text that does not itself spell an answer tag."""
    tok, env, fmt = SETUPS[False]
    if "answer>" in text:
        return
    for action in env.action_strings:
        reply = _enc(tok, f"<think>{text}</think>\n<answer>{action}</answer>")
        if len(reply) > R:
            continue
        (answer,), _, (good,) = _parse(fmt, [reply])
        assert good and answer == _enc(tok, action), (text, action)
