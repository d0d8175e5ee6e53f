"""Configs: every error class names its key and what is allowed, exits 2 through the CLI and writes
nothing; dotted overrides of nested keys and lists; the resolved YAML round-trips; docs are current."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest
import yaml

from bmrl import config
from bmrl.cli import build_parser, main
from bmrl.config import Config, ConfigError
from bmrl.config.docs import field_comments
from tests.paths import REPO


# (YAML file text, overrides, key named in the message, fragment saying what is allowed)
ERRORS = {
    "unknown key": ("budget: {kindd: mix}\n", [], "budget.kindd", "Allowed keys in budget: kind, budgets, probs"),
    "unknown section": ("", ["trian.steps=3"], "trian", "Allowed keys: seed, out_dir, model"),
    "unknown key suggests": ("", ["train.stepz=3"], "train.stepz", "Did you mean: 'steps'"),
    "wrong type": ("", ["train.steps=abc"], "train.steps", "Expected int"),
    "wrong type in file": ("rollout: {max_len: 2.5}\n", [], "rollout.max_len", "Expected int"),
    "wrong list element": ("", ["budget.budgets=[2,x]"], "budget.budgets[1]", "Expected int"),
    "scalar for list": ("", ["budget.budgets=8"], "budget.budgets", "Expected list of int"),
    "wrong bool": ("", ["env.show_budget=maybe"], "env.show_budget", "Expected bool"),
    "scalar for section": ("train: 3\n", [], "train", "give a mapping of its keys (steps, tasks_per_step"),
    "list for options": ("env: {options: [1, 2]}\n", [], "env.options", "must be a mapping"),
    "cap above max_turns": ("", ["budget.budgets=[32]"], "budget", "exceeds rollout.max_turns=16"),
    "mix cap above max_turns": ("", ["budget.kind=mix", "budget.budgets=[4,20]"], "budget", "largest cap 20"),
    "probs do not sum to 1": (
        "", ["budget.kind=mix", "budget.budgets=[2,8]", "budget.probs=[0.5,0.6]"], "budget.probs", "sum to 1"
    ),
    "probs length": ("", ["budget.kind=mix", "budget.budgets=[2,8]", "budget.probs=[1.0]"], "budget.probs", "one probability per cap"),
    "probs on fixed": ("", ["budget.probs=[1.0]"], "budget.probs", "applies to kind=mix only"),
    "fixed with two caps": ("", ["budget.budgets=[2,8]"], "budget.budgets", "exactly one cap"),
    "budget kind": ("", ["budget.kind=mixed"], "budget.kind", "choose one of: fixed, mix, uniform"),
    "uniform lo > hi": ("", ["budget.kind=uniform", "budget.lo=6", "budget.hi=3"], "budget.lo", "1 <= lo <= hi"),
    "cap below 1": ("", ["budget.budgets=[0]"], "budget.budgets", "integers >= 1"),
    "env name": ("", ["env.name=corridoor"], "env.name", "choose one of: corridor, frozenlake, keypad, sokoban, toolchain"),
    "env option name": ("", ["env.options.lenght=4"], "env.options.lenght", "valid options: max_budget (default 128), length"),
    "env option value": ("", ["env.options.eps=1.5"], "env.options.eps", "must be in [0, 1)"),
    "env option of other env": ("env: {name: sokoban, options: {length: 4}}\n", [], "env.options.length", "valid options"),
    "show_budget as option": ("", ["env.options.show_budget=true"], "env.options.show_budget", "set env.show_budget"),
    "max_budget below cap": (
        "", ["env.show_budget=true", "env.options.max_budget=4"], "env.options.max_budget", "set env.options.max_budget >= 16"
    ),
    "eval T above max_turns": ("", ["eval.ts=[1,32]"], "eval.ts", "[1, rollout.max_turns=16]"),
    "eval K above attempts": ("", ["eval.ks=[1,16]"], "eval.ks", "[1, eval.attempts=8]"),
    "advantage": ("", ["train.advantage=ppo"], "train.advantage", "choose one of: grpo"),
    "loss": ("", ["train.loss=dpo"], "train.loss", "choose one of: ppo"),
    "minibatches": ("", ["train.minibatches=3"], "train.minibatches", "does not divide the batch of 128"),
    "negative steps": ("", ["train.steps=-1"], "train.steps", "must be >= 0"),
    "schedule": ("", ["train.optim.schedule=linear"], "train.optim.schedule", "choose one of: cosine, constant"),
    "sft lr": ("", ["sft.optim.lr=0"], "sft.optim.lr", "must be > 0"),
    "gamma": ("", ["train.gamma=1.5"], "train.gamma", "must be in (0, 1]"),
    "top_p": ("", ["rollout.top_p=0"], "rollout.top_p", "must be in (0, 1]"),
    "attention block": ("", ["rollout.attention_block=-8"], "rollout.attention_block", "must be >= 0"),
    "noise": ("", ["sft.noise=1"], "sft.noise", "must be in [0, 1)"),
    "model heads": ("", ["model.num_attention_heads=3"], "model.num_attention_heads", "does not divide hidden_size=64"),
    "dtype": ("", ["model.dtype=float16"], "model.dtype", "choose one of: float32, bfloat16"),
    "mesh two -1": ("", ["mesh.fsdp=-1"], "mesh", "at most one axis may be -1"),
    "mesh zero": ("", ["mesh.tensor=0"], "mesh.tensor", "-1 for all remaining devices"),
    "checkpoint keep": ("", ["checkpoint.keep=0"], "checkpoint.keep", "must be >= 1"),
    "malformed override": ("", ["train.steps"], "train.steps", "must look like key.subkey=value"),
}


def _cli_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", list(ERRORS))
def test_config_error_exit_2_names_key(tmp_path, capsys, name):
    text, overrides, key, allowed = ERRORS[name]
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    out_dir = tmp_path / "run"
    err = _cli_error(capsys, ["config", "--config", str(path), f"out_dir={out_dir}", *overrides])
    assert f"config error: {key}: " in err, err
    assert allowed in err, err
    assert not out_dir.exists()
    with pytest.raises(ConfigError) as exc:  # the same error from the library, with its key
        config.load(path, overrides)
    assert exc.value.key == key


def test_file_errors(tmp_path, capsys):
    err = _cli_error(capsys, ["config", "--config", str(tmp_path / "missing.yaml")])
    assert "missing.yaml' does not exist" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: {kind: [\n")
    assert "is not valid YAML" in _cli_error(capsys, ["config", "--config", str(bad)])
    bad.write_text("- 1\n- 2\n")
    assert "must hold a mapping of config sections" in _cli_error(capsys, ["config", "--config", str(bad)])


# Commands that take `--config FILE KEY=VALUE...` and must refuse a bad config before any work.
def _commands() -> set[str]:
    parser = build_parser()
    return set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


RUN_COMMANDS = [c for c in ("train", "sft", "eval") if c in _commands()]
EXTRA_ARGS = {"eval": ["--policy", "policy"]}  # its other required arguments


@pytest.mark.parametrize("command", RUN_COMMANDS)
@pytest.mark.parametrize("name", ["unknown key", "wrong type", "cap above max_turns", "probs do not sum to 1"])
def test_run_commands_refuse_bad_config_and_write_nothing(tmp_path, capsys, monkeypatch, command, name):
    text, overrides, key, allowed = ERRORS[name]
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    err = _cli_error(capsys, [command, "--config", str(path), *EXTRA_ARGS.get(command, []), "out_dir=run", *overrides])
    assert f"{key}: " in err and allowed in err, err
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]  # no out_dir, no runs/, nothing


def test_dotted_overrides_nested_keys_and_lists(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("train: {steps: 7, optim: {lr: 0.01}}\nenv: {options: {length: 5}}\n")
    cfg = config.load(path, [
        "budget.kind=mix", "budget.budgets=[2,8]", "budget.probs=[0.25,0.75]",
        "train.optim.warmup_steps=3", "env.options.eps=0.2", "eval.ts=[1,2,8]", "model.path=null",
        "data.data_dir=/tmp/x y",
    ])
    assert (cfg.budget.kind, cfg.budget.budgets, cfg.budget.probs) == ("mix", [2, 8], [0.25, 0.75])
    assert (cfg.train.steps, cfg.train.optim.lr, cfg.train.optim.warmup_steps) == (7, 0.01, 3)
    assert cfg.sft.optim.lr == 3e-3  # untouched sibling keeps its own default
    assert cfg.env.options == {"length": 5, "eps": 0.2}  # options merge key by key
    assert cfg.eval.ts == [1, 2, 8] and cfg.model.path is None and cfg.data.data_dir == "/tmp/x y"
    mix = config.make_budget(cfg.budget)
    assert (mix.min_cap, mix.max_cap) == (2, 8)
    # an override wins over the file; a later override over an earlier one
    cfg = config.load(path, ["train.steps=9", "train.steps=11"])
    assert cfg.train.steps == 11


def test_layers_merge_in_order():
    cfg = config.build([{"train": {"steps": 1, "group_size": 4}}, {"train": {"steps": 2}}], ["seed=3"])
    assert (cfg.train.steps, cfg.train.group_size, cfg.seed) == (2, 4, 3)
    assert config.build(None) == Config()
    assert config.build({"train": None}) == Config()  # an empty section in YAML is the defaults


def test_default_grid_fits_the_turn_buffer():
    """eval.ts left at its default follows rollout.max_turns (a user who sets max_turns 8 is not refused
    for a default grid reaching 16); an explicit grid is kept; the resolved grid is what config.yaml holds."""
    assert Config().eval.ts == [1, 2, 4, 8, 16]
    assert config.load(None, ["rollout.max_turns=8"]).eval.ts == [1, 2, 4, 8]
    assert config.load(None, ["rollout.max_turns=12"]).eval.ts == [1, 2, 4, 8, 12]
    assert config.load(None, ["rollout.max_turns=8", "eval.ts=[1,3]"]).eval.ts == [1, 3]
    cfg = config.load(None, ["rollout.max_turns=8", "budget.budgets=[4]", "reproduce.small_t=4"])
    assert yaml.safe_load(config.to_yaml(cfg))["eval"]["ts"] == [1, 2, 4, 8]
    with pytest.raises(ConfigError, match="eval.ts"):
        config.load(None, ["rollout.max_turns=8", "eval.ts=[1,16]"])


def test_registered_options_reach_their_functions():
    """Each registered estimator and loss takes its own options from the config (grpo's normalize_std:
    Dr. GRPO's mean-only baseline); what a function does not take, or the trainer passes, is refused."""
    from types import SimpleNamespace

    import jax.numpy as jnp

    from bmrl.learn.step import compute_advantages

    traj = SimpleNamespace(outcome_reward=jnp.array([1.0, 0.0, 0.0, 0.0]), loss_mask=jnp.ones((4, 2)), turn_samples=None)
    plain = config.load(None, ["train.group_size=4", "train.advantage_options.normalize_std=false"]).train
    assert compute_advantages(traj, plain)[:, 0].tolist() == [0.75, -0.25, -0.25, -0.25]
    scaled = compute_advantages(traj, config.load(None, ["train.group_size=4"]).train)[:, 0]
    assert float(scaled[0]) == pytest.approx(0.75 / 0.4330127, rel=1e-4)  # divided by the group's std
    assert config.load(None, ["train.loss_options.clip_eps_high=0.28"]).train.loss_options == {"clip_eps_high": 0.28}
    for override, key in (("train.advantage_options.nope=1", "train.advantage_options.nope"),
                          ("train.loss_options.clip_eps=0.3", "train.loss_options.clip_eps"),
                          ("train.advantage_options.eps=[1]", "train.advantage_options.eps")):
        with pytest.raises(ConfigError) as err:
            config.load(None, [override])
        assert err.value.key == key
    with pytest.raises(ConfigError, match="choose one of: gemma2, gemma3_text, llama, mistral, qwen2, qwen3"):  # the model families' registry
        config.load(None, ["model.model_type=gpt"])


def test_resolved_yaml_round_trips(tmp_path, capsys):
    overrides = ["budget.kind=uniform", "budget.lo=2", "budget.hi=6", "env.options.length=5", "train.optim.lr=0.002"]
    assert main(["config", *overrides]) == 0
    printed = capsys.readouterr().out
    cfg = config.load(None, overrides)
    assert yaml.safe_load(printed) == config.to_dict(cfg)
    path = tmp_path / "resolved.yaml"
    config.save(cfg, path)
    assert config.load(path) == cfg
    assert "budgets: [8]" in printed  # short lists in flow style: readable


def test_every_config_file_is_valid():
    files = sorted((REPO / "configs").glob("*.yaml"))
    assert any(f.name == "corridor_tiny.yaml" for f in files)
    for f in files:
        if "command" in yaml.safe_load(f.read_text()):
            continue  # sweep files: tests/test_sweep.py
        text = f.read_text()
        assert text.startswith("#"), f"{f.name}: start with a comment saying what it runs, its runtime and result"
        data = yaml.safe_load(text)
        required = [f"{section}.{key}" for section, body in data.items() if isinstance(body, dict)
                    for key, value in body.items() if value == "???"]
        if required:  # real-model configs: the local model directory is a required override
            with pytest.raises(config.ConfigError, match="is required"):
                config.load(f)
        cfg = config.load(f, [f"{k}=/path/to/model" for k in required])
        if "reproduce" in data:
            config.check_reproduce(cfg)


def test_docs_are_current():
    doc = (REPO / "docs" / "configs.md").read_text()
    block = doc.split(config.DOC_BEGIN)[1].split(config.DOC_END)[0].strip()
    assert block == config.schema_markdown().strip(), "regenerate with: bmrl config --docs docs/configs.md"


def test_every_key_is_documented():
    def walk(obj, prefix=""):
        notes = field_comments(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                yield from walk(value, f"{prefix}{f.name}.")
            elif not notes.get(f.name):
                yield prefix + f.name

    assert list(walk(Config())) == [], "add a trailing `# meaning` comment to these fields in bmrl/config/schema.py"


def test_docs_command_updates_block(tmp_path, capsys):
    path = tmp_path / "doc.md"
    path.write_text(f"# title\n\n{config.DOC_BEGIN}\nstale\n{config.DOC_END}\n\ntail\n")
    assert main(["config", "--docs", str(path)]) == 0
    text = path.read_text()
    assert "stale" not in text and "| `budget.probs` | list of float or null | `null` |" in text
    assert text.startswith("# title") and text.endswith("tail\n")
    assert main(["config", "--docs", str(path)]) == 0
    assert "already current" in capsys.readouterr().out


def test_process_variant_config_is_the_study_plus_two_variants():
    """configs/reproduce_process.yaml is configs/reproduce_cpu.yaml plus the process-reward and the GiGPO variants,
    so the two studies cannot drift apart; each variant's stage trains with its own setting."""
    from bmrl.reproduce import _stage_configs

    study, process = (config.to_dict(config.load(REPO / "configs" / f)) for f in ("reproduce_cpu.yaml", "reproduce_process.yaml"))
    rl = _stage_configs(config.load(REPO / "configs" / "reproduce_process.yaml"), 0)[1]
    assert (rl["budgetmix_process"].train.process_coef, rl["budgetmix_process"].train.advantage) == (0.5, "grpo")
    assert (rl["budgetmix_gigpo"].train.process_coef, rl["budgetmix_gigpo"].train.advantage) == (0.0, "gigpo")
    assert (rl["budgetmix"].train.process_coef, rl["budgetmix"].train.advantage) == (0.0, "grpo")
    for name in ("budgetmix_process", "budgetmix_gigpo"):
        assert process["reproduce"]["variants"].pop(name) == study["reproduce"]["variants"]["budgetmix"]
    assert process["reproduce"].pop("process") == {"budgetmix_process": 0.5}
    assert process["reproduce"].pop("advantage") == {"budgetmix_gigpo": "gigpo"}
    study["reproduce"].pop("process")
    study["reproduce"].pop("advantage")
    assert process["out_dir"] != study["out_dir"]
    process["out_dir"] = study["out_dir"]
    assert process == study
