"""Streaming attempt-log readers: every record form gives the same arrays; malformed input errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bmrl.logs import LogFields, LogFormatError, detect_format, read_attempt_log
from bmrl.eval.passkt import pass_at_kt


def _random_attempts(seed: int, num_tasks: int = 30, max_n: int = 9, max_turn: int = 12):
    rng = np.random.default_rng(seed)
    n_i = rng.integers(1, max_n + 1, num_tasks)
    fst = np.where(rng.random((num_tasks, max_n)) < 0.5, rng.integers(1, max_turn + 1, (num_tasks, max_n)), 0)
    fst[np.arange(max_n)[None, :] >= n_i[:, None]] = 0
    return fst, n_i


def _records(fst, n_i, form: str, rng):
    """Records of every attempt, shuffled, in one of the three outcome forms."""
    recs = []
    for t, n in enumerate(n_i):
        for a in range(n):
            turn = int(fst[t, a])
            r = {"task_id": f"task-{t}", "attempt_id": a}
            if form == "first":
                r["first_success_turn"] = turn if turn or rng.random() < 0.5 else None
            elif form == "list":
                length = max(turn, int(rng.integers(0, 15)))
                r["turn_success"] = [i + 1 == turn for i in range(length)] if turn else [False] * length
            else:
                r["success"] = bool(turn)
                r["turns"] = turn if turn else int(rng.integers(1, 15))
            recs.append(r)
    order = rng.permutation(len(recs))
    return [recs[i] for i in order]


def _write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _as_sorted_rows(log, num_tasks):
    """The log's rows in task order, each row's attempts sorted (order within a task is irrelevant)."""
    index = log.task_index()
    rows = [index[f"task-{t}"] for t in range(num_tasks)]
    return _sort_valid(log.first_success_turn[rows], log.n_per_task[rows]), log.n_per_task[rows]


def _sort_valid(fst, n_i):
    """Sort each row's first n_i entries; padding stays 0 at the end."""
    out = np.zeros_like(fst)
    for i, n in enumerate(n_i):
        out[i, :n] = np.sort(fst[i, :n])
    return out


@pytest.mark.parametrize("form", ["first", "list", "success_turns"])
def test_log_surface_equals_pass_at_kt(tmp_path, form):
    fst, n_i = _random_attempts(1)
    rng = np.random.default_rng(2)
    path = _write_jsonl(tmp_path / "log.jsonl", _records(fst, n_i, form, rng))
    log = read_attempt_log(path)
    assert log.num_attempts == n_i.sum() and len(log.task_ids) == len(n_i) and log.skipped_records == 0
    got_fst, got_n = _as_sorted_rows(log, len(n_i))
    np.testing.assert_array_equal(got_n, n_i)
    ks, ts = [1], [1, 3, 6, 12]
    np.testing.assert_allclose(
        pass_at_kt(got_fst, ks, ts, n_per_task=got_n), pass_at_kt(fst, ks, ts, n_per_task=n_i), atol=1e-12
    )
    # Surfaces from the log's own (unsorted) arrays are the same: order within a task is irrelevant.
    np.testing.assert_allclose(
        pass_at_kt(log.first_success_turn, ks, ts, n_per_task=log.n_per_task).mean(),
        pass_at_kt(fst, ks, ts, n_per_task=n_i).mean(), atol=1e-12,
    )


def test_csv_gzip_and_grouped_forms_agree(tmp_path):
    fst, n_i = _random_attempts(3, num_tasks=12)
    csv_path = tmp_path / "log.csv"
    with open(csv_path, "w") as f:
        f.write("task_id,attempt_id,first_success_turn,turn_success,budget_visible\n")
        for t, n in enumerate(n_i):
            for a in range(n):
                turn = int(fst[t, a])
                if a % 2:
                    f.write(f"task-{t},{a},{turn},,false\n")
                else:  # per-turn list as "0;0;1"
                    flags = ";".join("1" if i + 1 == turn else "0" for i in range(max(turn, 3)))
                    f.write(f"task-{t},{a},,{flags},false\n")
    gz_path = tmp_path / "grouped.jsonl.gz"
    with gzip.open(gz_path, "wt") as f:
        for t, n in enumerate(n_i):
            f.write(json.dumps({"task_id": f"task-{t}", "first_success_turn": fst[t, :n].tolist()}) + "\n")
    for path in (csv_path, gz_path):
        log = read_attempt_log(path)
        got, got_n = _as_sorted_rows(log, len(n_i))
        np.testing.assert_array_equal(got_n, n_i)
        np.testing.assert_array_equal(got, _sort_valid(fst, n_i)[:, : got.shape[1]])
        assert not log.budget_visible
    assert detect_format(str(gz_path)) == "jsonl" and detect_format("x.csv") == "csv"


def test_custom_field_names_and_budget_flag(tmp_path):
    path = _write_jsonl(tmp_path / "l.jsonl", [
        {"problem": 7, "sample": 0, "solved_at": 2, "shows_budget": True},
        {"problem": 7, "sample": 1, "solved_at": 0},
        {"problem": 8, "sample": 0, "solved_at": 5},
    ])
    fields = LogFields(task="problem", attempt="sample", first_success_turn="solved_at", budget_visible="shows_budget")
    log = read_attempt_log(path, fields)
    assert log.task_ids == ["7", "8"] and log.budget_visible and log.max_turn == 5
    np.testing.assert_array_equal(log.n_per_task, [2, 1])
    np.testing.assert_array_equal(log.first_success_turn, [[2, 0], [5, 0]])


MALFORMED = [
    ('{"task_id": "a", "first_success_turn": 1}\n{"task_id": "a", "first_su', 2, None, "not valid JSON"),
    ('[1, 2]\n', 1, None, "JSON object"),
    ('{"attempt_id": 0, "first_success_turn": 1}\n', 1, "task_id", "missing"),
    ('{"task_id": "a", "attempt_id": 0}\n', 1, "first_success_turn", "missing"),
    ('{"task_id": "a", "first_success_turn": -2}\n', 1, "first_success_turn", "negative turn -2"),
    ('{"task_id": "a", "first_success_turn": "soon"}\n', 1, "first_success_turn", "integer turn"),
    ('{"task_id": "a", "first_success_turn": 2.5}\n', 1, "first_success_turn", "integer turn"),
    ('{"task_id": "b", "first_success_turn": []}\n', 1, "first_success_turn", "zero attempts"),
    ('{"task_id": "a", "turn_success": [false, "maybe"]}\n', 1, "turn_success", "turn 2"),
    ('{"task_id": "a", "success": "perhaps", "turns": 3}\n', 1, "success", "boolean"),
    ('{"task_id": "a", "success": true}\n', 1, "turns", "missing"),
    ('{"task_id": "a", "success": true, "turns": -1}\n', 1, "turns", "negative"),
    ('{"task_id": "a", "first_success_turn": 1, "budget_visible": "sometimes"}\n', 1, "budget_visible", "boolean"),
    ('{"task_id": "a", "attempt_id": 3, "first_success_turn": 1}\n{"task_id": "a", "attempt_id": 3, "first_success_turn": 0}\n',
     2, "attempt_id", "repeats the one on line 1"),
    ('{"task_id": ["a"], "first_success_turn": 1}\n', 1, "task_id", "task id"),
]


@pytest.mark.parametrize("text,line,field,message", MALFORMED)
def test_malformed_jsonl_names_file_line_field(tmp_path, text, line, field, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(LogFormatError, match=message) as info:
        read_attempt_log(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert str(err).startswith(f"{path}:{line}:")
    if field:
        assert f"field '{field}'" in str(err)


def test_malformed_csv(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("task_id,attempt_id,first_success_turn\na,0,1\na,1,-4\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:3: field 'first_success_turn': negative"):
        read_attempt_log(path)
    path.write_text("task_id,attempt_id,first_success_turn\na,0,1,9\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:2: .*more cells"):
        read_attempt_log(path)
    path.write_text("task_id,attempt_id,first_success_turn\na,x-1,1\na,2,0\na,x-1,4\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:4: field 'attempt_id': attempt id repeats the one on line 2"):
        read_attempt_log(path)
    path.write_text("task_id,attempt_id,first_success_turn\na,1,99999999999\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:2: field 'first_success_turn': turn 99999999999 is beyond the largest supported turn 1,000,000"):
        read_attempt_log(path)
    path.write_text("task_id,attempt_id,first_success_turn\n,0,1\n")
    with pytest.raises(LogFormatError, match=r"bad.csv:2: field 'task_id': missing"):
        read_attempt_log(path)


def test_skip_bad_counts_and_reports_tasks_left_empty(tmp_path):
    lines = [
        '{"task_id": "a", "attempt_id": 0, "first_success_turn": 1}',
        "not json",
        '{"task_id": "a", "attempt_id": 1, "first_success_turn": -3}',
        '{"task_id": "a", "attempt_id": 0, "first_success_turn": 2}',  # duplicate attempt id
        '{"task_id": "z", "attempt_id": 0, "first_success_turn": "x"}',  # z has no valid attempt
        '{"task_id": "b", "attempt_id": 0, "turn_success": [0, 1]}',
        "",
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines))
    log = read_attempt_log(path, skip_bad=True)
    assert log.skipped_records == 4
    assert log.task_ids == ["a", "b"] and log.empty_tasks == ["z"]
    np.testing.assert_array_equal(log.first_success_turn, [[1], [2]])
    assert any("mixed.jsonl:2:" in e for e in log.skipped_examples)
    assert log.summary()["tasks_with_zero_attempts"] == ["z"]


def test_empty_log_and_unknown_format(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(LogFormatError, match="no valid attempts"):
        read_attempt_log(path)
    with pytest.raises(ValueError, match="unknown log format"):
        read_attempt_log(tmp_path / "log.txt")


def test_per_task_in_power_of_two_groups_equals_the_padded_estimator():
    """Ragged attempt counts (1..9 and 16, across power-of-two boundaries), tiny calls to force chunks."""
    from bmrl.logs import AttemptLog
    from bmrl.eval.passkt import pass_at_kt_per_task

    rng = np.random.default_rng(7)
    n_i = rng.integers(1, 10, 23).astype(np.int32)
    n_i[:3] = [1, 2, 16]
    turns = np.where(rng.random(n_i.sum()) < 0.4, rng.integers(1, 20, n_i.sum()), 0).astype(np.int32)
    log = AttemptLog("mem", [f"t{i}" for i in range(len(n_i))], turns, n_i, len(turns), len(turns), 0, [], [], False, 19)
    ks, ts = [1], [1, 5, 19]
    want = pass_at_kt_per_task(log.first_success_turn, ks, ts, n_per_task=n_i)
    for cells in (1 << 20, 1):
        np.testing.assert_allclose(log.per_task(ks, ts, cells_per_call=cells), want, atol=1e-12)


def test_streaming_memory_is_bounded_for_large_and_lopsided_logs(tmp_path):
    """tracemalloc peak while reading 3*10^4 attempts: fixed buffers + ~60 bytes per attempt; a task with 10^5
    attempts next to 2,000 one-attempt tasks costs its attempts, not the 2*10^8 cells of a padded
    [tasks, max attempts] matrix (800 MB)."""
    import tracemalloc

    from bmrl.logs import read_attempt_log

    big = tmp_path / "big.jsonl.gz"
    with gzip.open(big, "wt") as f:
        for t in range(300):
            for a in range(100):
                f.write(f'{{"task_id": "task-{t}", "attempt_id": {a}, "first_success_turn": {(t * a) % 13}}}\n')
    lopsided = tmp_path / "lopsided.jsonl"
    with open(lopsided, "w") as f:
        f.write(json.dumps({"task_id": "many", "first_success_turn": [(i % 7) for i in range(100_000)]}) + "\n")
        for t in range(2000):
            f.write(json.dumps({"task_id": f"one-{t}", "first_success_turn": t % 5}) + "\n")
    peaks = {}
    for path in (big, lopsided):
        read_attempt_log(path).per_task([1], [1, 6, 12])  # compile first: only the data is measured
        tracemalloc.start()
        log = read_attempt_log(path)
        per_task = log.per_task([1], [1, 6, 12])
        peaks[path.name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert per_task.shape == (len(log.task_ids), 1, 3)
    assert peaks["big.jsonl.gz"] < 4e6 + 100 * 30_000, peaks  # measured 3.1 MB: 1 MiB read buffer + ~60 bytes per attempt
    assert peaks["lopsided.jsonl"] < 20e6, peaks  # measured 4.3 MB
    np.testing.assert_allclose(per_task[0, 0], [1 / 7, 6 / 7, 6 / 7], atol=1e-4)
