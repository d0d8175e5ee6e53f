"""Real-model configs end to end at the real models' widths and vocabularies, `bmrl train` shrunk only by
overrides of rows, turns, steps and buffer (`tests.real_models.shrink`): rollout, update, evaluation, checkpoint and
export, on random weights written by transformers (`tests.real_models`) with a tokenizer of the real vocabulary,
bfloat16 compute over float32 parameters as the configs say.

- configs/qwen2_5_0_5b_sokoban.yaml, full fine-tuning, on a 2-layer cut of Qwen2.5-0.5B (hidden 896, 14 heads of 64
  over 2 KV heads, MLP 4,864, the 151,936-token vocabulary, tied embeddings) with a 151,665-token ChatML tokenizer.
  A random policy at this vocabulary never plays a valid move, so every group's rewards are equal: the update runs
  (finite loss, entropy near ln V, the rollout's bfloat16 log-probs agreeing with the learner's) and, as a batch
  without signal must, changes neither the parameters nor Adam's moments; the checkpoint and the export both hold
  the starting weights, and the memory plan printed at start counts the real parameters.
- configs/llama3_2_1b_toolchain.yaml with LoRA rank 16 on every projection, on a 1-layer cut of Llama-3.2-1B
  (hidden 2,048, 32 heads of 64 over 8 KV heads, MLP 8,192, llama3 RoPE scaling, the 128,256-token vocabulary, tied
  embeddings). No reward either, so a test estimator gives each group's two rows advantages +1 and -1: the update
  moves the adapters' B (zero at the start) and nothing of the frozen base; the checkpoint holds the adapters alone;
  the PEFT adapter exported beside the merged policy loads back to the same model, whose log-probs transformers +
  PEFT (torch, float32) reproduce on the base directory.

All five real-model configs run in bench/real_shapes.py (docs/benchmarks.md), as deep as 12 GiB of RSS allows; the
suite runs these cuts because a head of 128,256 or 151,936 tokens costs about 10 s per step on 2 cores.
"""

from __future__ import annotations

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from bmrl.checkpoint import Checkpointer
from bmrl.cli import main
from bmrl.learn.advantages import ADVANTAGES
from bmrl.memory import GIB
from bmrl.model import from_pretrained
from tests.paths import REPO
from tests.real_models import ARCH, shrink, write_model_dir

CONFIG = "qwen2_5_0_5b_sokoban.yaml"
LAYERS = 2
LORA_CONFIG = "llama3_2_1b_toolchain.yaml"  # another family (Llama 3: RoPE scaling, 32 query heads over 8)
LORA_RANK = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_dir(CONFIG, tmp_path_factory.mktemp("qwen2_5_cut") / "model", layers=LAYERS)


@pytest.fixture(scope="module")
def lora_model_dir(tmp_path_factory):
    return write_model_dir(LORA_CONFIG, tmp_path_factory.mktemp("llama3_2_cut") / "model", layers=1)


def _flat(state) -> dict[str, np.ndarray]:
    """{path: array} of an nnx state or a restored checkpoint's params (whose leaves end in 'value')."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        out["/".join(k for k in keys if k != "value")] = np.asarray(x)
    return out


def _train(capsys, name: str, model_dir, out, *extra: str, evaluate: bool = True) -> tuple[str, list[dict]]:
    """`bmrl train` of config `name` on `model_dir` shrunk (`shrink`), with `extra` overrides (`evaluate=False`:
    `--no-eval`): (what it printed, its two steps' records). Checks what every real-shape run must show: two steps
    with a finite loss over rollout tokens, entropy near ln V (a random policy: the head and log-softmax span the
    whole vocabulary), the rollout's bfloat16 log-probs (KV-cache decode) agreeing with the learner's, the
    evaluation at the start and the end (`evaluate`), a memory plan printed at start, and step 2 reusing every
    compiled program."""
    code = main(["train", "--config", str(REPO / "configs" / name), f"model.path={model_dir}", f"out_dir={out}",
                 *shrink(name), *extra, "--no-progress", *([] if evaluate else ["--no-eval"])])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "memory plan per device" in printed
    vocab = ARCH[name]["vocab_size"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and r["rollout/tokens"] > 0
        assert math.log(vocab) - 0.5 < r["train/entropy"] <= math.log(vocab)
        assert abs(r["train/ratio_mean"] - 1) < 0.01 and r["train/ratio_max"] < 1.1, r
        assert r["train/groups_with_signal"] == 0  # no valid move, no reward
    evals = [r["step"] for r in records if "eval/pass1_T1" in r]
    assert evals == ([0, 2] if evaluate else [])  # the starting policy and the trained one, on the test split
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["compiles"] == {"budget_sample": 1, "rollout": 1, "train_step": 1} | (
        {"eval_rollout": 1} if evaluate else {})  # step 2 reused every program
    return printed, steps


def _checkpoint(out) -> dict:
    """The run's one checkpoint (step 2), restored raw (its verification included)."""
    ck = Checkpointer(out / "checkpoints")
    assert ck.all_steps() == [2]
    raw = ck.manager.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    ck.close()
    return raw


def test_real_shapes_train_end_to_end(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    printed, steps = _train(capsys, CONFIG, model_dir, out)

    start, _ = from_pretrained(model_dir)  # the random weights as bmrl reads them (bfloat16 file, float32 params)
    weights = _flat(nnx.state(start, nnx.Param))
    n_params = sum(x.size for x in weights.values())
    arch = ARCH[CONFIG]
    assert weights["embed_tokens/embedding"].shape == (arch["vocab_size"], arch["hidden_size"])
    assert len(start.layers) == LAYERS and n_params > arch["vocab_size"] * arch["hidden_size"]

    # The memory plan, printed at start, counts the real parameters in float32.
    planned = re.search(r"^  parameters\s+([\d.]+) GiB", printed, re.M)
    assert planned and float(planned.group(1)) == round(4 * n_params / GIB, 3), printed
    # No signal: the update is counted as such and not taken.
    assert all(r["train/no_signal_updates"] == 1 for r in steps)

    # The checkpoint at step 2 verifies and holds the starting weights and Adam's untouched (zero) moments.
    raw = _checkpoint(out)
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


def _by_position(rewards, group_size):
    """Advantages from +1 down to -1 along each group, whatever its rewards: signal for an update although a random
    policy at a real vocabulary earns no reward."""
    return jnp.tile(jnp.linspace(1.0, -1.0, group_size), rewards.shape[0] // group_size)


def test_real_shapes_lora_trains_the_adapters_alone(lora_model_dir, tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from bmrl.model.lora import LoRAParam
    from bmrl.model.peft import adapter_config, from_adapter_dir

    monkeypatch.setitem(ADVANTAGES, "by_position", _by_position)
    out = tmp_path / "run"
    printed, steps = _train(capsys, LORA_CONFIG, lora_model_dir, out, f"model.lora.rank={LORA_RANK}",
                            "train.advantage=by_position", evaluate=False)  # evaluation: the test above
    assert all(r["train/no_signal_updates"] == 0 for r in steps)  # both updates taken
    assert re.search(r"^  parameters .*\(frozen base [\d.]+ \+ adapters [\d.]+\)", printed, re.M), printed

    # The checkpoint holds the adapters alone (A and B of the 7 projections of the one layer); every B, zero at the
    # start, has moved.
    saved = _flat(_checkpoint(out)["params"])
    assert sorted({k.rsplit("/", 1)[1] for k in saved}) == ["lora_a", "lora_b"] and len(saved) == 2 * 7
    moved = {k: bool(v.any()) for k, v in saved.items() if k.endswith("lora_b")}
    assert all(moved.values()), moved

    # The exported files: the PEFT adapter holds the checkpoint's adapters; the merged policy is the base's file
    # bit for bit (in float32) but for the adapted kernels, which are the base's + (alpha / r) B A.
    spec, base_dir = adapter_config(out / "policy_adapter")
    assert spec.rank == LORA_RANK and base_dir.resolve() == lora_model_dir.resolve()
    adapter = load_file(str(out / "policy_adapter" / "adapter_model.safetensors"))
    base = load_file(str(lora_model_dir / "model.safetensors"))  # bfloat16, as transformers wrote it
    merged = load_file(str(out / "policy" / "model.safetensors"))
    arch = ARCH[LORA_CONFIG]
    assert base["model.embed_tokens.weight"].shape == (arch["vocab_size"], arch["hidden_size"])
    assert merged.keys() == base.keys() and len(adapter) == len(saved)
    for name, weight in base.items():
        stem = name.removesuffix(".weight")  # model.layers.0.self_attn.q_proj
        path = "/".join(stem.split(".")[1:])  # layers/0/self_attn/q_proj: bmrl's path of the same module
        if f"{path}/lora_a" not in saved:
            assert torch.equal(merged[name], weight.float()), name
            continue
        a, b = (adapter[f"base_model.model.{stem}.lora_{x}.weight"] for x in "AB")
        np.testing.assert_array_equal(a.numpy().T, saved[f"{path}/lora_a"], err_msg=name)
        np.testing.assert_array_equal(b.numpy().T, saved[f"{path}/lora_b"], err_msg=name)
        torch.testing.assert_close(merged[name], weight.float() + spec.scale * b @ a, rtol=0, atol=1e-6)
    del adapter, base, merged

    # The adapter loads back (the base it names + its adapters), and transformers' Llama with PEFT's LoRA on that
    # base directory gives the same log-probs (float32).
    adapted, _ = from_adapter_dir(out / "policy_adapter")
    for name, value in _flat(nnx.state(adapted, LoRAParam)).items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    tokens = np.random.default_rng(0).integers(0, arch["vocab_size"], (1, 32)).astype(np.int32)
    graphdef, state = nnx.split(adapted)
    want = np.asarray(jax.jit(lambda t, s: jax.nn.log_softmax(nnx.merge(graphdef, s)(t), axis=-1))(tokens, state))
    del adapted, state
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(str(lora_model_dir), dtype=torch.float32).eval()
        hf = peft.PeftModel.from_pretrained(hf, str(out / "policy_adapter")).eval()
        got = torch.log_softmax(hf(torch.tensor(tokens, dtype=torch.long)).logits, -1).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
