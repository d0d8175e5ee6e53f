"""`bmrl sweep`: expansion (grid x zip x seeds) and directory names, validation before any run,
reruns that skip finished runs, failed runs that are reported and retried, the summary table."""

from __future__ import annotations

import csv
import json
import os

import pytest
import yaml

from bmrl import sweep as sweep_lib
from bmrl.cli import main
from bmrl.config import ConfigError
from tests.paths import REPO



class Fake:
    """A sweep command for tests: records each run's config, returns metrics derived from it, and
    fails (optionally after writing a summary) on the seeds in `fail_seeds`."""

    def __init__(self, fail_seeds=(), write_before_fail=False):
        self.calls: list = []
        self.fail_seeds, self.write_before_fail = set(fail_seeds), write_before_fail

    def __call__(self, cfg):
        self.calls.append(cfg)
        summary = {
            "score": cfg.seed * 100 + cfg.train.group_size + (0.5 if cfg.budget.kind == "mix" else 0.0),
            "eval": {"8": {"pass1": cfg.train.group_size / 10}},
            "note": "strings are not metrics",
            "history": [1, 2],
        }
        if cfg.seed in self.fail_seeds:
            if self.write_before_fail:
                with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
                    json.dump(summary, f)
            raise RuntimeError(f"boom at seed {cfg.seed}")
        with open(os.path.join(cfg.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f)
        return summary


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", f)
    return f


SPEC = {
    "command": "fake",
    "overrides": {"train.steps": 3, "env": {"options": {"length": 5}}},
    "zip": {"budget.kind": ["fixed", "mix"], "budget.budgets": [[4], [2, 8]]},
    "grid": {"train.group_size": [4, 8], "train.optim.lr": [0.001]},
    "seeds": [0, 1],
}
NAMES = [
    f"kind={k},budgets={b},group_size={g},lr=0.001,seed={s}"
    for s in (0, 1) for k, b in (("fixed", "4"), ("mix", "2+8")) for g in (4, 8)
]


def _write(tmp_path, spec, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def _sweep(tmp_path, capsys, spec, *extra):
    overrides = [e for e in extra if not e.startswith("--")]  # argparse: positionals before options
    flags = [e for e in extra if e.startswith("--")]
    code = main(["sweep", _write(tmp_path, spec), *overrides, "--out", str(tmp_path / "out"), *flags])
    return code, capsys.readouterr()


def test_expansion_run_list_and_names(tmp_path, fake):
    s = sweep_lib.load_sweep(_write(tmp_path, SPEC), out_dir=str(tmp_path / "out"))
    assert [r.name for r in s.runs] == NAMES
    assert s.keys == ["budget.kind", "budget.budgets", "train.group_size", "train.optim.lr", "seed"]
    r = s.runs[3]  # seed 0, mix, group_size 8
    assert r.values == {"budget.kind": "mix", "budget.budgets": [2, 8], "train.group_size": 8, "train.optim.lr": 0.001, "seed": 0}
    c = r.config
    assert (c.seed, c.budget.kind, c.budget.budgets, c.train.group_size, c.train.optim.lr) == (0, "mix", [2, 8], 8, 0.001)
    assert (c.train.steps, c.env.options, c.out_dir) == (3, {"length": 5}, str(tmp_path / "out" / NAMES[3]))
    assert not (tmp_path / "out").exists()  # loading writes nothing


def test_expand_orders_seeds_zip_grid():
    spec = sweep_lib.SweepSpec(zip={"a": [1, 2]}, grid={"b": [1, 2], "c": [1, 2]}, seeds=[7])
    got = [(v["a"], v["b"], v["c"]) for v in sweep_lib.expand(spec)]
    assert got == [(1, 1, 1), (1, 1, 2), (1, 2, 1), (1, 2, 2), (2, 1, 1), (2, 1, 2), (2, 2, 1), (2, 2, 2)]
    assert sweep_lib.expand(sweep_lib.SweepSpec()) == [{}]  # no sweep axes: one run
    assert sweep_lib.short_names(["train.optim.lr", "sft.optim.lr", "seed"]) == {
        "train.optim.lr": "train.optim.lr", "sft.optim.lr": "sft.optim.lr", "seed": "seed"}


def test_labels_name_zip_entries(tmp_path, fake):
    spec = {**SPEC, "labels": ["tight", "mixed"], "grid": {}}
    s = sweep_lib.load_sweep(_write(tmp_path, spec))
    assert [r.name for r in s.runs] == ["tight,seed=0", "mixed,seed=0", "tight,seed=1", "mixed,seed=1"]
    assert s.out_dir == os.path.join("runs", "sweep")  # default: runs/<file name>


def test_run_write_configs_and_summary_table(tmp_path, capsys, fake):
    code, out = _sweep(tmp_path, capsys, SPEC)
    assert code == 0 and len(fake.calls) == 8
    root = tmp_path / "out"
    for name, cfg in zip(NAMES, fake.calls):
        saved = yaml.safe_load((root / name / "config.yaml").read_text())
        assert saved["out_dir"] == cfg.out_dir == str(root / name)
        assert saved["seed"] == cfg.seed and saved["budget"]["budgets"] == cfg.budget.budgets
    rows = list(csv.reader(open(root / "summary.csv")))
    assert rows[0] == ["run", "status", "budget.kind", "budget.budgets", "train.group_size", "train.optim.lr", "seed",
                       "score", "eval.8.pass1"]  # scalar metrics only, nested keys dotted
    assert rows[4] == [NAMES[3], "done", "mix", "[2, 8]", "8", "0.001", "0", "8.5", "0.8"]
    assert [r[-2] for r in rows[1:]] == ["4.0", "8.0", "4.5", "8.5", "104.0", "108.0", "104.5", "108.5"]
    md = (root / "summary.md").read_text()
    assert f"| {NAMES[3]} | done | mix | [2, 8] | 8 | 0.001 | 0 | 8.5 | 0.8 |" in md
    assert md in out.out  # printed at the end
    assert yaml.safe_load((root / "sweep.yaml").read_text())["runs"] == NAMES


def test_rerun_skips_finished_runs(tmp_path, capsys, fake):
    assert _sweep(tmp_path, capsys, SPEC)[0] == 0
    fake.calls.clear()
    code, out = _sweep(tmp_path, capsys, SPEC)
    assert code == 0 and fake.calls == []
    assert out.out.count("skipped, already finished") == 8
    rows = list(csv.reader(open(tmp_path / "out" / "summary.csv")))
    assert {r[1] for r in rows[1:]} == {"skipped"} and rows[4][-2] == "8.5"  # metrics read back
    # a run whose summary is gone is run again; the others stay skipped
    os.remove(tmp_path / "out" / NAMES[5] / "summary.json")
    _sweep(tmp_path, capsys, SPEC)
    assert [c.out_dir for c in fake.calls] == [str(tmp_path / "out" / NAMES[5])]
    # a CLI override changes the configs: the run directories made with other settings are refused
    # before any work (exit 2, the one rule of bmrl.rundir), nothing rewritten
    fake.calls.clear()
    before = (tmp_path / "out" / "summary.csv").read_bytes()
    code, out = _sweep(tmp_path, capsys, SPEC, "train.steps=4")
    assert code == 2 and fake.calls == [] and "train.steps" in out.err and "delete" in out.err
    assert (tmp_path / "out" / "summary.csv").read_bytes() == before


def test_unwritable_sweep_dir_exits_2(tmp_path, capsys, fake):
    (tmp_path / "out").write_text("a file where the sweep directory should be")
    code, out = _sweep(tmp_path, capsys, SPEC)
    assert code == 2 and fake.calls == [] and "not a directory" in out.err


@pytest.mark.parametrize("write_before_fail", [False, True])
def test_failed_run_is_reported_and_retried(tmp_path, capsys, monkeypatch, write_before_fail):
    failing = Fake(fail_seeds={1}, write_before_fail=write_before_fail)
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", failing)
    code, out = _sweep(tmp_path, capsys, SPEC)
    assert code == 1 and len(failing.calls) == 8  # keeps going after a failure
    assert "FAILED" in out.out and "boom at seed 1" in out.out and "4 of 8 runs failed" in out.err
    root = tmp_path / "out"
    for name in NAMES[4:]:
        assert not (root / name / "summary.json").exists()
        assert "RuntimeError: boom at seed 1" in (root / name / "error.txt").read_text()
        assert (root / name / "summary.json.failed").exists() == write_before_fail
    rows = list(csv.reader(open(root / "summary.csv")))
    assert [r[1] for r in rows[1:]] == ["done"] * 4 + ["failed"] * 4
    assert "- " + NAMES[4] + ": RuntimeError: boom at seed 1" in (root / "summary.md").read_text()
    # the rerun retries exactly the failed runs; once they succeed, error.txt goes
    fixed = Fake()
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", fixed)
    code, out = _sweep(tmp_path, capsys, SPEC)
    assert code == 0 and [c.out_dir for c in fixed.calls] == [str(root / n) for n in NAMES[4:]]
    assert not (root / NAMES[4] / "error.txt").exists()


def test_fail_fast_stops_and_lists_pending(tmp_path, capsys, monkeypatch):
    failing = Fake(fail_seeds={0})
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", failing)
    code, _ = _sweep(tmp_path, capsys, SPEC, "--fail-fast")
    assert code == 1 and len(failing.calls) == 1
    rows = list(csv.reader(open(tmp_path / "out" / "summary.csv")))
    assert [r[1] for r in rows[1:]] == ["failed"] + ["pending"] * 7


def test_multiprocess_sweep_stops_at_a_failed_run(tmp_path, capsys, monkeypatch):
    """On one of several processes a failed run ends the sweep (its peers may be in the run's collectives:
    going on, or writing the summary behind a barrier, would wait for them); the rerun retries it."""
    failing = Fake(fail_seeds={0}, write_before_fail=True)
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", failing)
    monkeypatch.setattr(sweep_lib, "_multiprocess", lambda: True)
    spec = sweep_lib.load_sweep(_write(tmp_path, SPEC), out_dir=str(tmp_path / "out"))
    logged = []
    with pytest.raises(RuntimeError, match="boom at seed 0"):
        sweep_lib.run_sweep(spec, log=logged.append)
    root = tmp_path / "out"
    assert len(failing.calls) == 1 and "a multi-process sweep stops at a failed run" in logged[-1]
    assert not (root / "summary.md").exists() and not (root / "summary.csv").exists()
    assert (root / NAMES[0] / "summary.json.failed").exists() and not (root / NAMES[0] / "summary.json").exists()
    fixed = Fake()
    monkeypatch.setitem(sweep_lib.COMMANDS, "fake", fixed)
    assert [r.status for r in sweep_lib.run_sweep(spec, log=logged.append)] == ["done"] * 8
    assert fixed.calls[0].out_dir == str(root / NAMES[0])


def test_metrics_choose_columns(tmp_path, capsys, fake):
    _sweep(tmp_path, capsys, {**SPEC, "metrics": ["eval.8.pass1", "missing"]})
    rows = list(csv.reader(open(tmp_path / "out" / "summary.csv")))
    assert rows[0][-2:] == ["eval.8.pass1", "missing"] and rows[1][-2:] == ["0.4", ""]


# (change to SPEC, key named, fragment of the message)
SWEEP_ERRORS = {
    "bad grid value": ({"grid": {"train.group_size": [4, 0]}}, "train.group_size", "must be >= 1, got 0 (in sweep run"),
    "bad zip value": ({"zip": {"budget.kind": ["fixed", "mix"], "budget.budgets": [[4], [2, 32]]}}, "budget",
                      "exceeds rollout.max_turns=16"),
    "grid value of wrong type": ({"grid": {"train.group_size": [4, "many"]}}, "train.group_size", "Expected int"),
    "not a config key": ({"grid": {"train.group": [4]}}, "grid.train.group", "not a config key"),
    "zip lengths": ({"zip": {"budget.kind": ["fixed", "mix"], "budget.budgets": [[4]]}}, "zip", "same length"),
    "labels": ({"labels": ["only-one"]}, "labels", "needs 2 distinct names"),
    "overridden swept key": ({"overrides": {"train.group_size": 2}}, "overrides.train.group_size", "is swept"),
    "key in grid and zip": ({"grid": {"budget.kind": ["fixed"]}}, "grid.budget.kind", "also in zip"),
    "unknown sweep key": ({"gird": {}}, "gird", "Allowed keys: command, base, out_dir, overrides, grid, zip"),
    "unknown command": ({"command": "trian"}, "command", "is not a sweep command; choose one of: config, eval,"),
    "missing base": ({"base": "nope.yaml"}, "base", "does not exist"),
    "seeds type": ({"seeds": "0,1"}, "seeds", "Expected list of int"),
    "same directory": ({"grid": {"train.optim.lr": [0.001, 0.0010000001]}}, "sweep", "same directory name"),
}


@pytest.mark.parametrize("name", list(SWEEP_ERRORS))
def test_sweep_errors_exit_2_before_any_work(tmp_path, capsys, fake, name):
    change, key, fragment = SWEEP_ERRORS[name]
    code = None
    with pytest.raises(SystemExit) as exc:
        code = _sweep(tmp_path, capsys, {**SPEC, **change})
    assert exc.value.code == 2 and code is None
    err = capsys.readouterr().err
    assert f"config error: {key}: " in err and fragment in err, err
    assert fake.calls == [] and not (tmp_path / "out").exists()


def test_cli_override_rules(tmp_path, capsys, fake):
    for override, fragment in (("seed=3", "is swept by this sweep"), ("out_dir=x", "use --out"),
                               ("train.stepz=1", "Allowed keys in train")):
        with pytest.raises(SystemExit) as exc:
            _sweep(tmp_path, capsys, SPEC, override)
        assert exc.value.code == 2 and fragment in capsys.readouterr().err
    assert fake.calls == [] and not (tmp_path / "out").exists()


def test_dry_run_lists_runs_and_writes_nothing(tmp_path, capsys, fake):
    code, out = _sweep(tmp_path, capsys, SPEC, "--dry-run")
    assert code == 0 and fake.calls == [] and not (tmp_path / "out").exists()
    assert [line.strip() for line in out.out.splitlines()[1:]] == NAMES


def test_lazy_commands_and_registration(monkeypatch):
    from bmrl.registry import Registry
    from bmrl.sft import run_sft

    assert sweep_lib.resolve_command("sft") is run_sft
    monkeypatch.setattr(sweep_lib, "COMMANDS", Registry("sweep command", {"ghost": "bmrl.no_such_module:run",
                                                                          "phantom": "bmrl.sweep:no_such_function"}))
    with pytest.raises(ConfigError, match="'ghost' cannot run: .*bmrl.no_such_module is not available"):
        sweep_lib.resolve_command("ghost")
    with pytest.raises(ConfigError, match="has no no_such_function"):
        sweep_lib.resolve_command("phantom")
    with pytest.raises(ConfigError, match="'train' is not a sweep command; choose one of: ghost, phantom"):
        sweep_lib.resolve_command("train")
    sweep_lib.register_command("spirit", Fake())
    assert isinstance(sweep_lib.resolve_command("spirit"), Fake)


def test_config_command_sweep(tmp_path, capsys):
    spec = {"command": "config", "grid": {"budget.kind": ["fixed", "uniform"]}, "overrides": {"budget.hi": 6}}
    code, out = _sweep(tmp_path, capsys, spec)
    assert code == 0
    rows = list(csv.reader(open(tmp_path / "out" / "summary.csv")))
    assert rows[0] == ["run", "status", "budget.kind", "min_cap", "max_cap", "batch"]
    assert rows[1:] == [["kind=fixed", "done", "fixed", "8", "8", "128"], ["kind=uniform", "done", "uniform", "1", "6", "128"]]


def test_repo_sweep_files_are_valid(monkeypatch):
    files = [f for f in sorted((REPO / "configs").glob("*.yaml")) if "command" in yaml.safe_load(f.read_text())]
    assert any(f.name == "sweep_budgets.yaml" for f in files)
    for f in files:
        assert f.read_text().startswith("#"), f"{f.name}: start with a comment saying what it runs"
        command = yaml.safe_load(f.read_text())["command"]
        monkeypatch.setitem(sweep_lib.COMMANDS, command, Fake())  # validation must not need the real command
        checked = []  # runtime facts (model.path: an SFT output not made here) are tested in test_config_refusals
        monkeypatch.setattr(sweep_lib, "_check_runtime", lambda command, cfg: checked.append(cfg))
        s = sweep_lib.load_sweep(f)
        assert checked == [r.config for r in s.runs]
        if f.name == "sweep_budgets.yaml":
            assert [r.name for r in s.runs] == [f"{k},seed={s}" for s in (0, 1) for k in ("fixed-tight", "fixed-generous", "mix")]
            assert [(r.config.budget.kind, r.config.budget.budgets) for r in s.runs[:3]] == [
                ("fixed", [4]), ("fixed", [8]), ("mix", [4, 8])]
