"""Python environments that come with bmrl: the safe calc tool, the tool-use environment, entry points,
and the Gymnasium adapter (skipped without gymnasium)."""

import builtins
import re
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs import make
from bmrl.envs.python import EntryError, load_entry
from bmrl.envs.python.calc import CalcError, calc
from bmrl.envs.python.jax_env import JaxAsPython
from bmrl.envs.python.tools import ToolUse


@pytest.mark.parametrize("expr, value", [
    ("1 + 2 * 3", 7), ("(3 + 4) * 2", 14), ("-2 ** 3", -8), ("7 / 2", 3.5), ("7 // 2", 3), ("7 % 4", 3),
    ("2 ** 40", 2**40), ("1.5 * 4", 6), ("+5 - -5", 10),
])
def test_calc_computes_arithmetic(expr, value):
    assert calc(expr) == value


@pytest.mark.parametrize("expr, says", [
    ("().__class__", "attribute access"),
    ("__import__('os').system('true')", "function calls"),
    ("import os", "could not parse"),
    ("open('x')", "function calls"),
    ("x + 1", "names"),
    ("'a' * 3", "not a number"),
    ("[1, 2][0]", "indexing"), ("[1, 2]", "List expressions"),
    ("2 ** 1000", "exponent 1000 is too large"),
    ("9 ** 9 ** 9", "too large"),
    ("10 ** 20", "larger than"),
    ("1 / 0", "division by zero"),
    ("1 < 2", "comparisons"),
    ("1 +" * 100, "characters"),
    ("", "needs an expression"),
    ("True + 1", "not a number"),
])
def test_calc_refuses_anything_but_arithmetic(expr, says, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("calc must never call eval/exec")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    with pytest.raises(CalcError, match=re.escape(says)):
        calc(expr)


def test_tool_env_oracle_solves_every_task_in_k_plus_two_steps():
    for seed in range(20):
        env = ToolUse(items=6, k=3)
        obs, info = env.reset(seed=seed)
        assert obs.startswith("Task:") and info["progress"] == 0.0
        for step in range(5):
            obs, reward, term, _, info = env.step(env.oracle())
            if term:
                break
        assert (step, reward, info["success"], info["progress"]) == (4, 1.0, True, 1.0)
    a, b = ToolUse(), ToolUse()
    assert a.reset(seed=7) == b.reset(seed=7) and a.reset(seed=7) != a.reset(seed=8)
    assert a.reset(seed=1, options={"seed": 7}) == b.reset(seed=7)  # a task's seed wins


def test_tool_errors_say_what_to_fix():
    env = ToolUse()
    env.reset(seed=3)
    cases = {"calc os.system": "attribute access", "lookup zebra": "items are", "dance": "use 'lookup <item>'",
             "answer many": "needs a number", "answer -1": "wrong, try again"}
    for action, says in cases.items():
        obs, reward, term, _, info = env.step(action)
        assert says in obs and info["error"] and reward == 0.0 and not term
    assert env.step(env.oracle())[4]["error"] is False


def test_entry_points_are_checked_before_the_run(tmp_path, monkeypatch):
    build = load_entry("bmrl.envs.python.tools:ToolUse", {"k": 3})
    assert build() is not build() and build().k == 3
    (tmp_path / "user_envs.py").write_text(textwrap.dedent("""
        class NoStep:
            def reset(self, *, seed=None, options=None):
                return "hi", {}
        class OldReset:
            def reset(self):
                return "hi", {}
            def step(self, action):
                return "ok", 0.0, False, False, {}
        import not_a_module_anywhere as _x
    """).replace("import not_a_module_anywhere as _x", ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_envs", None)
    bad = {
        "bmrl.envs.python.tools": "must look like 'package.module:factory'",
        "no_such_pkg.mod:make": "importing 'no_such_pkg.mod' failed",
        "bmrl.envs.python.tools:Nope": "has no callable 'Nope'",
        "user_envs:NoStep": "has no step() method",
        "user_envs:OldReset": "wrong signature",
    }
    for entry, says in bad.items():
        with pytest.raises(EntryError, match=re.escape(says)):
            load_entry(entry)
    with pytest.raises(EntryError, match="calling ToolUse"):
        load_entry("bmrl.envs.python.tools:ToolUse", {"k": 99})


def _lake_desc(holes, n):
    cells = ["H" if h else "F" for h in np.asarray(holes)]
    cells[0], cells[-1] = "S", "G"
    return ["".join(cells[r * n:(r + 1) * n]) for r in range(n)]


def _pos(text):
    r, c = re.search(r"At row (\d+), col (\d+)", text).groups()
    return int(r), int(c)


def test_gymnasium_frozenlake_agrees_with_bmrl(tiny_tokenizer):
    pytest.importorskip("gymnasium")
    from bmrl.envs.python.gym_text import GymText

    lake = make("frozenlake", tiny_tokenizer, size=4, eps=0.0, hole_terminates=True)
    ours = JaxAsPython(lake)
    rng = np.random.default_rng(0)
    for seed in range(4):
        holes, _ = lake.level(seed)
        gym = GymText("FrozenLake-v1", is_slippery=False)
        obs_g, _ = gym.reset(seed=seed, options={"desc": _lake_desc(holes, 4)})
        obs_o, _ = ours.reset(seed=0, options={"seed": seed})
        assert _pos(obs_g) == _pos(obs_o) and "Map:" in obs_g
        for action in rng.choice(ours.action_strings, 12):
            g, o = gym.step(str(action)), ours.step(str(action))
            assert (_pos(g[0]), g[1], g[2]) == (_pos(o[0]), o[1], o[2])
            assert g[4]["success"] == o[4]["success"] and g[4]["error"] == o[4]["error"]
            if g[2]:
                break
        gym.reset(seed=seed)  # the oracle walks a shortest path
        for turns in range(1, 20):
            if gym.step(gym.oracle())[2]:
                break
        assert turns == int(lake.optimal_turns({"seed": jnp.int32(seed)}))
    assert gym.step("jump")[4]["invalid"]
