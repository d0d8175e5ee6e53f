"""The `format` section (format.kind, format.system_prompt) on every path a config builds a format:
`build_run` for a JAX env and a Python env, SFT demonstrations, RL training, and the shipped real-model
config `configs/qwen_tools.yaml` with a Qwen-style chat template."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from bmrl.assembly import build_run
from bmrl.config import load
from tests.chat_helpers import chain_policy, chat_tokenizer, reply_chains
from tests.paths import REPO

PROMPT = "You are a careful agent."
THINK = ["format.kind=think_answer", f"format.system_prompt={PROMPT}"]
TINY = ["model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=1",
        "model.num_attention_heads=2", "model.num_key_value_heads=1"]
CORRIDOR = [*TINY, "env.options.length=3", "budget.budgets=[4]", "rollout.max_turns=4", "rollout.max_len=384",
            "eval.ts=[2]", "eval.ks=[1]", "eval.attempts=1", "sft.demo_turns=4"]


def _check_think_answer(run, starts_with: str) -> None:
    """The run's format: think_answer replies, the preamble first in the system text and in the prompt."""
    fmt, tok = run.fmt, run.tokenizer
    assert fmt.reply_format == "think_answer"
    assert fmt.system.startswith(PROMPT) and "<answer>" in fmt.system  # preamble, instructions, layout sentence
    assert tok.decode(fmt.prefix.tolist(), skip_special_tokens=True).startswith(starts_with)
    assert len(fmt.answer_open) > 0 and len(fmt.answer_close) > 0


def test_jax_env_run_format_and_sft_demos():
    """Corridor: the tiny tokenizer gets the tags as special tokens, replies need room for them, and
    the SFT demonstrations are laid out in the same think_answer format."""
    import jax

    from bmrl.learn.demos import make_demos

    run = build_run(load(None, [*CORRIDOR, *THINK]))
    _check_think_answer(run, PROMPT)
    assert len(run.fmt.answer_open) == 1 and len(run.fmt.answer_close) == 1  # special tags: one token each
    action = build_run(load(None, CORRIDOR)).fmt
    assert action.reply_format == "action" and PROMPT not in action.system

    demos = make_demos(run.env, run.fmt, {"seed": np.arange(2, dtype=np.int32)}, jax.random.key(0), num_turns=2,
                       max_len=384, noise=0.0)
    tokens, targets = np.asarray(demos.tokens), np.asarray(demos.loss_mask).astype(bool)
    answer_open = int(run.fmt.answer_open[0])
    turns = np.asarray(demos.turn_active).sum(1)
    assert (turns > 0).all() and ((tokens == answer_open) & targets).sum(1).tolist() == turns.tolist()  # one a turn


def test_python_env_run_format():
    """configs/python_env.yaml with the format keys: the plain format of the tiny tokenizer."""
    run = build_run(load(REPO / "configs" / "python_env.yaml", THINK))
    _check_think_answer(run, PROMPT)
    assert run.env.instructions in run.fmt.system


def _chat_dir(tmp_path_factory, style: str) -> str:
    """A local model directory with a `style` chat template and think/answer special tags: a tiny decoder
    steered to reply in canonical think_answer chains, some without an answer (format errors)."""
    from bmrl.chat import env_format
    from bmrl.envs import make
    from bmrl.model.hf import save_pretrained

    tok = chat_tokenizer(style)
    env = make("corridor", tok, length=3)
    fmt = env_format(env, "think_answer")
    path = tmp_path_factory.mktemp(style) / "model"
    save_pretrained(chain_policy(fmt, reply_chains(env, fmt, tok), len(tok), seed=1), tok, path)
    return str(path)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    """ChatML (Qwen2.5): the template keeps earlier replies as they were."""
    return _chat_dir(tmp_path_factory, "qwen")


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    """Qwen3's template: earlier replies lose their reasoning."""
    return _chat_dir(tmp_path_factory, "qwen3")


def test_train_parses_replies_with_the_run_format(qwen3_dir, tmp_path, monkeypatch):
    """A 1-step `train` with think_answer and Qwen3's template followed (`format.history: template`): the
    rollout and the evaluator get the run's format, the steered policy's tagged replies are read as actions
    (an action-format run would find none), and each played turn trains on the context it saw, earlier
    replies without their reasoning: a learner row per turn, each reply's tokens trained once."""
    import bmrl.assembly.jax_player as players_lib
    import bmrl.train as train_lib

    used = []
    real_rollout, real_evaluator = players_lib.make_rollout, train_lib.make_evaluator
    monkeypatch.setattr(players_lib, "make_rollout", lambda *a, **k: used.append(a[2]) or real_rollout(*a, **k))
    monkeypatch.setattr(train_lib, "make_evaluator", lambda *a, **k: used.append(a[1].fmt) or real_evaluator(*a, **k))
    cfg = load(None, [*CORRIDOR, *THINK, "format.history=template", f"model.path={qwen3_dir}",
                      f"out_dir={tmp_path / 'run'}", "rollout.max_reply_tokens=24", "rollout.max_len=512",
                      "train.steps=1", "train.tasks_per_step=2", "train.group_size=2", "eval.num_tasks=4",
                      "checkpoint.every=1"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_lib.train(cfg, progress=False)
    # The rollout and two evaluators (test at the first and last step, validation between).
    assert len(used) == 3 and all(f.reply_format == "think_answer" and f.system.startswith(PROMPT) for f in used)
    assert all(f.rewrites_history for f in used)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in records if "rollout/invalid_rate" in r]
    # Tagged answers are parsed (read as action strings, every reply would be invalid); the steered
    # policy's only invalid replies are those without an answer: format errors.
    assert step["rollout/format_error_rate"] == step["rollout/invalid_rate"] < 0.5, step
    assert step["train/num_tokens"] == step["rollout/sampled_tokens"] > 0, step  # every reply trained once


def test_qwen_tools_config_builds_with_a_model_directory(qwen_dir):
    """The shipped config: ChatML system turn with the preamble, think_answer, the tool env's tasks."""
    cfg = load(REPO / "configs" / "qwen_tools.yaml", [f"model.path={qwen_dir}"])
    run = build_run(cfg)
    assert run.fmt.reply_format == "think_answer" and cfg.format.system_prompt
    assert run.fmt.system.startswith(cfg.format.system_prompt)
    assert run.tokenizer.decode(run.fmt.prefix.tolist()).startswith("<|im_start|>system\n" + cfg.format.system_prompt)
    assert run.env.name == cfg.env.entry and len(run.env.split("test")) == 12


def test_sft_lays_out_a_turn_a_row_where_the_rollout_follows_the_template(qwen3_dir):
    """SFT decides its layout from the run's rollout: with Qwen3's template followed, each demonstrated turn is a
    row in the context the rollout gives it (`windowed_rows`, equal to the rollout's samples in
    tests/rollout/test_engine.py); with `format.history: whole`, one append-only row per demonstration."""
    from bmrl.sft import _windowed

    for history, per_turn in (("template", True), ("whole", False)):
        cfg = load(None, [*CORRIDOR, *THINK, f"format.history={history}", f"model.path={qwen3_dir}",
                          "rollout.max_reply_tokens=24", "rollout.max_len=512"])
        run = build_run(cfg)
        assert run.fmt.rewrites_history == per_turn and _windowed(cfg, run) == per_turn
