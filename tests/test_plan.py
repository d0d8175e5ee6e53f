"""`bmrl plan`: memory per device and time per RL step for named hardware, from shapes alone (no program is
compiled or run). The memory is `bmrl.memory`'s plan (one source of truth with `bmrl train`'s); a tiny model is
checked by hand to the byte and the time formula to 1e-9; a config that does not fit names a knob whose value
then fits; bad input exits 2; the real-model configs' generated notes equal the current plan."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys

import jax
import pytest

from bmrl import config as config_lib
from bmrl import plan as plan_lib
from bmrl.assembly import lora_spec
from bmrl.cli import main
from bmrl.commands import plan as plan_command
from bmrl.learn import optimizer_from_config
from bmrl.memory import GIB, STEP_COPIES, activation_bytes, plan_for_config
from bmrl.model import ModelConfig
from bmrl.parallel import MeshConfig, make_mesh
from tests.paths import REPO
from tests.real_models import ARCH  # the published config.json values of the real models the configs name

# A tiny experiment (a 2-layer decoder from scratch on the corridor), planned in milliseconds.
TINY = dict(
    model=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
    env=dict(name="corridor", options=dict(length=3)),
    budget=dict(kind="fixed", budgets=[2]),
    rollout=dict(max_turns=2, max_reply_tokens=4, max_len=32),
    train=dict(steps=10, tasks_per_step=2, group_size=2),
    eval=dict(ts=[2], ks=[1], attempts=1, num_tasks=1, bootstrap=0, probe_states=0),
    data=dict(train_size=8, val_size=4, test_size=4),
)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """{config file name: a directory holding only that model's config.json}."""
    out = {}
    for name, arch in ARCH.items():
        d = tmp_path_factory.mktemp(name.split(".")[0])
        (d / "config.json").write_text(json.dumps(arch))
        out[name] = str(d)
    return out


def cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `bmrl plan ARGV`, in-process."""
    try:
        code = main(["plan", *map(str, argv)])
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return int(code or 0), out.out, out.err


def write(tmp_path, data, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(config_lib.to_yaml(config_lib.build(data)))
    return path


# ---------------------------------------------------------------- (a) one source of truth
@pytest.mark.parametrize("overrides", [[], ["model.lora.rank=8", "train.kl_coef=0.1", "train.microbatches=2"]])
def test_plan_memory_is_plan_for_config_on_the_same_mesh(model_dirs, overrides):
    """`bmrl plan`'s memory is `bmrl train`'s plan (`plan_for_config` on a real mesh): the same bytes part by
    part, the LoRA saving note included, with the device memory pinned so the capacities agree."""
    name = "qwen3_0_6b_sokoban.yaml"
    cfg = config_lib.load(REPO / "configs" / name, [f"model.path={model_dirs[name]}", "mesh.device_memory_gb=32",
                                                    *overrides])
    mcfg = plan_lib.policy_model_config(cfg)
    p = plan_lib.plan(cfg, plan_lib.HARDWARE["cpu"], mcfg=mcfg)  # one device, as the local one
    t = cfg.train
    optimizer = optimizer_from_config(t.optim, t.steps * t.epochs * t.minibatches, master_f32=t.f32_master)
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    want = plan_for_config(cfg, mcfg, mesh, optimizer, lora=lora_spec(cfg))
    assert p.memory == want
    assert (p.memory.params, p.memory.opt_state, p.memory.kv_cache) == (want.params, want.opt_state, want.kv_cache)
    if overrides:
        assert p.memory.frozen and any("LoRA saves" in n for n in p.memory.notes)


# ---------------------------------------------------------------- (b) a tiny model by hand
def test_tiny_model_by_hand(monkeypatch):
    """Llama-shaped, untied head: P, its bytes, Adam's state and every term of the time model from the formulas."""
    V, h, inter, layers, heads, kv, hd, L = 64, 16, 32, 2, 2, 1, 8, 32
    mcfg = ModelConfig(model_type="llama", vocab_size=V, hidden_size=h, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                       tie_word_embeddings=False)
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter + 2 * h  # q, k v, o, MLP, 2 norms
    P = V * h + layers * per_layer + h + h * V  # embedding, layers, final norm, untied head
    assert P == 6736
    toy = plan_lib.Hardware("toy", "cpu", 1, memory=GIB, memory_text="1 GiB", peak_flops=1e9, bandwidth=1e9,
                            source="a test")
    monkeypatch.setitem(plan_lib.HARDWARE, "toy", toy)
    cfg = config_lib.build(TINY)
    p = plan_lib.plan(cfg, plan_lib.HARDWARE.lookup("toy"), mfu=0.5, bandwidth_share=0.25, kv_fill=0.5, mcfg=mcfg)

    m = p.memory
    assert p.params == P and p.matmul_params == P - V * h  # the input embedding is a lookup
    assert m.params == m.grads == 4 * P  # float32
    assert m.opt_state == 2 * 4 * P + 4 + 4 + 1 + 4 + 4  # Adam mu, nu + skip counters, a flag, 2 step counts
    rows = 2 * 2
    kv_bytes = 2 * layers * rows * L * kv * hd * 4  # keys and values, float32
    assert m.kv_cache == kv_bytes
    assert m.activations == activation_bytes(mcfg, rows, L)
    assert m.step_copies == STEP_COPIES * (4 * P + m.opt_state)  # the optimizer step's copies of params + state
    assert m.peak == 4 * P + m.opt_state + max(kv_bytes, 4 * P + m.activations, m.step_copies)
    assert p.fits and p.margin == int(0.9 * GIB) - m.peak

    t = p.time
    steps, prefill = 2 * 4, L - 2 * 4  # 2 turns x 4 reply tokens; the rest of the buffer prefilled
    f_rollout = 2 * (P - V * h) + 4 * layers * (0.5 * L) * heads * hd  # per token, attending to half the buffer
    f_learn = 2 * (P - V * h) + 4 * layers * L * heads * hd
    decode_bytes = 4 * P + 0.5 * kv_bytes
    per_step = max(decode_bytes / (1e9 * 0.25), rows * f_rollout / (1e9 * 0.5))
    expected = dict(decode_steps=steps, prefill_tokens=prefill, rows_per_device=rows, decode_bytes=decode_bytes,
                    decode_flops=rows * f_rollout, decode_s=steps * per_step, prefill_flops=rows * prefill * f_rollout,
                    prefill_s=rows * prefill * f_rollout / 5e8, learner_tokens=rows * L, learner_factor=3,
                    learner_flops=rows * L * 3 * f_learn, learner_s=rows * L * 3 * f_learn / 5e8)
    for key, value in expected.items():
        assert math.isclose(getattr(t, key), value, rel_tol=1e-9), (key, getattr(t, key), value)
    assert math.isclose(t.step_s, expected["decode_s"] + expected["prefill_s"] + expected["learner_s"], rel_tol=1e-9)

    remat = plan_lib.plan(config_lib.build([TINY, dict(train=dict(remat=True, kl_coef=0.1))]), toy, mfu=0.5,
                          bandwidth_share=0.25, mcfg=mcfg)
    assert remat.time.learner_factor == 5 and remat.memory.reference == 4 * P  # + a forward each, + the KL copy
    assert "P = 0.0M parameters" in p.table() and "FITS" in p.table()

    # A history window of 1 turn (2 turns at once fit the same 32 tokens): the same memory (a minibatch of rows of
    # the buffer), a row per turn for the learner, and every turn decodes its reply and re-prefills the window.
    window = plan_lib.plan(config_lib.build([TINY, dict(rollout=dict(history_turns=1))]), toy, mfu=0.5,
                           bandwidth_share=0.25, mcfg=mcfg)
    w = window.time
    assert window.memory.peak == m.peak and window.shapes.learner_rows == 2 * p.shapes.learner_rows
    assert (w.decode_steps, w.prefill_tokens, w.learner_tokens) == (steps, 2 * (L - 4), 2 * rows * L)
    assert "update 4 x 2 turn rows x 1 epoch" in window.table()
    # The chat template's history (format.history: template): a row per turn too; one context whose earlier replies
    # are re-prefilled once, as much as they keep (at most every decoded token): the buffer at most.
    template = plan_lib.plan(config_lib.build([TINY, dict(format=dict(history="template"))]), toy, mfu=0.5,
                             bandwidth_share=0.25, mcfg=mcfg).time
    assert (template.decode_steps, template.prefill_tokens, template.learner_tokens) == (steps, L, 2 * rows * L)


# ---------------------------------------------------------------- (c) does not fit -> a knob that fits
def test_a_config_that_does_not_fit_names_a_knob_whose_value_fits(tmp_path, capsys):
    """64 rows of 256 tokens in one minibatch on a 12 MiB device: exit 1, "DOES NOT FIT" and the smallest
    train.minibatches that fits, which, given as an override, fits (exit 0) with the peak the fix said."""
    data = config_lib.to_dict(config_lib.build([TINY, dict(
        rollout=dict(max_len=256), train=dict(tasks_per_step=8, group_size=8), mesh=dict(device_memory_gb=0.012))]))
    path = write(tmp_path, data)
    code, out, err = cli(capsys, "--config", path, "--hardware", "cpu")
    assert code == 1, err
    assert "DOES NOT FIT" in out and "does not fit on cpu (exit status 1)" in out
    fix = re.search(r"^    (train\.minibatches=(\d+)) fits: [\d.]+ MiB of [\d.]+ MiB usable", out, re.M)
    assert fix and int(fix.group(2)) > 1, out

    code, out, _ = cli(capsys, "--config", path, "--hardware", "cpu", "--json")
    plans = json.loads(out)
    assert code == 1 and not plans["fits"]
    fixes = {f["knob"]: f for f in plans["plans"][0]["fixes"]}
    assert fixes["train.minibatches"]["overrides"] == [fix.group(1)]
    assert fixes["train.minibatches"]["peak"] <= plans["plans"][0]["memory"]["usable"]
    smaller = config_lib.load(path, [f"train.minibatches={int(fix.group(2)) // 2}"])  # the next smaller value does not
    assert not plan_lib.plan(smaller, plan_lib.HARDWARE["cpu"], fixes=False).fits

    code, out, err = cli(capsys, "--config", path, fix.group(1), "--hardware", "cpu", "--json")  # re-planned with it
    fixed = json.loads(out)
    assert code == 0 and fixed["fits"], err
    assert fixed["plans"][0]["memory"]["peak"] == fixes["train.minibatches"]["peak"]
    for f in fixes.values():  # every knob that fits alone fits when applied
        if f["fits"] and f["knob"] != "together":
            assert plan_lib.plan(config_lib.load(path, f["overrides"]), plan_lib.HARDWARE["cpu"], fixes=False).fits, f


# ---------------------------------------------------------------- (d) bad input: exit 2
def test_unknown_hardware_and_bad_configs_exit_2(tmp_path, capsys):
    path = write(tmp_path, TINY)
    code, out, err = cli(capsys, "--config", path, "--hardware", "tpu-v9")
    assert code == 2 and out == ""
    assert "bmrl plan: unknown hardware 'tpu-v9'; valid: " in err
    assert all(name in err for name in plan_lib.HARDWARE)
    code, _, err = cli(capsys, "--config", path, "train.stepz=3", "--hardware", "cpu")
    assert code == 2 and "bmrl plan: config error: train.stepz" in err and "Traceback" not in err
    code, _, err = cli(capsys, "--config", path, "model.path=" + str(tmp_path / "nowhere"), "--hardware", "cpu")
    assert code == 2 and "config error: model.path" in err
    code, _, err = cli(capsys, "--config", REPO / "configs" / "qwen_tools.yaml", "--hardware", "h100")
    assert code == 2 and "model.path" in err and "is required" in err
    code, _, err = cli(capsys, "--config", path, "train.steps=2", "--hardware", "cpu", "--write-notes")
    assert code == 2 and "no overrides but model.path" in err
    code, _, err = cli(capsys, "--config", path, "--hardware", "cpu", "--mfu", "0")
    assert code == 2 and "--mfu" in err
    code, _, err = cli(capsys, "--hardware", "cpu")
    assert code == 2 and "--config FILE is required" in err


def test_help_names_the_registered_hardware_without_importing_jax():
    """The command's parser reads `bmrl.machines` (plain data): `bmrl plan --help` lists every registered machine
    and the default assumptions without importing the planner (jax); each machine has its figures and source."""
    code = ("import sys, argparse, bmrl.commands.plan as c; p = argparse.ArgumentParser(); "
            "c.register(p.add_subparsers()); assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    text = " ".join(parser._subparsers._group_actions[0].choices["plan"].format_help().split())
    assert ", ".join(plan_lib.HARDWARE) in text
    assert f"(default {plan_lib.Assumptions.mfu})" in text and f"(default {plan_lib.Assumptions.bandwidth_share})" in text
    for hw in plan_lib.HARDWARE.values():
        assert hw.source and hw.memory > 0 and hw.peak_flops > 0 and hw.bandwidth > 0, hw


def test_mesh_is_the_configs_or_all_devices_on_data():
    assert plan_lib.mesh_axes(config_lib.MeshCfg(), 8) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert plan_lib.mesh_axes(config_lib.MeshCfg(data=2, fsdp=-1, tensor=2), 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert plan_lib.mesh_axes(config_lib.MeshCfg(data=1, fsdp=8), 4) is None
    cfg = config_lib.build([TINY, dict(mesh=dict(data=1, fsdp=8))])
    p = plan_lib.plan(cfg, plan_lib.HARDWARE["tpu-v4-8"])
    assert p.mesh == {"data": 4, "fsdp": 1, "tensor": 1} and p.mesh_fallback
    assert "cannot form 4 devices: all on the data axis" in " ".join(p.table().split())


# ---------------------------------------------------------------- (e) the configs' notes are current
def _notes_command(block: str) -> tuple[str, dict]:
    head = block.splitlines()[0]
    hardware = re.search(r"--hardware (\S+)", head).group(1)
    options = {k.replace("-", "_"): float(v) for k, v in re.findall(r"--(mfu|bandwidth-share) (\S+)", head)}
    return hardware, options


@pytest.mark.parametrize("name", sorted(ARCH))
def test_config_notes_are_the_current_plan(name, model_dirs):
    """The generated block of each real-model config equals what `bmrl plan --write-notes` writes now;
    regenerate with: bmrl plan --config configs/NAME model.path=DIR --hardware ... --write-notes."""
    path = REPO / "configs" / name
    text = path.read_text()
    block = plan_lib.read_notes(text)
    assert block is not None, f"{name}: no generated bmrl plan block"
    hardware, options = _notes_command(block)
    cfg = config_lib.load(path, [f"model.path={model_dirs[name]}"])
    mcfg = plan_lib.policy_model_config(cfg)
    plans = [plan_lib.plan(cfg, plan_lib.HARDWARE.lookup(h), mcfg=mcfg, config_name=name, **options)
             for h in hardware.split(",")]
    assert block == plan_lib.notes_block(plans, hardware, plan_lib.Assumptions(**options)), (
        f"{name}: regenerate with bmrl plan --config configs/{name} model.path=DIR --hardware {hardware} --write-notes")
    assert "back-of-the-envelope" not in text  # the hand arithmetic is gone


def test_write_notes_replaces_only_the_block(tmp_path, capsys, model_dirs):
    name = "qwen2_5_0_5b_sokoban.yaml"  # a JAX env: no file next to it is read
    text = (REPO / "configs" / name).read_text()
    copy = tmp_path / name
    copy.write_text(text)
    code, out, _ = cli(capsys, "--config", copy, f"model.path={model_dirs[name]}", "--hardware",
                       _notes_command(plan_lib.read_notes(text))[0], "--write-notes")
    assert code == 0 and "already current" in out and copy.read_text() == text
    bare = text.replace(plan_lib.read_notes(text), "")
    copy.write_text(bare)
    code, out, _ = cli(capsys, "--config", copy, f"model.path={model_dirs[name]}", "--hardware", "h100",
                       "--write-notes")
    new = copy.read_text()
    assert code == 0 and "updated" in out and new.count(plan_lib.NOTES_END) == 1
    end = bare.index("\nseed:")  # after the leading comment lines, set off by a "#" line
    assert new.replace(plan_lib.read_notes(new), "") == bare[:end] + "#\n" + bare[end:]
    assert "on h100" in plan_lib.read_notes(new)
    assert config_lib.load(copy, ["model.path=/m"]) == config_lib.load(REPO / "configs" / name, ["model.path=/m"])


def test_plan_for_many_devices_shards_what_the_rules_shard(model_dirs):
    """fsdp splits parameters and optimizer state; tensor splits them and the KV heads (shapes only: an 8-device
    mesh planned on this 1-device machine)."""
    name = "llama3_2_1b_toolchain.yaml"
    base = config_lib.load(REPO / "configs" / name, [f"model.path={model_dirs[name]}"])
    mcfg = plan_lib.policy_model_config(base)
    hw = plan_lib.HARDWARE["h100x8"]
    plain = plan_lib.plan(dataclasses.replace(base, mesh=config_lib.MeshCfg(data=-1)), hw, mcfg=mcfg, fixes=False)
    assert plain.mesh == {"data": 8, "fsdp": 1, "tensor": 1}
    fsdp = plan_lib.plan(dataclasses.replace(base, mesh=config_lib.MeshCfg(data=1, fsdp=8)), hw, mcfg=mcfg, fixes=False)
    tensor = plan_lib.plan(dataclasses.replace(base, mesh=config_lib.MeshCfg(data=4, tensor=2)), hw, mcfg=mcfg,
                           fixes=False)
    assert fsdp.mesh == {"data": 1, "fsdp": 8, "tensor": 1} and not fsdp.mesh_fallback
    assert fsdp.memory.params < plain.memory.params / 7 and fsdp.memory.opt_state < plain.memory.opt_state / 7
    assert 0 < fsdp.memory.compute_copy < plain.memory.compute_copy / 7  # the copy is sharded as its parameters
    assert fsdp.memory.kv_cache == plain.memory.kv_cache  # the batch is split 8 ways either way
    assert tensor.memory.kv_cache == plain.memory.kv_cache  # 4 batch ways x 2 ways of KV heads: 8 either way
    assert tensor.time.decode_bytes < plain.time.decode_bytes  # each device reads half the weights


def test_compute_copy_follows_the_backend_and_the_dtypes():
    """The parameters as the matmuls read them: in the compute dtype on GPU and TPU, none when they are stored in
    it, float32 on XLA:CPU whenever either dtype is narrower (it computes bfloat16 dots in float32); integer leaves
    never. A tied model's rollout adds its [vocab, hidden] head in the compute dtype; the copy is in the rollout's
    and the update's bytes."""
    from bmrl.memory import compute_copy_bytes, plan_memory

    leaves = [jax.ShapeDtypeStruct((64, 32), "float32"), jax.ShapeDtypeStruct((8,), "int32")]
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    sh = [jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())] * 2
    n = 64 * 32
    assert compute_copy_bytes(leaves, sh, "bfloat16", "tpu") == compute_copy_bytes(leaves, sh, "bfloat16", "gpu") == 2 * n
    assert compute_copy_bytes(leaves, sh, "bfloat16", "cpu") == 4 * n
    assert compute_copy_bytes(leaves, sh, "float32", "cpu") == compute_copy_bytes(leaves, sh, "float32", "gpu") == 0
    bf16 = [jax.ShapeDtypeStruct((64, 32), "bfloat16")]
    assert compute_copy_bytes(bf16, sh[:1], "bfloat16", "gpu") == 0 and compute_copy_bytes(bf16, sh[:1], "bfloat16", "cpu") == 4 * n
    mcfg = ModelConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, tie_word_embeddings=True, param_dtype="float32", dtype="bfloat16")
    from bmrl.learn import make_optimizer

    kw = dict(rollout_batch=2, max_len=16, update_rows=2, device_memory_gb=1.0)
    tx = make_optimizer(1e-3, total_steps=10)
    cpu, tpu = (plan_memory(mcfg, mesh, tx, backend=b, **kw) for b in ("cpu", "tpu"))
    assert cpu.compute_copy == 2 * tpu.compute_copy == 2 * cpu.params // 2 > 0  # float32 params: 4 vs 2 bytes each
    assert cpu.head_copy == tpu.head_copy == 256 * 32 * 2
    assert cpu.rollout == cpu.kv_cache + cpu.compute_copy + cpu.head_copy
    assert cpu.update == max(cpu.grads + cpu.activations + cpu.compute_copy, cpu.step_copies)
    assert cpu.peak == cpu.params + cpu.opt_state + max(cpu.rollout, cpu.update)
    untied = dataclasses.replace(mcfg, tie_word_embeddings=False, dtype="float32")
    plain = plan_memory(untied, mesh, tx, backend="gpu", **kw)
    assert plain.compute_copy == plain.head_copy == 0 and "compute copy" not in plain.table()
    assert "compute copy" in cpu.table() and "tied head copy" in cpu.table()
