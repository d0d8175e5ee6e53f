"""`bmrl passkt`: outputs, paired audit, unmatched tasks, validity warning, malformed input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from bmrl.cli import main
from bmrl.commands.passkt import parse_int_list
from bmrl.eval.passkt import pass_at_kt


def _synthetic_logs(tmp_path, visible: bool = False):
    """Run b adds successes at turns 8..12 to run a: a gain at T=12 that vanishes at T <= 7.
    Task t-0 is only in a, task extra only in b."""
    rng = np.random.default_rng(0)
    num_tasks, n = 80, 6
    a = np.where(rng.random((num_tasks, n)) < 0.35, rng.integers(1, 4, (num_tasks, n)), 0)
    b = np.where((a == 0) & (rng.random((num_tasks, n)) < 0.6), rng.integers(8, 13, (num_tasks, n)), a)
    pa, pb = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    with open(pa, "w") as fa, open(pb, "w") as fb:
        for t in range(num_tasks):
            for i in range(n):
                fa.write(json.dumps({"task_id": f"t-{t}", "attempt_id": i, "first_success_turn": int(a[t, i])}) + "\n")
                if t > 0:
                    rec = {"task_id": f"t-{t}", "attempt_id": i, "first_success_turn": int(b[t, i])}
                    if visible:
                        rec["budget_visible"] = True
                    fb.write(json.dumps(rec) + "\n")
        for i in range(n):
            fb.write(json.dumps({"task_id": "extra", "attempt_id": i, "first_success_turn": 1}) + "\n")
    return str(pa), str(pb), a, b


def test_parse_int_list():
    assert parse_int_list("1,2,4-6", "--ks") == [1, 2, 4, 5, 6]
    assert parse_int_list("3,1,3", "--ts") == [1, 3]
    for bad in ("", "a", "5-2", "0"):
        with pytest.raises(ValueError):
            parse_int_list(bad, "--ks")


def test_single_log_outputs_match_estimator(tmp_path):
    pa, _, a, _ = _synthetic_logs(tmp_path)
    out = tmp_path / "out"
    rc = main(["passkt", pa, "--ks", "1,4", "--ts", "1-12", "--out", str(out), "--resamples", "200"])
    assert rc == 0
    result = json.loads((out / "passkt.json").read_text())
    surface = np.array(result["runs"]["base"]["surface"]["estimate"])
    np.testing.assert_allclose(surface, pass_at_kt(a, [1, 4], list(range(1, 13))), atol=1e-12)
    assert "own n" in result["estimator"]
    with open(out / "surface_base.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 12 and float(rows[0]["estimate"]) == pytest.approx(surface[0, 0])
    for png in ("heatmap_base.png", "pass1_curves.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "| T | K=1 | K=4 |" in (out / "report.md").read_text()


def test_paired_audit_unmatched_and_defaults(tmp_path, capsys):
    pa, pb, a, b = _synthetic_logs(tmp_path)
    out = tmp_path / "out"
    rc = main(["passkt", pa, pb, "--ks", "1,4", "--out", str(out), "--production-cap", "4", "--resamples", "200", "--no-plots"])
    assert rc == 0
    result = json.loads((out / "passkt.json").read_text())
    assert result["ts"] == list(range(1, 13))  # default: 1..largest logged turn
    assert result["unmatched_tasks"] == {"base": ["t-0"], "new": ["extra"]}
    assert result["paired"]["difference"] == "new - base" and result["paired"]["shared_tasks"] == 79
    diff = np.array(result["paired"]["surface"]["estimate"])
    np.testing.assert_allclose(diff, pass_at_kt(b[1:], [1, 4], range(1, 13)) - pass_at_kt(a[1:], [1, 4], range(1, 13)), atol=1e-12)
    paired = [s for s in result["audit"] if s.startswith("The gain")]
    assert len(paired) == 2 and all("does not survive at the production cap" in s for s in paired)
    assert any("only in base" in w for w in result["warnings"])
    printed = capsys.readouterr()
    assert "does not survive" in printed.out and "only in base" in printed.err
    assert (out / "difference.csv").exists() and "Paired difference: new - base" in (out / "report.md").read_text()


def test_budget_visible_warning(tmp_path, capsys):
    pa, pb, _, _ = _synthetic_logs(tmp_path, visible=True)
    out = tmp_path / "out"
    assert main(["passkt", pa, pb, "--ks", "1,4", "--out", str(out), "--resamples", "200", "--no-plots"]) == 0
    result = json.loads((out / "passkt.json").read_text())
    assert result["budget_visible"] and any("not the same as running it with cap T" in w for w in result["warnings"])
    assert main(["passkt", pa, "--ks", "1,4", "--out", str(out), "--resamples", "200", "--no-plots", "--budget-visible"]) == 0
    assert "budget was visible" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--ks", "7"], "exceeds the attempts"),
        (["--production-cap", "40", "--ts", "1-12"], "beyond the largest T"),
        (["--names", "x,y"], "--names needs 1"),
    ],
)
def test_argument_errors_exit_2(tmp_path, capsys, extra, message):
    pa, _, _, _ = _synthetic_logs(tmp_path)
    assert main(["passkt", pa, "--out", str(tmp_path / "o"), "--no-plots", *extra]) == 2
    assert message in capsys.readouterr().err


def test_malformed_log_exit_2_and_skip_bad(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"task_id": "a", "attempt_id": 0, "first_success_turn": 1}\n'
        '{"task_id": "a", "attempt_id": 1, "first_success_turn": -1}\n'
        '{"task_id": "a", "attempt_id": 2}\n'
    )
    out = tmp_path / "out"
    assert main(["passkt", str(path), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: field 'first_success_turn': negative turn -1" in err
    assert main(["passkt", str(path), "--out", str(out), "--no-plots", "--skip-bad", "--resamples", "50"]) == 0
    result = json.loads((out / "passkt.json").read_text())
    assert result["runs"]["bad"]["skipped_records"] == 2
    assert "2 malformed records skipped" in capsys.readouterr().out


def test_csv_with_custom_fields(tmp_path):
    path = tmp_path / "run.csv"
    path.write_text("problem,solved,num_turns\np1,true,3\np1,false,9\np2,1,1\np2,0,4\n")
    out = tmp_path / "out"
    rc = main([
        "passkt", str(path), "--out", str(out), "--no-plots", "--resamples", "50",
        "--task-field", "problem", "--attempt-field", "none", "--success-field", "solved", "--turns-field", "num_turns",
        "--turn-field", "none", "--turn-list-field", "none",
    ])
    assert rc == 0
    result = json.loads((out / "passkt.json").read_text())
    assert result["ks"] == [1, 2] and result["ts"] == list(range(1, 10))
    np.testing.assert_allclose(result["runs"]["run"]["surface"]["estimate"][0][:3], [0.25, 0.25, 0.5])


def test_command_module_import_is_light():
    code = "import sys, bmrl.commands.passkt, bmrl.logs, bmrl.eval.audit, bmrl.eval.bootstrap; assert 'jax' not in sys.modules and 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fewer_than_10_tasks_are_never_called_significant(tmp_path, capsys):
    """3 tasks where b always succeeds and a never: a zero-width interval, yet not 'significant'."""
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, turn in ((pa, 0), (pb, 1)):
        path.write_text("".join(json.dumps({"task_id": f"t{t}", "attempt_id": i, "first_success_turn": turn}) + "\n"
                                for t in range(3) for i in range(2)))
    out = tmp_path / "out"
    assert main(["passkt", str(pa), str(pb), "--out", str(out), "--no-plots", "--resamples", "50", "--production-cap", "1"]) == 0
    printed = capsys.readouterr().out
    assert "no difference is called significant: only 3 task(s), fewer than 10" in printed
    result = json.loads((out / "passkt.json").read_text())
    diff = result["paired"]["surface"]
    assert diff["lower"] == diff["upper"] == [[1.0], [1.0]]  # zero width
    assert "fewer than 10" in result["paired"]["significance"]
    assert any("(not significant at 95%)" in s for s in result["audit"])
    report = (out / "report.md").read_text()
    assert "**" not in report and "fewer than 10" in report


def test_default_ts_is_bounded_by_the_data_and_a_fixed_size(tmp_path):
    from bmrl.commands.passkt import DEFAULT_TS_POINTS, default_ts

    assert default_ts(7) == list(range(1, 8))
    grid = default_ts(1_000_000)
    assert len(grid) <= DEFAULT_TS_POINTS + 1 and grid[0] == 1 and grid[-1] == 1_000_000 and grid == sorted(set(grid))
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{t}", "first_success_turn": 10**6 if t % 2 else 3}) + "\n" for t in range(20)))
    out = tmp_path / "out"
    assert main(["passkt", str(path), "--out", str(out), "--no-plots", "--resamples", "20"]) == 0
    result = json.loads((out / "passkt.json").read_text())
    assert result["ts"] == grid and result["runs"]["long"]["surface"]["estimate"][0][-1] == 1.0
