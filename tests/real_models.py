"""The real models bmrl's configs name, at their real shapes with random weights: their published config.json
values (`ARCH`), and a local Hugging Face directory of one (transformers' own `from_config` + `save_pretrained`,
bfloat16 safetensors as the models ship) with a tokenizer of its real vocabulary size, special tokens at their
real ids and its chat template (`tests.chat_helpers.real_vocab_tokenizer`). Nothing is downloaded.

    path = write_model_dir("qwen2_5_0_5b_sokoban.yaml", tmp / "model", layers=2)   # a cut: 2 of 24 layers

A cut keeps every width and the vocabulary and drops layers (`layers=None`: the full depth). `shrink(name)`: the
overrides that shrink a config's run to 2 steps of one group of 2 rows, one turn and a buffer that holds its prompt
and one reply, and nothing about the model. Shared by the suite (tests/e2e/test_real_shapes.py, tests/test_plan.py)
and bench/real_shapes.py, which puts the repository root on sys.path to import it.
"""

from __future__ import annotations

import json
from pathlib import Path

# The config.json fields of the real models the configs name (public Hugging Face configs; no weights needed).
QWEN2_5_0_5B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
                    intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    hidden_act="silu", sliding_window=32768, use_sliding_window=False, max_window_layers=21)
ARCH = {
    "qwen2_5_0_5b_sokoban.yaml": QWEN2_5_0_5B,
    "qwen_tools.yaml": QWEN2_5_0_5B,
    "qwen3_0_6b_sokoban.yaml": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, hidden_act="silu", sliding_window=None, use_sliding_window=False, max_window_layers=28),
    "llama3_2_1b_toolchain.yaml": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
        attention_bias=False, mlp_bias=False, hidden_act="silu"),
    "gemma3_1b_tools.yaml": dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262144, hidden_size=1152,
        intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, rope_theta=1000000, rope_local_base_freq=10000, rms_norm_eps=1e-6,
        sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256, attn_logit_softcapping=None,
        final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh", attention_bias=False),
}

_QWEN = (("<|endoftext|>", 151643), ("<|im_start|>", 151644), ("<|im_end|>", 151645))
# model_type: (chat_helpers style, the tokenizer's length, special tokens at their ids, named special tokens)
TOKENIZERS = {
    "qwen2": ("qwen", 151665, _QWEN, (("eos_token", "<|im_end|>"), ("pad_token", "<|endoftext|>"))),
    "qwen3": ("qwen3", 151669, (*_QWEN, ("<think>", 151667), ("</think>", 151668)),
              (("eos_token", "<|im_end|>"), ("pad_token", "<|endoftext|>"))),
    "llama": ("llama3", 128256, (("<|begin_of_text|>", 128000), ("<|end_of_text|>", 128001),
                                 ("<|start_header_id|>", 128006), ("<|end_header_id|>", 128007), ("<|eot_id|>", 128009)),
              (("bos_token", "<|begin_of_text|>"), ("eos_token", "<|eot_id|>"))),
    "gemma3_text": ("gemma3", 262145, (("<pad>", 0), ("<eos>", 1), ("<bos>", 2), ("<start_of_turn>", 105),
                                       ("<end_of_turn>", 106), ("<image_soft_token>", 262144)),
                    (("bos_token", "<bos>"), ("eos_token", "<eos>"), ("pad_token", "<pad>"))),
}


# rollout.max_len: one turn of each config's env and format with its model's tokenizer, rounded up from what `bmrl
# train`'s buffer check asks for (the prompt, the longest first observation and a reply: 205, 273, 481, 157 and 476
# tokens in this order).
BUFFER = {"qwen2_5_0_5b_sokoban.yaml": 224, "qwen3_0_6b_sokoban.yaml": 320, "qwen_tools.yaml": 640,
          "llama3_2_1b_toolchain.yaml": 160, "gemma3_1b_tools.yaml": 704}
# 2 rows (one task's group of 2), one turn, 2 steps; the evaluation on one task at T=1 at the start and the end; a
# checkpoint at step 2. Nothing about the model.
SHRINK = ["train.steps=2", "train.tasks_per_step=1", "train.group_size=2", "train.minibatches=1",
          "budget.budgets=[1]", "rollout.max_turns=1", "eval.ts=[1]", "eval.ks=[1]", "eval.attempts=1",
          "eval.num_tasks=1", "eval.bootstrap=0", "eval.probe_states=0", "checkpoint.every=2", "data.train_size=8",
          "data.val_size=4", "data.test_size=4"]


def shrink(name: str) -> list[str]:
    """The overrides that shrink config `name`'s run (`SHRINK` and its `BUFFER`): rows, turns, steps, buffer."""
    return [f"rollout.max_len={BUFFER[name]}", *SHRINK]


def config_json(name: str, layers: int | None = None) -> dict:
    """The published config.json values of the model `name` (a configs/ file name) runs, cut to `layers`."""
    arch = dict(ARCH[name])
    if layers is not None:
        if not 1 <= layers <= arch["num_hidden_layers"]:
            raise ValueError(f"{name}: layers={layers} is not in 1..{arch['num_hidden_layers']}")
        arch["num_hidden_layers"] = layers
        if "max_window_layers" in arch:
            arch["max_window_layers"] = min(arch["max_window_layers"], layers)
    return arch


def tokenizer_for(name: str):
    """The tokenizer of `name`'s model: its real length, special tokens and (trimmed) chat template."""
    from tests.chat_helpers import real_vocab_tokenizer

    style, length, ids, named = TOKENIZERS[ARCH[name]["model_type"]]
    return real_vocab_tokenizer(style, length, ids, named)


def write_model_dir(name: str, path: str | Path, layers: int | None = None, seed: int = 0) -> Path:
    """Write the model of config `name` with random weights (`layers`: a cut, None: all) and its tokenizer to
    `path`, as a downloaded Hugging Face directory: config.json, model.safetensors (bfloat16), tokenizer files."""
    import torch
    import transformers

    path = Path(path)
    arch = config_json(name, layers)
    tok = tokenizer_for(name)
    special = {k: tok.convert_tokens_to_ids(getattr(tok, k.replace("_id", ""))) for k in
               ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(tok, k.replace("_id", "")) is not None}
    hf_config = transformers.AutoConfig.for_model(**arch, **special)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    saved = json.loads((path / "config.json").read_text())
    assert saved["vocab_size"] == arch["vocab_size"] and saved["num_hidden_layers"] == arch["num_hidden_layers"]
    return path
