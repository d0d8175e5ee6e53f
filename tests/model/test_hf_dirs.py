"""Bad Hugging Face model directories: every one is refused with the error type and the file it is about.

Each case breaks a copy of one tiny saved model (config, weights, index, symlinks, pickles, NaN) and
names the text the error must contain (the file, or the tensor). `python -m tests.model.test_hf_dirs`
prints how many cases get a clear error with the installed `bmrl` (the issue-16 before/after count).
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bmrl.model import CheckpointError, ConfigError, ModelConfig, from_pretrained, init_model, save_pretrained
from tests.model.hf_edit import edit_config, edit_tensors

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
EMBED = "model.embed_tokens.weight"
CASES = {}


def case(build):
    """Register `build(d) -> expected text`: it breaks the model directory `d` (its parent is free space)."""
    CASES[build.__name__] = build
    return build


def _shard(d, index_entry):
    """Move the weights to `<parent>/x.safetensors` and point an index at it as `index_entry`."""
    names = list(load_file(str(d / WEIGHTS)))
    shutil.move(d / WEIGHTS, d.parent / "x.safetensors")
    (d / INDEX).write_text(json.dumps({"weight_map": {n: index_entry for n in names}}))


# ---------------------------------------------------------------- directory and config.json
@case
def missing_directory(d):
    shutil.rmtree(d)
    return str(d)


@case
def path_is_a_file(d):
    shutil.rmtree(d)
    d.write_text("not a directory")
    return str(d)


@case
def no_config(d):
    (d / "config.json").unlink()
    return "config.json"


@case
def config_not_json(d):
    (d / "config.json").write_text("{model_type: llama")
    return "config.json"


@case
def config_is_a_list(d):
    (d / "config.json").write_text("[1, 2]")
    return "config.json"


@case
def config_binary(d):
    (d / "config.json").write_bytes(b"\xff\xfe\x00\x81binary")
    return "config.json"


@case
def config_unsupported_model_type(d):
    edit_config(d, model_type="gpt2")
    return "config.json"


@case
def config_without_model_type(d):
    cfg = json.loads((d / "config.json").read_text())
    del cfg["model_type"]
    (d / "config.json").write_text(json.dumps(cfg))
    return "config.json"


@case
def config_heads_not_divisible(d):
    edit_config(d, num_key_value_heads=3)
    return "config.json"


@case
def config_unsupported_activation(d):
    edit_config(d, hidden_act="gelu")
    return "config.json"


@case
def config_field_of_wrong_type(d):
    edit_config(d, hidden_size="big")
    return "config.json"


@case
def config_symlink_leaves_directory(d):
    shutil.move(d / "config.json", d.parent / "config.json")
    (d / "config.json").symlink_to(d.parent / "config.json")
    return "config.json"


# ---------------------------------------------------------------- weights
@case
def no_weights(d):
    (d / WEIGHTS).unlink()
    return str(d)


@case
def pickle_bin_only(d):
    (d / WEIGHTS).unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    return "pytorch_model.bin"


@case
def pickle_pt_only(d):
    (d / WEIGHTS).unlink()
    (d / "model.pt").write_bytes(b"\x80\x04pickle")
    return "model.pt"


@case
def pickle_pkl_only(d):
    (d / WEIGHTS).unlink()
    (d / "weights.pkl").write_bytes(b"\x80\x04pickle")
    return "weights.pkl"


@case
def weights_truncated(d):
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[: len(data) // 2])
    return WEIGHTS


@case
def weights_empty_file(d):
    (d / WEIGHTS).write_bytes(b"")
    return WEIGHTS


@case
def weights_garbage_header(d):
    (d / WEIGHTS).write_bytes((2**40).to_bytes(8, "little") + b"{garbage")
    return WEIGHTS


@case
def weights_is_a_directory(d):
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).mkdir()
    return WEIGHTS


@case
def weights_symlink_leaves_directory(d):
    shutil.move(d / WEIGHTS, d.parent / "x.safetensors")
    (d / WEIGHTS).symlink_to(d.parent / "x.safetensors")
    return WEIGHTS


@case
def weights_symlink_loop(d):
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).symlink_to(d / WEIGHTS)
    return WEIGHTS


@case
def tensor_missing(d):
    edit_tensors(d, lambda t: t.pop("model.norm.weight"))
    return "model.norm.weight"


@case
def tensor_misshaped(d):
    edit_tensors(d, lambda t: t.update({"model.norm.weight": np.ones(3, np.float32)}))
    return "model.norm.weight"


@case
def config_disagrees_with_tensors(d):
    edit_config(d, num_hidden_layers=2)
    return "model.layers.1."


@case
def tensor_nan(d):
    def edit(t):
        t[EMBED] = t[EMBED].copy()
        t[EMBED][3, 1] = np.nan

    edit_tensors(d, edit)
    return EMBED


@case
def tensor_inf(d):
    def edit(t):
        t["lm_head.weight"] = t["lm_head.weight"].copy()
        t["lm_head.weight"][0, 0] = -np.inf

    edit_tensors(d, edit)
    return "lm_head.weight"


@case
def tensor_integer_dtype(d):
    edit_tensors(d, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].astype(np.int32)}))
    return "model.norm.weight"


@case
def duplicate_tensor_in_two_files(d):
    save_file({EMBED: load_file(str(d / WEIGHTS))[EMBED]}, str(d / "extra.safetensors"))
    return "extra.safetensors"


# ---------------------------------------------------------------- index
@case
def index_not_json(d):
    (d / INDEX).write_text('{"weight_map": {')
    return INDEX


@case
def index_without_weight_map(d):
    (d / INDEX).write_text(json.dumps({"metadata": {}}))
    return INDEX


@case
def index_entry_not_a_string(d):
    (d / INDEX).write_text(json.dumps({"weight_map": {EMBED: 7}}))
    return INDEX


@case
def index_names_absent_file(d):
    names = list(load_file(str(d / WEIGHTS)))
    (d / INDEX).write_text(json.dumps({"weight_map": {n: "model-00001-of-00002.safetensors" for n in names}}))
    return "model-00001-of-00002.safetensors"


@case
def index_entry_parent_traversal(d):
    _shard(d, "../x.safetensors")
    return "../x.safetensors"


@case
def index_entry_absolute_path(d):
    _shard(d, str(d.parent / "x.safetensors"))
    return str(d.parent / "x.safetensors")


@case
def index_entry_through_symlinked_folder(d):
    _shard(d, "shards/x.safetensors")
    (d / "shards").symlink_to(d.parent, target_is_directory=True)
    return "shards"


@case
def index_maps_tensor_to_wrong_file(d):
    tensors = load_file(str(d / WEIGHTS))
    norm = tensors.pop("model.norm.weight")
    save_file(tensors, str(d / "a.safetensors"))
    save_file({"model.norm.weight": norm}, str(d / "b.safetensors"))
    (d / WEIGHTS).unlink()
    weight_map = {n: "a.safetensors" for n in [*tensors, "model.norm.weight"]}
    (d / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return "a.safetensors"


# ---------------------------------------------------------------- tokenizer
@case
def tokenizer_json_garbage(d):
    (d / "tokenizer.json").write_text("{not json")
    return "tokenizer.json"


@case
def tokenizer_larger_than_vocabulary(d):
    vocab = json.loads((d / "config.json").read_text())["vocab_size"] - 10
    edit_config(d, vocab_size=vocab)
    edit_tensors(d, lambda t: t.update({n: t[n][:vocab] for n in (EMBED, "lm_head.weight")}))
    return "tokenizer.json"


# ---------------------------------------------------------------- runner
def build_saved(root: Path, tokenizer) -> Path:
    """A tiny llama with a tokenizer, saved as a Hugging Face directory under `root`."""
    cfg = ModelConfig.tiny(len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1)
    path = root / "saved"
    save_pretrained(init_model(cfg, seed=0), tokenizer, path)
    return path


def run_case(name: str, saved: Path, work: Path) -> tuple[bool, str]:
    """Break a copy of `saved` with case `name`; (clear error?, what happened)."""
    d = work / "model"
    shutil.copytree(saved, d)
    expected = CASES[name](d)
    try:
        from_pretrained(d)
    except (CheckpointError, ConfigError) as e:
        return expected in str(e), f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - counting what the loader lets through
        return False, f"{type(e).__name__}: {e}"
    return False, "loaded without error"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer):
    return build_saved(tmp_path_factory.mktemp("model_dirs"), tiny_tokenizer)


def test_at_least_23_cases():
    assert len(CASES) >= 23


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_model_directory_gets_a_clear_error(name, saved, tmp_path):
    clear, what = run_case(name, saved, tmp_path)
    assert clear, what


def test_pickle_refusal_says_how_to_convert(saved, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(saved, d)
    pickle_bin_only(d)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*safe_serialization=True"):
        from_pretrained(d)


def test_nonfinite_weights_load_with_explicit_opt_in(saved, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(saved, d)
    tensor_nan(d)
    with pytest.raises(CheckpointError, match="allow_nonfinite=True"):
        from_pretrained(d)
    model, _ = from_pretrained(d, allow_nonfinite=True)
    assert np.isnan(np.asarray(model.embed_tokens.embedding[...])[3, 1])


def test_sharded_files_in_a_subdirectory_and_hub_cache_symlinks_load(saved, tmp_path):
    """Inside is fine: shards in a subfolder, and a hub-cache snapshot whose files link to ../../blobs."""
    d = tmp_path / "model"
    shutil.copytree(saved, d)
    (d / "shards").mkdir()
    names = list(load_file(str(d / WEIGHTS)))
    shutil.move(d / WEIGHTS, d / "shards" / "w.safetensors")
    (d / INDEX).write_text(json.dumps({"weight_map": {n: "shards/w.safetensors" for n in names}}))
    from_pretrained(d)

    repo = tmp_path / "hub" / "models--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(p for p in saved.iterdir() if p.is_file())):
        shutil.copy(file, repo / "blobs" / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
    model, tokenizer = from_pretrained(snapshot)
    assert tokenizer is not None and model.config.num_hidden_layers == 1


if __name__ == "__main__":  # the before/after count of issue 16
    import tempfile

    from bmrl.model.tokenizer import train_tiny_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        saved_dir = build_saved(Path(tmp), train_tiny_tokenizer(["move up", "move down", "a wall"] * 4, 300))
        clear = 0
        for i, name in enumerate(sorted(CASES)):
            work = Path(tmp) / f"case{i}"
            work.mkdir()
            ok, what = run_case(name, saved_dir, work)
            clear += ok
            print(f"{'ok  ' if ok else 'BAD '} {name}: {what.splitlines()[0][:150] if what else ''}")
        bmrl_dir = os.path.dirname(sys.modules["bmrl"].__file__)
        print(json.dumps({"cases": len(CASES), "clear_errors": clear, "bmrl": bmrl_dir}))
