"""Evaluation logs of any agent harness (one record per attempt), read as a stream and validated:
`attempts` (records -> per-task first-success turns, `AttemptLog`) and `files` (JSON lines or CSV,
plain or gzipped, line by line). numpy only: `bmrl passkt` reads logs without jax. The surfaces,
intervals and the budget audit computed from them are `bmrl.eval`'s (`bootstrap`, `audit`)."""

from bmrl.logs.attempts import MAX_TURN, AttemptLog, LogFields, read_attempt_log
from bmrl.logs.files import JSONL_SUFFIXES, LogFormatError, detect_format

__all__ = ["JSONL_SUFFIXES", "MAX_TURN", "AttemptLog", "LogFields", "LogFormatError", "detect_format", "read_attempt_log"]
