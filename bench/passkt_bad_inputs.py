"""Replay the bad-input table of `tests/commands/test_passkt_bad_inputs.py` against a checkout of bmrl.

Each case runs `python -m bmrl passkt ...` in its own process with a 3 GiB address-space limit and a
timeout, so a case that exhausts memory fails alone. A case is handled cleanly when the command
exits 2 with no traceback and names the file and line (or the option). Then the fuzz of the same
test file (its hypothesis strategy, derandomized, so both checkouts see the same logs) in one such
process: each fuzzed log must exit 0, or 2 naming the file. Prints one line per case and the counts
as JSON on the last line.

    python bench/passkt_bad_inputs.py                          # this checkout
    python bench/passkt_bad_inputs.py --checkout /tmp/old_bmrl   # another one (e.g. before a change)
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "commands", "test_passkt_bad_inputs.py")


def _load_tests():
    """The test module by file path, so that `bmrl` is imported from the checkout under test."""
    spec = importlib.util.spec_from_file_location("passkt_bad_inputs", TESTS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def fuzz_child(examples: int) -> None:
    """Run the derandomized fuzz in this process; print the outcome counts as JSON."""
    from hypothesis import HealthCheck, given, settings

    mod = _load_tests()
    counts: collections.Counter = collections.Counter()

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(**mod.FUZZ)
    def one(records, raw, as_csv, skip_bad):
        with tempfile.TemporaryDirectory() as root:
            path = mod.write_fuzz_log(root, records, raw, as_csv)
            try:
                rc, err = mod._run_quiet(mod.fuzz_args(path, root, skip_bad))
            except BaseException as e:  # noqa: BLE001 - counting crashes is the point
                counts[f"crash {type(e).__name__}"] += 1
                return
            kind = "accepted" if rc == 0 else "refused naming the file" if rc == 2 and path in err else f"exit {rc}"
            counts[kind] += 1
            if kind.startswith("exit") and len(examples) < 5:
                examples.append(err.strip()[-200:])

    examples: list[str] = []
    one()
    import bmrl

    for e in examples:
        print("example:", e, file=sys.stderr)
    print(json.dumps({**counts, "bmrl": os.path.dirname(bmrl.__file__)}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkout", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--fuzz", type=int, default=300, help="fuzzed logs (0 = none)")
    p.add_argument("--fuzz-only", action="store_true", help="skip the table of cases")
    p.add_argument("--fuzz-child", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fuzz_child:
        return fuzz_child(args.fuzz_child)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.checkout), "MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu"}
    mod = _load_tests()
    CASES, expected_text, materialize = mod.CASES, mod.expected_text, mod.materialize
    outcomes: dict[str, str] = {}
    for case in [] if args.fuzz_only else CASES:
        with tempfile.TemporaryDirectory() as root:
            argv, first = materialize(case, root)
            try:
                r = subprocess.run([sys.executable, "-m", "bmrl", *argv], capture_output=True, text=True, env=env,
                                   timeout=args.timeout, preexec_fn=_limit, cwd=os.path.abspath(args.checkout))
                err = r.stderr
                if r.returncode == 2 and "Traceback" not in err and expected_text(case, first) in err:
                    outcome = "clean"
                elif r.returncode == 2:
                    outcome = "exit 2, message without file/line/option"
                elif r.returncode == 0:
                    outcome = "accepted (exit 0)"
                else:
                    last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [""]
                    outcome = f"crash (exit {r.returncode}): {last[0][:100]}"
            except subprocess.TimeoutExpired:
                outcome = f"timeout after {args.timeout:.0f} s"
        outcomes[case[0]] = outcome
        print(f"{case[0]:24s} {outcome}", flush=True)
    clean = sum(o == "clean" for o in outcomes.values())
    crashes = sum(o.startswith(("crash", "timeout")) for o in outcomes.values())
    fuzz = {}
    if args.fuzz:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--fuzz-child", str(args.fuzz)], capture_output=True,
                           text=True, env=env, preexec_fn=_limit, timeout=max(args.timeout, 20 * args.fuzz),
                           cwd=os.path.abspath(args.checkout))
        fuzz = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-300:]}
        print(f"fuzz: {fuzz}\n{r.stderr[-1500:]}")
    print(json.dumps({"checkout": os.path.abspath(args.checkout), "cases": len(outcomes), "clean": clean,
                      "crash_or_timeout": crashes, "other": len(outcomes) - clean - crashes, "fuzz": fuzz}))


if __name__ == "__main__":
    main()
