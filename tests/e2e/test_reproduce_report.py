"""`bmrl reproduce` end to end on the tiny study (`tests.e2e.study`), run once in this process on one device:
stage lines on stderr, a rerun that re-renders the report from the saved results, the figures (one per
finding, shared colour scales) and report.md's tables; and the same study on 2 processes.

`bmrl launch --processes 2 --cpu-devices 2 -- reproduce ...` runs the study as 2 processes with 2 devices each,
on mesh data 2 x fsdp 2 (the data axis across the processes): SFT and RL losses, exported weights, evaluation
results episode by episode, the findings and each stage's summary must equal the 1-device run's within float
tolerance, with one set of outputs written by process 0. `bmrl eval` of its BudgetMix policy runs on 2
processes and in this process (the same results). One RL stage of the 2-process study is restarted from its
step-1 checkpoint as 1 process x 4 devices or 2 processes again (orbax reshards it onto the new process
layout): it must end where the 1-device stage ends."""

import contextlib
import io
import json
import os
import re
import shutil
import types

import numpy as np
import pytest

from bmrl.metrics import Progress
from bmrl.stages import StageProgress, run_stage
from tests.e2e.processes import assert_close_tree, assert_same_run, finish, read_run, start
from tests.e2e.study import CONFIG, STUDY, run_tiny_study
from tests.eval.test_markdown import gfm_tables

LINE = re.compile(r"^\[stage (\d+)/(\d+)\] (seed \d+ - (?:SFT|RL \S+|eval)) - (.+)$")

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_stage_lines_numbering_skips_and_eta(tmp_path, capsys):
    """Lines on stderr (not a TTY here), one per event; ETA from finished stages by kind, before any has
    finished from the stage's own step rate, `eta ?` with neither."""
    clock = Clock()
    stages = StageProgress(0, clock=clock, compile_clock=lambda: 0.0)
    stages.plan(["sft", "rl", "rl", "eval"])
    done = tmp_path / "sft"
    done.mkdir()
    (done / "summary.json").write_text('{"x": 1}')

    def cfg(d):
        return types.SimpleNamespace(out_dir=str(d))

    def rl(c, minutes):
        for i in (1, 2):
            clock.t += 30 * minutes
            stages.step(i, 2)
        return {}

    assert run_stage(stages, "seed 0 - SFT", "sft", lambda c: 1 / 0, cfg(done)) == {"x": 1}
    run_stage(stages, "seed 0 - RL a", "rl", lambda c: rl(c, 10), cfg(tmp_path / "a"))
    run_stage(stages, "seed 0 - RL b", "rl", lambda c: rl(c, 4), cfg(tmp_path / "b"))
    stages.start("seed 0 - eval", "eval")
    stages.note("eval base (policy 1/2)")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    parsed = [LINE.match(x).groups() for x in lines]
    assert [(int(i), int(n)) for i, n, _, _ in parsed] == [(1, 4)] + [(2, 4)] * 4 + [(3, 4)] * 4 + [(4, 4)] * 2
    assert lines[0].startswith("[stage 1/4] seed 0 - SFT - skipped (done already: ")
    # Nothing finished yet: RL a's first step took 5 min of 2 steps, so it and each later stage take 10.
    assert lines[1:3] == ["[stage 2/4] seed 0 - RL a - started - eta ?", "[stage 2/4] seed 0 - RL a - step 1/2 - eta 25 min"]
    # RL a took 10 min: RL b is expected to take 10 (5 left after its first step), the eval the mean, 10.
    assert lines[4] == "[stage 2/4] seed 0 - RL a - done in 10.0 min - eta 20 min"
    assert lines[6] == "[stage 3/4] seed 0 - RL b - step 1/2 - eta 18 min"
    # RL b took 4: the next RL is expected to take 4 (the last of its kind), the eval (none finished) 4.
    assert lines[8] == "[stage 3/4] seed 0 - RL b - done in 4.0 min - eta 4 min"
    assert lines[10] == "[stage 4/4] seed 0 - eval - eval base (policy 1/2) - eta 4 min"
    assert stages.skipped == 1


def test_eta_is_within_30_percent_from_stage_3_when_first_stages_pay_the_compiles():
    """Five seeds of SFT, three RL and an eval, where the first stage of each kind is slow (it compiles:
    SFT 6 min of which 2 compiling, then 4; RL 2 of which 0.8, then 1.2; eval 1.5 of which 0.5, then 1):
    from stage 3 on, every printed ETA is within 30% of what actually remains (or half a minute).
    (The mean over finished stages, without the compiles taken out, printed 62 min at stage 3 with 38 left.)"""
    clock, compiled = Clock(), [0.0]
    lines: list[tuple[float, str]] = []
    stages = StageProgress(0, write=lambda line: lines.append((clock.t / 60, line)), clock=clock,
                           compile_clock=lambda: compiled[0])
    kinds = ["sft", "rl", "rl", "rl", "eval"] * 5
    stages.plan(kinds)
    steady, first = {"sft": 4.0, "rl": 1.2, "eval": 1.0}, {"sft": 2.0, "rl": 0.8, "eval": 0.5}  # minutes
    compile_minutes = [first[k] if k not in kinds[:i] else 0.0 for i, k in enumerate(kinds)]
    total = sum(steady[k] for k in kinds) + sum(compile_minutes)
    for i, kind in enumerate(kinds):
        stages.start(f"seed {i // 5} - " + {"sft": "SFT", "rl": "RL fixed", "eval": "eval"}[kind], kind)
        steps = 10 if kind != "eval" else 1
        for n in range(1, steps + 1):  # the compiles come first, then even steps
            clock.t += 60 * (steady[kind] / steps + (compile_minutes[i] if n == 1 else 0.0))
            compiled[0] += 60 * (compile_minutes[i] if n == 1 else 0.0)
            stages.step(n, steps) if kind == "rl" or kind == "sft" else stages.note("evaluating")
        stages.finish()
    checked = 0
    for t, line in lines:
        stage = int(LINE.match(line).group(1))
        m = re.search(r"eta (\d+|<1) min$", line)
        if stage < 3 or m is None:
            continue
        eta, left = (0.5 if m.group(1) == "<1" else float(m.group(1))), total - t
        assert abs(eta - left) <= max(0.3 * left, 0.5), (line, round(left, 2))
        checked += 1
    assert checked == len([x for x in lines if int(LINE.match(x[1]).group(1)) >= 3]) > 100


def test_progress_calls_on_step_every_tenth_and_at_the_end():
    calls = []
    bar = Progress(total=25, enable=False, on_step=lambda n, t: calls.append((n, t)))
    for _ in range(25):
        bar.update(success=0.5)
    bar.close()
    assert calls == [(n, 25) for n in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)]
    calls.clear()
    bar = Progress(total=30, initial=20, enable=False, on_step=lambda n, t: calls.append(n))
    bar.update(5)
    bar.update(5)
    assert calls == [25, 30]  # a tenth of 30 is 3: 20 -> 25 and 25 -> 30 each cross a multiple of it


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny study (`tests.e2e.study`, every stage for real, in this process on one device): its out_dir,
    config and stderr lines. Tests may add files beside it, and must leave what it wrote as it was."""
    return run_tiny_study(tmp_path_factory.mktemp("tiny_study"))


def test_first_run_says_every_stage(tiny_run):
    _, _, lines = tiny_run
    stage = [LINE.match(x).groups() for x in lines if LINE.match(x)]
    assert {int(n) for _, n, _, _ in stage} == {5}  # SFT, three RL variants, evaluation
    assert [int(i) for i, _, _, what in stage if what.startswith("started")] == [1, 2, 3, 4, 5]
    assert [int(i) for i, _, _, what in stage if what.startswith("done in")] == [1, 2, 3, 4, 5]
    assert sum(what.startswith("step 2/2") for _, _, _, what in stage) == 3  # each RL stage's steps
    for k in range(1, 5):  # the evaluation says which policy it is on
        assert any(f"(policy {k}/4)" in what for i, _, _, what in stage if i == "5")
    assert stage[0][3] == "started - eta ?" and "eta ?" not in stage[-1][3]
    sft_steps = [what for i, _, _, what in stage if i == "1" and what.startswith("sft step")]
    assert sft_steps and not any("eta ?" in what for what in sft_steps)  # the first stage projects its own steps


def test_rerun_re_renders_from_saved_results(tiny_run, monkeypatch):
    from bmrl import assembly, train
    from bmrl.eval import run
    from bmrl import sft
    from bmrl.reproduce import reproduce

    out, cfg, _ = tiny_run
    before = {f: (out / f).read_text() for f in ("summary.json", "report.md")}
    for f in (out / "figures").iterdir():
        f.unlink()

    def refuse(*a, **k):
        raise AssertionError("a finished run trained or evaluated again")

    for mod, name in ((sft, "run_sft"), (train, "train"), (run, "evaluate_policies"), (assembly, "load_policy")):
        monkeypatch.setattr(mod, name, refuse)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        reproduce(cfg)
    lines = err.getvalue().splitlines()
    assert [x.split(" - ")[-1].split(":")[0] for x in lines[:5]] == ["skipped (done already"] * 5
    assert lines[5].startswith("all 5 stages done already: re-rendering report.md and figures from the saved results")
    after = {f: (out / f).read_text() for f in ("summary.json", "report.md")}
    assert after == before
    s = json.loads(after["summary.json"])
    for key in ("findings", "sentences", "details", "table"):
        assert s[key]
    for rel in s["figures"].values():
        assert (out / rel).is_file() and f"]({rel})" in after["report.md"]


def test_report_figures_and_tables(tiny_run):
    out, _, _ = tiny_run
    report = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert {"f1_gain", "f2_states", "f3_pass"} <= set(summary["figures"])
    assert report.count("95% bootstrap interval over seeds and tasks") >= 4
    tables = gfm_tables(report)
    assert len(tables) == 2 and len(tables[1]) == 1 + 4 and tables[1][0][0] == "policy"
    seeds = summary["seeds"]  # the per-seed values, a row per training seed, the same in summary.json
    assert [r[0] for r in tables[0][1:]] == [str(x) for x in seeds] and len(summary["per_seed"]) == len(seeds)
    assert tables[0][0][:2] == ["seed", "F1: G (T=8 - T=5)"]
    g = summary["per_seed"][0]["G"]
    if len(seeds) == 1:  # one seed: its G is the pooled point estimate
        assert g == pytest.approx(summary["findings"]["F1"]["intervals"]["gain_large_minus_small"]["mean"])
    assert "go on and show the oracle's repair" in report and "in clean states and" in report
    suites = summary["suites"]  # the quickstart corridor has two levels: held out by seed only, and it says so
    assert suites["disjoint_by"] == "seed" and suites["overlap"] > 0
    assert f"{suites['overlap']} of the {suites['test']} test tasks repeat a training level" in report
    assert (out / "data").is_dir() and not any((out / "seed0").glob("*/data"))  # one stored suite for all stages
    n_runs = len(seeds) * 3  # two steps each: shorter than train.dead_after, no run can be flagged
    assert summary["dead_runs"] == [] and f"None of the {n_runs} RL runs lost its signal. Rule: A run is dead" in report
    # Three SFT steps leave a base that hardly ever succeeds: one RL cannot learn from, listed with the rule, and
    # every verdict says it rests on such runs (each seed has one); no verdict names a run that is not flagged.
    weak = [b["seed"] for b in summary["untrainable_bases"]]
    assert "## SFT bases RL cannot learn from" in report and all(f"- seed {x}: held-out Pass@(1,T)" in report for x in weak)
    named = {r["seed"] for k in ("F1", "F2", "F3") for r in summary["findings"][k]["without_dead_runs"]["dead_runs"]}
    assert named == set(weak) and ("without the dead run" in report) == bool(weak)
    for seed_report in re.findall(r"\]\((seed\d+/eval/report\.md)\)", report):
        gfm_tables((out / seed_report).read_text())


def test_small_t_is_the_one_t_of_f1(tiny_run):
    """reproduce.small_t=5 on the grid T in {4, 5, 8}: the whole pipeline's F1 verdict, its measured
    sentence, the per-seed table and summary.json all use T=5 (`test_report_reads_each_finding_once`
    checks one interval per number on a report with known effects)."""
    out, cfg, _ = tiny_run
    assert cfg.reproduce.small_t == 5 and min(cfg.eval.ts) == 4
    s = json.loads((out / "summary.json").read_text())
    f1 = s["findings"]["F1"]
    assert (f1["T_small"], f1["T_large"], s["findings"]["T_small"]) == (5, 8, 5)
    g = f1["intervals"]["gain_large_minus_small"]
    assert s["findings"]["gain_large_minus_small"] == g and s["findings"]["gain_small"] == f1["intervals"]["gain_small"]
    shown = f"{g['mean']:+.3f} [{g['lower']:+.3f}, {g['upper']:+.3f}]"
    assert f"the gain at T=8 minus the gain at T=5 is {shown}" in s["sentences"][0]
    assert f"at T=5; the gain at T=8 minus the gain at T=5 is {shown}" in s["details"][0]
    assert "T=4" not in s["sentences"][0] + s["details"][0]


def test_rerun_with_changed_settings_is_refused_before_any_write(tiny_run):
    """A finished stage made with other settings is not silently reused: the rerun names the key and the
    fix, and writes nothing (the top-level config.yaml and summary stay those of the finished run)."""
    from bmrl.config import ConfigError, load
    from bmrl.reproduce import reproduce

    out, cfg, _ = tiny_run
    before = {f: (out / f).read_text() for f in ("config.yaml", "summary.json")}
    for override, key in (("sft.recovery=0.9", "sft.recovery"), ("train.optim.lr=0.5", "train.optim.lr")):
        changed = load(CONFIG, [f"out_dir={out}", *STUDY, override])
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}: the finished stage in .* delete"):
            reproduce(changed)
        assert {f: (out / f).read_text() for f in before} == before


def test_heatmaps_share_one_colour_scale(tmp_path, monkeypatch):
    """Every surface heatmap gets the same (vmin, vmax) covering all of them; every difference heatmap
    the same bound, symmetric around 0, covering every difference."""
    from bmrl.eval import plots
    from bmrl.study import figures

    calls = {"surface": [], "difference": []}
    real_s, real_d = plots.plot_surface_heatmap, plots.plot_difference_heatmap
    monkeypatch.setattr(plots, "plot_surface_heatmap",
                        lambda s, *a, **k: calls["surface"].append((np.asarray(s), k["vmin"], k["vmax"])) or real_s(s, *a, **k))
    monkeypatch.setattr(plots, "plot_difference_heatmap",
                        lambda d, *a, **k: calls["difference"].append((np.asarray(d), k["bound"])) or real_d(d, *a, **k))
    rng = np.random.default_rng(0)
    ks, ts = (1, 2, 4), (2, 4, 8)
    pooled = {n: {"surface": np.clip(rng.random((20, 3, 3)) * scale, 0, 1)}
              for n, scale in (("base", 0.3), ("a", 0.6), ("b", 1.0))}
    f = figures.study_figures(str(tmp_path), pooled, None, ["base", "a", "b"], ks, ts, "a", resamples=20)
    (vmin, vmax), (lo, hi) = f.scales["surface"], f.scales["difference"]
    assert len(calls["surface"]) == 3 and len(calls["difference"]) == 2
    assert {(a, b) for _, a, b in calls["surface"]} == {(vmin, vmax)}
    assert vmin == min(s.min() for s, _, _ in calls["surface"]) and vmax == max(s.max() for s, _, _ in calls["surface"])
    assert {b for _, b in calls["difference"]} == {hi} and lo == -hi
    assert hi == max(np.abs(d).max() for d, _ in calls["difference"])
    assert "f1_gain" not in f.paths and all(os.path.isfile(p) for p in f.paths.values())


# ---- the same study on 2 processes (`bmrl launch`), against the 1-device run above ----------------
VARIANTS = ("fixed_long", "fixed_short", "budgetmix")


@pytest.fixture(scope="module")
def study(tiny_run, tmp_path_factory):
    """The tiny study on 2 processes x 2 devices, beside the 1-device reference (`tiny_run`)."""
    tmp = tmp_path_factory.mktemp("multihost")
    multi_out, logs = tmp / "multi", tmp / "logs"
    multi = start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(logs), "--", "reproduce",
                    "--config", CONFIG, *STUDY, "mesh.data=2", "mesh.fsdp=2", f"out_dir={multi_out}"],
                   tmp / "multi.log", None)
    finish(multi, tmp / "multi.log", "bmrl launch --processes 2 reproduce")
    return {"tmp": tmp, "ref": tiny_run[0], "multi": multi_out, "logs": logs}


def test_two_processes_run_the_study_like_one(study):
    """SFT losses, every RL stage's run (losses, summary, where it ran), the saved evaluation results turn by
    turn and the study's findings agree; process 0 alone writes the study's outputs (process 1 only logs)."""
    ref_out, multi_out = study["ref"], study["multi"]
    sft = [r["loss"] for r in map(json.loads, open(ref_out / "seed0" / "sft" / "sft_metrics.jsonl"))]
    assert len(sft) == 3 and len(set(sft)) == 3
    np.testing.assert_allclose([r["loss"] for r in map(json.loads, open(multi_out / "seed0" / "sft" / "sft_metrics.jsonl"))],
                               sft, rtol=1e-4, atol=1e-6)
    for variant in VARIANTS:
        got, want = read_run(multi_out / "seed0" / variant), read_run(ref_out / "seed0" / variant)
        assert len(want["losses"]) == 2 and all(want["losses"]), variant  # the entropy term moves every loss
        assert_same_run(got, want)
        assert sorted(os.listdir(multi_out / "seed0" / variant / "checkpoints")) == ["1", "2"]
        d, dr = got["summary"]["distributed"], want["summary"]["distributed"]
        assert (d["processes"], d["devices"], d["local_devices"]) == (2, 4, 2)
        assert (dr["processes"], dr["devices"], dr["local_devices"]) == (1, 1, 1)
        assert d["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1} and dr["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
        assert dr["transfer_s_per_step"] == 0
        # The exported policies are the same weights.
        from safetensors.numpy import load_file

        a, b = (load_file(o / "seed0" / variant / "policy" / "model.safetensors") for o in (multi_out, ref_out))
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=f"{variant} {name}")
    got, want = (json.load(open(o / "seed0" / "eval" / "results.json")) for o in (multi_out, ref_out))
    assert got["policies"].keys() == want["policies"].keys() == {"base", *VARIANTS}
    for name, w in want["policies"].items():
        np.testing.assert_allclose(got["policies"][name]["per_task"], w["per_task"], atol=1e-6, err_msg=name)
        assert got["policies"][name]["episodes"] == w["episodes"], name  # the same episodes, turn by turn
        assert got["policies"][name]["probe_correct"] == w["probe_correct"], name
    g, w = (json.load(open(o / "summary.json")) for o in (multi_out, ref_out))
    assert g["sentences"] == w["sentences"] and g["table"] == w["table"]
    assert os.listdir(study["logs"]) == ["process1.log"]
    assert sorted(os.listdir(multi_out / "figures")) == sorted(os.listdir(ref_out / "figures"))


def test_eval_on_two_processes_equals_one(study):
    """`bmrl eval` of the study's BudgetMix policy (Pass@(K,T) grid, decision-accuracy probes, error injection)
    on 2 processes x 2 devices (mesh data 2 x fsdp 2) and in this process on one device: the same results,
    episode by episode, written by process 0 alone, and the same verdict lines printed by every process."""
    from bmrl.cli import main

    tmp = study["tmp"]

    def args(out, *mesh):  # the overrides in one run of positionals: argparse takes them only together
        return ["eval", "--config", CONFIG, "--no-plots", "--names", "budgetmix",
                "--policy", str(study["ref"] / "seed0" / "budgetmix" / "policy"), "--out", str(out),
                *STUDY, *mesh, f"out_dir={out}"]

    two = start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(tmp / "eval2_logs"), "--",
                  *args(tmp / "eval2", "mesh.data=2", "mesh.fsdp=2")], tmp / "eval2.log", None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert main(args(tmp / "eval1")) == 0
    finish(two, tmp / "eval2.log", "the 2-process bmrl eval")
    want, got = (json.load(open(tmp / d / "results.json"))["policies"]["budgetmix"] for d in ("eval1", "eval2"))
    assert {"surface", "probe", "injected_eval", "decomposition"} <= want.keys()  # grid, probes, injection all ran
    want.pop("compiles"), got.pop("compiles")
    assert_close_tree(got, want)
    # Both processes print the same verdicts (process 0's through the launcher); process 1 writes no file.
    assert os.listdir(tmp / "eval2_logs") == ["process1.log"]
    lines = {name: [line for line in text.splitlines() if "Pass@(1," in line]
             for name, text in [("one", printed.getvalue()), ("0", open(tmp / "eval2.log").read()),
                                ("1", open(tmp / "eval2_logs" / "process1.log").read())]}
    assert lines["one"] and lines["0"] == lines["one"] and lines["1"] == lines["one"], lines
    assert f"process 0 writes the results to {tmp / 'eval2'}" in open(tmp / "eval2_logs" / "process1.log").read()


@pytest.mark.parametrize("processes", [1, 2])
def test_restart_resumes_the_two_process_checkpoint(study, processes):
    """An RL stage of the 2-process study restarted from its step-1 checkpoint, as 2 processes again or
    as 1 process x 4 devices (orbax reshards it onto the new process layout): the stage ends equal to the
    uninterrupted reference's."""
    out = study["tmp"] / f"restart{processes}"
    shutil.copytree(study["multi"] / "seed0" / "budgetmix", out)
    shutil.rmtree(out / "checkpoints" / "2")
    (out / "summary.json").unlink()
    log = study["tmp"] / f"restart{processes}.log"
    args = ["train", "--config", str(out / "config.yaml"), f"out_dir={out}", "--no-progress", "--no-eval"]
    if processes == 1:
        proc = start(args, log, 4)
    else:
        proc = start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(out / "logs"), "--", *args],
                      log, None)
    finish(proc, log, f"the {processes}-process restart")
    assert "resumed from" in open(log).read() and "at step 1" in open(log).read()
    got, ref = read_run(out), read_run(study["ref"] / "seed0" / "budgetmix")
    assert_same_run(got, ref)  # without evaluations, as the stage ran in `bmrl reproduce`
    assert got["summary"]["resumed_from"] == 1 and got["summary"]["distributed"]["processes"] == processes
