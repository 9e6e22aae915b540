"""The ``calculator`` tool: safe arithmetic, evaluated by walking Python's ``ast`` with a whitelist.

No ``eval``: only numbers, ``+ - * / // % **`` (``^`` is a power too), unary
signs, parentheses, a few math functions and the constants ``pi``, ``e``,
``tau``.  Bounded: the expression's length, the exponent, the size of every
intermediate integer and the time spent; anything else is a :class:`ToolError`.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable
from typing import Any

from engine.tools.registry import Tool, ToolError

MAX_CHARS = 500
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4096  # about 1,230 decimal digits
MAX_SECONDS = 0.5

_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x),
    "exp": math.exp,
    "log": math.log,
    "ln": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "degrees": math.degrees,
    "radians": math.radians,
    "abs": abs,
    "round": lambda x, n=None: round(x) if n is None else round(x, max(-100, min(100, int(n)))),
    "floor": math.floor,
    "ceil": math.ceil,
    "min": min,
    "max": max,
    "hypot": math.hypot,
    "gcd": math.gcd,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,  # a calculator's ^
}


def evaluate(expression: str, *, max_seconds: float = MAX_SECONDS) -> int | float:
    """The value of ``expression``; raises :class:`ToolError` for anything that is not bounded arithmetic."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("give an arithmetic expression, for example 2*(3+4)")
    if len(expression) > MAX_CHARS:
        raise ToolError(f"the expression is {len(expression)} characters long; the limit is {MAX_CHARS}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression ({exc.msg}): {expression!r}") from None
    deadline = time.perf_counter() + max_seconds
    return _Walker(deadline).visit(tree.body)


class _Walker:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def visit(self, node: ast.AST) -> Any:
        if time.perf_counter() > self.deadline:
            raise ToolError("the calculation took too long; simplify the expression")
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _check(node.value)
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            value = self.visit(node.operand)
            return value if isinstance(node.op, ast.UAdd) else -value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.visit(node.left), self.visit(node.right)
            return _check(_binary(node.op, left, right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            if node.keywords:
                raise ToolError(f"{node.func.id}() takes no named arguments")
            args = [self.visit(a) for a in node.args]
            try:
                return _check(_FUNCTIONS[node.func.id](*args))
            except (ValueError, TypeError, OverflowError) as exc:
                raise ToolError(f"{node.func.id}: {exc}") from None
        raise ToolError(f"only arithmetic is allowed; {_describe(node)} is not")


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Pow | ast.BitXor):
        if abs(right) > MAX_EXPONENT:
            raise ToolError(f"the exponent {right} is too large; the limit is {MAX_EXPONENT}")
        ints = isinstance(left, int) and isinstance(right, int)
        if ints and right > 0 and (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
            raise ToolError(f"{left}**{right} is too large to compute")
    big = isinstance(left, int) and isinstance(right, int) and abs(left).bit_length() + abs(right).bit_length()
    if isinstance(op, ast.Mult) and big and big > MAX_INT_BITS + 1:
        raise ToolError("the product is too large to compute")
    try:
        return _BINARY[type(op)](left, right)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("the result is too large") from None


def _check(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, complex):
            raise ToolError("the result is a complex number; only real arithmetic is supported")
        raise ToolError(f"unexpected value {value!r}")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"the result has more than {MAX_INT_BITS} bits; it is too large")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "that function call"
    if isinstance(node, ast.Constant):
        return f"the value {node.value!r}"
    return f"a {type(node).__name__} expression"


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def _run(arguments: dict[str, Any]) -> str:
    return _format(evaluate(arguments.get("expression", "")))


def calculator_tool(timeout_s: float = 2.0) -> Tool:
    return Tool(
        name="calculator",
        description=(
            "Evaluate an arithmetic expression exactly: + - * / // % ** (or ^), parentheses, "
            "sqrt, log, exp, sin, cos, tan, abs, round, floor, ceil, min, max and pi, e."
        ),
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 2*(3+4) or sqrt(2)/3"}},
            "required": ["expression"],
        },
        fn=_run,
        timeout_s=timeout_s,
    )
