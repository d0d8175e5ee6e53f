"""`bmrl sft --config FILE key=value ...`: train the SFT base policy (eps-noisy oracle demonstrations).

Writes <out_dir>/policy (a Hugging Face directory with its tokenizer), config.yaml,
sft_metrics.jsonl and summary.json. --config is required. A bad config (the buffer and model directory
included) stops before anything is written, with exit status 2.
"""

from __future__ import annotations

import argparse

from bmrl.commands._common import add_config_args, config_exit, load_run


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sft",
        help="Behaviour-clone an eps-noisy oracle (errors shown, recovery not) into a base policy.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, required=True)
    p.set_defaults(func=run)


def _build_jax_run(cfg):
    """`build_run`, refusing a Python env first: demonstrations come from a JAX env's oracle."""
    from bmrl.build import build_run
    from bmrl.config import check_jax_env

    check_jax_env(cfg, "bmrl sft")
    return build_run(cfg)


def run(args: argparse.Namespace) -> int:
    from bmrl.config import ConfigError

    cfg, built = load_run(args, "sft", _build_jax_run)
    from bmrl.learn.sft import run_sft

    try:
        s = run_sft(cfg, run=built)
    except ConfigError as err:  # e.g. weights that do not load (model.path), found before any write
        raise config_exit("sft", err) from None
    print(
        f"sft {s['env']}: success@T={s['eval_T']} greedy {s['success_greedy']:.3f} sampled {s['success_sampled']:.3f} "
        f"(initial {s['init_success_greedy']:.3f}), decision accuracy {s['decision_accuracy_sampled']:.3f}, "
        f"final loss {s['final_loss']:.4f}, {s['wall_time_s']:.0f}s"
    )
    print(cfg.out_dir)
    return 0
