"""`bmrl sft --config FILE key=value ...`: train the SFT base policy (eps-noisy oracle demonstrations).

Writes <out_dir>/policy (a Hugging Face directory with its tokenizer), config.yaml,
sft_metrics.jsonl and summary.json. --config is required. A Python env (env.kind=python) must name its
oracle's next action (info["next_oracle_action"], bmrl/envs/python/protocol.py). A bad config (the buffer and model directory
included), an out_dir that is not writable or holds a run made with other settings (bmrl.rundir) stop before
anything is written, with exit status 2; a finished out_dir with the same settings is left as it is. A
killed run resumes from its newest checkpoint; checkpoints it cannot resume from (all unusable, or LoRA
adapters trained on another base) also exit 2.
"""

from __future__ import annotations

import argparse
import sys

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


def run(args: argparse.Namespace) -> int:
    from bmrl.config import ConfigError

    cfg, built = load_run(args, "sft")
    from bmrl.checkpoint import CheckpointMismatch, NoGoodCheckpoint
    from bmrl.sft import run_sft

    try:
        s = run_sft(cfg, run=built)
    except (NoGoodCheckpoint, CheckpointMismatch) as err:  # checkpoints it cannot resume from (another base)
        print(f"bmrl sft: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:  # e.g. weights that do not load (model.path), a Python env without an oracle to
        # demonstrate (info["next_oracle_action"]): found before any write
        raise config_exit("sft", err) from None
    print(
        f"sft {s['env']}: success@T={s['eval_T']} greedy {s['success_greedy']:.3f} sampled {s['success_sampled']:.3f} "
        f"(initial {s['init_success_greedy']:.3f}), decision accuracy {s['decision_accuracy_sampled']:.3f}, "
        f"final loss {s['final_loss']:.4f}, {s['wall_time_s']:.0f}s"
    )
    print(cfg.out_dir)
    return 0
