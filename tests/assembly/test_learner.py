"""The learner (bmrl.assembly.learner): split and merge give back the policy, and a checkpoint's LoRA
adapters are resumed only onto the base they were trained on, by RL and SFT alike."""

import jax
import numpy as np
import pytest
from flax import nnx

from bmrl.assembly.learner import Learner
from bmrl.checkpoint import CheckpointMismatch
from bmrl.config import build
from bmrl.model import ModelConfig, init_model
from bmrl.model.lora import LoRAParam, LoRASpec, add_lora

LORA = ["model.lora.rank=4", "model.lora.dropout=0.1"]


def tiny(seed=0, lora=True):
    model = init_model(ModelConfig.tiny(64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1), seed)
    return add_lora(model, LoRASpec(rank=4), seed) if lora else model


def flat(state) -> dict:
    return {path: np.asarray(var[...]) for path, var in nnx.to_flat_state(state)}


def assert_same(a, b):
    a, b = flat(a), flat(b)
    assert a.keys() == b.keys()
    for path in a:
        assert a[path].dtype == b[path].dtype and a[path].tobytes() == b[path].tobytes(), path


@pytest.mark.parametrize("lora", [True, False])
def test_split_and_merge_give_back_the_policy(lora):
    policy = tiny(lora=lora)
    want = jax.tree.map(np.array, nnx.state(policy))
    learner, params = Learner.of(policy, build({}, LORA if lora else []))
    trained = [type(v) for _, v in nnx.to_flat_state(params)]
    if lora:  # the adapters train; the base is kept apart, and recorded
        assert learner.lora and set(trained) == {LoRAParam} and learner.dropout == 0.1
        assert not any(isinstance(v, LoRAParam) for _, v in nnx.to_flat_state(learner.base))
        assert learner.checkpoint_meta() == {"base": {"path": None, "sha256": learner.base_identity["sha256"]}}
    else:  # every parameter trains
        assert not learner.lora and learner.base is None and learner.dropout == 0.0 and LoRAParam not in trained
        assert learner.checkpoint_meta() == {}
    assert_same(learner.policy_params(params), want)
    assert_same(nnx.state(learner.merged(params)), want)


def test_checkpoint_of_another_base_is_refused():
    cfg = build({}, LORA)
    learner, _ = Learner.of(tiny(0), cfg)
    other, _ = Learner.of(tiny(1), cfg)
    assert other.base_identity != learner.base_identity  # the content hash tells the bases apart
    learner.check_checkpoint(learner.checkpoint_meta(), "out/checkpoints")  # the same base: accepted
    for meta in (other.checkpoint_meta(), {}):  # another base, or none recorded: refused, saying what to do
        with pytest.raises(CheckpointMismatch, match="out/checkpoints.*another base.*model.path.*new out_dir"):
            learner.check_checkpoint(meta, "out/checkpoints")
    plain, _ = Learner.of(tiny(0, lora=False), build({}, []))  # full fine-tuning: no base to check
    plain.check_checkpoint(other.checkpoint_meta(), "out/checkpoints")
    plain.check_checkpoint({}, "out/checkpoints")


class Killed(Exception):
    """Stands in for a kill, raised from SFT's progress hook after a checkpoint."""


def test_sft_lora_resume_onto_another_base_exits_2(tmp_path, monkeypatch, capsys):
    """A LoRA SFT run killed after its step-2 checkpoint, its base directory then overwritten by another
    model, is refused on rerun (`bmrl sft`: exit 2, naming the checkpoints and model.path) and trains nothing."""
    import bmrl.sft
    from bmrl.assembly import build_tokenizer, new_policy
    from bmrl.cli import main
    from bmrl.model import save_pretrained

    tiny_run = ["env.name=corridor", "env.options={length: 3}", "model.hidden_size=16", "model.intermediate_size=32",
                "model.num_hidden_layers=1", "model.num_attention_heads=2", "model.num_key_value_heads=1",
                "budget.budgets=[2]", "rollout.max_turns=2", "rollout.max_reply_tokens=4", "rollout.max_len=160",
                "eval.ts=[2]", "eval.num_tasks=4", "sft.batch_size=2", "sft.demo_turns=2", "sft.steps=4",
                "sft.checkpoint_minutes=0", "data.train_size=16", "data.test_size=4"]
    base = tmp_path / "base"

    def write_base(seed):
        cfg = build({}, tiny_run + [f"seed={seed}"])
        tok = build_tokenizer(cfg)
        save_pretrained(new_policy(cfg, tok), tok, base)

    write_base(0)
    cfg = build({}, tiny_run + LORA + [f"model.path={base}", f"out_dir={tmp_path / 'run'}"])
    monkeypatch.setattr(bmrl.sft, "evaluate_policy", lambda *a, **k: {"greedy": {"success": 0.0}})  # no eval compiles

    def kill(done, steps):
        if done == 2:
            raise Killed

    with pytest.raises(Killed):
        bmrl.sft.run_sft(cfg, log=lambda _: None, on_step=kill)
    write_base(1)  # another model under the same path
    capsys.readouterr()
    code = main(["sft", "--config", str(tmp_path / "run" / "config.yaml")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{tmp_path / 'run' / 'checkpoints'} hold LoRA adapters trained on another base" in err
    assert str(base) in err and "Point model.path at that base" in err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["1", "2"]
