"""LoRA (bmrl.model.lora): adapters on a frozen base, through the model, the update and the training loop.

Tiny 1-layer decoders and the synthetic batches of tests/test_train.py; numbers are checked against
the base model itself (bitwise at the start) and against the merged model.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bmrl.learn import skip_nonfinite
from bmrl.learn import step as step_lib
from bmrl.model import ModelConfig, init_model
from bmrl.model.lora import LoRAParam, LoRASpec, add_lora, merge_lora, split_lora
from bmrl.parallel import make_mesh
from tests.paths import ROOT
from tests.test_train import V, fake_traj, on_policy_traj, train_cfg

SPEC = LoRASpec(rank=4, alpha=8.0)


def tiny(dtype="float32", seed=0, model_type="qwen2"):
    """A 1-layer qwen2 decoder (q/k/v biases: the adapter sits beside a bias too)."""
    return init_model(ModelConfig.tiny(V, model_type=model_type, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, param_dtype=dtype, dtype=dtype),
                      seed)


def forward(graphdef, *states):
    return _forward(graphdef, TOKENS, *states)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, tokens, *states):
    """The logits of the model `graphdef` with `states` merged: one program per graph and shapes, every test's
    (eager NNX compiles a program per op)."""
    return nnx.merge(graphdef, *states)(tokens)


def logits(model, tokens):
    """`model(tokens)` behind one jit, as numpy."""
    graphdef, *states = nnx.split(model)
    return np.asarray(_forward(graphdef, np.asarray(tokens, np.int32), *states))


def randomized(adapters, scale):
    """Every adapter matrix (B too) drawn N(0, scale^2) from a seed of its size, on the host (eager
    jax.random compiled a program per shape)."""
    return jax.tree.map(lambda x: jax.device_put(
        (np.random.default_rng(x.size).standard_normal(x.shape) * scale).astype(np.float32)), adapters)


TOKENS = np.random.default_rng(0).integers(0, V, (2, 7)).astype(np.int32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_starting_policy_is_the_base_bitwise(dtype):
    model = tiny(dtype)
    base_out = forward(*nnx.split(model))
    add_lora(model, SPEC, seed=3)
    graphdef, adapters, base = split_lora(model)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adapters))  # adapters float32, base as stored
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(base))
    assert len(jax.tree.leaves(adapters)) == 2 * 7
    np.testing.assert_array_equal(np.asarray(forward(graphdef, adapters, base)), np.asarray(base_out))
    # B random as well: the adapter moves the outputs; merged into the kernels it gives the same logits
    adapters = randomized(adapters, 0.3)
    lora_out = forward(graphdef, adapters, base)
    assert float(np.abs(np.asarray(lora_out) - np.asarray(base_out)).max()) > 1e-2
    merged = merge_lora(nnx.merge(graphdef, adapters, base))
    assert not any(isinstance(v, LoRAParam) for _, v in nnx.to_flat_state(nnx.state(merged)))
    tol = 1e-5 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(np.asarray(forward(*nnx.split(merged))), np.asarray(lora_out), rtol=tol, atol=tol)


def test_adapters_follow_the_partition_rules():
    """A and B split like their kernel's input and output axes (rank replicated); on 8 simulated devices
    (data 2, fsdp 2, tensor 2), placed by the rules, the LoRA model gives one device's logits and
    adapter gradients."""
    import os
    import subprocess
    import sys

    from jax.sharding import PartitionSpec as P

    from bmrl.parallel import spec_for
    from tests.xla import EIGHT_CPU_DEVICES
    from tests.test_parallel import FakeMesh

    mesh = FakeMesh()
    assert spec_for("layers/0/self_attn/q_proj/lora_a", (64, 8), mesh) == P("fsdp")
    assert spec_for("layers/0/mlp/up_proj/lora_b", (8, 64), mesh) == P(None, "tensor")
    assert spec_for("layers/0/self_attn/o_proj/lora_a", (64, 8), mesh) == P("tensor")
    assert spec_for("layers/0/mlp/down_proj/lora_b", (8, 64), mesh) == P(None, "fsdp")
    env = dict(os.environ, XLA_FLAGS=EIGHT_CPU_DEVICES, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert res.returncode == 0 and "same" in res.stdout, res.stdout + res.stderr


_MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from bmrl.model import ModelConfig, init_model
from bmrl.model.lora import LoRASpec, add_lora, split_lora
from bmrl.parallel import MeshConfig, make_mesh, param_shardings
cfg = ModelConfig.tiny(64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64)
graphdef, adapters, base = split_lora(add_lora(init_model(cfg, 0), LoRASpec(rank=4, alpha=8.0)))
adapters = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.size), x.shape) * 0.3, adapters)
tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 8)), jnp.int32)
def run(a, b):
    loss = lambda a: jnp.sum(nnx.merge(graphdef, a, b)(tokens) ** 2) / 1e3
    return jax.jit(jax.value_and_grad(loss))(a)
one = run(adapters, base)
mesh = make_mesh(MeshConfig(2, 2, 2))
place = lambda s: jax.device_put(s, param_shardings(s, mesh))
a8 = place(adapters)
assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated for x in jax.tree.leaves(a8))
eight = run(a8, place(base))
for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
print("same")
"""


def lora_update(model, tr, cfg, lr=0.05, dropout=0.0):
    graphdef, adapters, base = split_lora(model)
    tx = skip_nonfinite(optax.adam(lr))
    opt_state = step_lib.init_opt_state(tx, adapters)
    update = step_lib.make_update(graphdef, tx, cfg, 1.0, donate=False, frozen=True, dropout=dropout)
    return graphdef, adapters, base, opt_state, update


def test_update_trains_adapters_only_and_kl_to_the_base_starts_at_zero():
    model = add_lora(tiny(), SPEC)
    tr = on_policy_traj(model)
    graphdef, adapters, base, opt_state, update = lora_update(model, tr, train_cfg(kl_coef=0.5))
    base_before = jax.tree.map(np.array, base)
    assert {x.shape for x in jax.tree.leaves(opt_state)} <= {x.shape for x in jax.tree.leaves(adapters)} | {()}
    new, opt_state, m = update(adapters, opt_state, base, tr, jax.random.key(0))
    assert float(m["kl"]) == 0.0 and float(m["approx_kl"]) == 0.0  # on policy, the policy is the base
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, base), base_before)
    b_moved = [float(np.abs(np.asarray(x)).max()) for p, x in nnx.to_flat_state(new) if p[-1] == "lora_b"]
    assert min(b_moved) > 0  # every adapter moved
    new, _, m = update(new, opt_state, base, tr, jax.random.key(1))
    assert float(m["kl"]) > 0  # off the base now: the KL term sees it
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, base), base_before)


def test_update_with_lora_dropout_draws_from_the_key():
    model = add_lora(tiny(), LoRASpec(rank=4, alpha=8.0, dropout=0.5))
    tr = fake_traj(1)
    cfg = train_cfg(minibatches=2)
    graphdef, adapters, base, opt_state, update = lora_update(model, tr, cfg, dropout=0.5)
    plain = lora_update(model, tr, cfg, dropout=0.0)[-1]
    a, b = (update(adapters, opt_state, base, tr, jax.random.key(0))[0] for _ in range(2))
    c = plain(adapters, opt_state, base, tr, jax.random.key(0))[0]
    same = lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y)))  # noqa: E731  (compared on the host)
    assert all(jax.tree.leaves(jax.tree.map(same, a, b)))  # same key, same masks
    assert not all(jax.tree.leaves(jax.tree.map(same, a, c)))  # dropout did something


# ------------------------------------------------------------------------------- the loop
class _Killed(Exception):
    pass


def _checkpoint_bytes(directory, step):
    """Bytes of the arrays a checkpoint holds, from its manifest."""
    from bmrl.checkpoint import Checkpointer

    ckpt = Checkpointer(directory)
    try:
        arrays = ckpt._read_manifest(step)["arrays"]
    finally:
        ckpt.close()
    return sum(int(np.prod(a["shape"])) * np.dtype(a["dtype"]).itemsize for a in arrays.values())


def test_lora_run_base_frozen_small_checkpoints_resume_bitwise_and_base_checked(tmp_path, monkeypatch):
    """A LoRA run (KL to the base, dropout, a history window of 1 turn: each turn its own learning sample)
    killed after its step-2 checkpoint and resumed ends with the bytes of an uninterrupted run; its
    checkpoints are a small fraction of full training's; a resume against another base is refused."""
    from safetensors.numpy import load_file

    from bmrl import train as train_lib
    from bmrl.assembly import learner as learner_lib
    from bmrl.checkpoint import CheckpointMismatch
    from tests.test_train import tiny_cfg

    over = dict(model={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "lora": {"rank": 4, "dropout": 0.1}},
                train={"steps": 4, "kl_coef": 0.1, "optim": {"lr": 3e-2}}, checkpoint={"every": 2, "keep": 2},
                rollout={"history_turns": 1})
    train_lib.train(tiny_cfg(tmp_path / "ref", **over), progress=False, evaluate=False)

    def kill(done, total):
        if done == 3:
            raise _Killed

    cfg = tiny_cfg(tmp_path / "run", **over)
    with pytest.raises(_Killed):
        train_lib.train(cfg, progress=False, on_step=kill, evaluate=False)
    with monkeypatch.context() as m:  # the base changed under the run: refused, naming model.path
        m.setattr(learner_lib, "content_hash", lambda state: "another base")
        with pytest.raises(CheckpointMismatch, match="another base.*model.path"):
            train_lib.train(cfg, progress=False, evaluate=False)
    out = train_lib.train(cfg, progress=False, evaluate=False)
    assert out["resumed_from"] == 2
    from bmrl.assembly import load_policy  # the PEFT adapter beside the merged policy: the same model

    (adapted, _), (merged, _) = load_policy(out["policy_adapter"]), load_policy(out["policy"])
    tokens = np.random.default_rng(2).integers(0, 300, (2, 9)).astype(np.int32)
    np.testing.assert_allclose(logits(adapted, tokens), logits(merged, tokens), rtol=1e-5, atol=1e-5)
    a, b = (load_file(str(d / "policy" / "model.safetensors")) for d in (tmp_path / "ref", tmp_path / "run"))
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name

    # The checkpoint: adapters + their Adam moments; full training keeps every parameter three times.
    n_params = sum(v.size for v in a.values())
    lora_bytes = _checkpoint_bytes(tmp_path / "run" / "checkpoints", 4)
    assert lora_bytes < 0.1 * 3 * 4 * n_params, (lora_bytes, n_params)


# ------------------------------------------------------------------------------- export
def test_export_merged_and_peft_adapter_load_with_the_same_logits(tmp_path, tiny_tokenizer):
    """policy/ (merged) and policy_adapter/ (PEFT, on the base written beside it) give the LoRA model's
    logits: in bmrl (load_policy of either) and in torch (transformers; peft.PeftModel on the base)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from bmrl.assembly import load_policy
    from bmrl.model.peft import export_policy

    cfg = ModelConfig.tiny(512, model_type="qwen2", hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1)
    model = add_lora(init_model(cfg, 0), LoRASpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj")))
    graphdef, adapters, base = split_lora(model)
    adapters = randomized(adapters, 0.5)
    model = nnx.merge(graphdef, adapters, base)
    written = export_policy(model, tiny_tokenizer, tmp_path, None)
    assert set(written) == {"policy", "base", "policy_adapter"}
    from bmrl.commands.compare import parse_spec  # bmrl compare takes the adapter directory as a policy

    assert parse_spec(written["policy_adapter"]) == {"kind": "dir", "path": written["policy_adapter"]}
    tokens = np.asarray(np.random.default_rng(1).integers(0, len(tiny_tokenizer), (2, 9)), np.int32)
    want = logits(model, tokens)
    scale = np.abs(want).max()

    adapter_model, _ = load_policy(written["policy_adapter"])  # the adapter dir reloads to the same model
    np.testing.assert_array_equal(logits(adapter_model, tokens), want)
    merged, _ = load_policy(written["policy"])
    np.testing.assert_allclose(logits(merged, tokens), want, atol=1e-5 * scale, rtol=0)

    with torch.no_grad():
        t_tokens = torch.tensor(tokens, dtype=torch.long)
        hf_merged = AutoModelForCausalLM.from_pretrained(written["policy"], torch_dtype=torch.float32).eval()
        np.testing.assert_allclose(hf_merged(t_tokens).logits.numpy(), want, atol=1e-5 * scale, rtol=0)
        hf_base = AutoModelForCausalLM.from_pretrained(written["base"], torch_dtype=torch.float32).eval()
        hf_lora = peft.PeftModel.from_pretrained(hf_base, written["policy_adapter"]).eval()
        np.testing.assert_allclose(hf_lora(t_tokens).logits.numpy(), want, atol=1e-5 * scale, rtol=0)


# ------------------------------------------------------------------------------- the memory plan
def test_memory_plan_counts_frozen_base_adapters_and_their_optimizer_state():
    from bmrl.learn import make_optimizer
    from bmrl.memory import plan_memory
    from bmrl.parallel import MeshConfig

    model = tiny("bfloat16")
    mcfg = model.config
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    tx = make_optimizer(1e-3, total_steps=10)
    nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    kw = dict(rollout_batch=6, max_len=40, update_rows=4, device_memory_gb=1.0, kl_reference=True)
    full, lora = plan_memory(mcfg, mesh, tx, **kw), plan_memory(mcfg, mesh, tx, lora=SPEC, **kw)
    _, adapters, base = split_lora(add_lora(model, SPEC))
    assert lora.frozen == nbytes(base) == full.params and lora.params == nbytes(base) + nbytes(adapters)
    assert lora.grads == nbytes(adapters) and lora.opt_state == nbytes(step_lib.init_opt_state(tx, adapters))
    assert full.reference == full.params and lora.reference == 0  # the KL reference: a copy, or the base itself
    assert lora.activations > full.activations and lora.grads + lora.opt_state < full.grads + full.opt_state
    assert "frozen base" in lora.table() and "KL reference" in full.table()


def test_sft_step_trains_the_adapters_on_a_frozen_base_with_dropout():
    from bmrl.learn.sft import make_sft_step

    model = add_lora(tiny(), LoRASpec(rank=4, alpha=8.0, dropout=0.2))
    graphdef, adapters, base = split_lora(model)
    tr = fake_traj(2)
    tx = skip_nonfinite(optax.adam(0.05))
    opt_state = step_lib.init_opt_state(tx, adapters)
    step = make_sft_step(graphdef, tx)
    before = jax.tree.map(np.array, base)
    losses = []
    for i in range(3):
        adapters, opt_state, m = step(adapters, opt_state, tr.tokens, tr.length, tr.loss_mask, base, jax.random.key(i))
        losses.append(float(m["loss"]))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, base), before)
    assert losses[-1] < losses[0]
