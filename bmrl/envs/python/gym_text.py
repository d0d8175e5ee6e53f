"""Gymnasium's toy-text environments as text environments (optional extra: `pip install -e ".[envs]"`).

    env = GymText("FrozenLake-v1", is_slippery=False)       # any gymnasium.make keyword
    obs, info = env.reset(seed=0, options={"desc": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    obs, reward, terminated, truncated, info = env.step("right")

Actions are Gymnasium's action names (FrozenLake: left, down, right, up; Taxi-v4: south, north, east,
west, pickup, dropoff; CliffWalking: up, right, down, left). FrozenLake is rendered as bmrl's own
FrozenLake renders its map (P, F, H, G) and has an oracle (shortest path, exact when nothing slips;
`info["oracle_action"]` and `info["next_oracle_action"]`);
the others are shown with Gymnasium's text rendering. An unknown action leaves the state unchanged and
says which actions exist. `options["desc"]` (FrozenLake) sets the map of that episode.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

ACTIONS = {
    "FrozenLake-v1": ("left", "down", "right", "up"),
    "Taxi-v4": ("south", "north", "east", "west", "pickup", "dropoff"),
    "CliffWalking-v1": ("up", "right", "down", "left"),
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))  # FrozenLake: left, down, right, up


def _gymnasium():
    try:
        import gymnasium
    except ImportError:
        raise ImportError(
            "The Gymnasium adapter needs gymnasium: pip install -e '.[envs]' (or pip install 'gymnasium>=1.0')."
        ) from None
    return gymnasium


class GymText:
    """A Gymnasium toy-text environment (discrete states and actions) behind bmrl's text protocol."""

    def __init__(self, env_id: str = "FrozenLake-v1", **make_kwargs: Any):
        if env_id not in ACTIONS:
            raise ValueError(f"GymText supports {sorted(ACTIONS)}, got {env_id!r}.")
        self.gym = _gymnasium()
        self.env_id, self.make_kwargs = env_id, dict(make_kwargs)
        self.action_strings = ACTIONS[env_id]
        self.env = self._make(None)
        self.state: int | None = None

    def _make(self, desc):
        kwargs = dict(self.make_kwargs, **({"desc": list(desc)} if desc is not None else {}))
        render = {} if self.env_id == "FrozenLake-v1" else {"render_mode": "ansi"}
        return self.gym.make(self.env_id, **render, **kwargs)

    # ---- text -------------------------------------------------------------------------------
    def _desc(self) -> list[str]:
        return ["".join(c.decode() if isinstance(c, bytes) else c for c in row) for row in self.env.unwrapped.desc]

    def _text(self, first: bool) -> str:
        if self.env_id != "FrozenLake-v1":
            text = _ANSI.sub("", self.env.unwrapped.render()).rstrip("\n") + "\n"
            if self.env_id.startswith("Taxi"):  # the taxi is only a colour in Gymnasium's rendering
                row, col, where, dest = self.env.unwrapped.decode(self.state)
                spot = "in the taxi" if where == 4 else f"at {'RGYB'[where]}"
                text += f"Taxi at row {row}, col {col}. Passenger {spot}. Destination {'RGYB'[dest]}.\n"
            return text
        n = len(self._desc()[0])
        r, c = divmod(self.state, n)
        where = f"At row {r}, col {c}.\n"
        if not first:
            return where
        cells = [["P" if (i, j) == (r, c) else ("F" if ch == "S" else ch) for j, ch in enumerate(row)]
                 for i, row in enumerate(self._desc())]
        return "Map:\n" + "".join(" " + " ".join(row) + "\n" for row in cells) + where

    # ---- oracle (FrozenLake) ----------------------------------------------------------------
    def _distances(self) -> dict[tuple[int, int], int]:
        desc = self._desc()
        goal = next((i, row.index("G")) for i, row in enumerate(desc) if "G" in row)
        dist, todo = {goal: 0}, deque([goal])
        while todo:
            r, c = todo.popleft()
            for dr, dc in _DELTAS:
                q = (r + dr, c + dc)
                if 0 <= q[0] < len(desc) and 0 <= q[1] < len(desc[0]) and desc[q[0]][q[1]] != "H" and q not in dist:
                    dist[q] = dist[(r, c)] + 1
                    todo.append(q)
        return dist

    def oracle(self) -> str | None:
        """FrozenLake: the move toward the goal along a shortest path (the first in action order)."""
        if self.env_id != "FrozenLake-v1" or self.state is None:
            return None
        desc, dist = self._desc(), self._distances()
        r, c = divmod(self.state, len(desc[0]))
        far = 1 << 20
        costs = [dist.get((r + dr, c + dc), far) if 0 <= r + dr < len(desc) and 0 <= c + dc < len(desc[0]) else far
                 for dr, dc in _DELTAS]
        return self.action_strings[costs.index(min(costs))]

    # ---- protocol ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        desc = (options or {}).get("desc")
        if desc is not None:
            self.env = self._make(desc)
        self.state, _ = self.env.reset(seed=None if seed is None else int(seed) % (1 << 63))
        self.state = int(self.state)
        return self._text(first=True), self._next({"progress": 0.0})

    def _next(self, info: dict) -> dict:
        """`info` with the oracle's action in the current state, where there is an oracle (FrozenLake)."""
        nxt = self.oracle()
        return info if nxt is None else {**info, "next_oracle_action": nxt}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        oracle = self.oracle()
        if action not in self.action_strings:
            msg = f"Invalid action. Valid actions are: {', '.join(self.action_strings)}.\n"
            return msg, 0.0, False, False, self._next({"error": True, "invalid": True, "oracle_action": oracle})
        before = self.state
        obs, reward, terminated, truncated, _ = self.env.step(self.action_strings.index(action))
        self.state = int(obs)
        goal_ends = self.env_id.startswith("CliffWalking")  # its goal step still costs -1
        success = bool(terminated) and (float(reward) > 0 or goal_ends)
        error = self.state == before or float(reward) <= -10 or (bool(terminated) and not success)
        info = {"success": success, "error": error, "invalid": False, "oracle_action": oracle}
        return self._text(first=False), float(reward), bool(terminated), bool(truncated), self._next(info)
