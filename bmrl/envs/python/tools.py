"""A tool-use environment: multi-step price questions solved with a `lookup` tool over a table and a
`calc` tool (safe arithmetic, `bmrl.envs.python.calc`), then an `answer`.

    Task: 3 pear and 2 milk. What is the total price? Tools: lookup <item>, calc <expression>, answer <number>.
    > lookup pear          -> lookup pear = 4
    > lookup milk          -> lookup milk = 9
    > calc 3 * 4 + 2 * 9   -> calc 3 * 4 + 2 * 9 = 30
    > answer 30            -> answer 30: correct.      (reward 1, success, terminated)

Tasks are generated from the reset seed (or `options["seed"]`): the table's prices and the question.
A wrong answer is an error the agent is told about (it may try again); a malformed action or a tool
error says what to fix. `info["oracle_action"]` is the step of the shortest solution from the state
before the step, `info["next_oracle_action"]` the one from the state after it (and after reset).
"""

from __future__ import annotations

import numpy as np

from bmrl.envs.python.calc import CalcError, calc

ITEMS = ("apple", "bread", "cheese", "egg", "fish", "grape", "honey", "juice", "kiwi", "lemon", "milk", "nut",
         "olive", "pear", "rice", "salt")
USAGE = "use 'lookup <item>', 'calc <expression>' or 'answer <number>'"
INSTRUCTIONS = ("Answer price questions with tools, one action a reply: 'lookup <item>' reads a price, "
                "'calc <expression>' computes, 'answer <number>' gives the total.")


class ToolUse:
    """Price questions over a table of `items` items, each needing `k` lookups, one calc and an answer."""

    def __init__(self, items: int = 6, k: int = 2, max_price: int = 20, max_qty: int = 5):
        if not 1 <= k <= items <= len(ITEMS):
            raise ValueError(f"ToolUse needs 1 <= k <= items <= {len(ITEMS)}, got k={k}, items={items}.")
        if max_price < 1 or max_qty < 1:
            raise ValueError(f"ToolUse needs max_price >= 1 and max_qty >= 1, got {max_price}, {max_qty}.")
        self.n_items, self.k, self.max_price, self.max_qty = items, k, max_price, max_qty
        self.instructions = INSTRUCTIONS
        self.table: dict[str, int] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        seed = (options or {}).get("seed", seed)
        rng = np.random.default_rng(None if seed is None else int(seed))
        names = [ITEMS[i] for i in rng.choice(len(ITEMS), self.n_items, replace=False)]
        self.table = {n: int(rng.integers(1, self.max_price + 1)) for n in names}
        picked = [names[i] for i in rng.choice(self.n_items, self.k, replace=False)]
        self.order = [(int(rng.integers(1, self.max_qty + 1)), n) for n in picked]
        self.expr = " + ".join(f"{q} * {{{n}}}" for q, n in self.order)
        self.target = sum(q * self.table[n] for q, n in self.order)
        self.found: dict[str, int] = {}
        self.computed = False
        items = " and ".join(f"{q} {n}" for q, n in self.order)
        return (f"Task: {items}. What is the total price? Tools: lookup <item>, calc <expression>, "
                f"answer <number>. Items: {', '.join(sorted(self.table))}.\n"), {"progress": 0.0,
                                                                                  "next_oracle_action": self.oracle()}

    def oracle(self) -> str:
        """The next step of the shortest solution from here."""
        for _, n in self.order:
            if n not in self.found:
                return f"lookup {n}"
        if not self.computed:
            return "calc " + self.expr.format(**self.found)
        return f"answer {self.target}"

    def _progress(self) -> float:
        return (sum(n in self.found for _, n in self.order) + self.computed) / (self.k + 2)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        oracle = self.oracle()
        tool, _, arg = str(action).strip().partition(" ")
        arg = arg.strip()
        reward, done, error = 0.0, False, False
        if tool == "lookup" and arg in self.table:
            self.found[arg] = self.table[arg]
            obs = f"lookup {arg} = {self.table[arg]}\n"
        elif tool == "lookup":
            obs, error = f"tool error: no item {arg!r} in the table; items are {', '.join(sorted(self.table))}.\n", True
        elif tool == "calc":
            try:
                value = calc(arg)
                obs = f"calc {arg} = {value}\n"
                self.computed |= value == self.target and len(self.found) >= self.k
            except CalcError as e:
                obs, error = f"tool error: {e}\n", True
        elif tool == "answer":
            try:
                right = float(arg) == self.target
            except ValueError:
                right = None
            if right is None:
                obs, error = f"tool error: answer needs a number, got {arg!r}.\n", True
            elif right:
                obs, reward, done = f"answer {arg}: correct.\n", 1.0, True
            else:
                obs, error = f"answer {arg}: wrong, try again.\n", True
        else:
            obs, error = f"tool error: unknown action {str(action)[:40]!r}; {USAGE}.\n", True
        info = {"success": done, "error": error, "oracle_action": oracle, "next_oracle_action": self.oracle(),
                "progress": 1.0 if done else self._progress()}
        return obs, reward, done, False, info
