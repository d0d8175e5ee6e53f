"""Every config in configs/ is run by a test (shrunk only by overrides) or listed here with the reason it is not.

`RUN_BY` names, per config, the test file that runs it: that file must name the config's file. `NOT_RUN` gives
the reason for each config the suite does not run. A new config in neither fails this test, and so does a
stale entry (a config that no longer exists, or a test file that no longer names its config).
"""

from __future__ import annotations

from tests.paths import REPO

RUN_BY = {
    "quickstart.yaml": "tests/e2e/study.py",  # bmrl reproduce, shrunk: the report tests' study
    "corridor_tiny.yaml": "tests/study/test_controls.py",  # bmrl compare of scripted policies on its env and eval
    "corridor_long.yaml": "tests/e2e/test_long_horizon.py",  # bmrl train, 2 steps, 8 turns
    "python_env.yaml": "tests/e2e/test_python_env.py",  # bmrl train, 1 step
    "gym_frozenlake.yaml": "tests/e2e/test_python_env.py",  # bmrl train, 1 step
    "qwen2_5_0_5b_sokoban.yaml": "tests/e2e/test_real_shapes.py",  # bmrl train, 2 steps, a 2-layer cut
    "llama3_2_1b_toolchain.yaml": "tests/e2e/test_real_shapes.py",  # bmrl train, LoRA rank 16, 2 steps, 1 layer
}
NOT_RUN = {
    "reproduce_cpu.yaml": "the study itself (about 2,600 s of CPU); its pipeline runs from quickstart.yaml "
                          "(tests/e2e/study.py), and README's figures are this file's runs",
    "reproduce_process.yaml": "reproduce_cpu.yaml plus a process-reward and a GiGPO variant (tests/config/test_config.py "
                              "checks exactly that); process advantages are tested in tests/test_train.py, GiGPO's in "
                              "tests/learn/test_gigpo.py",
    "reproduce_python.yaml": "bmrl reproduce on a Python env runs in tests/e2e/test_reproduce_python.py (about 95 s, "
                             "a corridor of the same jax_env:builtin wrapper); a second study would add about 70 s",
    "sweep_budgets.yaml": "six corridor_tiny RL runs from an SFT base (12-15 min); tests/test_sweep.py loads and "
                          "validates each run it names, and runs the sweep command on tiny configs",
    "qwen_tools.yaml": "Qwen2.5-0.5B as qwen2_5_0_5b_sokoban.yaml (run at a cut by tests/e2e/test_real_shapes.py); "
                       "with its tool env and 256-token replies (120 CPU s per step at 10 of 24 layers) in "
                       "bench/real_shapes.py (docs/benchmarks.md)",
    "qwen3_0_6b_sokoban.yaml": "a 151,936-token head costs about 10 s per step on 2 cores even at a cut; run at its "
                               "real shapes by bench/real_shapes.py (docs/benchmarks.md)",
    "gemma3_1b_tools.yaml": "a 262,144-token head and 256-token replies cost 178 CPU s per step even at one layer; run "
                            "at its real widths by bench/real_shapes.py (docs/benchmarks.md)",
}


def unaccounted(configs: set[str], run_by: dict[str, str], not_run: dict[str, str]) -> list[str]:
    """What is wrong with `run_by` and `not_run` for the config file names `configs` (empty: nothing)."""
    problems = [f"{name}: neither run by a test (RUN_BY) nor listed with a reason (NOT_RUN)"
                for name in sorted(configs - set(run_by) - set(not_run))]
    problems += [f"{name}: listed but not in configs/" for name in sorted((set(run_by) | set(not_run)) - configs)]
    problems += [f"{name}: both run and listed as not run" for name in sorted(set(run_by) & set(not_run))]
    for name, test in sorted(run_by.items()):
        path = REPO / test
        if not path.is_file() or name not in path.read_text():
            problems.append(f"{name}: {test} does not name it")
    problems += [f"{name}: no reason given" for name, why in sorted(not_run.items()) if not why.strip()]
    return problems


def test_every_config_is_run_or_listed_with_a_reason():
    configs = {f.name for f in (REPO / "configs").glob("*.yaml")}
    assert not unaccounted(configs, RUN_BY, NOT_RUN)


def test_the_check_fails_on_a_config_nobody_runs_or_a_stale_entry():
    configs = set(RUN_BY) | set(NOT_RUN)  # the lists' own configs: this test does not depend on configs/
    assert not unaccounted(configs, RUN_BY, NOT_RUN)
    assert unaccounted(configs | {"new.yaml"}, RUN_BY, NOT_RUN) == [
        "new.yaml: neither run by a test (RUN_BY) nor listed with a reason (NOT_RUN)"]
    assert unaccounted(configs - {"quickstart.yaml"}, RUN_BY, NOT_RUN) == ["quickstart.yaml: listed but not in configs/"]
    stale = RUN_BY | {"quickstart.yaml": "tests/test_plan.py"}  # a file that does not name it
    assert unaccounted(configs, stale, NOT_RUN) == ["quickstart.yaml: tests/test_plan.py does not name it"]
    assert unaccounted(configs, RUN_BY, NOT_RUN | {"gemma3_1b_tools.yaml": " "}) == [
        "gemma3_1b_tools.yaml: no reason given"]
