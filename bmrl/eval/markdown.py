"""The one markdown table writer of bmrl: every report's tables go through `table`.

GitHub-flavoured markdown splits a table row at every `|` that is not escaped, so a cell holding
`P(success|error)` would add a column and break the whole table. `cell` escapes such pipes (and the
backslashes right before them, so `a\\|b` stays one cell), and turns line breaks into spaces, because
a table row must be one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

_PIPE = re.compile(r"(\\*)\|")
ALIGN = {"left": "---", "right": "---:", "center": ":---:"}


def cell(value: object) -> str:
    """One table cell as text: `|` -> `\\|` (backslashes before it doubled), newlines -> spaces."""
    text = " ".join(str(value).splitlines()) if value is not None else ""
    return _PIPE.sub(lambda m: m.group(1) * 2 + "\\|", text).strip()


def row(cells: Iterable[object]) -> str:
    """`| a | b |` with every cell escaped."""
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str | Sequence[str] = "left") -> str:
    """A GitHub-markdown table: header, separator, rows (each must have len(header) cells).

    `align`: "left", "right", "center" for all columns, or one of them per column."""
    header = list(header)
    aligns = [align] * len(header) if isinstance(align, str) else list(align)
    if len(aligns) != len(header) or any(a not in ALIGN for a in aligns):
        raise ValueError(f"align needs one of {sorted(ALIGN)} per column ({len(header)}), got {align!r}.")
    lines = [row(header), "|" + "|".join(ALIGN[a] for a in aligns) + "|"]
    for i, r in enumerate(rows):
        r = list(r)
        if len(r) != len(header):
            raise ValueError(f"table row {i} has {len(r)} cells, the header has {len(header)}: {r!r}.")
        lines.append(row(r))
    return "\n".join(lines)


def key_values(items: Mapping[str, object]) -> str:
    """A two-column table of facts (name, value)."""
    return table(["", ""], list(items.items()))
