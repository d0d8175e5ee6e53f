"""The repository's root, for tests that read its files (configs, notebooks, scripts) or start `bmrl` in it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = str(REPO)
