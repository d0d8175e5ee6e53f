"""Task suites as tensorflow-datasets (array_record) builders; see `bmrl.data.suites`."""

from bmrl.data.suites import (
    SPLITS,
    SUITES,
    SuiteSpec,
    TaskSuite,
    build_suite,
    load_suite,
    make_suite_env,
    split_seeds,
    suite_tasks,
)

__all__ = [
    "SPLITS",
    "SUITES",
    "SuiteSpec",
    "TaskSuite",
    "build_suite",
    "load_suite",
    "make_suite_env",
    "split_seeds",
    "suite_tasks",
]
