"""Chat formats from real chat templates: fragments, whole rollouts equal to apply_chat_template, loss mask.

Templates (tests/chat_helpers.py) live in local tokenizer configs of tiny BPEs trained here and are
reloaded with AutoTokenizer. Two rollouts (a compile each) are shared by the tests of this module:
Qwen-style ChatML with think_answer replies and Llama-3-style with action replies.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.chat import ChatFormatError, HistoryError, chat_format, env_format, make_format, system_text
from bmrl.envs import INVALID, make
from bmrl.formats import reply_instructions
from bmrl.rollout import RolloutConfig, rollout
from bmrl.rollout.baseline import python_loop_rollout
from bmrl.sampling import SamplingConfig
from tests.chat_helpers import LLAMA3_TEMPLATE, chain_policy, chat_tokenizer, conversation, reply_chains, template_ids

CAPS = jnp.array([2, 4, 6, 6], jnp.int32)
TASKS = {"seed": jnp.arange(4, dtype=jnp.int32)}
FORMAT_REWARD = -0.25


def _setup(style, reply_format):
    tok = chat_tokenizer(style)
    env = make("corridor", tok, length=3, eps=0.3)
    fmt = env_format(env, reply_format)
    chains = reply_chains(env, fmt, tok)
    policy = chain_policy(fmt, chains, len(tok), seed=1)
    R, Tm = max(len(c) for c, _ in chains) + 2, 6
    cfg = RolloutConfig(max_turns=Tm, max_reply_tokens=R, max_len=fmt.tokens_needed(Tm, env.max_obs_len, R),
                        sampling=SamplingConfig(temperature=1.0), format_reward=FORMAT_REWARD)
    return tok, env, fmt, policy, cfg


@pytest.fixture(scope="module")
def runs():
    """style -> (tokenizer, env, fmt, policy, cfg, trajectory)."""
    out = {}
    for style, reply_format in (("qwen", "think_answer"), ("llama3", "action")):
        tok, env, fmt, policy, cfg = _setup(style, reply_format)
        traj = rollout(policy, env, TASKS, CAPS, jax.random.key(0), cfg, fmt)
        out[style] = (tok, env, fmt, policy, cfg, jax.device_get(traj))
    return out


def _text(tok, ids):
    return tok.decode([int(i) for i in ids])


# ---- fragments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("reply_format", ["action", "think_answer"])
def test_qwen_fragments(reply_format):
    tok = chat_tokenizer("qwen")
    fmt = chat_format(tok, "Walk to the exit.", reply_format=reply_format, system_prompt="Be brief.")
    system = f"Be brief.\n\nWalk to the exit.\n\n{reply_instructions(reply_format)}"
    assert fmt.system == system == system_text("Walk to the exit.", reply_format, "Be brief.")
    assert _text(tok, fmt.prefix) == f"<|im_start|>system\n{system}<|im_end|>\n"
    assert _text(tok, fmt.obs_open) == "<|im_start|>user\n"
    assert _text(tok, fmt.obs_close) == "<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.stop_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    assert _text(tok, fmt.reply_close) == "\n"  # after <|im_end|>: not sampled, not trained on
    assert fmt.notes == () and fmt.reply_format == reply_format


def test_qwen_default_system_message_is_replaced():
    """Without a system message Qwen's template adds its own; the chat format always sends the task's."""
    tok = chat_tokenizer("qwen")
    default = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "You are Qwen" in default
    fmt = chat_format(tok, "Walk to the exit.")
    assert "You are Qwen" not in _text(tok, fmt.prefix) and "Walk to the exit." in _text(tok, fmt.prefix)


def test_llama3_fragments_and_trim_note():
    tok = chat_tokenizer("llama3")
    fmt = chat_format(tok, "Walk to the exit.")
    assert _text(tok, fmt.prefix) == (
        f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{fmt.system}<|eot_id|>"
    )
    assert _text(tok, fmt.obs_open) == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert _text(tok, fmt.obs_close) == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert fmt.stop_ids == (tok.convert_tokens_to_ids("<|eot_id|>"),) and len(fmt.reply_close) == 0
    assert any("trims whitespace" in n for n in fmt.notes)
    assert chat_format(chat_tokenizer("llama3_notrim"), "Walk to the exit.").notes == ()


def test_template_without_system_role_gets_the_system_prompt_in_the_first_user_turn():
    """Gemma-style: raises on a system message and trims contents. The fragments still compose exactly
    for contents without edge whitespace."""
    tok = chat_tokenizer("gemma")
    fmt = chat_format(tok, "Walk to the exit.", reply_format="think_answer")
    assert any("no system role" in n for n in fmt.notes)
    assert _text(tok, fmt.prefix) == f"<|bos|><start_of_turn>user\n{fmt.system}\n\n" and len(fmt.obs_open) == 0
    assert _text(tok, fmt.reply_close) == "\n<start_of_turn>user\n"
    obs, reply = ["Position 0. Exit at 3.", "You hit a wall.\nPosition 0."], "<think>I go.</think><answer>left</answer>"
    stream = np.concatenate([fmt.prefix, fmt.obs_open, tok.encode(obs[0]), fmt.obs_close, tok.encode(reply),
                             fmt.stop_ids, fmt.reply_close, fmt.obs_open, tok.encode(obs[1]), fmt.obs_close])
    msgs = [{"role": "user", "content": fmt.system + "\n\n" + obs[0]}, {"role": "assistant", "content": reply},
            {"role": "user", "content": obs[1]}]
    np.testing.assert_array_equal(template_ids(tok, msgs, add_generation_prompt=True)["input_ids"], stream)


@pytest.mark.parametrize("system_prompt", [None, "Be brief."])
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
def test_qwen3_and_gemma3_fragments_equal_the_template_over_three_turns(style, system_prompt):
    """The fragments around three observations and two replies (then the generation prompt) are the
    template's tokens of the same conversation with the system message (Gemma 3: joined to the first
    user turn, as its template does), with and without a system-prompt preamble. Qwen3 with think_answer:
    equal once the reasoning of the replies before the last user turn is dropped, which the template
    does and the rollout does not (named in `Format.notes`)."""
    tok = chat_tokenizer(style)
    obs = ["Position 0. Exit at 3.", "You hit a wall.\nPosition 0.", "Position 1. Exit at 3."]
    for reply_format, replies in (("action", ["left", "right"]),
                                  ("think_answer", ["<think>I go.</think>\n<answer>left</answer>",
                                                    "<think>Next move now.</think>\n<answer>right</answer>"])):
        fmt = chat_format(tok, "Walk to the exit.", reply_format=reply_format, system_prompt=system_prompt)
        assert fmt.system.startswith(system_prompt or "Walk")
        parts, kept = [fmt.prefix], [fmt.prefix]
        for t, o in enumerate(obs):
            turn = [fmt.obs_open, tok.encode(o), fmt.obs_close]
            parts += turn
            kept += turn
            if t < len(replies):
                closing = [fmt.stop_ids, fmt.reply_close]
                parts += [tok.encode(replies[t]), *closing]
                kept += [tok.encode(replies[t].split("</think>\n")[-1]), *closing]
        msgs = [{"role": "system", "content": fmt.system}]
        for t, o in enumerate(obs):
            msgs += [{"role": "user", "content": o}] + ([{"role": "assistant", "content": replies[t]}] if t < 2 else [])
        want = template_ids(tok, msgs, add_generation_prompt=True)["input_ids"]
        rewrites = style == "qwen3" and reply_format == "think_answer"
        np.testing.assert_array_equal(want, np.concatenate(kept if rewrites else parts))
        assert rewrites == any("rewrites think_answer replies" in n for n in fmt.notes)
        assert not fmt.rewrites_history  # format.history: whole, the default
        if rewrites:
            assert len(np.concatenate(parts)) > len(want)  # the rollout's context: the reasoning kept
            # format.history: template follows the template: each earlier reply keeps what the template renders
            follow = chat_format(tok, "Walk to the exit.", reply_format=reply_format, system_prompt=system_prompt,
                                 history="template")
            for r in replies:
                ids = tok.encode(r)
                np.testing.assert_array_equal(ids[int(follow.kept_from(np.asarray(ids), len(ids))):],
                                              tok.encode(r.split("</think>\n")[-1]))
            assert follow.rewrites_history and any("so does the rollout" in n for n in follow.notes)
        else:  # nothing to follow: refused, naming the setting
            with pytest.raises(HistoryError, match="format.history: whole"):
                chat_format(tok, "Walk to the exit.", reply_format=reply_format, history="template")
    if style == "gemma3":
        assert _text(tok, fmt.prefix) == f"<bos><start_of_turn>user\n{fmt.system}\n\n" and len(fmt.obs_open) == 0


def test_refuses_templates_it_cannot_reproduce():
    plain = chat_tokenizer(None)
    with pytest.raises(ChatFormatError, match="no chat template"):
        chat_format(plain, "x")
    assert make_format(plain, "x").obs_open.size == 0  # make_format falls back to the plain format
    with pytest.raises(HistoryError, match="has none"):  # no template, no history rewrite to follow
        make_format(plain, "x", "think_answer", history="template")
    tok = chat_tokenizer("qwen")
    saved = tok.chat_template
    try:  # an assistant turn that ends in plain text, not one end-of-turn token
        tok.chat_template = ("{% for m in messages %}{{ m.role + ': ' + m.content + '\n\n' }}{% endfor %}"
                             "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
        with pytest.raises(ChatFormatError, match="single token"):
            chat_format(tok, "x")
    finally:
        tok.chat_template = saved


# ---- whole rollouts -----------------------------------------------------------------------------


def test_qwen_rollout_equals_apply_chat_template(runs):
    """Every row's stream equals the template's tokens of its rebuilt conversation, token for token.

    Named boundary case: the template renders "\\n" after the final <|im_end|> (reply_close); the
    rollout ends at the final stop token, so the template has exactly reply_close more.
    """
    tok, env, fmt, _, _, traj = runs["qwen"]
    for b in range(len(CAPS)):
        messages, spans = conversation(traj, b, fmt, tok)
        for obs, reply in spans:  # the tokens the policy sampled are canonical: text round trips
            assert tok.encode(tok.decode(reply), add_special_tokens=False) == reply
        n = int(traj.length[b])
        want = template_ids(tok, messages)["input_ids"]
        np.testing.assert_array_equal(want[:n], traj.tokens[b, :n], err_msg=f"row {b}")
        np.testing.assert_array_equal(want[n:], fmt.reply_close)


def test_llama3_rollout_equals_apply_chat_template(runs):
    """Exact against the Llama-3 template without `| trim`. Named difference with the real (trimming)
    template: each observation's trailing newline, which the rollout keeps and the template strips."""
    tok, env, fmt, _, _, traj = runs["llama3"]
    newline = tok.encode("\n", add_special_tokens=False)
    for b in range(len(CAPS)):
        messages, spans = conversation(traj, b, fmt, tok)
        n = int(traj.length[b])
        stream = np.asarray(traj.tokens[b, :n])
        exact = template_ids(tok, messages, chat_template=LLAMA3_TEMPLATE.replace(" | trim", ""))["input_ids"]
        np.testing.assert_array_equal(exact, stream, err_msg=f"row {b}")
        # The real template: drop each observation's trailing newline from the stream, then equal.
        keep = np.ones(n, bool)
        pos = len(fmt.prefix)
        for t, (obs, reply) in enumerate(spans):
            pos += (len(fmt.reply_close) + 1 if t else 0) + len(fmt.obs_open)
            assert obs[-len(newline):] == newline
            keep[pos + len(obs) - len(newline) : pos + len(obs)] = False
            pos += len(obs) + len(fmt.obs_close) + len(reply)
        trimmed = template_ids(tok, messages)["input_ids"]
        np.testing.assert_array_equal(trimmed, stream[keep], err_msg=f"row {b}")


@pytest.mark.parametrize("style", ["qwen", "llama3"])
def test_loss_mask_is_exactly_the_assistant_tokens(runs, style):
    """loss_mask == the template's own assistant mask ({% generation %}: content + end-of-turn token,
    not Qwen's "\\n" after <|im_end|>, nothing of the roles or observations), and 1 on every stop."""
    tok, env, fmt, _, _, traj = runs[style]
    chat_template = None if style == "qwen" else LLAMA3_TEMPLATE.replace(" | trim", "")
    for b in range(len(CAPS)):
        messages, _ = conversation(traj, b, fmt, tok)
        n = int(traj.length[b])
        want = template_ids(tok, messages, chat_template=chat_template, return_assistant_tokens_mask=True)
        np.testing.assert_array_equal(want["assistant_masks"][:n], traj.loss_mask[b, :n], err_msg=f"row {b}")
        assert not want["assistant_masks"][n:].any() and not traj.loss_mask[b, n:].any()
        stops = np.isin(traj.tokens[b, :n], fmt.stop_ids) & (traj.loss_mask[b, :n] > 0)
        assert stops.sum() == int(traj.turns_used[b])  # every reply's stop was sampled and is trained on


def test_think_answer_format_errors_in_the_rollout(runs):
    """Replies without an answer are format errors: INVALID, shown as invalid, penalised, counted."""
    tok, env, fmt, _, cfg, traj = runs["qwen"]
    active = np.asarray(traj.turn_active)
    fe = np.asarray(traj.format_error) & active
    assert fe.any() and (active & ~fe).any(), "the policy should make both kinds of reply"
    assert (np.asarray(traj.action)[fe] == INVALID).all() and np.asarray(traj.invalid)[fe].all()
    np.testing.assert_allclose(np.asarray(traj.reward)[fe], FORMAT_REWARD)
    ok_replies = active & ~fe
    assert (np.asarray(traj.action)[ok_replies] != INVALID).all()
    for b in range(len(CAPS)):
        messages, _ = conversation(traj, b, fmt, tok)
        for t in np.flatnonzero(fe[b]):
            assert "<answer>" not in messages[2 + 2 * t]["content"]
            if 2 + 2 * (t + 1) < len(messages):
                assert messages[1 + 2 * (t + 1)]["content"].startswith("Invalid action.")


def test_rollout_equals_python_loop_with_a_chat_format(runs):
    tok, env, fmt, policy, cfg, traj = runs["qwen"]
    base = jax.device_get(python_loop_rollout(policy, env, TASKS, CAPS, jax.random.key(0), cfg, fmt))
    for f in ("tokens", "length", "loss_mask", "turn_of_token", "action", "reward", "format_error", "invalid",
              "turns_used", "success", "terminated", "truncated"):
        np.testing.assert_array_equal(np.asarray(getattr(base, f)), np.asarray(getattr(traj, f)), err_msg=f)
    np.testing.assert_allclose(base.logprobs, traj.logprobs, atol=1e-4)
