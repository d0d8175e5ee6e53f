"""The memory plan (exact bytes for params, optimizer state and KV cache; activations checked against
XLA's compiled buffers; refusal of a config that cannot fit) and the memory options, each against the
plain path: remat, gradient accumulation over micro-batches, bfloat16 params with a float32 master copy.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bmrl import config as config_lib
from bmrl.learn import make_optimizer
from bmrl.learn import step as step_lib
from bmrl.memory import MemoryPlanError, activation_bytes, plan_memory
from bmrl.model import ModelConfig, init_model
from bmrl.model.attention import QUERY_BLOCK
from bmrl.parallel import MeshConfig, make_mesh
from tests.paths import ROOT
from tests.test_train import fake_traj, flat, train_cfg

V, B, L = 24, 8, 12  # fake_traj's shapes


def model_cfg(**kw):
    base = dict(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1)
    return ModelConfig(**{**base, **kw})


def nbytes(tree):
    """Bytes of the arrays (or of their shapes: `jax.eval_shape`'s ShapeDtypeStructs) of `tree`."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def init_params(mcfg):
    """(graphdef, params) of `mcfg`, the params those of the float32 model of the same seed (cast in numpy,
    round to nearest even as XLA's convert: no one-op program per parameter shape)."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: init_model(mcfg, 0)))
    _, params = nnx.split(init_model(dataclasses.replace(mcfg, param_dtype="float32"), 0))
    return graphdef, jax.tree.map(lambda x: jax.device_put(np.asarray(x).astype(jnp.dtype(mcfg.param_dtype))), params)


def flat64(tree):
    """`flat` of any float tree, as float64 (bfloat16 and float32 both exact), converted in numpy."""
    return np.concatenate([np.ravel(np.asarray(x).astype(np.float64)) for x in jax.tree.leaves(tree)])


def run_steps(mcfg, cfg, tx, steps=2, traj_seed=0):
    """`steps` updates of a fresh model; returns (losses, final params as float64 vector)."""
    graphdef, params = init_params(mcfg)
    opt_state = step_lib.init_opt_state(tx, params)
    update = step_lib.make_update(graphdef, tx, cfg, 1.0, donate=False)
    losses = []
    for i in range(steps):
        params, opt_state, m = update(params, opt_state, None, fake_traj(traj_seed + i), jax.random.key(i))
        losses.append(float(m["loss"]))
    return np.array(losses), flat64(params)


@pytest.mark.parametrize("family", [
    dict(model_type="qwen2"),
    dict(model_type="qwen3", head_dim=16),  # q/k norms, head_dim != hidden / heads
    dict(model_type="gemma2", sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    dict(model_type="gemma3_text", sliding_window=4),  # sandwich norms and q/k norms
])
def test_plan_bytes_are_exact_on_one_device(family):
    mcfg = model_cfg(tie_word_embeddings=False, **family)
    if family["model_type"] != "qwen2":  # each family's extra tensors (norms, capped scores) in the estimate
        plain = model_cfg(tie_word_embeddings=False, model_type="llama", head_dim=mcfg.head_dim)
        assert activation_bytes(mcfg, B, L) > activation_bytes(plain, B, L)
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    tx = make_optimizer(1e-3, total_steps=10, master_f32=True)
    plan = plan_memory(mcfg, mesh, tx, rollout_batch=6, max_len=40, update_rows=4, device_memory_gb=1.0)
    # The model, its optimizer state and its cache as the real calls would build them, traced, not run: exactly
    # their shapes and dtypes (nothing compiled; the numbers are not what is planned).
    model = nnx.eval_shape(lambda: init_model(mcfg, 0))
    params = nnx.state(model)
    assert plan.params == plan.grads == nbytes(params)
    opt_state = jax.eval_shape(lambda p: step_lib.init_opt_state(tx, p), params)
    assert plan.opt_state == nbytes(opt_state)  # f32 master + adam moments + counters
    assert plan.kv_cache == nbytes(jax.eval_shape(lambda: model.init_cache(6, 40)))
    assert plan.capacity == 2**30 and plan.capacity_source == "mesh.device_memory_gb" and plan.fits
    assert "optimizer state" in plan.table() and "peak" in plan.table()


def workspace_bytes() -> int:
    """XLA's temporaries for a program of one small matmul: a fixed workspace some backends add to every
    program with one (cuBLAS's, ~32 MiB on a GPU; ~0 on the CPU), which no activation estimate holds."""
    a = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    return jax.jit(lambda x: x @ x.T).lower(a).compile().memory_analysis().temp_size_in_bytes


# The remat tests' shapes: 4 rows of 2 query blocks (scores [rows, heads, seq, seq] would dominate), a decoder
# of 1 or 2 layers. Both tests compile the same updates (model, optimizer, config, shapes): the second loads
# the first's programs from the session's compile cache.
REMAT_ROWS, REMAT_SEQ = 4, 2 * QUERY_BLOCK


def remat_model_cfg(layers):
    return model_cfg(num_hidden_layers=layers, hidden_size=64, intermediate_size=256, num_attention_heads=4,
                     num_key_value_heads=2)


def remat_update(mcfg, remat, params, opt_state, traj):
    """The update of the remat tests (lr 3e-3, groups of 4 rows), lowered for these (abstract or real) inputs
    and compiled."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: init_model(mcfg, 0)))
    tx = make_optimizer(3e-3, total_steps=10)
    upd = step_lib.make_update(graphdef, tx, train_cfg(tasks_per_step=REMAT_ROWS // 4, remat=remat), 1.0,
                               donate=False)
    return upd.lower(params, opt_state, None, traj, jax.random.key(0)).compile()


def xla_temp(mcfg, remat):
    """Compiled (not run) temporaries of the update of REMAT_ROWS x REMAT_SEQ tokens, less the fixed workspace."""
    params = nnx.state(nnx.eval_shape(lambda: init_model(mcfg, 0)))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    tx = make_optimizer(3e-3, total_steps=10)
    opt_state = jax.eval_shape(lambda p: step_lib.init_opt_state(tx, p), params)
    traj = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), remat_traj())
    compiled = remat_update(mcfg, remat, params, opt_state, traj)
    return compiled.memory_analysis().temp_size_in_bytes - workspace_bytes()


def remat_traj():
    """fake_traj's batch at the remat tests' shapes, its one group's rewards made to differ (signal)."""
    traj = fake_traj(0, rows=REMAT_ROWS, width=REMAT_SEQ)
    reward = np.zeros(traj.reward.shape, np.float32)
    reward[:, -1] = [1, 0, 0, 1]
    return traj.replace(reward=jax.device_put(reward), success=jax.device_put(reward[:, -1] > 0))


def test_remat_keeps_one_layer_and_the_estimate_tracks_xla_per_layer():
    """Compile only, 1 vs 2 layers, sequences of 2 query blocks (scores [rows, heads, seq, seq] would
    dominate): with remat XLA's temporaries grow by a layer input, not a layer's activations, and the
    estimate follows XLA's growth per layer and its total (within 2x), both ways. (jax.
    checkpoint alone grew by a whole layer's activations: XLA merged the recomputation away.)"""
    rows, seq = REMAT_ROWS, REMAT_SEQ
    temp, est = {}, {}
    for remat in (False, True):
        for layers in (1, 2):
            mcfg = remat_model_cfg(layers)
            temp[remat, layers] = xla_temp(mcfg, remat)
            est[remat, layers] = activation_bytes(mcfg, rows, seq, remat=remat)
            assert est[remat, layers] / 2 < temp[remat, layers] < 2 * est[remat, layers], (remat, layers, temp, est)
    grow = {r: temp[r, 2] - temp[r, 1] for r in (False, True)}
    grow_est = {r: est[r, 2] - est[r, 1] for r in (False, True)}
    assert grow[True] < grow[False] / 2, (grow, temp)
    for r in (False, True):
        assert grow_est[r] / 2 < grow[r] < 2 * grow_est[r], (r, grow, grow_est)


def test_remat_same_numbers_less_memory_and_the_estimate_tracks_xla():
    """Remat gives the same update (loss and parameters) with smaller compiled temporary buffers, and
    the activation estimate is within 3x of XLA's temporaries for the compiled update (less the fixed
    workspace of a one-matmul program: ~0 on the CPU, cuBLAS's on a GPU), both ways. The 2-layer update of
    the test above, run: its programs, loaded from the compile cache, not compiled again."""
    mcfg = remat_model_cfg(2)
    rows, seq = REMAT_ROWS, REMAT_SEQ
    params = nnx.state(init_model(mcfg, 0))
    tx = make_optimizer(3e-3, total_steps=10)
    opt_state = step_lib.init_opt_state(tx, params)
    traj = remat_traj()
    temp, result = {}, {}
    for remat in (False, True):
        compiled = remat_update(mcfg, remat, params, opt_state, traj)
        temp[remat] = compiled.memory_analysis().temp_size_in_bytes - workspace_bytes()
        est = activation_bytes(mcfg, rows, seq, remat=remat)
        assert temp[remat] / 3 < est < 3 * temp[remat], (remat, est, temp[remat])
        p, _, m = compiled(params, opt_state, None, traj, jax.random.key(0))
        assert m["skipped_updates"] == 0 and m["no_signal_updates"] == 0  # a real step, taken
        result[remat] = (float(m["loss"]), flat(p))
    assert temp[True] < temp[False]
    assert activation_bytes(mcfg, rows, seq, remat=True) < activation_bytes(mcfg, rows, seq)
    assert not np.array_equal(result[False][1], flat(params))  # the step moved the parameters
    assert abs(result[True][0] - result[False][0]) < 1e-6
    # The recomputed forward is compiled (fused) apart from the first: float32 sums may round apart, and
    # Adam divides tiny gradients by their own size: 1e-6 is 3e-4 of one step's size (lr 3e-3).
    np.testing.assert_allclose(result[True][1], result[False][1], rtol=1e-5, atol=1e-6)


def test_microbatches_accumulate_to_the_minibatch_gradient():
    """2 minibatches of 4 rows, each split into 2 (token_mean) or 4 (seq_mean) micro-batches: the same
    losses and parameters as without accumulation."""
    mcfg = model_cfg()
    tx = make_optimizer(3e-3, total_steps=10)
    for aggregation, micro in (("token_mean", 2), ("seq_mean", 4)):
        plain = run_steps(mcfg, train_cfg(minibatches=2, aggregation=aggregation), tx)
        acc = run_steps(mcfg, train_cfg(minibatches=2, microbatches=micro, aggregation=aggregation), tx)
        np.testing.assert_allclose(acc[0], plain[0], rtol=1e-5, atol=1e-6, err_msg=aggregation)
        np.testing.assert_allclose(acc[1], plain[1], rtol=1e-4, atol=1e-6, err_msg=aggregation)
    with pytest.raises(ValueError, match="train.microbatches=3 does not divide the minibatch of 4 rows"):
        run_steps(mcfg, train_cfg(minibatches=2, microbatches=3), tx, steps=1)


def test_bf16_params_with_f32_master_follow_the_f32_run():
    """bfloat16 params + a float32 master copy track the float32 run (bfloat16 rounding apart), and
    the master keeps updates too small for bfloat16 (plain bfloat16 params would not move)."""
    # 2 minibatches: the float32 run's update is the accumulation test's plain one (one program for both)
    f32 = run_steps(model_cfg(), train_cfg(minibatches=2), make_optimizer(3e-3, total_steps=10), steps=3)
    bf16 = run_steps(model_cfg(param_dtype="bfloat16"), train_cfg(minibatches=2),
                     make_optimizer(3e-3, total_steps=10, master_f32=True), steps=3)
    np.testing.assert_allclose(bf16[0], f32[0], rtol=0.05, atol=2e-3)
    np.testing.assert_allclose(bf16[1], f32[1], atol=2e-2)

    graphdef, params = init_params(model_cfg(param_dtype="bfloat16"))
    tiny = dict(lr=1e-6, total_steps=10, schedule="constant")
    out = {}
    for master in (False, True):
        tx = make_optimizer(**tiny, master_f32=master)
        state = step_lib.init_opt_state(tx, params)
        update = step_lib.make_update(graphdef, tx, train_cfg(), 1.0, donate=False)
        p = params
        for i in range(3):
            p, state, _ = update(p, state, None, fake_traj(i), jax.random.key(i))
        out[master] = (p, state)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(out[True][0]))
    start = flat64(params).astype(np.float32)
    moved_plain = np.mean(flat(out[False][0]).astype(np.float32) != start)  # most updates round away
    moved_master = np.mean(flat(out[True][1].inner_state.master) != start)  # the master keeps them
    assert moved_plain < 0.1 and moved_master > 0.9, (moved_plain, moved_master)


def test_train_refuses_a_config_that_cannot_fit(tmp_path):
    """`bmrl train` with 1 MiB of device memory: exit 2, the plan's numbers and the fixes, nothing trained."""
    from tests.test_train import TINY

    data = json.loads(json.dumps(TINY))
    data["out_dir"] = str(tmp_path / "run")
    data["mesh"] = {"device_memory_gb": 0.001}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(config_lib.to_yaml(config_lib.build(data)))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    res = subprocess.run([sys.executable, "-m", "bmrl", "train", "--config", str(cfg_path), "--no-progress"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "config error: memory:" in res.stderr and "GiB per device" in res.stderr
    for line in ("parameters", "optimizer state", "KV cache", "activations", "mesh.device_memory_gb"):
        assert line in res.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_plan_error_names_the_fix():
    mcfg = model_cfg(vocab_size=4096, hidden_size=256, intermediate_size=512)
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    plan = plan_memory(mcfg, mesh, make_optimizer(1e-3, total_steps=10), rollout_batch=64, max_len=512,
                       update_rows=64, device_memory_gb=0.05)
    with pytest.raises(MemoryPlanError, match="train.remat=true") as err:
        plan.check()
    assert err.value.key == "memory" and f"{plan.peak / 2**30:.2f} GiB" in str(err.value)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lora_update_holds_the_planned_compute_copy(dtype):
    """Compile only, on this process's backend (XLA:CPU in the suite; bench/device.sh runs this file on a GPU):
    the LoRA update of a model whose weights dominate (2 layers, hidden 512, a 2,048-token tied vocabulary, float32
    parameters) holds the plan's update within 25%: the adapters' gradients and activations plus the compute copy
    (the parameters as the matmuls read them: float32 on XLA:CPU, bfloat16 on a GPU, when they read bfloat16;
    nothing when they read float32). With bfloat16 compute, the plan without the copy would miss more than a third
    of XLA's temporaries."""
    from bmrl.model.lora import LoRASpec, add_lora, split_lora

    mcfg = ModelConfig(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, param_dtype="float32",
                       dtype=dtype)
    spec = LoRASpec(rank=4, alpha=8.0)
    shapes = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    graphdef, adapters, base = split_lora(add_lora(nnx.eval_shape(lambda: init_model(mcfg, 0)), spec))
    adapters, base = shapes(adapters), shapes(base)
    tx = make_optimizer(1e-3, total_steps=10)
    opt_state = jax.eval_shape(lambda p: step_lib.init_opt_state(tx, p), adapters)
    upd = step_lib.make_update(graphdef, tx, train_cfg(), 1.0, donate=False, frozen=True)
    temp = upd.lower(adapters, opt_state, base, fake_traj(0), jax.random.key(0)).compile().memory_analysis()
    temp = temp.temp_size_in_bytes - workspace_bytes()
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    plan = plan_memory(mcfg, mesh, tx, rollout_batch=B, max_len=L, update_rows=B, device_memory_gb=1.0, lora=spec)
    assert plan.update == plan.grads + plan.activations + plan.compute_copy  # not the optimizer step
    assert 0.8 * temp < plan.update < 1.25 * temp, (dtype, temp, plan)
    if dtype == "bfloat16":
        held = 4 if jax.default_backend() == "cpu" else 2  # bytes per parameter of the copy
        assert plan.compute_copy == held * sum(x.size for x in jax.tree.leaves(base) + jax.tree.leaves(adapters))
        assert plan.update - plan.compute_copy < 2 / 3 * temp
    else:
        assert plan.compute_copy == 0
