"""A safe arithmetic evaluator for the `calc` tool: an AST whitelist, never `eval` or `exec`.

Allowed: int and float literals, + - * / // % ** and unary + -, parentheses. Refused, with what to
fix: names, calls, attribute access, subscripts, strings, comparisons, anything that does not parse
as an expression (imports, statements), exponents above `MAX_EXPONENT`, results above `MAX_ABS`,
division by zero, expressions longer than `MAX_CHARS`.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS = 1e15

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSED = {
    ast.Name: "names", ast.Call: "function calls", ast.Attribute: "attribute access", ast.Subscript: "indexing",
    ast.Compare: "comparisons", ast.BoolOp: "and/or", ast.Lambda: "lambdas", ast.IfExp: "if/else",
}
HINT = "calc takes numbers and + - * / // % ** ( ) only, e.g. calc (3 + 4) * 2"


class CalcError(ValueError):
    """An expression calc refuses; the message says what to fix."""


def calc(expr: str) -> int | float:
    """Evaluate an arithmetic expression safely (see the module docstring)."""
    if not isinstance(expr, str) or not expr.strip():
        raise CalcError(f"calc needs an expression; {HINT}.")
    if len(expr) > MAX_CHARS:
        raise CalcError(f"the expression has {len(expr)} characters (at most {MAX_CHARS}); split it into steps.")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise CalcError(f"could not parse {expr.strip()!r}; {HINT}.") from None
    value = _eval(tree.body)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _check(value) -> int | float:
    if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
        raise CalcError("the result is not a real number; check the signs and exponents.")
    if abs(value) > MAX_ABS:
        raise CalcError(f"the result is larger than {MAX_ABS:.0e}; use smaller numbers.")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):
            return _check(node.value)
        raise CalcError(f"{node.value!r} is not a number; {HINT}.")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalcError(f"the exponent {right} is too large (at most {MAX_EXPONENT}).")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalcError("division by zero; check the divisor.")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except (OverflowError, ZeroDivisionError) as e:
            raise CalcError(f"{e}; use smaller numbers.") from None
    what = _REFUSED.get(type(node), f"{type(node).__name__} expressions")
    raise CalcError(f"not allowed in calc: {what}; {HINT}.")
