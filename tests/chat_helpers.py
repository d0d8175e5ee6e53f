"""Tiny tokenizers with real chat templates, tokenizers of a real model's vocabulary size (its special tokens at
their ids), a steered Qwen2 policy that replies in chains of tokens, and the conversation of a rollout rebuilt
from its decoded turns."""

from __future__ import annotations

import functools
import json
import tempfile

import numpy as np

from bmrl.formats import TAGS, encode, reply_instructions
from bmrl.model.config import ModelConfig
from bmrl.model.decoder import init_model
from bmrl.model.tokenizer import load_tokenizer, save_tokenizer, train_tiny_tokenizer

# Qwen2.5's template without the tool branches (ChatML, a default system message when none is given),
# with {% generation %} marks around what the assistant produces (content and <|im_end|>, not the "\n").
QWEN_TEMPLATE = (
    r"{%- if messages[0]['role'] == 'system' %}"
    r"{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    r"{%- else %}"
    r"{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    r"{%- endif %}"
    r"{%- for message in messages %}"
    r"{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    r"{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    r"{%- elif message.role == 'assistant' %}"
    r"{{- '<|im_start|>assistant\n' }}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"
    r"{{- '\n' }}"
    r"{%- endif %}"
    r"{%- endfor %}"
    r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# Meta-Llama-3-Instruct's template (contents trimmed), with {% generation %} marks on assistant turns.
LLAMA3_TEMPLATE = (
    r"{%- for message in messages %}"
    r"{%- if loop.index0 == 0 %}{{- bos_token }}{%- endif %}"
    r"{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    r"{%- if message['role'] == 'assistant' %}"
    r"{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    r"{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    r"{%- endfor %}"
    r"{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

# Gemma's template: no system role (raises), "model" for the assistant, contents trimmed.
GEMMA_TEMPLATE = (
    r"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    r"{% endif %}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    r"{% else %}{% set role = message['role'] %}{% endif %}"
    r"{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Qwen3's template without the tool branches: no default system message; assistant turns before the
# last user query lose their reasoning (content after "</think>", left-stripped of newlines).
QWEN3_TEMPLATE = (
    r"{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    r"{%- endif %}"
    r"{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}"
    r"{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    r"{%- if not ns.found and message.role == 'user' %}{%- set ns.found = true %}"
    r"{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    r"{%- for message in messages %}{%- set content = message.content %}"
    r"{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    r"{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}"
    r"{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}"
    r"{%- if '</think>' in content %}"
    r"{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}"
    r"{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    r"{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    r"{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n'"
    r" + content.lstrip('\n') }}"
    r"{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"
    r"{{- '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    r"{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    r"{%- endif %}"
)

# Gemma 3's template for text: a system message becomes the start of the first user turn (its text and
# a blank line), "model" for the assistant, contents trimmed.
GEMMA3_TEMPLATE = (
    r"{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    r"{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    r"{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    r"{%- for message in loop_messages -%}"
    r"{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    r"{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    r"{%- set role = message['role'] -%}{%- endif -%}"
    r"{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    r"{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

STYLES = {
    "qwen": (QWEN_TEMPLATE, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], {}),
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               {"bos_token": "<|begin_of_text|>"}),
    "llama3_notrim": (LLAMA3_TEMPLATE.replace(" | trim", ""),
                      ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                      {"bos_token": "<|begin_of_text|>"}),
    "gemma": (GEMMA_TEMPLATE, ["<start_of_turn>", "<end_of_turn>"], {}),
    "qwen3": (QWEN3_TEMPLATE, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], {}),
    "gemma3": (GEMMA3_TEMPLATE, ["<bos>", "<start_of_turn>", "<end_of_turn>"], {"bos_token": "<bos>"}),
}


@functools.lru_cache(maxsize=None)
def _texts() -> tuple[str, ...]:
    from bmrl.envs import corpus

    extra = ["system user assistant model", reply_instructions("think_answer"), "I go. Next move now."]
    return tuple(corpus(["corridor"], observations=False)) + tuple(extra)


@functools.lru_cache(maxsize=None)
def chat_tokenizer(style: str | None, tags: bool = True):
    """A tiny BPE with `style`'s chat template (None: no template) and, if `tags`, special think/answer
    tags; saved to a local directory and reloaded with AutoTokenizer, as a real model's would be."""
    tok = train_tiny_tokenizer(list(_texts()), vocab_size=384)
    specials = list(TAGS) if tags else []
    if style is not None:
        template, role_tokens, named = STYLES[style]
        specials = role_tokens + specials
        tok.add_special_tokens(named)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    if style is not None:
        tok.chat_template = template
    path = tempfile.mkdtemp(prefix=f"bmrl_chat_{style}_")
    save_tokenizer(tok, path)
    return load_tokenizer(path)


@functools.lru_cache(maxsize=None)
def _real_texts() -> tuple[str, ...]:
    from bmrl.envs import corpus
    from bmrl.envs.python.tools import INSTRUCTIONS, USAGE

    return (*corpus(observations=False), INSTRUCTIONS, USAGE, reply_instructions("think_answer"),
            "system user assistant model")


@functools.lru_cache(maxsize=None)
def real_vocab_tokenizer(style: str, length: int, ids: tuple[tuple[str, int], ...], named: tuple[tuple[str, str], ...],
                         merges: int = 2048):
    """A byte-level BPE of `length` tokens with `style`'s chat template and a real model's special tokens at
    their real ids (`ids`: (token, id) pairs; `named`: ("bos_token", token) pairs), saved to a local directory
    and reloaded with AutoTokenizer, as the real model's would be.

    The texts every env and the tool env speak are learnt as `merges` BPE tokens at the lowest free ids; the
    other ids are filler tokens ("<fill_N>") that no text encodes to but a random model samples and decodes.
    Built in about 2 s, no download; the pre-tokenizer is byte-level for every style (Gemma's own is
    SentencePiece's), so texts split differently from the real model's, but ids, length and turns are its.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(_real_texts()), trainer=trainers.BpeTrainer(
        vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    spec = json.loads(tok.to_str())
    learnt = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    special = dict(ids)
    if len(learnt) + len(special) > length or max(special.values()) >= length:
        raise ValueError(f"{length} tokens cannot hold {len(learnt)} learnt and {len(special)} special ones")
    free = iter(i for i in range(length) if i not in special.values())
    vocab = {token: next(free) for token in learnt} | {f"<fill_{i}>": i for i in free} | special
    assert sorted(vocab.values()) == list(range(length)), "ids are 0..length-1, each once"
    spec["model"]["vocab"] = vocab
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   clean_up_tokenization_spaces=False)
    named = dict(named)
    fast.add_special_tokens(named)  # in the vocabulary already: they keep their ids
    others = [t for t in special if t not in named.values()]
    fast.add_special_tokens({"additional_special_tokens": others}, replace_extra_special_tokens=False)
    fast.chat_template = STYLES[style][0]
    path = tempfile.mkdtemp(prefix=f"bmrl_real_{style}_")
    save_tokenizer(fast, path)
    loaded = load_tokenizer(path)
    assert len(loaded) == length and all(loaded.convert_tokens_to_ids(t) == i for t, i in special.items()), style
    return loaded


def reply_chains(env, fmt, tokenizer, thoughts=("I go.", "Next move now."), missing_weight=0.9):
    """Token chains (reply tokens + stop) the policy can follow, with the weight of their last link.

    action: every action string, and "wait" (not an action). think_answer: for each thought and
    action `<think>THOUGHT</think><answer>ACTION</answer>`, and (weight `missing_weight`) a reply
    that stops after `</think>` with no answer (a format error).
    """
    stop = int(fmt.stop_ids[0])
    acts = [list(map(int, row[:n])) for row, n in zip(env.actions.tokens, env.actions.lengths)]
    if fmt.reply_format == "action":
        return [(a + [stop], 1.0) for a in acts + [list(encode(tokenizer, "wait"))]]
    chains = []
    for th in thoughts:
        head = [*fmt.think_open, *encode(tokenizer, th), *fmt.think_close]
        for a in acts:
            chains.append(([*head, *fmt.answer_open, *a, *fmt.answer_close, stop], 1.0))
        chains.append(([*head, stop], missing_weight))
    return [([int(t) for t in c], w) for c, w in chains]


def chain_policy(fmt, chains, vocab_size: int, seed: int = 0, scale: float = 30.0, mix: float = 0.3, hidden: int = 64):
    """A tiny random Qwen2 decoder rewired into a near-bigram model over `chains`.

    The attention/MLP outputs are scaled by `mix`, so the final hidden state is mostly the last
    token's embedding; the unembedding scores each chain's first token after the generation prompt's
    last token and each next token after its predecessor (the chain's weight on its last link).
    Where chains branch, the choice is near-even under temperature 1, and off-chain tokens are
    vanishingly unlikely at the default scale, so replies are chains: canonical token sequences.
    """
    cfg = ModelConfig.tiny(vocab_size, model_type="qwen2", hidden_size=hidden)
    model = init_model(cfg, seed)
    for layer in model.layers:
        layer.self_attn.o_proj.kernel[...] = layer.self_attn.o_proj.kernel[...] * mix
        layer.mlp.down_proj.kernel[...] = layer.mlp.down_proj.kernel[...] * mix
    emb = np.asarray(model.embed_tokens.embedding[...])
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    links: dict[tuple[int, int], float] = {}
    for chain, weight in chains:
        prev = [int(fmt.obs_close[-1])] + chain[:-1]
        for i, (p, q) in enumerate(zip(prev, chain)):
            w = weight if i == len(chain) - 1 else 1.0
            links[(p, q)] = max(links.get((p, q), 0.0), w)
    kernel = np.zeros((hidden, vocab_size), np.float32)
    for (p, q), w in links.items():
        kernel[:, q] += w * unit[p]
    model.lm_head.kernel[...] = kernel * scale
    return model


def conversation(traj, b: int, fmt, tokenizer):
    """Messages of row `b` rebuilt from its decoded turns, and per turn (obs, reply) token spans.

    Observation t is what lies between obs_open and obs_close before reply t; reply t runs from its
    first sampled token up to its stop token (the stop is checked, not decoded into the content).
    """
    n = int(traj.length[b])
    toks = np.asarray(traj.tokens[b, :n])
    turn = np.asarray(traj.turn_of_token[b, :n])
    mask = np.asarray(traj.loss_mask[b, :n])
    stops = set(fmt.stop_ids)
    assert np.array_equal(toks[: len(fmt.prefix)], fmt.prefix)
    messages = [{"role": "system", "content": fmt.system}]
    spans = []
    for t in range(int(traj.turns_used[b])):
        idx = np.flatnonzero(turn == t)
        r0 = int(idx[mask[idx] > 0][0])
        r1 = r0 + next(i for i, tok in enumerate(toks[r0:]) if int(tok) in stops)
        head = (fmt.reply_close if t else np.zeros(0, np.int32)).tolist() + fmt.obs_open.tolist()
        seg = toks[int(idx[0]) : r0].tolist()
        assert seg[: len(head)] == head and seg[len(seg) - len(fmt.obs_close):] == fmt.obs_close.tolist(), (t, seg)
        obs = seg[len(head) : len(seg) - len(fmt.obs_close)]
        reply = toks[r0:r1].tolist()
        messages.append({"role": "user", "content": tokenizer.decode(obs)})
        messages.append({"role": "assistant", "content": tokenizer.decode(reply)})
        spans.append((obs, reply))
    return messages, spans


def template_ids(tokenizer, messages, **kw):
    """`apply_chat_template(..., tokenize=True)` as a dict of numpy arrays."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)
    return {k: np.asarray(v) for k, v in out.items()}
