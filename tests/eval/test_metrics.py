"""The metric table (`bmrl.eval.metrics`): the evaluator's metrics and the report's rows are its entries, so a
metric computed from the records is one entry; the table's metrics checked by hand."""

import numpy as np
import pytest

from bmrl.envs import make
from bmrl.eval.decompose import Episodes
from bmrl.eval.evaluate import evaluate
from bmrl.eval.metrics import METRICS, Metric
from bmrl.eval.report import write_report
from bmrl.rollout import RolloutConfig, make_noisy_oracle
from tests.eval.test_decompose import _episodes

T, F = True, False


def test_a_new_entry_is_evaluated_and_reported(tiny_tokenizer, tmp_path, monkeypatch):
    reward = Metric(lambda ep: ep.per_task(ep.reward.sum(1)).mean(1), "reward per attempt", 18)
    monkeypatch.setitem(METRICS, "reward", reward)
    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    tasks = {"seed": np.arange(1, 13, 2, dtype=np.int32)}
    r = evaluate(make_noisy_oracle(0.3), env, tasks, ts=[2, 5], ks=[1], attempts=3,
                 rollout_cfg=RolloutConfig(max_turns=5, max_reply_tokens=1, max_len=1), key=1, bootstrap=50)
    assert list(r.metrics) == list(METRICS)
    want = r.episodes.reward.sum(1).reshape(6, 3).mean(1).mean()
    assert r.metrics["reward"].mean == pytest.approx(want) and want > 0
    assert r.to_dict()["metrics"]["reward"]["mean"] == pytest.approx(want)
    paths, _ = write_report(tmp_path, {"noisy": r}, plot=False)
    text = open(paths["report"]).read()
    assert f"| reward per attempt | {r.metrics['reward']} |" in text
    assert "| turns used |" in text and "truncated" not in text  # a metric without a label has no row


def test_the_table_by_hand():
    base = _episodes()  # 2 tasks x 2 attempts (tests.eval.test_decompose)
    ep = Episodes(**{n: getattr(base, n) for n in Episodes.FIELDS}, num_tasks=2, attempts=2,
                  truncated=np.array([T, T, F, F]), overflow=np.array([F, F, F, T]))
    got = {name: m.per_task(ep) for name, m in METRICS.items()}
    np.testing.assert_allclose(got["success"], [0, 1])
    np.testing.assert_allclose(got["turns_used"], [4, 4.5])
    np.testing.assert_allclose(got["turns_to_success"], [np.nan, 4.5])  # task 0 never succeeded
    np.testing.assert_allclose(got["invalid_rate"], [0, 1 / 9])
    np.testing.assert_allclose(got["env_error_rate"], [1 / 8, 1 / 9])
    np.testing.assert_allclose(got["truncated"], [1, 0])
    np.testing.assert_allclose(got["overflow"], [0, 0.5])
