"""The SFT base policy: it learns the task but stays imperfect; its files load back; bad configs exit 2."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bmrl.config import ConfigError, build
from bmrl.sft import run_sft
from bmrl.model import from_pretrained

OVERRIDES = [
    "env.name=corridor", "env.options={length: 4, eps: 0.1}",
    "model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=1",  # 2 layers: the same numbers
    "budget.budgets=[8]", "rollout.max_turns=12", "rollout.max_reply_tokens=4", "rollout.max_len=352",
    "rollout.compact_min_rows=0",  # 32-row evaluations: compaction (its own test) would compile a second turn
    "sft.steps=80", "sft.batch_size=32", "sft.noise=0.25", "sft.demo_turns=6",
    "sft.optim.lr=0.005", "sft.optim.warmup_steps=10", "sft.optim.schedule=constant",
    "eval.ts=[4,8]", "eval.ks=[1]", "eval.attempts=1", "eval.num_tasks=32",
    "data.train_size=512", "data.test_size=64",
]


# A checkpoint at every log step (every 8 steps, keeping 2): the resume test restarts from this run's step-73 one.
CHECKPOINTS = ["checkpoint.keep=2", "sft.checkpoint_minutes=0"]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "run"
    cfg = build({}, OVERRIDES + CHECKPOINTS + [f"out_dir={out}"])
    summary, model = run_sft(cfg, log=lambda _: None, return_model=True)
    return cfg, summary, model


def test_sft_learns_an_imperfect_base_policy(sft_run):
    cfg, s, _ = sft_run
    assert s["eval_T"] == 8
    assert s["init_success_greedy"] <= 0.1, s  # a random tiny model does not walk corridors
    assert s["success_greedy"] >= 0.6, s  # cloned the oracle's decisions
    # ... but it is a base policy that errs when sampled, at about the demonstrations' noise rate.
    assert s["decision_accuracy_sampled"] < 0.97 and s["error_rate_sampled"] > 0.02, s
    assert s["decision_accuracy_greedy"] > s["decision_accuracy_sampled"], s
    assert s["final_loss"] < 1.0
    rows = [json.loads(line) for line in open(os.path.join(cfg.out_dir, "sft_metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(cfg.sft.steps))
    assert rows[-1]["loss"] < rows[0]["loss"] / 3
    # demonstrations: cut after the first wrong action, so most end early
    assert 0.2 < rows[-1]["demo_cut"] < 1.0 and rows[-1]["demo_wrong_rate"] > 0


def test_outputs_load_back_identically(sft_run):
    cfg, s, model = sft_run
    out = cfg.out_dir
    for name in ("config.yaml", "summary.json", "sft_metrics.jsonl", "policy/config.json", "policy/model.safetensors",
                 "policy/tokenizer.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert json.load(open(os.path.join(out, "summary.json")))["success_greedy"] == s["success_greedy"]
    loaded, tok = from_pretrained(os.path.join(out, "policy"))
    assert tok is not None and len(tok) <= loaded.config.vocab_size
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, len(tok), (2, 40)), jnp.int32)
    np.testing.assert_array_equal(np.asarray(loaded(tokens)), np.asarray(model(tokens)))
    from bmrl.config import load

    again = load(os.path.join(out, "config.yaml"))
    assert again == cfg


def test_killed_sft_resumes_bitwise(sft_run, tmp_path, monkeypatch):
    """The module's run, killed after its step-73 checkpoint (of 80; its step-80 checkpoint, summary and policy
    never written, its sft_metrics.jsonl holding lines past the checkpoint as a kill between checkpoints
    leaves them), run again: it resumes at step 73, redoes only the steps after it, and ends exactly as the
    uninterrupted run: bitwise the same weights, the same sft_metrics.jsonl (times aside) and summary. The
    evaluations, a function of the weights, are the module run's (each would compile its programs again)."""
    import shutil

    import bmrl.sft

    cfg0, ref, ref_model = sft_run
    out = tmp_path / "run"
    shutil.copytree(cfg0.out_dir, out)
    assert sorted(os.listdir(out / "checkpoints")) == ["73", "80"]
    for name in ("checkpoints/80", "summary.json", "policy"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    cfg = build({}, OVERRIDES + CHECKPOINTS + [f"out_dir={out}"])
    initial = {"greedy": {**ref["eval"]["greedy"], "success": ref["init_success_greedy"]}}
    monkeypatch.setattr(bmrl.sft, "evaluate_policy", lambda *a, **k: initial if a[6:] == (("greedy",),) else ref["eval"])
    lines = []
    summary, model = run_sft(cfg, log=lines.append, return_model=True)
    assert any(line.startswith("sft: resumed from ") and line.endswith("at step 73") for line in lines), lines
    assert [int(line.split()[2]) for line in lines if line.startswith("sft step")] == [79]  # 73.. only
    a, b = nnx.state(ref_model, nnx.Param), nnx.state(model, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    untimed = lambda rows: [{k: v for k, v in r.items() if k != "time_s"} for r in rows]  # noqa: E731
    metrics = [untimed(map(json.loads, open(os.path.join(c.out_dir, "sft_metrics.jsonl")))) for c in (cfg0, cfg)]
    assert metrics[0] == metrics[1] and len(metrics[1]) == cfg.sft.steps
    timeless = lambda s: {k: v for k, v in s.items() if k not in ("train_time_s", "wall_time_s", "policy_dir")}  # noqa: E731
    assert timeless(summary) == timeless(ref)


def test_bad_sft_config_exits_2_and_writes_nothing(tmp_path, capsys):
    from bmrl.cli import main

    for override in ("sft.noise=1.5", "rollout.max_len=64", "model.path=/nonexistent/policy"):
        out = tmp_path / override.split("=")[0]
        (tmp_path / "cfg.yaml").write_text("seed: 0\n")
        with pytest.raises(SystemExit) as exc:
            main(["sft", "--config", str(tmp_path / "cfg.yaml"), override, f"out_dir={out}"])
        assert exc.value.code == 2, override
        err = capsys.readouterr().err
        assert override.split("=")[0] in err, err
        assert not out.exists(), override


def test_check_fits_refuses_and_warns(tiny_tokenizer):
    from bmrl.assembly import JaxPlayer, make_budget
    from bmrl.rollout import default_format

    cfg = build({}, ["env.options={length: 4}", "rollout.max_len=200", "rollout.max_turns=12", "eval.ts=[1,4,8]",
                     "budget.kind=mix", "budget.budgets=[2,8]"])
    env = JaxPlayer.make_env(cfg, tiny_tokenizer)
    with pytest.warns(UserWarning, match="largest cap"):
        problems = JaxPlayer(cfg, env, default_format(env)).check_fits(make_budget(cfg.budget))
    assert problems
    with pytest.raises(ConfigError, match="rollout.max_reply_tokens"):
        bad = build({}, ["rollout.max_reply_tokens=1"])
        JaxPlayer(bad, env, default_format(env)).check_fits(make_budget(bad.budget))
