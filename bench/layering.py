"""How the package's imports and size look: the numbers of the house issue, measured from the source.

    python bench/layering.py            # prints the report
    python bench/layering.py --json     # the same as JSON

Reads every `bmrl/**/*.py` with `ast` (nothing is imported) and reports:
- cycles: strongly connected components of the module import graph, once over module-level imports and
  once over all imports (function-level ones included: they hide a cycle, they do not remove it);
- function-level imports of bmrl modules (each an import inside a function body);
- env-kind forks: places outside config validation that ask whether the env is a Python one;
- the longest functions and the largest modules.
`tests/repo/test_layering.py` turns the cycle count and the layer order into assertions.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "bmrl"
FORK = re.compile(r"""env\.kind\s*[!=]=|kind\s*[!=]=\s*["']python["']|isinstance\([^)]*PythonEnv\)|\bif (not )?python\b|"""
                  r"""\bpython else\b|\bis_host\(cfg""")


def modules() -> dict[str, pathlib.Path]:
    """{dotted module name: path} of every module of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict) -> str | None:
    """The longest known module that `name` (a dotted import target) names or lies in."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.AST, here: str, is_pkg: bool, known: dict) -> list[str]:
    """The bmrl modules an Import/ImportFrom node reads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = here.split(".")
            anchor = anchor if is_pkg else anchor[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        names = [f"{base}.{a.name}" for a in node.names] + [base]
    found = {_resolve(n, known) for n in names if n.split(".")[0] == "bmrl"}
    found.discard(None)
    found.discard(here)
    if len(found) > 1 and isinstance(node, ast.ImportFrom):  # `from bmrl.x import y`: y if a module, else bmrl.x
        base_mod = _resolve(names[-1], known)
        subs = {f for f in found if f != base_mod}
        found = subs or {base_mod}
    return sorted(found)


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports(known: dict) -> tuple[dict, dict, list]:
    """(top-level graph, full graph, function-level imports as (module, line, target))."""
    top, full, local = {m: set() for m in known}, {m: set() for m in known}, []
    for mod, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"

        def visit(node, depth):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child):
                    continue
                inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _targets(child, mod, is_pkg, known):
                        full[mod].add(t)
                        if depth:
                            local.append((mod, child.lineno, t))
                        else:
                            top[mod].add(t)
                visit(child, inner)

        visit(tree, 0)
    return top, full, local


def cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def _package_of(mod: str, known: dict) -> bool:
    return known[mod].name == "__init__.py"


def acyclic(graph: dict, known: dict) -> dict:
    """`graph` without edges into a package's `__init__` from its own submodules and without a package's
    re-export edges: what remains are the dependencies between modules that do work."""
    out = {}
    for m, ts in graph.items():
        if _package_of(m, known):
            out[m] = set()
            continue
        out[m] = {t for t in ts if not (_package_of(t, known) and m.startswith(t + "."))}
    return out


def functions(known: dict, top: int = 12) -> list[tuple[int, str]]:
    """(lines, module:function) of the longest functions."""
    rows = []
    for mod, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows.append((node.end_lineno - node.lineno + 1, f"{mod}:{node.name}"))
    return sorted(rows, reverse=True)[:top]


def forks(known: dict) -> list[tuple[str, int, str]]:
    """Lines that ask the env kind, outside comments and docstrings-only lines."""
    out = []
    for mod, path in known.items():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if FORK.search(code) and not code.strip().startswith(('"', "'")):
                out.append((mod, i, line.strip()))
    return out


def measure() -> dict:
    known = modules()
    top, full, local = imports(known)
    sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in known.items()), reverse=True)[:12]
    return {
        "cycles_top_level": cycles(acyclic(top, known)),
        "cycles_all_imports": cycles(acyclic(full, known)),
        "function_level_bmrl_imports": len(local),
        "function_level_by_module": _count(m for m, _, _ in local),
        "env_kind_forks": len(forks(known)),
        "env_kind_forks_by_module": _count(m for m, _, _ in forks(known)),
        "longest_functions": functions(known),
        "largest_modules": sizes,
    }


def _count(items) -> dict:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> None:
    m = measure()
    if "--json" in sys.argv:
        print(json.dumps(m, indent=1))
        return
    print(f"cycles (module-level imports): {len(m['cycles_top_level'])}")
    for c in m["cycles_top_level"]:
        print("   ", " <-> ".join(c))
    print(f"cycles (all imports, function-level included): {len(m['cycles_all_imports'])}")
    for c in m["cycles_all_imports"]:
        print("   ", " <-> ".join(c) if len(c) < 8 else f"{len(c)} modules: {', '.join(c)}")
    print(f"function-level bmrl imports: {m['function_level_bmrl_imports']}")
    print(f"env-kind forks: {m['env_kind_forks']}  {m['env_kind_forks_by_module']}")
    print("longest functions:", ", ".join(f"{n} {f}" for n, f in m["longest_functions"][:8]))
    print("largest modules:", ", ".join(f"{n} {f}" for n, f in m["largest_modules"][:8]))


if __name__ == "__main__":
    main()
