"""A Jinja sandbox whose every step counts against a budget, so an untrusted chat template always ends.

:class:`BoundedEnvironment` is transformers' ``ImmutableSandboxedEnvironment`` with hooks at
every place a template does work: each loop iteration (every ``{% for %}`` iterable is wrapped
when the template is parsed), each call (methods, filters, macros, ``loop(...)``), the
operators that can grow values (``*``, ``**``, ``+``, ``%`` and ``~``), and each value written
out.  While :func:`budgeted` is active on this thread, each hook takes a step from the
:class:`Budget` and checks its deadline, refuses an operation whose result would be far too big
before it runs (the product of its two largest operands: a string and a repeat count, a text and
a format width, a separator and a list), and measures what it made: no single string or list may
pass ``max_value`` characters (items), nor everything made together ``max_made``.  A hook that
finds the budget spent raises :class:`TemplateBudgetError`; Jinja has no way to catch it, so the
render ends at once, even in nested loops or deep in macros.  Outside :func:`budgeted` (Jinja
folding constants at compile time) the hooks only pass through, and a template renders exactly
as transformers renders it: the hooks never change a value.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from jinja2 import nodes, pass_context, pass_eval_context
from jinja2.runtime import LoopContext, Macro, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

MAX_INT_BITS = 65_536  # an integer result of * or ** past this many bits is refused before it is computed
_ACTIVE: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("brisk_template_budget", default=None)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_SIZED = (str, *_CONTAINERS)
_DIGITS = re.compile(r"\d+")


class TemplateBudgetError(Exception):
    """A template went past its budget; the message says which bound."""


class Budget:
    """Time, steps and characters one render may spend (see the module docstring)."""

    def __init__(self, deadline_s: float, max_steps: int) -> None:
        self.deadline_s, self.deadline = deadline_s, time.perf_counter() + deadline_s
        self.steps_left, self.max_steps = max_steps, max_steps
        self.max_value = self.max_made = self.made_left = 0
        self._sizes: dict[int, tuple[Any, int, int]] = {}  # id -> (container, size, height): each walked once

    def bound_values(self, max_value: int, max_made: int) -> None:
        """At most ``max_value`` characters (items) in any one value, ``max_made`` in all values made."""
        self.max_value, self.max_made, self.made_left = max_value, max_made, max_made

    def step(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise TemplateBudgetError(f"it took more than {self.max_steps:,} steps (loop rounds and calls)")
        if time.perf_counter() > self.deadline:
            raise TemplateBudgetError(f"it ran for more than {self.deadline_s:g} s")

    def charge(self, chars: int) -> None:
        """Count ``chars`` more characters made; past ``max_made`` the render ends."""
        self.made_left -= chars
        if self.made_left < 0:
            raise TemplateBudgetError(f"it made more than {self.max_made:,} characters in all")

    def foresee(self, estimate: int) -> None:
        """Refuse, before it runs, an operation that could make about ``estimate`` characters."""
        if estimate > self.max_made:
            about = f"about {estimate:,}" if estimate < 10**15 else "more than 10^15"
            raise TemplateBudgetError(f"one step would make {about} characters (at most {self.max_made:,} in all)")

    def made(self, value: Any) -> Any:
        """``value``, after checking and counting its size (strings and containers; others are free)."""
        if type(value) is str or isinstance(value, str):
            self.make(len(value))
        elif isinstance(value, _CONTAINERS):  # new memory: its slots; what it holds was counted when made
            self.make(self.size(value), new=len(value))
        return value

    def make(self, n: int, new: int | None = None) -> None:
        """Check one value of ``n`` characters (items, with what they hold); count ``new`` (else ``n``) made."""
        if n > self.max_value:
            raise TemplateBudgetError(f"it made a text or list of {n:,} characters (the limit is {self.max_value:,})")
        self.charge(n if new is None else new)

    def size(self, value: Any) -> int:
        """Characters of a string; items plus the sizes of what they hold for a container; else 1."""
        if type(value) is str or isinstance(value, str):
            return len(value)
        if isinstance(value, range):
            return len(value)
        if not isinstance(value, _CONTAINERS):
            return 1
        known = self._sizes.get(id(value))
        return known[1] if known is not None else self._walk(value)[0]

    def height(self, value: Any) -> int:
        """How deeply a container nests (0 for anything else): indented JSON grows with it."""
        if not isinstance(value, _CONTAINERS):
            return 0
        known = self._sizes.get(id(value))
        return known[2] if known is not None else self._walk(value)[1]

    def magnitude(self, value: Any, counts: bool) -> int:
        """How much an operand can multiply a result by: its size, or an integer's value where ``counts``."""
        if counts and isinstance(value, int) and not isinstance(value, bool):
            return abs(value)
        return self.size(value)

    def _walk(self, root: Any) -> tuple[int, int]:
        """Size and height of a container, children first, without recursion (kept for later calls)."""
        sizes, busy = self._sizes, {id(root)}
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            obj, expanded = stack.pop()
            items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else list(obj)
            if not expanded:
                stack.append((obj, True))
                for item in items:
                    if isinstance(item, _CONTAINERS) and id(item) not in sizes and id(item) not in busy:
                        busy.add(id(item))
                        stack.append((item, False))
                continue
            total, height = len(items), 1
            for item in items:
                if not isinstance(item, _CONTAINERS):
                    total += self.size(item)
                elif id(item) in sizes:
                    total += sizes[id(item)][1]
                    height = max(height, sizes[id(item)][2] + 1)
                else:
                    total += 1  # a cycle back to a container still being walked
            sizes[id(obj)] = (obj, total, height)
            busy.discard(id(obj))
        return sizes[id(root)][1:]


@contextmanager
def budgeted(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the one every hook on this thread spends from, for the ``with`` block."""
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def _estimate(budget: Budget, values: list[Any], multiplies: bool, ints: bool = False) -> int:
    """What an operation on ``values`` could make: the product of the two largest magnitudes if it
    ``multiplies`` (repeats one operand per part of another), else their sum (integers by value if ``ints``)."""
    sizes = [budget.magnitude(v, ints) + 1 for v in values]
    if not multiplies or len(sizes) < 2:
        return sum(sizes)
    first, second = sorted(sizes, reverse=True)[:2]
    return first * second


def _widths(fmt: str) -> int:
    """The largest number written in a format string (a field width or precision, at most)."""
    return max((int(d) for d in _DIGITS.findall(fmt) if len(d) < 20), default=0) if "%" in fmt or "{" in fmt else 0


def _format_estimate(budget: Budget, fmt: str, args: list[Any]) -> int:
    """What formatting ``args`` into ``fmt`` could make: each field as wide as the widest value or width."""
    widest = max([_widths(fmt), *(budget.magnitude(a, True) for a in args)], default=0)
    return len(fmt) * (widest + 1)


class _Counted:
    """A ``{% for %}`` iterable whose every round takes a step and charges the loop body's own text."""

    __slots__ = ("inner", "weight")

    def __init__(self, inner: Any, weight: int) -> None:
        self.inner, self.weight = inner, weight

    def __len__(self) -> int:
        return len(self.inner)  # a TypeError for iterators, as Jinja's loop.length expects

    def __iter__(self) -> Iterator[Any]:
        budget = _ACTIVE.get()
        if budget is None:
            yield from self.inner
            return
        for item in self.inner:
            budget.step()
            budget.charge(self.weight)
            yield item


@pass_context
def _count_rounds(_context: Any, iterable: Any, weight: int) -> _Counted:
    return _Counted(iterable, weight)


@pass_eval_context
def _concat(eval_ctx: Any, parts: tuple[Any, ...]) -> str:
    """Jinja's ``~``, sized before it joins."""
    budget = _ACTIVE.get()
    if budget is not None:
        budget.step()
        budget.foresee(sum(budget.size(p) for p in parts))
    joined = markup_join(parts) if eval_ctx.autoescape else str_join(parts)
    return budget.made(joined) if budget is not None else joined


class _Bound(NodeTransformer):
    """Routes every loop's iterable and every ``~`` through the counted filters above."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        weight = sum(len(data.data) for data in node.find_all(nodes.TemplateData))
        node.iter = nodes.Filter(node.iter, "brisk_rounds", [nodes.Const(weight)], [], None, None)
        node.iter.set_lineno(node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load")
        return nodes.Filter(parts, "brisk_concat", [], [], None, None).set_lineno(node.lineno)


# filters and str methods that repeat one operand per part of another (the rest make about what they get)
_MULTIPLYING_FILTERS = frozenset({"batch", "center", "format", "indent", "join", "pprint", "replace", "round"})
_MULTIPLYING_FILTERS |= {"slice", "tojson", "wordwrap"}
_MULTIPLYING_METHODS = frozenset({"center", "expandtabs", "format", "format_map", "join", "ljust", "replace"})
_MULTIPLYING_METHODS |= {"rjust", "translate", "zfill"}
_COUNTING_FILTERS = frozenset({"batch", "center", "format", "indent", "round", "slice", "tojson"})  # ints: counts
_NESTING_FILTERS = frozenset({"pprint", "tojson"})  # their output indents by depth


def _foresee_filter(budget: Budget, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a filter call whose result would be far too big, before it runs."""
    values = [*args, *kwargs.values()]
    estimate = _estimate(budget, values, name in _MULTIPLYING_FILTERS, ints=name in _COUNTING_FILTERS)
    if name in _NESTING_FILTERS and args:
        estimate *= budget.height(args[0]) + 1
    if name == "format" and args and isinstance(args[0], str):
        estimate = max(estimate, _format_estimate(budget, args[0], values[1:]))
    if name == "round" and any(isinstance(v, int) and abs(v) > 1000 for v in values[1:]):
        raise TemplateBudgetError("|round was asked for more than 1000 digits")
    if name == "sum" and not isinstance(kwargs.get("start", args[2] if len(args) > 2 else 0), int | float):
        raise TemplateBudgetError("|sum adds numbers only here (adding lists or strings takes quadratic time)")
    budget.foresee(estimate)


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a filter) with a step, a size forecast and its result measured; never folded at compile time."""
    passing = _PassArg.from_obj(func)

    @pass_context
    @functools.wraps(func)
    def bounded(context: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _ACTIVE.get()
        if budget is not None:
            budget.step()
            _foresee_filter(budget, name, args, kwargs)
        if passing is _PassArg.context:
            result = func(context, *args, **kwargs)
        elif passing is _PassArg.eval_context:
            result = func(context.eval_ctx, *args, **kwargs)
        elif passing is _PassArg.environment:
            result = func(context.environment, *args, **kwargs)
        else:
            result = func(*args, **kwargs)
        return budget.made(result) if budget is not None else result

    return bounded


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002  # Jinja's names
    """Jinja's ``lipsum`` for at most 100 paragraphs of at most 1000 words."""
    if n > 100 or max > 1000:
        raise TemplateBudgetError("lipsum was asked for more than 100 paragraphs or 1000 words")
    return str(generate_lorem_ipsum(n, html, min, max))


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox with every unit of work counted (see the module docstring)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, reference: ImmutableSandboxedEnvironment) -> None:
        """The same options, extensions, globals and filters as ``reference``, each filter bounded."""
        super().__init__(
            trim_blocks=reference.trim_blocks,
            lstrip_blocks=reference.lstrip_blocks,
            keep_trailing_newline=reference.keep_trailing_newline,
            autoescape=reference.autoescape,
            extensions=[type(ext) for ext in reference.extensions.values()],
            finalize=self._written,
        )
        self.globals.update(reference.globals)
        self.globals["lipsum"] = _lipsum
        self.filters.update({name: _bounded_filter(name, f) for name, f in reference.filters.items()})
        self.filters["brisk_rounds"], self.filters["brisk_concat"] = _count_rounds, _concat

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        _Bound().visit(tree)
        return tree

    @staticmethod
    def _written(value: Any) -> Any:
        """Every ``{{ value }}`` on its way out: a step, and its size counted."""
        budget = _ACTIVE.get()
        if budget is None:
            return value
        budget.step()
        return budget.made(value)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _ACTIVE.get()
        if budget is not None:
            budget.step()
            if not isinstance(obj, Macro | LoopContext):  # template code: its own steps are counted
                _foresee_call(budget, obj, [*args, *kwargs.values()])
        result = super().call(context, obj, *args, **kwargs)
        return budget.made(result) if budget is not None else result

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _ACTIVE.get()
        if budget is None:
            return self.binop_table[operator](left, right)
        budget.step()
        if operator == "+" and type(left) is str and type(right) is str:  # the common case, sized exactly
            budget.make(len(left) + len(right))
            return left + right
        _foresee_binop(budget, operator, left, right)
        return budget.made(self.binop_table[operator](left, right))


def _foresee_call(budget: Budget, obj: Any, values: list[Any]) -> None:
    """Refuse a call whose result would be far too big, before it runs (str methods take counts and widths)."""
    target = getattr(obj, "__wrapped__", obj)  # str.format comes wrapped by the sandbox
    owner = getattr(target, "__self__", None)
    if isinstance(owner, str) and getattr(target, "__name__", "") in ("format", "format_map"):
        budget.foresee(_format_estimate(budget, owner, values))
    if owner is not None and not isinstance(owner, ModuleType):
        values = [owner, *values]
    multiplies = isinstance(owner, str) and getattr(target, "__name__", "") in _MULTIPLYING_METHODS
    budget.foresee(_estimate(budget, values, multiplies, ints=multiplies))


def _foresee_binop(budget: Budget, operator: str, left: Any, right: Any) -> None:
    """Refuse ``left OPERATOR right`` before it runs when its result would be far too big."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*" and ints:
        if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
            raise TemplateBudgetError(f"it multiplied numbers past {MAX_INT_BITS:,} bits")
    elif operator == "*":
        budget.foresee(_estimate(budget, [left, right], multiplies=True, ints=True))
    elif operator == "**" and ints and right > 0 and abs(left) > 1:
        if right * abs(left).bit_length() > MAX_INT_BITS:
            raise TemplateBudgetError(f"it raised a number to a power past {MAX_INT_BITS:,} bits")
    elif operator == "+":
        budget.foresee(budget.size(left) + budget.size(right))
    elif operator == "%" and isinstance(left, str):
        budget.foresee(_format_estimate(budget, left, [right]))
