"""The notebooks run top to bottom on a tiny config, and what they compute is right.

Each notebook is executed with nbclient in a kernel of this interpreter (a kernelspec pointing at
`sys.executable`, found through JUPYTER_PATH), its working directory `notebooks/`. Parameters are set
the way papermill does it: a cell inserted right after the cell tagged `parameters` overrides them
(tiny sizes, outputs under tmp_path). A last appended cell prints the notebook's `SUMMARY` as JSON,
which the tests check against independent computations and the files the notebook wrote.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.paths import REPO
from tests.xla import suite_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = REPO / "notebooks"
KERNEL = "bmrl-notebook-test"
MARK = "__NOTEBOOK_SUMMARY__"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernelspec running ipykernel with this interpreter (this venv), and the kernel's environment
    (inherited from this process: figures as inline PNG outputs, CPU, fast-compiling XLA)."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # figures become outputs
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    # One CPU device whatever other tests set, and the suite's cheap compiles (tests.xla).
    monkeypatch.setenv("XLA_FLAGS", suite_flags())
    return KERNEL


def run_notebook(name: str, params: dict, kernel_name: str, timeout: int = 600):
    """Execute notebooks/<name> with `params` injected; returns (executed notebook, SUMMARY)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:  # stored without outputs
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name} is stored with outputs"
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name} needs exactly one cell tagged 'parameters'"
    source = nb.cells[tagged[0]].source
    for key in params:
        assert re.search(rf"^{key} = ", source, re.M), f"{name}: {key} is not a parameter"
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(tagged[0] + 1, injected)
    nb.cells.append(nbformat.v4.new_code_cell(f"import json as _json\nprint({MARK!r} + _json.dumps(SUMMARY))"))
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=timeout, startup_timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(line for line in text.splitlines() if line.startswith(MARK))
    return nb, json.loads(line[len(MARK):])


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def check_surface(est, lower=None, upper=None, name=""):
    """A Pass@(K,T) surface [K, T]: in [0, 1], non-decreasing in K and in T, inside its interval."""
    est = np.asarray(est, float)
    assert est.ndim == 2 and np.all(est >= 0) and np.all(est <= 1), name
    assert np.all(np.diff(est, axis=0) >= -1e-12), f"{name}: not monotone in K"
    assert np.all(np.diff(est, axis=1) >= -1e-12), f"{name}: not monotone in T"
    if lower is not None:
        assert np.all(np.asarray(lower) <= est + 1e-12) and np.all(est <= np.asarray(upper) + 1e-12), name


def test_passkt_analysis_notebook(tmp_path, kernel):
    from bmrl.eval import pass_at_kt

    out = tmp_path / "passkt"
    params = dict(NUM_TASKS=40, ATTEMPTS=8, MAX_TURNS=12, PRODUCTION_CAP=6, RESAMPLES=50, OUT_DIR=str(out))
    nb, s = run_notebook("passkt_analysis.ipynb", params, kernel)

    assert s["synthetic"] and json.loads((out / "summary.json").read_text()) == s
    arrays = dict(np.load(out / "first_success_turns.npz"))
    assert set(arrays) == {"base", "new"} and arrays["base"].shape == (40, 8)
    assert arrays["new"].max() <= 12 and arrays["new"].min() >= 0
    for name, a in arrays.items():
        surf = s["arrays"][name]
        assert surf["ks"] == [1, 2, 4, 8] and surf["ts"] == list(range(1, 13))
        check_surface(surf["estimate"], surf["lower"], surf["upper"], name)
        np.testing.assert_allclose(surf["estimate"], pass_at_kt(a, surf["ks"], surf["ts"]), atol=1e-12)
        # (b): the surface read back from the JSONL log is pass_at_kt of the same arrays
        log = s["logs"][name]
        assert log["tasks"] == 40 and Path(log["log"]).is_file()
        check_surface(log["estimate"], log["lower"], log["upper"], f"log {name}")
        np.testing.assert_allclose(log["estimate"], pass_at_kt(a, log["ks"], log["ts"]), atol=1e-12)
    # Paired difference = new - base cell by cell; the log route gives the same numbers and intervals.
    d = s["difference"]
    np.testing.assert_allclose(d["estimate"], np.subtract(s["arrays"]["new"]["estimate"], s["arrays"]["base"]["estimate"]),
                               atol=1e-12)
    assert np.all(np.asarray(d["lower"]) <= np.asarray(d["estimate"]) + 1e-12)
    assert s["logs"]["new"]["ts"] == d["ts"]
    for k in ("estimate", "lower", "upper"):
        np.testing.assert_allclose(s["log_difference"][k], d[k], atol=1e-12)
    # The audit speaks about the production cap, for each run and for the gain.
    assert len(s["audit"]) == 4 and all("T=6" in line for line in s["audit"])
    assert any("new - base" in line for line in s["log_audit"])
    for path in s["figures"].values():
        assert Path(path).is_file() and Path(path).stat().st_size > 1000
    assert images(nb) >= 6  # heatmaps, curves, differences shown inline


def test_quickstart_notebook(tmp_path, kernel):
    out = tmp_path / "quickstart"
    extra = [
        "sft.batch_size=8", "train.tasks_per_step=4", "train.group_size=8",  # 32 rollouts = 8 tasks x 4 T
        "eval.bootstrap=50", "eval.probe_states=0", "data.train_size=64", "data.test_size=16",
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",  # compile-bound: a smaller graph
        "rollout.compact_min_rows=0",  # no second copy of the turn for the 32-row batches (tested in test_rollout.py)
    ]
    params = dict(SFT_STEPS=10, RL_STEPS=2, NUM_TASKS=8, ATTEMPTS=4, OUT_DIR=str(out), EXTRA_OVERRIDES=extra)
    nb, s = run_notebook("quickstart.ipynb", params, kernel, timeout=900)

    assert json.loads((out / "notebook_summary.json").read_text()) == s
    assert s["ks"] == [1, 2, 4] and s["ts"] == [4, 5, 6, 8]  # K grid from ATTEMPTS, T grid from the config
    assert s["sft"]["steps"] == 10
    assert len((out / "sft" / "sft_metrics.jsonl").read_text().splitlines()) == 10
    assert set(s["rl"]) == {"fixed", "budgetmix"}
    for name, run in s["rl"].items():
        assert run["steps"] == 2 and (Path(run["policy"]) / "model.safetensors").is_file()
        assert set(run["pass1_after"]) == {"4", "5", "6", "8"}
    # The two RL runs really rolled out under their budgets (mean turn cap of each step's batch).
    caps = {name: [m["rollout/caps"] for m in map(json.loads, (out / name / "metrics.jsonl").read_text().splitlines())
                   if "rollout/caps" in m] for name in ("fixed", "budgetmix")}
    assert caps["fixed"] == [8.0, 8.0]
    assert len(caps["budgetmix"]) == 2 and all(4 <= c <= 8 for c in caps["budgetmix"]) and min(caps["budgetmix"]) < 8
    assert set(s["policies"]) == {"base", "fixed", "budgetmix"}
    for name, p in s["policies"].items():
        assert np.shape(p["surface"]) == (3, 4)
        check_surface(p["surface"], p["lower"], p["upper"], name)
        assert [p["pass1_by_T"][str(t)] for t in s["ts"]] == pytest.approx(p["surface"][0])
        assert p["area"] == pytest.approx(np.mean(p["surface"]))
    np.testing.assert_allclose(
        s["difference_budgetmix_minus_fixed"],
        np.subtract(s["policies"]["budgetmix"]["surface"], s["policies"]["fixed"]["surface"]), atol=1e-12)
    report = Path(s["report"]).read_text()
    assert "budgetmix" in report and (out / "eval" / "heatmap_base.png").is_file()
    assert images(nb) >= 3  # surfaces, Pass@(1,T) curves, difference, inline
