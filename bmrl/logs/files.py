"""Reading attempt logs line by line: JSON lines or CSV, plain or gzipped, one record at a time.

Each reader yields `(line number, record dict)`, or `(line number, LogFormatError)` for a line that
is not a record, so the caller decides whether to stop or skip. Lines are decoded one at a time (a
bad byte is reported on its own line), no line longer than MAX_LINE_BYTES is read whole, and a
truncated or corrupt .gz archive is refused whole, with a message naming the file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from typing import Any

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
MAX_LINE_BYTES = 1 << 26  # 64 MiB: a longer line is refused rather than read whole into memory
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


class LogFormatError(ValueError):
    """A malformed record or file: names the file, the line (0 = the whole file) and the field."""

    def __init__(self, path: str, line: int, field: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        where = f"{path}:{line}" if line else path
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")


def detect_format(path: str) -> str:
    """'jsonl' or 'csv' from the file name (a trailing .gz is ignored)."""
    name = path.removesuffix(".gz")
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    raise ValueError(f"{path}: unknown log format; name it .jsonl or .csv (optionally .gz), or pass the format.")


def lines(path: str) -> Iterator[tuple[int, str | LogFormatError]]:
    """(line number, text) of every line, decoded one line at a time so that a bad byte is reported
    on its own line. A truncated or corrupt .gz archive is refused whole (never half read)."""
    line_no = 0
    with open(path, "rb") as plain, (gzip.GzipFile(fileobj=plain) if path.endswith(".gz") else plain) as raw_file:
        f = io.BufferedReader(raw_file, 1 << 20) if raw_file is not plain else plain
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except (EOFError, zlib.error, gzip.BadGzipFile) as err:
                raise LogFormatError(
                    path, 0, None,
                    f"the gzip archive is truncated or corrupt after line {line_no} ({type(err).__name__}: {err}); "
                    "nothing of it was used. Copy or compress the log again (gzip -t checks an archive).",
                ) from None
            if not raw:
                return
            line_no += 1
            if len(raw) > MAX_LINE_BYTES:
                raise LogFormatError(path, line_no, None, f"the line is longer than {MAX_LINE_BYTES >> 20} MiB; "
                                     "a log needs one record per line.")
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                hint = (" (the file starts with a UTF-16 byte-order mark: convert it with iconv -f UTF-16 -t UTF-8)"
                        if line_no == 1 and raw[:2] in _UTF16_BOMS else "")
                yield line_no, LogFormatError(path, line_no, None, f"not UTF-8 text (byte {raw[err.start]:#04x} at "
                                              f"column {err.start + 1}){hint}; save the log as UTF-8.")
                continue
            yield line_no, text


def iter_jsonl(path: str) -> Iterator[tuple[int, Any]]:
    """(line, record dict or LogFormatError) per non-blank line of a JSON-lines log."""
    # scan_once is the C scanner behind json.loads, without its two Python-level wrappers;
    # on any failure json.loads re-parses the line for a precise message.
    scan = json.JSONDecoder().scan_once
    for line_no, line in lines(path):
        if isinstance(line, LogFormatError):
            yield line_no, line
            continue
        try:
            record, end = scan(line, 0)
            if type(record) is dict and not line[end:].strip():
                yield line_no, record
                continue
        except (StopIteration, json.JSONDecodeError, ValueError, RecursionError):
            pass
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            yield line_no, LogFormatError(path, line_no, None, f"line is not valid JSON ({e.msg}, column {e.colno}).")
            continue
        except RecursionError:
            yield line_no, LogFormatError(path, line_no, None, "the JSON is nested too deeply to read.")
            continue
        if not isinstance(record, dict):
            yield line_no, LogFormatError(path, line_no, None, f"a record must be a JSON object, got {type(record).__name__}.")
            continue
        yield line_no, record


def iter_csv(path: str) -> Iterator[tuple[int, Any]]:
    """(line, {column: cell} or LogFormatError) per data row of a CSV log with a header row;
    empty cells are left out (missing values), the rest stay strings."""
    bad: list[LogFormatError] = []

    def text_lines() -> Iterator[str]:
        for _, line in lines(path):
            if isinstance(line, LogFormatError):
                bad.append(line)
                yield "\n"  # an empty row in its place; the error is reported for it below
                continue
            yield line

    reader = csv.reader(text_lines())
    header = None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            yield reader.line_num, LogFormatError(path, reader.line_num, None, f"not a CSV row ({err}).")
            continue
        if bad:
            yield reader.line_num, bad.pop()
            continue
        if header is None:
            header = row
            continue
        if not row:
            continue
        if len(row) > len(header):
            yield reader.line_num, LogFormatError(
                path, reader.line_num, None, f"the row has more cells than the header's {len(header)} columns.")
            continue
        yield reader.line_num, {k: v for k, v in zip(header, row) if v != ""}
