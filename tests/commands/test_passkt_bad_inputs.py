"""`bmrl passkt` on foreign logs: a table of bad inputs, each refused with exit 2 and a message that
names the file and line (or the option), no traceback; plus fuzzed records.

`CASES` is data so that `bench/passkt_bad_inputs.py` can replay the same table, each case in its own
memory-limited process, against any checkout (the before/after count of the issue).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile

import pytest

GOOD = "".join(
    json.dumps({"task_id": f"t{t}", "attempt_id": a, "first_success_turn": (t + a) % 4}) + "\n"
    for t in range(12)
    for a in range(2)
)  # 24 lines; a bad record appended is line 25
LINE = 25


def _rec(**kw) -> str:
    return json.dumps(kw)


def _jsonl(bad: str | bytes) -> dict[str, bytes]:
    tail = bad if isinstance(bad, bytes) else bad.encode()
    return {"a.jsonl": GOOD.encode() + tail + b"\n"}


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


_GZ = _gz(GOOD.encode() * 200)
_NESTED = "[" * 100000 + "]" * 100000
_CSV_GOOD = "task_id,attempt_id,first_success_turn\n" + "".join(f"t{t},{a},{(t + a) % 3}\n" for t in range(6) for a in range(2))

# (id, files, extra arguments, what the message must name: "line" = "<file>:<line>", "file" = "<file>",
#  else a literal substring). "{a}" in arguments is the path of the first file.
CASES: list[tuple[str, dict[str, bytes], list[str], str]] = [
    # --- records (JSONL): the message names file:line
    ("not_json", _jsonl('{"task_id": "t", "first_success_turn": 1'), [], "line"),
    ("json_array", _jsonl("[1, 2]"), [], "line"),
    ("json_string", _jsonl('"x"'), [], "line"),
    ("json_number", _jsonl("5"), [], "line"),
    ("json_null", _jsonl("null"), [], "line"),
    ("trailing_garbage", _jsonl(_rec(task_id="t", first_success_turn=1) + " xyz"), [], "line"),
    ("lone_brace", _jsonl("}"), [], "line"),
    ("task_missing", _jsonl(_rec(first_success_turn=1)), [], "line"),
    ("task_null", _jsonl(_rec(task_id=None, first_success_turn=1)), [], "line"),
    ("task_list", _jsonl(_rec(task_id=[1], first_success_turn=1)), [], "line"),
    ("task_dict", _jsonl(_rec(task_id={"a": 1}, first_success_turn=1)), [], "line"),
    ("task_bool", _jsonl(_rec(task_id=True, first_success_turn=1)), [], "line"),
    ("task_float", _jsonl(_rec(task_id=1.5, first_success_turn=1)), [], "line"),
    ("task_empty", _jsonl(_rec(task_id="", first_success_turn=1)), [], "line"),
    ("no_outcome", _jsonl(_rec(task_id="t")), [], "line"),
    ("turn_negative", _jsonl(_rec(task_id="t", first_success_turn=-1)), [], "line"),
    ("turn_text", _jsonl(_rec(task_id="t", first_success_turn="abc")), [], "line"),
    ("turn_fraction", _jsonl(_rec(task_id="t", first_success_turn=2.5)), [], "line"),
    ("turn_bool", _jsonl(_rec(task_id="t", first_success_turn=True)), [], "line"),
    ("turn_1e8", _jsonl(_rec(task_id="t", first_success_turn=100_000_000)), [], "line"),
    ("turn_1e8_float", _jsonl('{"task_id": "t", "first_success_turn": 1e8}'), [], "line"),
    ("turn_inf", _jsonl('{"task_id": "t", "first_success_turn": 1e400}'), [], "line"),
    ("turn_nan", _jsonl('{"task_id": "t", "first_success_turn": NaN}'), [], "line"),
    ("turn_2_70", _jsonl(_rec(task_id="t", first_success_turn=2**70)), [], "line"),
    ("turn_dict", _jsonl(_rec(task_id="t", first_success_turn={"a": 1})), [], "line"),
    ("grouped_empty", _jsonl(_rec(task_id="t", first_success_turn=[])), [], "line"),
    ("grouped_negative", _jsonl(_rec(task_id="t", first_success_turn=[1, -2])), [], "line"),
    ("grouped_text", _jsonl(_rec(task_id="t", first_success_turn=[1, "x"])), [], "line"),
    ("grouped_huge", _jsonl(_rec(task_id="t", first_success_turn=[1, 10**9])), [], "line"),
    ("grouped_bad_string", _jsonl(_rec(task_id="t", first_success_turn="[1, 2")), [], "line"),
    ("turn_list_text", _jsonl(_rec(task_id="t", turn_success="abc")), [], "line"),
    ("turn_list_two", _jsonl(_rec(task_id="t", turn_success=[0, 2])), [], "line"),
    ("turn_list_dict", _jsonl(_rec(task_id="t", turn_success={"x": 1})), [], "line"),
    ("success_maybe", _jsonl(_rec(task_id="t", success="maybe", turns=3)), [], "line"),
    ("success_no_turns", _jsonl(_rec(task_id="t", success=True)), [], "line"),
    ("success_zero_turns", _jsonl(_rec(task_id="t", success=True, turns=0)), [], "line"),
    ("success_negative_turns", _jsonl(_rec(task_id="t", success=True, turns=-3)), [], "line"),
    ("success_turns_1e8", _jsonl(_rec(task_id="t", success=True, turns=100_000_000)), [], "line"),
    ("budget_flag_text", _jsonl(_rec(task_id="t", first_success_turn=1, budget_visible="sometimes")), [], "line"),
    ("duplicate_attempt", _jsonl(_rec(task_id="t0", attempt_id=0, first_success_turn=1)), [], "line"),
    ("nested_record", _jsonl(_NESTED), [], "line"),
    ("nested_field", _jsonl('{"task_id": "t", "first_success_turn": 1, "x": ' + _NESTED + "}"), [], "line"),
    ("invalid_utf8", _jsonl(b'{"task_id": "t\xff\xfe", "first_success_turn": 1}'), [], "line"),
    ("nul_byte", _jsonl(b'{"task_id": "t", \x00 "first_success_turn": 1}'), [], "line"),
    # --- whole files: the message names the file
    ("empty_file", {"a.jsonl": b""}, [], "file"),
    ("blank_lines", {"a.jsonl": b"\n\n  \n"}, [], "file"),
    ("all_bad_skip", {"a.jsonl": b"[1]\n{}\n"}, ["--skip-bad"], "file"),
    ("utf16_file", {"a.jsonl": GOOD.encode("utf-16")}, [], "file"),
    ("binary_file", {"a.jsonl": bytes(range(256)) * 8}, [], "file"),
    ("gz_truncated", {"a.jsonl.gz": _GZ[: len(_GZ) // 2]}, [], "file"),
    ("gz_truncated_tail", {"a.jsonl.gz": _GZ[:-4]}, [], "file"),
    ("gz_corrupt", {"a.jsonl.gz": _GZ[:40] + bytes(b ^ 0xFF for b in _GZ[40:80]) + _GZ[80:]}, [], "file"),
    ("gz_not_gzip", {"a.jsonl.gz": GOOD.encode()}, [], "file"),
    ("gz_of_binary", {"a.jsonl.gz": _gz(bytes(range(256)) * 8)}, [], "file"),
    ("gz_header_only", {"a.jsonl.gz": _GZ[:10]}, [], "file"),
    ("unknown_extension", {"a.txt": GOOD.encode()}, [], "file"),
    ("missing_file", {}, [], "a.jsonl"),
    ("csv_nul", {"a.csv": (_CSV_GOOD + "t9,0,\x001\n").encode()}, [], "line"),
    ("csv_huge_field", {"a.csv": (_CSV_GOOD + "t9,0," + "9" * 200_000 + "\n").encode()}, [], "line"),
    ("csv_extra_cells", {"a.csv": (_CSV_GOOD + "t9,0,1,7\n").encode()}, [], "line"),
    ("csv_bad_turn", {"a.csv": (_CSV_GOOD + "t9,0,-4\n").encode()}, [], "line"),
    ("csv_turn_1e8", {"a.csv": (_CSV_GOOD + "t9,0,100000000\n").encode()}, [], "line"),
    ("csv_header_only", {"a.csv": b"task_id,first_success_turn\n"}, [], "file"),
    ("csv_binary", {"a.csv": bytes(range(256)) * 8}, [], "file"),
    ("csv_gz_truncated", {"a.csv.gz": _gz(_CSV_GOOD.encode() * 300)[:300]}, [], "file"),
    ("csv_format_on_jsonl", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--format", "csv"], "file"),
    # --- arguments: the message names the option
    ("ts_1e9", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ts", "1-1000000000"], "--ts"),
    ("ts_single_huge", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ts", "5000000"], "--ts"),
    ("ks_1e9", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ks", "1-1000000000"], "--ks"),
    ("ts_zero", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ts", "0"], "--ts"),
    ("ts_text", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ts", "a-b"], "--ts"),
    ("ts_reversed", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ts", "5-2"], "--ts"),
    ("ks_beyond_attempts", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--ks", "64"], "--ks"),
    ("resamples_few", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--resamples", "5"], "resamples"),
    ("resamples_1e9", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--resamples", "1000000000"], "--resamples"),
    ("confidence_1_5", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--confidence", "1.5"], "confidence"),
    ("confidence_nan", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--confidence", "nan"], "confidence"),
    ("cap_zero", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--production-cap", "0"], "--production-cap"),
    ("cap_beyond_grid", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--production-cap", "99", "--ts", "1-4"], "--production-cap"),
    ("names_count", _jsonl(_rec(task_id="t", first_success_turn=1)), ["--names", "x,y"], "--names"),
    ("no_shared_tasks", {"a.jsonl": GOOD.encode(), "b.jsonl": GOOD.replace('": "t', '": "u').encode()}, [], "share no task"),
    ("three_logs", {"a.jsonl": GOOD.encode(), "b.jsonl": GOOD.encode(), "c.jsonl": GOOD.encode()}, [], "one or two logs"),
    ("out_is_a_file", {"a.jsonl": GOOD.encode(), "out": b"x"}, [], "out"),
]


def materialize(case, root: str) -> tuple[list[str], str]:
    """Write the case's files under root; (CLI arguments, the path of the first log)."""
    _, files, extra, _ = case
    for fname, data in files.items():
        with open(os.path.join(root, fname), "wb") as f:
            f.write(data)
    logs = [os.path.join(root, f) for f in files if f != "out"] or [os.path.join(root, "a.jsonl")]
    out = os.path.join(root, "out") if "out" in files else os.path.join(root, "result")
    args = ["passkt", *logs, "--out", out, "--no-plots", "--resamples", "50", *extra]
    return args, logs[0]


def expected_text(case, first_log: str) -> str:
    what = case[3]
    if what == "line":
        return f"{first_log}:{LINE if not case[1].get('a.csv') else _CSV_GOOD.count(chr(10)) + 1}"
    if what == "file":
        return first_log
    if what == "out":
        return os.path.join(os.path.dirname(first_log), "out")
    return what


def test_cases_are_many_and_distinct():
    names = [c[0] for c in CASES]
    assert len(names) >= 60 and len(set(names)) == len(names)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exit_2_names_file_and_line(case, tmp_path, capsys):
    from bmrl.cli import main

    args, first = materialize(case, str(tmp_path))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bmrl passkt: error: ") and "Traceback" not in err, err
    assert expected_text(case, first) in err, err
    assert not os.path.exists(os.path.join(tmp_path, "result", "passkt.json"))


# ---- fuzzing ---------------------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["1", "0", "true", "[1, 0]", "0;1", "1e8", "-1", ""]),
)
_json_value = st.recursive(_json_scalar, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=8)
_field_names = st.sampled_from(["task_id", "attempt_id", "first_success_turn", "turn_success", "success", "turns", "budget_visible", "x"])
_random_record = st.dictionaries(_field_names, _json_value, max_size=6)
_near_valid_record = st.fixed_dictionaries(
    {"task_id": st.sampled_from(["a", "b", "c", 7]) | _json_scalar},
    optional={
        "attempt_id": st.integers(0, 3) | _json_scalar,
        "first_success_turn": st.integers(0, 12) | st.lists(st.integers(0, 12), max_size=4) | _json_value,
        "turn_success": st.lists(st.booleans(), max_size=6) | _json_value,
        "success": st.booleans(), "turns": st.integers(0, 12) | _json_scalar, "budget_visible": st.booleans() | _json_scalar,
    },
)
_record = _near_valid_record | _random_record


def _run_quiet(args) -> tuple[int, str]:
    import contextlib
    import io

    from bmrl.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(args)
    return rc, err.getvalue()


def fuzz_args(path: str, root: str, skip_bad: bool) -> list[str]:
    return ["passkt", path, "--out", os.path.join(root, "o"), "--no-plots", "--resamples", "20", *(["--skip-bad"] if skip_bad else [])]


def write_fuzz_log(root: str, records: list[dict], raw: list[bytes], as_csv: bool) -> str:
    """The records as a JSONL or CSV log (CSV: one column per field, cells JSON-encoded), then the
    raw byte lines; returns its path."""
    path = os.path.join(root, "fuzz.csv" if as_csv else "fuzz.jsonl")
    with open(path, "wb") as f:
        if as_csv:
            keys = sorted({k for r in records for k in r}) or ["task_id"]
            f.write((",".join(keys) + "\n").encode())
            for r in records:
                f.write((",".join(json.dumps(r.get(k, ""), allow_nan=True).replace(",", ";") for k in keys) + "\n").encode())
        else:
            for r in records:
                f.write((json.dumps(r, allow_nan=True) + "\n").encode())
        for line in raw:
            f.write(line.replace(b"\n", b" ") + b"\n")
    return path


FUZZ = dict(records=st.lists(_record, min_size=1, max_size=8), raw=st.lists(st.binary(max_size=12), max_size=2),
            as_csv=st.booleans(), skip_bad=st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**FUZZ)
def test_fuzzed_records_exit_0_or_2_naming_the_file(records, raw, as_csv, skip_bad):
    """Near-valid and arbitrary JSON records (any field, any value) and raw byte lines, with and
    without --skip-bad: exit 0, or exit 2 with a message that names the log; never a traceback."""
    with tempfile.TemporaryDirectory() as root:
        path = write_fuzz_log(root, records, raw, as_csv)
        rc, err = _run_quiet(fuzz_args(path, root, skip_bad))
        assert rc in (0, 2), err
        if rc == 2:
            assert path in err and "Traceback" not in err, err
