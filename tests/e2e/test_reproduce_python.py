"""`bmrl reproduce` on a Python environment (env.kind=python): SFT base from the env's oracle, RL
variants, evaluation on the host loop and the three verdicts, end to end at the smallest sizes."""

import contextlib
import io
import json

import pytest

from bmrl.cli import main

CONFIG = """\
seed: 0
model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
env: {kind: python, entry: "bmrl.envs.python.jax_env:builtin", options: {name: corridor, length: 2, eps: 0.2}, workers: 4}
data: {tasks: tasks.jsonl}
budget: {kind: fixed, budgets: [4]}
rollout: {max_turns: 4, max_reply_tokens: 4, max_len: 192}
sft: {steps: 2, batch_size: 4, demo_turns: 4, recovery: 0.5}
train: {steps: 1, tasks_per_step: 2, group_size: 2}
eval: {ts: [2, 4], ks: [1, 2], attempts: 2, num_tasks: 4, bootstrap: 10, probe_states: 8}
checkpoint: {every: 1, keep: 1}
reproduce:
  seeds: [0]
  variants: {fixed_long: {kind: fixed, budgets: [4]}, fixed_short: {kind: fixed, budgets: [2]}, budgetmix: {kind: mix, budgets: [2, 4]}}
  small_t: 2
  inject_turns: [1]
"""


@pytest.mark.slow  # about 95 s on 2 cores: five stages (SFT, three RL variants, evaluation of four policies)
def test_reproduce_runs_on_a_python_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    (tmp_path / "tasks.jsonl").write_text("".join(f'{{"seed": {i}}}\n' for i in range(121)))  # 4 land in test
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        assert main(["reproduce", "--config", "cfg.yaml", "out_dir=out"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for finding in ("F1", "F2", "F3"):
        assert summary["findings"][finding]["verdict"] in ("as_study", "opposite", "inconclusive")
    assert summary["units"] == 4 and set(summary["table"]) == {"base", "fixed_long", "fixed_short", "budgetmix"}
    assert summary["not_measured"] and "probe set" in summary["not_measured"][0]
    assert summary["table"]["base"]["probe_accuracy_states"] is None  # skipped, not invented
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Not measured" in report and "bmrl.envs.python.jax_env:builtin" in report
    sft = json.loads((tmp_path / "out" / "seed0" / "sft" / "summary.json").read_text())
    assert sft["eval_tasks"] == 4 and sft["env_options"]["name"] == "corridor"
    assert "skipped the decision-accuracy probes and error injection" in err.getvalue()
