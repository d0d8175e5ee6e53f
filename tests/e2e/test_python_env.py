"""Python environments from a config file (env.kind=python): train and eval through the CLI, faults
counted and logged with their task, the wrapped corridor evaluating to the compiled path's numbers,
and a broken entry refused (exit 2) before anything is written."""

from __future__ import annotations

import itertools
import json
import textwrap
import warnings

import numpy as np
import pytest

from bmrl.cli import main
from bmrl.data import level_hashes, task_splits

# A two-action guessing game; a task with "boom" raises in step (a fault of user code, not a crash).
ENV_MODULE = '''
class Guess:
    action_strings = ("a", "b")
    instructions = "Guess the letter: reply a or b."

    def __init__(self, hint=True):
        self.hint = hint

    def reset(self, *, seed=None, options=None):
        self.task = dict(options or {})
        return ("Say " + self.task["target"] + ".\\n") if self.hint else "Guess.\\n", {}

    def step(self, action):
        if self.task.get("boom"):
            raise RuntimeError("boom in task " + self.task["id"])
        won = action == self.task["target"]
        info = {"success": won, "error": not won, "oracle_action": self.task["target"]}
        return ("Right.\\n" if won else "Wrong.\\n"), float(won), won, False, info


def make(hint=True):
    return Guess(hint)
'''
# 34 tasks, two in three with "boom"; split by content (`bmrl.data.task_splits`): 28 train (19 boom),
# 3 validation, 3 test: g12 (boom), g13, g33 (boom).
TASKS = [{"id": f"g{i}", "target": "ab"[i % 2], **({"boom": True} if i % 3 != 1 else {})} for i in range(34)]
CONFIG = """\
seed: 0
model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
env: {kind: python, entry: "MODULE:make", options: {hint: true}, step_timeout_s: 20.0, workers: 4}
data: {tasks: tasks.jsonl}
budget: {kind: fixed, budgets: [3]}
rollout: {max_turns: 3, max_reply_tokens: 4, max_len: 128}
train: {steps: 2, tasks_per_step: 2, group_size: 2}
eval: {ts: [1, 3], ks: [1], attempts: 1, num_tasks: 3, mode: truncate, bootstrap: 0, probe_states: 4}
checkpoint: {every: 2, keep: 1}
"""


def _write(tmp_path, module: str, body: str = ENV_MODULE, tasks=TASKS) -> str:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG.replace("MODULE", module))
    return str(path)


def test_train_then_eval_a_python_env_from_a_config(tmp_path, monkeypatch, capsys):
    """The entry is found next to the config file (not on sys.path, not in the working directory); two
    steps train; every fault (the boom tasks) is counted per step and logged with its task; eval runs it."""
    (tmp_path / "conf").mkdir()
    cfg = _write(tmp_path / "conf", "pyenvcfg_guess")
    monkeypatch.chdir(tmp_path)  # out_dir relative to here; the module is only in conf/
    assert main(["train", "--config", cfg, "out_dir=run", "--no-progress"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    faults = [r["rollout/faults"] for r in records if "rollout/faults" in r]
    assert len(faults) == 2 and sum(faults) > 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "faults.jsonl").read_text().splitlines()]
    assert len(logged) == sum(faults)
    assert all(x["task"]["boom"] and x["kind"] == "exception" and "boom in task" in x["message"] for x in logged)
    splits = task_splits(TASKS)
    assert {x["task"]["id"] for x in logged} <= {t["id"] for t in splits.tasks["train"] if t.get("boom")}
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert str(tmp_path / "conf" / "tasks.jsonl") in saved  # the run's config stands on its own

    # A run killed after logging step 3's faults but before its checkpoint: the resume replays step 3
    # and its faults are in the file once (the stale line is dropped).
    with open(tmp_path / "run" / "faults.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "row": 0, "task": {"id": "stale"}, "turn": 0, "kind": "exception",
                            "message": "from the killed run"}) + "\n")
    assert main(["train", "--config", cfg, "out_dir=run", "train.steps=3", "--no-progress"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step3 = [r["rollout/faults"] for r in records if "rollout/faults" in r and r["step"] == 3]
    logged = [json.loads(line) for line in (tmp_path / "run" / "faults.jsonl").read_text().splitlines()]
    assert len(step3) == 1 and [x for x in logged if x["step"] <= 2] == logged[: sum(faults)]
    assert len([x for x in logged if x["step"] == 3]) == step3[0]
    assert all(x["task"]["id"] != "stale" for x in logged)

    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["eval", "--config", cfg, "--policy", str(tmp_path / "run" / "policy"), "out_dir=run",
                     "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "skipped the decision-accuracy probes and error injection" in err
    res = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    policy = res["policies"]["policy"]
    assert [t["id"] for t in splits.tasks["test"]] == ["g12", "g13", "g33"]  # the fixture: a boom among them
    assert policy["faults"] > 0 and policy["tasks"] == 3  # the test split

    # compare on the Python env: F2's states carry the oracle's action from info["oracle_action"]; a
    # policy against itself moves nothing, so both verdicts are inconclusive. Scripted policies need a
    # JAX env's state: refused, exit 2.
    policy_dir = str(tmp_path / "run" / "policy")
    overrides = ["out_dir=run", "eval.bootstrap=20", "eval.attempts=2", "eval.ks=[1,2]"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["compare", "--config", cfg, "--base", policy_dir, "--trained", policy_dir, *overrides]) == 0
        summary = json.loads((tmp_path / "run" / "compare" / "summary.json").read_text())
        assert summary["findings"]["F2"]["shared_states"]["clean"] > 0
        assert {summary["findings"][f]["verdict"] for f in ("F1", "F2")} == {"inconclusive"}
        capsys.readouterr()
        assert main(["compare", "--config", cfg, "--base", "scripted:oracle", "--trained", policy_dir, *overrides]) == 2
    assert "scripted policies act on a JAX env's state" in capsys.readouterr().err


@pytest.fixture(scope="module")
def corridor_policy(tiny_tokenizer):
    from bmrl.envs import make
    from bmrl.rollout import default_format
    from tests.rollout_helpers import steered_policy

    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    return steered_policy(env, default_format(env), seed=2, scale=3.0)


def test_wrapped_corridor_evaluates_like_the_compiled_one(tmp_path, tiny_tokenizer, corridor_policy):
    """The same policy, keys and test tasks: env.kind=python with the corridor wrapped
    (`bmrl.envs.python.jax_env:builtin`) gives the jax-kind run's first-success turns, exactly, in
    exact and truncate mode (mode both); so the same Pass@(1,T)."""
    from bmrl.assembly import split_tasks
    from bmrl.config import build, load
    from bmrl.eval.run import evaluate_policies
    from bmrl.eval.settings import EvalSettings

    base = {
        "seed": 3, "env": {"name": "corridor", "options": {"length": 3, "eps": 0.2}},
        "rollout": {"max_turns": 6, "max_reply_tokens": 6, "max_len": 512, "temperature": 1.0},
        "eval": {"ts": [2, 3, 6], "ks": [1, 2], "attempts": 2, "num_tasks": 6, "mode": "both", "bootstrap": 0,
                 "probe_states": 0, "temperature": 1.0},
        "budget": {"kind": "fixed", "budgets": [6]},
    }
    train, test = (split_tasks(build(base), split, 6)["seed"] for split in ("train", "test"))
    # The task file's split is by content: each line gets the first "salt" (a key the corridor ignores)
    # that puts it in the split the JAX run holds its seed in (hash % 16: 0 test, >= 2 train).
    lines = [_salted(int(s), test=i % 2 == 1) for pair in zip(train, test) for i, s in enumerate(pair)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    py = dict(base, env={"kind": "python", "entry": "bmrl.envs.python.jax_env:builtin",
                         "options": {"name": "corridor", "length": 3, "eps": 0.2}},
              data={"tasks": "tasks.jsonl"})
    (tmp_path / "py.yaml").write_text(json.dumps(py))
    policies = {"p": (corridor_policy, tiny_tokenizer)}
    quiet = lambda msg: None  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jax_cfg, py_cfg = build(base), load(tmp_path / "py.yaml")
        jax_res = evaluate_policies(jax_cfg, policies, EvalSettings.from_config(jax_cfg, inject_turns=()), log=quiet)["p"]
        py_res = evaluate_policies(py_cfg, policies, EvalSettings.from_config(py_cfg, inject_turns=()), log=quiet)["p"]
    assert py_res.faults == 0 and jax_res.faults is None
    np.testing.assert_array_equal(py_res.first_success_turn, jax_res.first_success_turn)
    np.testing.assert_array_equal(py_res.surface.estimate, jax_res.surface.estimate)
    np.testing.assert_array_equal(py_res.surface_truncate.estimate, jax_res.surface_truncate.estimate)
    assert py_res.max_abs_difference == jax_res.max_abs_difference == 0.0  # budget hidden: truncation is exact
    p1 = jax_res.pass1()[0]
    assert 0 < p1[-1] < 1 and p1[0] == 0.0, p1  # a real surface: corridors of 3 need 3 turns


def _salted(seed: int, test: bool) -> dict:
    """`{"seed": seed, "salt": n}` with the first n whose content hash puts it in test (or in train)."""
    for salt in itertools.count():
        bucket = int(level_hashes(None, [{"seed": seed, "salt": salt}])[0]) % 16
        if (bucket == 0) if test else (bucket >= 2):
            return {"seed": seed, "salt": salt}


BROKEN = {
    "import error": ("import no_such_module_anywhere\n", "env.entry"),
    "no factory": ("x = 1\n", "env.entry"),
    "wrong signature": (("class E:\n    def reset(self, seed):\n        return '', {}\n    def step(self, a):\n"
                         "        pass\n\ndef make(hint=True):\n    return E()\n"), "env.entry"),
    "factory raises": ("def make(hint=True):\n    raise ValueError('hint must be a letter')\n", "env.options"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_entry_exits_2_before_anything_is_written(case, tmp_path, monkeypatch, capsys):
    body, key = BROKEN[case]
    module = "pyenvcfg_broken_" + case.replace(" ", "_")
    cfg = _write(tmp_path, module, body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", cfg, "out_dir=out", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"config error: {key}" in err and module in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


JAX_CONFIG = """\
seed: 0
model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
env: {name: corridor, options: {length: 3}}
data: {train_size: 32, val_size: 4, test_size: 4}
budget: {kind: fixed, budgets: [3]}
rollout: {max_turns: 3, max_reply_tokens: 3, max_len: 192}
train: {steps: 2, tasks_per_step: 2, group_size: 2}
eval: {ts: [3], ks: [1], attempts: 1, num_tasks: 4, mode: truncate, bootstrap: 0, probe_states: 4}
checkpoint: {every: 2, keep: 1}
"""


# New families through `bmrl train`, one run per env kind, the two that between them take every decoder
# path the new families add (Gemma 3: q/k norms, sandwich norms, sliding/global layers with their own
# RoPE; Gemma 2: tanh soft-capping, GeGLU, sliding window). Qwen3 (q/k norms) and Mistral (a sliding window)
# add no path of their own and were dropped (~25 s each on 2 cores); each family's forward is checked
# against transformers in tests/model/families/test_parity.py, and the model is called the same way by both kinds of
# env (tests/rollout/test_host.py). Add ("qwen3", "jax"), ("mistral", "python") for the full list.
TRAIN_RUNS = [("gemma3_text", "python"), ("gemma2", "jax")]


@pytest.mark.slow
@pytest.mark.parametrize("family, kind", TRAIN_RUNS)
def test_every_family_trains(family, kind, tmp_path, monkeypatch):
    """`bmrl train` runs 2 RL steps of a tiny model of the family (sliding window 8, shorter than the
    contexts) on the compiled corridor or a Python env, and saves a policy of that family."""
    if kind == "python":
        path = _write(tmp_path, f"pyenvcfg_{family}", tasks=[t for t in TASKS if "boom" not in t])
    else:
        path = str(tmp_path / "jax.yaml")
        (tmp_path / "jax.yaml").write_text(JAX_CONFIG)
    monkeypatch.chdir(tmp_path)
    args = ["train", "--config", path, "out_dir=run", f"model.model_type={family}", "model.sliding_window=8"]
    assert main([*args, "--no-progress"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses) == 2 and np.isfinite(losses).all()
    saved = json.loads((tmp_path / "run" / "policy" / "config.json").read_text())
    assert saved["model_type"] == family and saved["sliding_window"] == 8


@pytest.mark.parametrize("name", ["gym_frozenlake.yaml", "python_env.yaml"])
def test_shipped_python_env_config_trains(name, tmp_path, capsys):
    """The shipped Python-env configs (Gymnasium's FrozenLake through GymText; the built-in tool env) train one
    step and evaluate, shrunk by overrides of steps and rows only."""
    from tests.paths import REPO

    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "--config", str(REPO / "configs" / name), f"out_dir={out}", "train.steps=1",
                     "train.tasks_per_step=2", "train.group_size=2", "train.minibatches=1", "eval.num_tasks=2",
                     "eval.attempts=1", "eval.ks=[1]", "checkpoint.every=1", "--no-progress"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in records if "train/loss" in r]
    assert np.isfinite(step["train/loss"]) and step["rollout/tokens"] > 0
    assert "memory plan per device" in capsys.readouterr().out
    assert (out / "policy" / "model.safetensors").is_file() and (out / "checkpoints" / "1").is_dir()
