"""Task suites: train / validation / test tasks disjoint by content (a JAX env's level seeds, a Python
env's task dicts), stored as TFDS array_record; see `bmrl.data.suites` and `bmrl.data.content`."""

from bmrl.data.content import canonical, level_hashes
from bmrl.data.suites import (
           SPLITS,
           Splits,
           TaskSplits,
           build_suite,
           compute_splits,
           level_options,
           read_suite,
           read_task_suite,
           suite_name,
           suite_overlap,
           task_splits,
           task_suite_name,
)

__all__ = ["SPLITS", "Splits", "TaskSplits", "build_suite", "canonical", "compute_splits", "level_hashes",
           "level_options", "read_suite", "read_task_suite", "suite_name", "suite_overlap", "task_splits",
           "task_suite_name"]
