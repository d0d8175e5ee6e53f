"""Chat formats: a `Format` derived from a tokenizer's own chat template, once, on the host.

Real instruct models speak in roles. `chat_format` renders probe conversations with placeholder
contents through `tokenizer.apply_chat_template`, splits the text around the placeholders and
tokenizes the pieces into the fragments the compiled rollout concatenates:

    prefix       conversation start: the system prompt (instructions, actions, reply format)
                 up to the first user message's content
    obs_open     user-turn open                  (ChatML "<|im_start|>user\\n")
    obs_close    user-turn close + generation prompt ("<|im_end|>\\n<|im_start|>assistant\\n")
    stop_ids     the assistant's end-of-turn token ("<|im_end|>"), sampled by the policy
    reply_close  what the template puts after it before the next user turn (ChatML "\\n")

It then checks, in tokens, that the fragments concatenated around tokenized contents equal the
template's own tokenization of a whole probe conversation, and refuses (ChatFormatError) templates
it cannot reproduce that way. What it finds but can reproduce only approximately (content trimming,
rewritten reasoning in history) is listed in `Format.notes`; docs/chat_formats.md has the details.
Models without a chat template use `bmrl.formats.plain_format` through `make_format`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from bmrl.formats import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ANSWER_SEP,
    HISTORIES,
    THINK_CLOSE,
    THINK_OPEN,
    Format,
    check_answer_layout,
    encode,
    pad_token_id,
    plain_format,
    reply_instructions,
    tag_fields,
)

# Placeholder contents: plain lowercase words, a pre-token of their own in any BPE.
_SYS, _OBS1, _REPLY1, _OBS2 = "bmrlsystemzq", "bmrlobservationzq", "bmrlreplyzq", "bmrlnextobservationzq"
_MERGED_SEP = "\n\n"  # system prompt and first observation, for templates without a system role


class ChatFormatError(ValueError):
    """A chat template bmrl cannot turn into token fragments (the message says why and what to do)."""


class TagLayoutError(ChatFormatError):
    """think_answer tags that the tokenizer merges with an action (`make_format`)."""


class HistoryError(ChatFormatError):
    """`format.history: template` with a template whose history rewrite the rollout cannot follow."""


_FOLLOWED = ("The template drops the reasoning of earlier replies, and so does the rollout (format.history: "
             "template): each turn trains on the context it saw, as its own sample.")


def has_chat_template(tokenizer) -> bool:
    """True if `tokenizer` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def system_text(instructions: str, reply_format: str = "action", system_prompt: str | None = None) -> str:
    """The system prompt: optional preamble, the task instructions (with the actions), the reply format."""
    return "\n\n".join(p for p in (system_prompt, instructions, reply_instructions(reply_format)) if p)


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _messages(system: str, turns: list[str], merge_system: bool) -> list[dict]:
    """[system, user, assistant, user, ...] (system merged into the first user turn if asked)."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(turns)]
    if merge_system:
        msgs[0] = {"role": "user", "content": system + _MERGED_SEP + turns[0]}
        return msgs
    return [{"role": "system", "content": system}] + msgs


def _split(text: str, marks: list[str]) -> list[str]:
    """Text before, between and after `marks`, each of which must occur once, in order."""
    pieces, rest = [], text
    for m in marks:
        if text.count(m) != 1:
            raise ChatFormatError(
                f"The chat template rendered the placeholder {m!r} {text.count(m)} times (expected once); "
                "bmrl needs a template that copies message contents verbatim."
            )
        head, rest = rest.split(m)
        pieces.append(head)
    return pieces + [rest]


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def _is_special(tokenizer, tok_id: int) -> bool:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return tok_id in set(tokenizer.all_special_ids) or (tok_id in added and added[tok_id].special)


def chat_format(tokenizer, instructions: str, *, reply_format: str = "action", system_prompt: str | None = None,
                history: str = "whole") -> Format:
    """A Format from `tokenizer.chat_template` with the system prompt built from `instructions`.

    The system message is `system_prompt` (optional preamble), `instructions` (task and actions) and
    the reply-format sentence. Templates without a system role get it in the first user message.
    `history`: `whole` keeps every reply in the context as sampled; `template` follows the template's
    rewrite of earlier replies (Qwen3 drops their reasoning: `Format.history_cut`).
    Raises ChatFormatError for a tokenizer without a template, an end of turn that is not one special
    token, or a template whose pieces do not tokenize like the whole conversation; HistoryError for
    `template` with a template that rewrites nothing, or rewrites in a way the rollout cannot follow.
    """
    _check_history(history)
    if not has_chat_template(tokenizer):
        raise ChatFormatError("The tokenizer has no chat template; use bmrl.formats.plain_format or make_format.")
    system = system_text(instructions, reply_format, system_prompt)
    probe_turns = [_OBS1, _REPLY1, _OBS2]
    notes: list[str] = []
    try:
        probe = _render(tokenizer, _messages(_SYS, probe_turns, False), True)
        merge = False
    except Exception as e:  # jinja2 TemplateError from raise_exception("System role not supported")
        merge = True
        probe = _render(tokenizer, _messages(_SYS, probe_turns, True), True)
        notes.append(f"The template has no system role ({e}); the system prompt opens the first user message.")
    _, sys_to_obs, obs_close, reply_to_obs, tail = _split(probe, [_SYS, _OBS1, _REPLY1, _OBS2])
    if tail != obs_close:
        raise ChatFormatError(
            f"The template closes the second user turn differently ({tail!r}) from the first ({obs_close!r}); "
            "bmrl wraps every observation with the same fragments."
        )

    # The end of the assistant turn: one special token, the stop token the policy samples.
    after_reply = encode(tokenizer, reply_to_obs)
    stop = int(after_reply[0]) if len(after_reply) else -1
    stop_text = tokenizer.decode([stop]) if stop >= 0 else ""
    if stop < 0 or not _is_special(tokenizer, stop) or not reply_to_obs.startswith(stop_text):
        raise ChatFormatError(
            f"The template ends an assistant turn with {reply_to_obs!r}, which does not start with one special "
            "end-of-turn token; the compiled rollout stops replies on a single token."
        )
    rest = reply_to_obs[len(stop_text):]
    # The user-turn open is what precedes every user content; leading whitespace goes to the close.
    obs_open = rest[len(rest) - _common_suffix(rest, sys_to_obs):]
    obs_open = obs_open[len(obs_open) - len(obs_open.lstrip()):]
    reply_close = rest[: len(rest) - len(obs_open)]

    # The conversation start with the real system prompt (the template may transform it).
    first = _render(tokenizer, _messages(system, [_OBS1], merge), True)
    start, after = _split(first, [_OBS1])
    if after != obs_close or not start.endswith(obs_open):
        raise ChatFormatError(
            "The template renders the first user turn differently with the real system prompt; "
            f"got {first!r}."
        )
    prefix = start[: len(start) - len(obs_open)]

    fmt = Format(
        prefix=encode(tokenizer, prefix), obs_open=encode(tokenizer, obs_open),
        obs_close=encode(tokenizer, obs_close), reply_close=encode(tokenizer, reply_close),
        stop_ids=(stop,), pad_id=pad_token_id(tokenizer), reply_format=reply_format,
        system=system, notes=tuple(notes + _probe_notes(tokenizer, system, merge, reply_format, stop_text, history)),
        **tag_fields(tokenizer, reply_format),
    )
    _verify(tokenizer, fmt, system, merge)
    return fmt if history == "whole" else _following_history(tokenizer, fmt, system, merge)


def _stream(fmt: Format, tokenizer, turns: list[str]) -> np.ndarray:
    """Tokens the rollout lays out for user/assistant `turns` (ending with a user turn): each reply as the
    history keeps it once an observation follows (`Format.kept_from`)."""
    parts = [fmt.prefix]
    for i, content in enumerate(turns):
        if i % 2 == 0:
            parts += [fmt.obs_open, encode(tokenizer, content), fmt.obs_close]
        else:
            reply = encode(tokenizer, content)
            parts += [reply[int(fmt.kept_from(reply, len(reply))):], np.asarray(fmt.stop_ids[:1], np.int32),
                      fmt.reply_close]
    return np.concatenate(parts)


def _check_history(history: str) -> None:
    if history not in HISTORIES:
        raise ValueError(f"Unknown history {history!r}; valid: {', '.join(HISTORIES)}.")


def _think_reply(reasoning: str, sep: str = ANSWER_SEP) -> str:
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{sep}{ANSWER_OPEN}x{ANSWER_CLOSE}"


def _rewrites_history(tokenizer, system: str, merge: bool, reply_format: str) -> bool:
    """Does the template render a think_answer reply before the last user turn other than as it was sampled?"""
    if reply_format != "think_answer":
        return False
    reply = _think_reply(_REPLY1)
    return reply not in _render(tokenizer, _messages(system, [_OBS1, reply, _OBS2], merge), True)


def _following_history(tokenizer, fmt: Format, system: str, merge: bool) -> Format:
    """`fmt` with the template's history rewrite (`format.history: template`): an earlier reply keeps what
    follows its last `</think>`, left-stripped of newline tokens, as Qwen3's template renders it; checked in
    tokens against the template on probe replies."""
    if not _rewrites_history(tokenizer, system, merge, fmt.reply_format):
        raise HistoryError(
            "format.history=template follows a chat template that rewrites earlier replies (Qwen3 drops their "
            f"reasoning); this one renders {fmt.reply_format} replies in the history as they were sampled. "
            "Set format.history: whole."
        )
    newlines = {int(ids[0]) for k in (1, 2, 3, 4) if len(ids := encode(tokenizer, "\n" * k)) == 1}
    out = dataclasses.replace(fmt, history_cut=encode(tokenizer, THINK_CLOSE), history_strip=tuple(sorted(newlines)),
                              notes=fmt.notes + (_FOLLOWED,))
    for reply in (_think_reply(_REPLY1), _think_reply(_REPLY1, "\n\n"), "bmrlnothinkzq"):
        differ = _differs(tokenizer, out, system, merge, [_OBS1, reply, _OBS2])
        if differ:
            raise HistoryError(
                "The chat template rewrites earlier replies in a way the rollout cannot follow in tokens (after "
                f"the last {THINK_CLOSE}, newlines stripped): template {differ[0]} vs rollout {differ[1]} "
                f"for the reply {reply!r}. Set format.history: whole."
            )
    return out


def _differs(tokenizer, fmt: Format, system: str, merge: bool, turns: list[str]) -> tuple[list, list] | None:
    """(the template's tokens, the rollout's) of the probe conversation `turns` where they differ, else None."""
    want = encode(tokenizer, _render(tokenizer, _messages(system, turns, merge), True))
    got = _stream(fmt, tokenizer, turns)
    return None if np.array_equal(want, got) else (want.tolist(), got.tolist())


def _verify(tokenizer, fmt: Format, system: str, merge: bool) -> None:
    """The fragments around tokenized contents must equal the template's tokens of a whole conversation."""
    differ = _differs(tokenizer, fmt, system, merge, [_OBS1, _REPLY1, _OBS2])
    if differ:
        raise ChatFormatError(
            "The chat template's pieces do not tokenize like the whole conversation (a fragment boundary "
            f"splits a pre-token): template {differ[0]} vs fragments {differ[1]}."
        )


def _probe_notes(tokenizer, system: str, merge: bool, reply_format: str, stop_text: str, history: str) -> list[str]:
    """Template behaviours the fragments reproduce only approximately, found by rendering probes."""
    notes = []
    padded = f" {_OBS1} \n"
    if padded not in _render(tokenizer, _messages(system, [padded], merge), True):
        notes.append(
            "The template rewrites message contents (e.g. trims whitespace): observations ending in a "
            "newline keep it in the rollout, where the template would drop it."
        )
    last = _render(tokenizer, _messages(system, [_OBS1, _REPLY1], merge), False)
    ending = last.split(_REPLY1)[-1]
    if not ending.startswith(stop_text):
        notes.append(f"The template ends the final assistant turn with {ending!r}, not with {stop_text!r}.")
    if history == "whole" and _rewrites_history(tokenizer, system, merge, reply_format):
        notes.append(
            "The template rewrites think_answer replies in the history (e.g. drops the reasoning); the "
            "rollout keeps every reply whole in the context (format.history: template follows the template)."
        )
    return notes


def make_format(
    tokenizer,
    instructions: str,
    reply_format: str = "action",
    *,
    system_prompt: str | None = None,
    action_strings: tuple[str, ...] | None = None,
    history: str = "whole",
) -> Format:
    """The chat format if `tokenizer` has a chat template, else the plain built-in one.

    With `action_strings` and `think_answer`, refuses tags that BPE would merge with an action
    (`check_answer_layout`); make them special tokens (`bmrl.formats.add_tag_tokens`) or change the tags.
    `history` is `chat_format`'s; the plain format has no template to follow (`template`: HistoryError).
    """
    if has_chat_template(tokenizer):
        fmt = chat_format(tokenizer, instructions, reply_format=reply_format, system_prompt=system_prompt,
                          history=history)
    else:
        _check_history(history)
        if history != "whole":
            raise HistoryError("format.history=template follows a chat template's rewrite of earlier replies; this "
                               "tokenizer has none (the plain format keeps replies whole). Set format.history: whole.")
        text = instructions if not system_prompt else f"{system_prompt} {instructions}"
        fmt = plain_format(tokenizer, text, reply_format)
    bad = check_answer_layout(tokenizer, fmt, action_strings or ())
    if bad:
        raise TagLayoutError(
            f"With this tokenizer the answer tags merge with the actions {bad} (BPE joins a tag and its "
            "neighbours), so the rollout could not find them in a reply. Add the tags as special tokens "
            "(bmrl.formats.add_tag_tokens) for a from-scratch model, or use the action reply format."
        )
    return fmt


@functools.lru_cache(maxsize=64)
def env_format(env, reply_format: str = "action", system_prompt: str | None = None, history: str = "whole") -> Format:
    """`make_format` for an environment (its tokenizer, instructions and actions), cached per env so
    repeated rollouts reuse one compiled program."""
    return make_format(env.tokenizer, env.instructions, reply_format,
                       system_prompt=system_prompt, action_strings=env.action_strings, history=history)
