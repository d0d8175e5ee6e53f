"""`tests/` is laid out like `bmrl/`: the tests of `bmrl/x/y.py` live in `tests/x/`, end-to-end command runs in
`tests/e2e/`, checks of the repository's other folders in `tests/repo/`. A folder that names no package is
refused, so the layout cannot drift one move at a time."""

from tests.paths import REPO

OWN_FOLDERS = {"e2e", "repo"}  # not packages of bmrl


def _folders(root):
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"}


def test_every_test_folder_mirrors_a_package_of_bmrl():
    tests = _folders(REPO / "tests")
    packages = {p for p in _folders(REPO / "bmrl") if (REPO / "bmrl" / p / "__init__.py").exists()}
    strays = {f for f in tests if f.split("/")[0] not in OWN_FOLDERS and f not in packages}
    assert not strays, f"tests/{sorted(strays)} mirror no package of bmrl/: move them under the package they test"
    unpackaged = {f for f in tests if not (REPO / "tests" / f / "__init__.py").exists()}
    assert not unpackaged, f"tests/{sorted(unpackaged)} need an __init__.py (test modules of the same name collide)"


def test_every_test_file_lives_in_a_folder_of_the_layout():
    """A top-level test module is a top-level module's (`tests/test_train.py`); `tests/test_envs_x.py` belongs in `tests/envs/`."""
    flat = sorted(p.name for p in (REPO / "tests").glob("test_*.py"))
    packages = {p.name for p in (REPO / "bmrl").iterdir() if (p / "__init__.py").exists()}
    prefixed = [n for n in flat if n.removesuffix(".py").split("_")[1] in packages]
    assert not prefixed, f"{prefixed}: a package's tests go in tests/<package>/"
