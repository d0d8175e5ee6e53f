"""A real-model config end to end at the real model's widths and vocabulary: `bmrl train` of
configs/qwen2_5_0_5b_sokoban.yaml on a 2-layer cut of Qwen2.5-0.5B (hidden 896, 14 heads of 64 over 2 KV
heads, MLP 4,864, the 151,936-token vocabulary, tied embeddings; random bfloat16 weights written by
transformers) with a 151,665-token ChatML tokenizer (`tests.real_models`), bfloat16 compute over float32
parameters as the config says. Shrunk only by overrides of rows, turns, steps and buffer: rollout, update,
evaluation, checkpoint and export. The full depth of all five real-model configs runs in bench/real_shapes.py
(docs/benchmarks.md); the suite runs this one cut because a 151,936-token head costs 10 s per step on 2 cores.

A random policy at this vocabulary never plays a valid move, so every group's rewards are equal: the update
runs (finite loss, entropy near ln V, the rollout's bfloat16 log-probs agreeing with the learner's) and, as a
batch without signal must, changes neither the parameters nor Adam's moments; the checkpoint and the export
both hold the starting weights, and the memory plan printed at start counts the real parameters.
"""

from __future__ import annotations

import json
import math
import re

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from bmrl.checkpoint import Checkpointer
from bmrl.cli import main
from bmrl.memory import GIB
from bmrl.model import from_pretrained
from tests.paths import REPO
from tests.real_models import ARCH, write_model_dir

CONFIG = "qwen2_5_0_5b_sokoban.yaml"
LAYERS = 2
# 2 rows (one task's group of 2), one turn, a buffer that holds the prompt and one reply, 2 steps; the
# evaluation on one task at T=1; a checkpoint at step 2. Nothing about the model.
SHRINK = ["train.steps=2", "train.tasks_per_step=1", "train.group_size=2", "train.minibatches=1",
          "budget.budgets=[1]", "rollout.max_turns=1", "rollout.max_len=224", "eval.ts=[1]", "eval.ks=[1]",
          "eval.attempts=1", "eval.num_tasks=1", "eval.bootstrap=0", "eval.probe_states=0", "checkpoint.every=2",
          "data.train_size=8", "data.val_size=4", "data.test_size=4"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_dir(CONFIG, tmp_path_factory.mktemp("qwen2_5_cut") / "model", layers=LAYERS)


def _flat(state) -> dict[str, np.ndarray]:
    """{path: array} of an nnx state or a restored checkpoint's params (whose leaves end in 'value')."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        out["/".join(k for k in keys if k != "value")] = np.asarray(x)
    return out


def test_real_shapes_train_end_to_end(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--config", str(REPO / "configs" / CONFIG), f"model.path={model_dir}", f"out_dir={out}",
                 *SHRINK, "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed

    start, _ = from_pretrained(model_dir)  # the random weights as bmrl reads them (bfloat16 file, float32 params)
    weights = _flat(nnx.state(start, nnx.Param))
    n_params = sum(x.size for x in weights.values())
    arch = ARCH[CONFIG]
    assert weights["embed_tokens/embedding"].shape == (arch["vocab_size"], arch["hidden_size"])
    assert len(start.layers) == LAYERS and n_params > arch["vocab_size"] * arch["hidden_size"]

    # The memory plan, printed at start, counts the real parameters in float32.
    assert "memory plan per device" in printed
    planned = re.search(r"^  parameters\s+([\d.]+) GiB", printed, re.M)
    assert planned and float(planned.group(1)) == round(4 * n_params / GIB, 3), printed

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and r["rollout/tokens"] > 0
        # Near-uniform over the whole real vocabulary: the head and log-softmax span all 151,936 logits.
        assert math.log(arch["vocab_size"]) - 0.5 < r["train/entropy"] <= math.log(arch["vocab_size"])
        # The rollout's bfloat16 log-probs (KV-cache decode) are the learner's, up to bfloat16 rounding.
        assert abs(r["train/ratio_mean"] - 1) < 0.01 and r["train/ratio_max"] < 1.1, r
        # No valid move, no reward, no signal: the update is counted as such and not taken.
        assert r["train/groups_with_signal"] == 0 and r["train/no_signal_updates"] == 1
    evals = [r for r in records if "eval/pass1_T1" in r]
    assert [r["step"] for r in evals] == [0, 2]  # the starting policy and the trained one, on the test split
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["compiles"] == {"eval_rollout": 1, "budget_sample": 1, "rollout": 1,
                                                             "train_step": 1}  # step 2 reused every program

    # The checkpoint at step 2 verifies and holds the starting weights and Adam's untouched (zero) moments.
    ck = Checkpointer(out / "checkpoints")
    assert ck.all_steps() == [2]
    raw = ck.manager.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    ck.close()
    saved = _flat(raw["params"])
    assert saved.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    moments = [np.asarray(x) for path, x in jax.tree_util.tree_flatten_with_path(raw["opt_state"])[0]
               if any(getattr(k, "key", None) in ("mu", "nu") for k in path)]
    assert len(moments) == 2 * len(weights) and not any(m.any() for m in moments)
    del raw, saved, moments

    # The exported policy: a Hugging Face directory of the same architecture and tokenizer, loading back equal.
    policy, tok = from_pretrained(out / "policy")
    exported = json.loads((out / "policy" / "config.json").read_text())
    assert {k: exported[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "tie_word_embeddings")} == {
        "vocab_size": arch["vocab_size"], "hidden_size": arch["hidden_size"], "num_hidden_layers": LAYERS,
        "tie_word_embeddings": True}
    assert len(tok) == 151665 and tok.convert_tokens_to_ids("<|im_end|>") == 151645 and tok.chat_template
    for name, value in _flat(nnx.state(policy, nnx.Param)).items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
