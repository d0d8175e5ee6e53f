"""Experiment configuration: typed dataclasses, YAML files, dotted overrides, clear errors.

    cfg = load("configs/corridor_tiny.yaml", ["budget.kind=mix", "budget.budgets=[4,8]"])
    save(cfg, f"{cfg.out_dir}/config.yaml")

One idea per module: `schema` (the typed sections; a field's trailing comment is its documentation),
`load` (strict YAML, dotted overrides, no interpolation), `validate` (every value checked once,
naming the key, the value and the fix), `docs` (the schema rendered into docs/configs.md). Every
refusal is a `ConfigError`, raised before any work is done; the CLI turns it into exit status 2.
What needs the built tokenizer and environment is checked by `bmrl.assembly.build_run`, also before
anything is written.
"""

from bmrl.config.schema import (
    BudgetCfg,
    CheckpointCfg,
    Config,
    ConfigError,
    DataCfg,
    EnvCfg,
    EvalCfg,
    FormatCfg,
    MeshCfg,
    ModelCfg,
    OptimCfg,
    ReproduceCfg,
    RolloutCfg,
    SFTCfg,
    TrainCfg,
)
from bmrl.config.validate import (
    check_caps, check_probes, check_reproduce, is_python_env, make_budget, validate,
)
from bmrl.config.load import build, changed_keys, load, parse_overrides, read_yaml, save, to_dict, to_yaml
from bmrl.config.docs import DOC_BEGIN, DOC_END, schema_markdown, update_docs

__all__ = [
    "BudgetCfg", "CheckpointCfg", "Config", "ConfigError", "DataCfg", "EnvCfg", "EvalCfg", "FormatCfg", "MeshCfg", "ModelCfg",
    "OptimCfg", "ReproduceCfg", "RolloutCfg", "SFTCfg", "TrainCfg",
    "check_caps", "check_probes", "check_reproduce", "is_python_env", "make_budget", "validate",
    "build", "changed_keys", "load", "parse_overrides", "read_yaml", "save", "to_dict", "to_yaml",
    "DOC_BEGIN", "DOC_END", "schema_markdown", "update_docs",
]
