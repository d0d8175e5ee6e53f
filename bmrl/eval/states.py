"""Clean and post-error states: does a policy decide better on the oracle's path, or right after an error?

Decision quality = accuracy P(action == oracle's action) of the policy's own actions in clean states
(no error at any earlier turn of the attempt, so on the oracle's path); recovery = the same accuracy in
the state right after an error (injected, its own, or one the environment reported). A memoryless
policy, whose action does not depend on whether it just erred, has the same accuracy in both, so a
change of error rate alone moves both alike. Computed from per-turn records (`Episodes`); errors of a
kind as in `bmrl.eval.decompose`.
"""

from __future__ import annotations

import numpy as np

from bmrl.eval.decompose import Episodes


def _state_masks(ep: Episodes, kind: str) -> tuple[np.ndarray, ...]:
    """bool[B, Tm] each: right (acted and == oracle), clean (acted, no earlier error), post (acted, the
    previous turn an error), first_post (post, and that error was the attempt's first). Acted: a
    played, not injected turn whose oracle action is known (a Python env's info["oracle_action"])."""
    acted = ep.turn_active & ~ep.injected & (ep.oracle_action >= 0)  # a Python env may not name its oracle's action
    right = acted & (ep.action == ep.oracle_action) & ~ep.invalid
    err = ep.errors(kind)
    before = np.cumsum(err, axis=1) - err  # errors at earlier turns
    prev_err = np.pad(err, ((0, 0), (1, 0)))[:, :-1]
    prev_before = np.pad(before, ((0, 0), (1, 0)))[:, :-1]
    return right, acted & (before == 0), acted & prev_err, acted & prev_err & (prev_before == 0)


def state_accuracy_counts(ep: Episodes, kind: str = "any") -> dict[str, np.ndarray]:
    """Per task (int [num_tasks]): the policy's own actions in clean states (no error at any earlier
    turn of the attempt: on the oracle's path) and in the state right after an error (the previous
    turn was an error of `kind`, injected or its own), and how many of each were the oracle's action:
    {"clean", "clean_right", "post_error", "post_error_right"}. Accuracy in a kind of state is the
    ratio of sums over tasks (every state weighs the same; a per-task ratio would be biased with few
    attempts, since an attempt's clean run ends at its first error). A memoryless policy has the
    same accuracy in both kinds."""
    right, clean, post, _ = _state_masks(ep, kind)
    count = lambda m: ep.per_task(m).sum((1, 2))
    return {"clean": count(clean), "clean_right": count(right & clean), "post_error": count(post),
            "post_error_right": count(right & post)}


def paired_state_counts(a: Episodes, b: Episodes, kind: str = "any") -> dict[str, np.ndarray]:
    """Per task (int [num_tasks]): the states both policies met, and how often each was right there.

    `a` and `b` must be the same tasks run with the same keys (`evaluate` with one key). A clean state
    is then the same state for both (the oracle's path under the same environment randomness), and so
    is the state right after a first error when both made that error with the same action (a slip,
    the one wrong move of a two-action game, an injected error). Keys: "clean", "post_error" (states)
    and "{clean,post_error}_right_{a,b}". Refuses episodes whose shared states disagree on the
    oracle's action (not the same tasks or keys)."""
    if a.action.shape != b.action.shape or (a.num_tasks, a.attempts) != (b.num_tasks, b.attempts):
        raise ValueError(f"paired states need the same rows and turns: {a.action.shape} vs {b.action.shape}.")
    ra, ca, _, pa = _state_masks(a, kind)
    rb, cb, _, pb = _state_masks(b, kind)
    same_prev = np.pad(a.action == b.action, ((0, 0), (1, 0)))[:, :-1]
    clean, post = ca & cb, pa & pb & same_prev
    if np.any((clean | post) & (a.oracle_action != b.oracle_action)):
        raise ValueError("the two policies' shared states have different oracle actions: they were not run on the "
                         "same tasks with the same keys; evaluate both with the same tasks and key.")
    count = lambda m: a.per_task(m).sum((1, 2))
    return {"clean": count(clean), "post_error": count(post), "clean_right_a": count(ra & clean),
            "clean_right_b": count(rb & clean), "post_error_right_a": count(ra & post),
            "post_error_right_b": count(rb & post)}
