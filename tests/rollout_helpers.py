"""A tiny random policy wired to answer in actions, so rollouts act for real."""

import jax.numpy as jnp
import numpy as np

from bmrl.model.config import ModelConfig
from bmrl.model.decoder import init_model


def steered_policy(env, fmt, seed: int = 0, scale: float = 12.0, mix: float = 0.3, noise: float = 0.0, hidden: int = 64):
    """A random tiny decoder rewired into a near-bigram model over the action strings.

    The attention and MLP outputs are scaled by `mix`, so the final hidden state is mostly the last
    token's embedding; the unembedding then scores the first token of every action after the
    observation's closing token, each next action token after its predecessor, and the stop token
    after an action's last token. The attention/MLP residue makes the choice depend on the context.
    Replies are then mostly valid actions, some invalid, and environments step, err, succeed and fail
    inside the rollout as under a real policy.
    """
    tok = env.tokenizer
    cfg = ModelConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    model = init_model(cfg, seed)
    for layer in model.layers:
        layer.self_attn.o_proj.kernel[...] = layer.self_attn.o_proj.kernel[...] * mix
        layer.mlp.down_proj.kernel[...] = layer.mlp.down_proj.kernel[...] * mix
    emb = np.asarray(model.embed_tokens.embedding[...])
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    kernel = np.zeros((hidden, cfg.vocab_size), np.float32)
    for row, n in zip(env.actions.tokens, env.actions.lengths):
        prev = [int(fmt.obs_close[-1])] + [int(t) for t in row[:n]]
        nxt = [int(t) for t in row[:n]] + [int(fmt.stop_ids[0])]
        for p, q in zip(prev, nxt):
            kernel[:, q] += unit[p]
    kernel = np.clip(kernel, -1.0, 1.0)
    kernel += noise * np.random.default_rng(seed).standard_normal(kernel.shape) * (kernel != 0).any(0)
    model.lm_head.kernel[...] = jnp.asarray(kernel * scale)
    return model
