"""Task suites: train / validation / test levels disjoint by content, stored as TFDS array_record;
see `bmrl.data.suites` and `bmrl.data.content`."""

from bmrl.data.content import level_hashes
from bmrl.data.suites import (
           SPLITS,
           Splits,
           build_suite,
           compute_splits,
           level_options,
           read_suite,
           suite_name,
           suite_overlap,
)

__all__ = ["SPLITS", "Splits", "build_suite", "compute_splits", "level_hashes", "level_options", "read_suite",
           "suite_name", "suite_overlap"]
