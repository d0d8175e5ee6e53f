"""Every markdown table bmrl writes parses as a GitHub table: the one writer escapes cells, and the
reports of `write_report`, `bmrl reproduce`, `bmrl passkt` and `bmrl sweep` are checked table by table."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bmrl.eval import markdown
from bmrl.eval.bootstrap import Interval

_SEPARATOR_CELL = re.compile(r"^\s*:?-+:?\s*$")


def split_row(line: str) -> list[str]:
    """GFM cell split: `|` delimits unless escaped (`\\|`); a backslash escapes the next character."""
    s = line.strip()
    s = s.removeprefix("|")
    cells, cur, i = [], "", 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            cur += s[i : i + 2]
            i += 2
            continue
        if ch == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip() or not s.endswith("|"):
        cells.append(cur.strip())
    return cells


def gfm_tables(text: str) -> list[list[list[str]]]:
    """Every table of a markdown document, checked: a header row, a separator row with as many
    cells, and every body row with exactly as many cells (a stray `|` adds one). A line starting
    with `|` outside a valid table is an error. Returns the tables as rows of cells."""
    lines = text.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            i += 1
            continue
        header = split_row(lines[i])
        assert i + 1 < len(lines), f"line {i + 1}: a table row with no separator row: {lines[i]!r}"
        sep = split_row(lines[i + 1])
        assert all(_SEPARATOR_CELL.match(c) for c in sep), f"line {i + 2}: not a separator row: {lines[i + 1]!r}"
        assert len(sep) == len(header), f"line {i + 1}: header has {len(header)} cells, separator {len(sep)}: {lines[i]!r}"
        rows, i = [header], i + 2
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            cells = split_row(lines[i])
            assert len(cells) == len(header), f"line {i + 1}: {len(cells)} cells, header has {len(header)}: {lines[i]!r}"
            rows.append(cells)
            i += 1
        tables.append(rows)
    _cross_check(text, tables)
    return tables


def _cross_check(text: str, tables: list) -> None:
    """The same count of tables and cells from markdown-it-py's GFM table rule, when installed."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # pragma: no cover - the tiny checker above still ran
        return
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert sum(t.type == "table_open" for t in tokens) == len(tables)
    cells_per_row, n = [], 0
    for t in tokens:
        if t.type == "tr_open":
            n = 0
        elif t.type in ("th_open", "td_open"):
            n += 1
        elif t.type == "tr_close":
            cells_per_row.append(n)
    assert cells_per_row == [len(r) for tab in tables for r in tab]


def test_checker_rejects_what_github_would_break():
    gfm_tables("| a | b |\n|---|---|\n| 1 | 2 |\n")
    with pytest.raises(AssertionError, match="cells"):
        gfm_tables("| policy | P(success|error) |\n|---|---|\n| x | 1 |\n")
    with pytest.raises(AssertionError, match="cells, header"):
        gfm_tables("| a | b |\n|---|---|\n| 1 | x|y |\n")
    with pytest.raises(AssertionError, match="separator"):
        gfm_tables("| a | b |\n| 1 | 2 |\n")


@pytest.mark.parametrize("text", ["P(success|error)", "a\\|b", "ends with \\", "two\nlines", "||", "`x | y`", "", 3.5, None])
def test_cells_are_escaped_and_keep_their_text(text):
    md = markdown.table(["name", "value"], [[text, "ok"]])
    (t,) = gfm_tables(md)
    assert len(t) == 2 and t[1][1] == "ok"
    want = "" if text is None else " ".join(str(text).splitlines()).strip()
    assert t[1][0].replace("\\|", "|").replace("\\\\", "\\") == want.replace("\\\\", "\\")


def test_table_refuses_ragged_rows_and_bad_alignment():
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        markdown.table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        markdown.table(["a", "b"], [], align=["left"])
    assert markdown.table(["a", "b"], [], align=["left", "right"]).splitlines()[1] == "|---|---:|"


def test_reproduce_tables_parse():
    """The table that printed `P(success|error)` unescaped (0 tables parsed) now parses."""
    from bmrl.study.findings import BASE, LEVELS, Study
    from bmrl.study.report import summary_table

    rng = np.random.default_rng(0)
    ks, ts = (1, 2), (4, 8)

    def unit(n):
        return {"surface": rng.random((n, 2, 2)), "decision_accuracy": rng.random(n), "recovery": rng.random(n)}

    pooled = {BASE: unit(30), "rl|odd": unit(30)}
    levels = {n: {m: Interval(0.5, 0.4, 0.6, 30) for m in LEVELS if m in p} for n, p in pooled.items()}
    md, _ = summary_table(pooled, Study(None, None, None, levels), list(pooled), ks, ts)
    (t,) = gfm_tables(md)
    assert len(t) == 3 and "P(success\\|error)" in t[0] and t[2][0] == "rl\\|odd"
    assert t[1][-4:] == ["0.500 [0.400, 0.600]", "-", "0.500 [0.400, 0.600]", "-"]


def test_passkt_report_tables_parse(tmp_path):
    from bmrl.cli import main

    rng = np.random.default_rng(1)
    paths = []
    for name in ("a", "b"):
        p = tmp_path / f"{name}.jsonl"
        with open(p, "w") as f:
            for t in range(12):
                for i in range(4):
                    turn = int(rng.integers(1, 6)) if rng.random() < 0.5 else 0
                    f.write(json.dumps({"task_id": f"x|{t}", "attempt_id": i, "first_success_turn": turn}) + "\n")
        paths.append(str(p))
    out = tmp_path / "out"
    assert main(["passkt", *paths, "--out", str(out), "--resamples", "50", "--no-plots", "--production-cap", "3"]) == 0
    tables = gfm_tables((out / "report.md").read_text())
    assert len(tables) == 5  # two key-value tables, two surfaces, one difference


def test_write_report_tables_parse(tiny_tokenizer, tmp_path):
    """Every table of an evaluation report of two scripted policies (paired) parses."""
    from bmrl.envs import make
    from bmrl.rollout import make_noisy_oracle, oracle_policy
    from bmrl.eval.evaluate import evaluate
    from bmrl.eval.report import write_report
    from bmrl.rollout import RolloutConfig
    from bmrl.sampling import SamplingConfig

    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    cfg = RolloutConfig(max_turns=6, max_reply_tokens=5, max_len=512, sampling=SamplingConfig(temperature=1.0))
    tasks = {"seed": np.arange(1, 25, 2, dtype=np.int32)}
    results = {
        name: evaluate(p, env, tasks, ts=[3, 6], ks=[1, 2], attempts=3, rollout_cfg=cfg, key=0, bootstrap=50)
        for name, p in (("noisy", make_noisy_oracle(0.4)), ("oracle", oracle_policy))
    }
    paths, _ = write_report(tmp_path, results, baseline="noisy", plot=False, settings={"note": "a|b"})
    with open(paths["report"]) as f:
        tables = gfm_tables(f.read())
    # settings, summary, per policy (surface, metrics, recovery), paired (surface, metrics)
    assert len(tables) == 1 + 1 + 2 * 3 + 2
    summary = tables[1]
    assert summary[0][0] == "policy" and "P(success given an error)" in summary[0] and len(summary) == 3
    assert any("P(success given an error)" in r[0] for t in tables for r in t)
