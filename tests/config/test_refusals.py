"""Bad configs are refused before anything is written: exit status 2, the key named, no traceback.

A table of invalid config files, overrides and command lines, each run in-process through the CLI's
`main(argv)` in an empty working directory: the command must exit 2, print the key at fault on
stderr without a traceback, and leave the directory exactly as it was (no out_dir, no config.yaml).
Covers static values (types, ranges, NaN/inf, float32 overflow, seed range), file hygiene (binary,
non-UTF-8, duplicate keys, `${...}` interpolation) and runtime facts checked before any write
(the context buffer, the reply limit, the model directory, the device mesh).
"""

from __future__ import annotations

import contextlib
import os
import pathlib

import pytest

from bmrl.cli import main
from tests.paths import REPO

# A tiny experiment: were any case accepted, it would run in seconds rather than minutes.
BASE = """\
seed: 0
model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
env: {name: corridor, options: {length: 3}}
budget: {kind: fixed, budgets: [4]}
rollout: {max_turns: 4, max_reply_tokens: 6, max_len: 256}
sft: {steps: 1, batch_size: 2, demo_turns: 4}
train: {steps: 1, tasks_per_step: 2, group_size: 2}
eval: {ts: [2, 4], ks: [1, 2], attempts: 2, num_tasks: 2, bootstrap: 0, probe_states: 0}
data: {train_size: 8, test_size: 4}
checkpoint: {every: 1, keep: 1}
reproduce:
  seeds: [0]
  variants: {fixed_long: {kind: fixed, budgets: [4]}, fixed_short: {kind: fixed, budgets: [2]}, budgetmix: {kind: mix, budgets: [2, 4]}}
  small_t: 2
"""
SWEEP = "command: train\nbase: cfg.yaml\n"
BIG = str(2**80)

# A Python env (env.kind=python) on the same experiment: the tool-use env with a small task file.
PY = BASE.replace("env: {name: corridor, options: {length: 3}}",
                  "env: {kind: python, entry: 'bmrl.envs.python.tools:ToolUse', options: {k: 2}}").replace(
                  "data: {train_size: 8, test_size: 4}\n", "")  # a Python env's tasks: data.tasks (all of them)
TASKS = ["data.tasks={tasks}"]
# The shipped real-model config (model.path ???), refused before its tasks are read.
QWEN = (REPO / "configs" / "qwen_tools.yaml").read_text()

# name: (command, config text (None = BASE; bytes = written raw), overrides, text the error must contain)
# `{policy}`, `{nomodel}`, `{badjson}`, `{afile}`, `{tasks}`, `{badtasks}`, `{emptytasks}`, `{fewtasks}`, `{envdir}`
# name fixtures made in the working directory.
CASES: dict[str, tuple[str, str | bytes | None, list[str], str]] = {
    # file hygiene
    "binary file": ("train", b"seed: 0\n\x00\x01\x02\xff\n", [], "binary"),
    "non-UTF-8 file": ("train", "seed: 0\nout_dir: caf\xe9\n".encode("latin-1"), [], "UTF-8"),
    "duplicate top-level key": ("train", BASE + "seed: 3\n", [], "seed"),
    "duplicate nested key": ("train", BASE.replace("steps: 1, tasks", "steps: 1, steps: 2, tasks"), [], "steps"),
    "interpolation in file": ("train", BASE + "out_dir: ${oc.env:HOME}/x\n", [], "interpolation"),
    "env interpolation in override": ("train", None, ["data.data_dir=${oc.env:HOME}"], "data.data_dir"),
    "key interpolation in override": ("train", None, ["train.steps=${sft.steps}"], "train.steps"),
    "interpolation in list": ("train", None, ["eval.ts=[2,'${rollout.max_turns}']"], "interpolation"),
    "file is a list": ("train", "- 1\n- 2\n", [], "mapping"),
    "invalid YAML": ("train", "budget: {kind: [\n", [], "not valid YAML"),
    "python tag": ("train", "seed: !!python/object/apply:os.getcwd []\n", [], "not valid YAML"),
    "empty override key": ("train", None, ["=3"], "key.subkey=value"),
    "malformed override": ("train", None, ["train.steps"], "key.subkey=value"),
    # command lines that start runs
    "train without --config": ("train", "NOCONFIG", [], "--config"),
    "sft without --config": ("sft", "NOCONFIG", [], "--config"),
    "reproduce without --config": ("reproduce", "NOCONFIG", [], "--config"),
    # non-finite and out-of-range numbers
    "lr nan": ("train", None, ["train.optim.lr=nan"], "train.optim.lr"),
    "lr inf": ("train", None, ["train.optim.lr=inf"], "train.optim.lr"),
    "lr -inf": ("train", None, ["train.optim.lr=-inf"], "train.optim.lr"),
    "lr 1e39 overflows float32": ("train", None, ["train.optim.lr=1e39"], "train.optim.lr"),
    "lr underflows to 0": ("train", None, ["train.optim.lr=1e-400"], "train.optim.lr"),
    "sft lr nan": ("sft", None, ["sft.optim.lr=nan"], "sft.optim.lr"),
    "adam b1 nan": ("train", None, ["train.optim.b1=nan"], "train.optim.b1"),
    "adam eps inf": ("train", None, ["train.optim.eps=inf"], "train.optim.eps"),
    "grad norm nan": ("train", None, ["train.optim.max_grad_norm=nan"], "train.optim.max_grad_norm"),
    "temperature nan": ("train", None, ["rollout.temperature=nan"], "rollout.temperature"),
    "top_p nan": ("train", None, ["rollout.top_p=nan"], "rollout.top_p"),
    "clip_eps inf": ("train", None, ["train.clip_eps=inf"], "train.clip_eps"),
    "kl_coef nan": ("train", None, ["train.kl_coef=nan"], "train.kl_coef"),
    "gamma nan": ("train", None, ["train.gamma=nan"], "train.gamma"),
    "eval temperature inf": ("train", None, ["eval.temperature=inf"], "eval.temperature"),
    "rope_theta nan": ("train", None, ["model.rope_theta=nan"], "model.rope_theta"),
    "sft noise nan": ("sft", None, ["sft.noise=nan"], "sft.noise"),
    "mix probs nan": ("train", None, ["budget.kind=mix", "budget.budgets=[2,4]", "budget.probs=[.nan,0.5]"], "budget.probs"),
    "env option nan": ("train", None, ["env.options.eps=.nan"], "env.options.eps"),
    "seed 2**80": ("train", None, [f"seed={BIG}"], "seed"),
    "seed negative": ("train", None, ["seed=-1"], "seed"),
    "seed 2**40": ("train", None, [f"seed={2**40}"], "seed"),
    "steps 2**80": ("train", None, [f"train.steps={BIG}"], "train.steps"),
    "train_size 2**80": ("sft", None, [f"data.train_size={BIG}"], "data.train_size"),
    "float for int": ("train", None, ["rollout.max_len=2.5"], "rollout.max_len"),
    # values that type-check but cannot work
    "cap above max_turns": ("train", None, ["budget.budgets=[32]"], "budget"),
    "eval T of 0": ("train", None, ["eval.ts=[0,2]"], "eval.ts"),
    "eval ts empty": ("train", None, ["eval.ts=[]"], "eval.ts"),
    "eval K of 0": ("train", None, ["eval.ks=[0]"], "eval.ks"),
    "uniform lo 0": ("train", None, ["budget.kind=uniform", "budget.lo=0", "budget.hi=4"], "budget.lo"),
    "max_turns 0": ("train", None, ["rollout.max_turns=0"], "rollout.max_turns"),
    "history_turns 0": ("train", None, ["rollout.history_turns=0"], "rollout.history_turns"),
    "window max_len 120": ("train", None, ["rollout.history_turns=1", "rollout.max_len=120"], "rollout.max_len"),
    "top_k negative": ("train", None, ["rollout.top_k=-1"], "rollout.top_k"),
    "minibatches": ("train", None, ["train.minibatches=3"], "train.minibatches"),
    "max_nonfinite 0": ("train", None, ["train.max_nonfinite=0"], "train.max_nonfinite"),
    "checkpoint every 0": ("train", None, ["checkpoint.every=0"], "checkpoint.every"),
    "num_tasks 0": ("train", None, ["eval.num_tasks=0"], "eval.num_tasks"),
    "demo_turns 0": ("sft", None, ["sft.demo_turns=0"], "sft.demo_turns"),
    "env name": ("train", None, ["env.name=nope"], "env.name"),
    "env option value": ("train", None, ["env.options.length=0"], "env.options.length"),
    "kv heads": ("train", None, ["model.num_key_value_heads=3"], "model.num_key_value_heads"),
    "lora rank < 0": ("train", None, ["model.lora.rank=-1"], "model.lora.rank"),
    "lora alpha 0": ("train", None, ["model.lora.rank=4", "model.lora.alpha=0"], "model.lora.alpha"),
    "lora unknown target": ("train", None, ["model.lora.targets=[q_proj,qkv]"], "model.lora.targets"),
    "lora dropout 1": ("sft", None, ["model.lora.dropout=1.0"], "model.lora.dropout"),
    "unknown key": ("train", None, ["train.stepz=3"], "train.stepz"),
    "empty out_dir": ("train", None, ["out_dir= "], "out_dir"),
    "shown budget table too small": ("train", None, ["env.show_budget=true", "env.options.max_budget=2"], "max_budget"),
    # runtime facts, checked before anything is written
    "max_len 10": ("train", None, ["rollout.max_len=10"], "rollout.max_len"),
    "max_reply_tokens 1": ("train", None, ["rollout.max_reply_tokens=1"], "rollout.max_reply_tokens"),
    "sft max_len 10": ("sft", None, ["rollout.max_len=10"], "rollout.max_len"),
    "sft max_reply_tokens 1": ("sft", None, ["rollout.max_reply_tokens=1"], "rollout.max_reply_tokens"),
    "model.path missing": ("train", None, ["model.path=no/such/dir"], "model.path"),
    "model.path without config.json": ("train", None, ["model.path={nomodel}"], "model.path"),
    "model.path bad config.json": ("train", None, ["model.path={badjson}"], "model.path"),
    "model.path is a file": ("train", None, ["model.path={afile}"], "model.path"),
    "sft model.path missing": ("sft", None, ["model.path=no/such/dir"], "model.path"),
    "HF policy, max_len 10": ("train", None, ["model.path={policy}", "rollout.max_len=10"], "rollout.max_len"),
    "mesh needs 7 devices": ("train", None, ["mesh.data=7"], "mesh"),
    # reproduce, eval and sweep
    "reproduce small_t not in ts": ("reproduce", None, ["reproduce.small_t=3"], "reproduce.small_t"),
    "reproduce variant cap": ("reproduce", None, ["reproduce.variants.fixed_long.budgets=[8]"], "reproduce.variants.fixed_long"),
    "reproduce advantage of no variant": ("reproduce", None, ["reproduce.advantage.nope=gigpo"], "reproduce.advantage.nope"),
    "reproduce advantage unknown": ("reproduce", None, ["reproduce.advantage.fixed_long=nope"], "reproduce.advantage.fixed_long"),
    "reproduce seed 2**80": ("reproduce", None, [f"reproduce.seeds=[{BIG}]"], "reproduce.seeds"),
    "reproduce max_len 10": ("reproduce", None, ["rollout.max_len=10"], "rollout.max_len"),
    "reproduce lr nan": ("reproduce", None, ["train.optim.lr=nan"], "train.optim.lr"),
    "eval temperature nan": ("eval", None, ["eval.temperature=nan"], "eval.temperature"),
    "eval seed 2**80": ("eval", None, [f"seed={BIG}"], "seed"),
    "eval policy missing": ("eval-missing", None, [], "no/such/policy"),
    "eval inject turn beyond buffer": ("eval", None, ["--inject-turns=1,9"], "--inject-turns"),
    "eval inject prob nan": ("eval", None, ["--inject-prob=nan"], "--inject-prob"),
    "eval probe noise 1": ("eval", None, ["--probe-noise=1"], "--probe-noise"),
    "eval window 0": ("eval", None, ["--window=0"], "--window"),
    "sweep lr nan": ("sweep", "overrides: {train.optim.lr: .nan}\n", [], "train.optim.lr"),
    "sweep duplicate key": ("sweep", "grid: {train.steps: [1]}\ngrid: {train.steps: [2]}\n", [], "grid"),
    "sweep max_len 10": ("sweep", "grid: {rollout.max_len: [10, 256]}\n", [], "rollout.max_len"),
    "sweep interpolation": ("sweep", "overrides: {data.data_dir: '${oc.env:HOME}'}\n", [], "interpolation"),
    # Python environments (env.kind=python): the entry is imported and the tasks read before any write
    "env kind unknown": ("train", None, ["env.kind=lua"], "env.kind"),
    "python without entry": ("train", None, ["env.kind=python", *TASKS], "env.entry"),
    "python entry malformed": ("train", PY, ["env.entry=tools.ToolUse", *TASKS], "package.module:factory"),
    "python env with a history window": ("train", PY, ["rollout.history_turns=2", *TASKS], "rollout.history_turns"),
    "python entry import error": ("train", PY, ["env.entry=no_such_module_xyz:make", *TASKS], "no_such_module_xyz"),
    "python entry not callable": ("train", PY, ["env.entry=bmrl.envs.python.tools:ITEMS", *TASKS], "env.entry"),
    "python entry wrong signature": ("train", PY, ["env.entry=badsig_env:make", "env.path={envdir}",
                                                   *TASKS], "wrong signature"),
    "python factory options": ("train", PY, ["env.options.k=99", *TASKS], "env.options"),
    "python without tasks": ("train", PY, [], "data.tasks"),
    "python tasks missing": ("train", PY, ["data.tasks=no/such.jsonl"], "does not exist"),
    "python tasks bad line": ("train", PY, ["data.tasks={badtasks}"], "line 2"),
    "python tasks empty": ("train", PY, ["data.tasks={emptytasks}"], "0 task(s)"),
    "python show_budget": ("train", PY, ["env.show_budget=true", *TASKS], "env.show_budget"),
    "python on_fault": ("train", PY, ["env.on_fault=crash", *TASKS], "env.on_fault"),
    "python timeout 0": ("train", PY, ["env.step_timeout_s=0", *TASKS], "env.step_timeout_s"),
    "python workers 0": ("train", PY, ["env.workers=0", *TASKS], "env.workers"),
    "python with a JAX env's name": ("train", PY, ["env.name=toolchain", *TASKS], "env.name"),
    "python tasks too few": ("train", PY, ["data.tasks={fewtasks}"], "5 train, 1 validation, 0 test"),
    "python max_len 20": ("train", PY, ["rollout.max_len=20", *TASKS], "rollout.max_len"),
    "jax with entry": ("train", None, ["env.entry=a:b"], "env.entry"),
    "jax with tasks": ("train", None, TASKS, "data.tasks"),
    # SFT and reproduce play a Python env's oracle: it must name info["next_oracle_action"], and a noisy
    # oracle (sft.noise > 0) draws its wrong actions from action_strings (the tool env lists none)
    "sft python env without next oracle": ("sft", PY, ["env.entry=nooracle_env:make", "env.path={envdir}", *TASKS],
                                           "next_oracle_action"),
    "reproduce python env without next oracle": ("reproduce", PY, ["env.entry=nooracle_env:make",
                                                                   "env.path={envdir}", *TASKS], "next_oracle_action"),
    "sft python noise without action strings": ("sft", PY, TASKS, "sft.noise"),
    "reproduce python noise without action strings": ("reproduce", PY, TASKS, "sft.noise"),
    "eval python tasks bad line": ("eval", PY, ["data.tasks={badtasks}"], "line 2"),
    # the format section: reply layout and system prompt
    "format kind unknown": ("train", None, ["format.kind=json"], "format.kind"),
    "format history unknown": ("train", None, ["format.history=none"], "format.history"),
    "template history, plain format": ("train", None, ["format.kind=think_answer", "format.history=template"],
                                       "format.history"),  # no chat template, no rewrite to follow
    "python env, template history": ("train", PY, ["format.history=template", *TASKS], "format.history"),
    "format system_prompt number": ("train", None, ["format.system_prompt=3"], "format.system_prompt"),
    "format system_prompt boolean": ("train", "format: {system_prompt: yes}\n" + BASE, [], "format.system_prompt"),
    "format system_prompt list": ("train", None, ["format.system_prompt=[a]"], "format.system_prompt"),
    "think_answer max_reply_tokens 4": ("train", None, ["format.kind=think_answer", "rollout.max_reply_tokens=4"],
                                        "rollout.max_reply_tokens"),
    "sft think_answer max_reply_tokens 4": ("sft", None, ["format.kind=think_answer", "rollout.max_reply_tokens=4"],
                                            "rollout.max_reply_tokens"),
    "eval think_answer, tags not special": ("eval", None, ["format.kind=think_answer"], "rollout.max_reply_tokens"),
    "python think_answer max_reply_tokens 3": ("train", PY, ["format.kind=think_answer", "rollout.max_reply_tokens=3",
                                                             *TASKS], "rollout.max_reply_tokens"),
    "qwen_tools without model.path": ("train", QWEN, TASKS, "model.path"),
    "qwen_tools model.path missing": ("train", QWEN, ["model.path=no/such/Qwen2.5-0.5B-Instruct", *TASKS],
                                      "model.path"),
}


def _listing(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _make_policy(path: pathlib.Path, cfg_path: pathlib.Path) -> None:
    """A tiny saved policy with its tokenizer (for `eval --policy` and an existing model.path)."""
    try:
        from bmrl.assembly import build_tokenizer, new_policy
    except ImportError:  # before bmrl.policy became bmrl.assembly
        from bmrl.policy import build_tokenizer, new_policy
    from bmrl.config import load
    from bmrl.model.hf import save_pretrained

    cfg = load(cfg_path)
    tok = build_tokenizer(cfg)
    save_pretrained(new_policy(cfg, tok), tok, path)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> pathlib.Path:
    """Model directories the cases point at: a saved tiny policy, an empty dir, a bad config.json, a file."""
    root = tmp_path_factory.mktemp("fixtures")
    (root / "cfg.yaml").write_text(BASE)
    _make_policy(root / "policy", root / "cfg.yaml")
    (root / "nomodel").mkdir()
    (root / "badjson").mkdir()
    (root / "badjson" / "config.json").write_text('{"model_type": "llama", ')
    (root / "afile").write_text("not a directory\n")
    (root / "tasks").write_text("".join(f'{{"seed": {i}}}\n' for i in range(32)))  # split: 29, 2, 1 test
    (root / "fewtasks").write_text("".join(f'{{"seed": {i}}}\n' for i in range(6)))  # split: 5, 1, 0 test
    (root / "badtasks").write_text('{"seed": 1}\n{"seed": 2,\n{"seed": 3}\n')
    (root / "emptytasks").write_text("\n")
    (root / "envdir").mkdir()
    (root / "envdir" / "badsig_env.py").write_text(
        "class E:\n    def reset(self, seed):\n        return '', {}\n\n    def step(self, a):\n        pass\n\n\n"
        "def make(**options):\n    return E()\n")
    (root / "envdir" / "nooracle_env.py").write_text(  # the protocol, but no info["next_oracle_action"]
        "class E:\n    action_strings = ('a', 'b')\n\n    def reset(self, *, seed=None, options=None):\n"
        "        return 'obs', {}\n\n    def step(self, action):\n        return 'obs', 0.0, False, False, {}\n\n\n"
        "def make(**options):\n    return E()\n")
    return root


def argv_of(name: str, fixtures: pathlib.Path) -> list[str]:
    """The command line of case `name`, run in a directory holding cfg.yaml (and sweep.yaml)."""
    command, text, overrides, _ = CASES[name]
    for k in ("policy", "nomodel", "badjson", "afile", "tasks", "badtasks", "emptytasks", "fewtasks", "envdir"):
        overrides = [o.replace("{" + k + "}", str(fixtures / k)) for o in overrides]
    if text == "NOCONFIG":
        return [command, "out_dir=out", *overrides]
    if command == "sweep":
        return ["sweep", "sweep.yaml", "--out", "out", *overrides]
    if command == "eval":
        return ["eval", "--config", "cfg.yaml", "--policy", str(fixtures / "policy"), "out_dir=out", *overrides]
    if command == "eval-missing":
        return ["eval", "--config", "cfg.yaml", "--policy", "no/such/policy", "out_dir=out", *overrides]
    return [command, "--config", "cfg.yaml", "out_dir=out", *overrides]


def write_inputs(name: str, workdir: pathlib.Path) -> None:
    command, text, _, _ = CASES[name]
    if command == "sweep":
        (workdir / "cfg.yaml").write_text(BASE)
        (workdir / "sweep.yaml").write_text(SWEEP + text)
    elif isinstance(text, bytes):
        (workdir / "cfg.yaml").write_bytes(text)
    else:
        (workdir / "cfg.yaml").write_text(BASE if text in (None, "NOCONFIG") else text)


def outcome(name: str, workdir: pathlib.Path, fixtures: pathlib.Path) -> tuple[int, list[str]]:
    """(exit status of `bmrl <case>` run in `workdir`, paths it created there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_inputs(name, workdir)
    before = _listing(workdir)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        code = main(argv_of(name, fixtures))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # a traceback: the CLI would exit 1
        code = 1
    finally:
        os.chdir(cwd)
    return int(code or 0), sorted(set(_listing(workdir)) - set(before))


def test_the_table_is_large():
    assert len(CASES) >= 60


@pytest.mark.parametrize("name", list(CASES))
def test_bad_config_is_refused_before_anything_is_written(name, tmp_path, fixtures, capsys):
    code, created = outcome(name, tmp_path, fixtures)
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}, stderr: {err[-2000:]}"
    assert created == [], f"wrote {created}"
    assert "Traceback" not in err
    assert CASES[name][3] in err, err


def test_refusals_say_key_value_and_fix(tmp_path, fixtures, capsys):
    """A few messages in full: the key, the value given and what to do instead."""
    expect = {
        "lr 1e39 overflows float32": ["train.optim.lr", "1e+39", "float32"],
        "seed 2**80": ["seed", BIG, "2147483647"],
        "max_len 10": ["rollout.max_len", "10", "raise rollout.max_len to >="],
        "env interpolation in override": ["data.data_dir", "${oc.env:HOME}", "not expanded"],
        "duplicate nested key": ["steps", "twice", "keep one"],
        "python tasks bad line": ["data.tasks", "badtasks", "line 2", "one JSON object a line"],
        "python tasks too few": ["data.tasks", "fewtasks", "6 distinct task(s)", "0 test", "give more distinct tasks"],
        "python entry import error": ["env.entry", "no_such_module_xyz", "next to the config file"],
        "think_answer max_reply_tokens 4": ["rollout.max_reply_tokens", "4 cannot hold", "answer tags",
                                            "format.kind=action"],
        "qwen_tools without model.path": ["model.path", "is required", "model.path="],
        "sft python env without next oracle": ["env.entry", "nooracle_env:make", "info['next_oracle_action']",
                                               "reset's and step's info"],
        "sft python noise without action strings": ["sft.noise", "0.25", "action_strings", "sft.noise=0"],
    }
    for name, fragments in expect.items():
        with contextlib.suppress(SystemExit):
            outcome(name, tmp_path / name.replace(" ", "_").replace("*", ""), fixtures)
        err = capsys.readouterr().err
        for fragment in fragments:
            assert fragment in err, (name, fragment, err)


def test_interpolation_is_not_expanded_even_in_a_valid_spot(tmp_path, monkeypatch, capsys):
    """`${oc.env:VAR}` never reaches the config: `bmrl config` refuses it instead of printing $VAR's value."""
    monkeypatch.setenv("BMRL_SECRET", "expanded-value")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["config", "data.data_dir=${oc.env:BMRL_SECRET}"])
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert "expanded-value" not in out.out + out.err


def test_shipped_configs_pass_every_check():
    """No false refusals: every shipped config that needs no local model passes the runtime checks too."""
    import warnings

    import yaml

    from bmrl.assembly import build_reproduce_run, build_run
    from bmrl.config import load

    files = sorted((REPO / "configs").glob("*.yaml"))
    checked = []
    for f in files:
        data = yaml.safe_load(f.read_text())
        if "command" in data or "???" in f.read_text():
            continue  # sweep files (test_sweep.py); real-model configs need a local model directory
        cfg = load(f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a largest cap that may overflow is a warning, not a refusal
            run = (build_reproduce_run if "reproduce" in data else build_run)(cfg)
        assert run.budget.max_cap <= cfg.rollout.max_turns
        assert run.env.name == (cfg.env.entry if cfg.env.kind == "python" else cfg.env.name)
        checked.append(f.name)
    assert {"corridor_tiny.yaml", "quickstart.yaml", "python_env.yaml"} <= set(checked)


def test_rows_that_do_not_split_over_the_mesh_are_refused(tmp_path):
    """On 8 devices (data = -1: all of them), `bmrl train`'s rows and each training evaluation's tasks must be
    multiples of data x fsdp: 4 rollout rows are refused naming train.tasks_per_step, then 2 held-out tasks naming
    eval.num_tasks; 8 and 8 pass, and 2 and 2 on 2 devices."""
    from bmrl.assembly import build_run
    from bmrl.assembly.checks import check_batch_split
    from bmrl.config import ConfigError, load

    path = tmp_path / "cfg.yaml"
    path.write_text(BASE)

    def check(*overrides, devices=8):
        cfg = load(str(path), ["data.test_size=8", "data.val_size=8", *overrides])
        check_batch_split(cfg, build_run(cfg), devices=devices)

    with pytest.raises(ConfigError) as err:
        check()
    assert err.value.key == "train.tasks_per_step" and "4 rollout rows" in str(err.value) and "= 8 devices" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check("train.tasks_per_step=4")
    assert err.value.key == "eval.num_tasks" and "a multiple of 8" in str(err.value)
    check("train.tasks_per_step=4", "eval.num_tasks=8")
    check("train.tasks_per_step=1", "eval.num_tasks=2", devices=2)


def test_a_sweeps_train_runs_are_checked_for_the_mesh_split(tmp_path, monkeypatch):
    """`bmrl sweep`'s check of a train run is `bmrl train`'s: rows that do not split over 8 devices are refused."""
    import jax

    from bmrl import sweep
    from bmrl.config import ConfigError, load

    path = tmp_path / "cfg.yaml"
    path.write_text(BASE)
    cfg = load(str(path), ["data.test_size=8", "data.val_size=8"])
    sweep._check_runtime("train", cfg)  # 1 device: every row count splits
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    with pytest.raises(ConfigError) as err:
        sweep._check_runtime("train", cfg)
    assert err.value.key == "train.tasks_per_step"
