"""Tools and the registry of the ones the user enabled.

A :class:`Tool` is a name, a description, a JSON schema of its arguments, a
function and a timeout.  The function takes the arguments as one dict and
returns the result text (or an awaitable of it); it raises :class:`ToolError`
with a message for the model and the user when it cannot do what was asked.

A :class:`Registry` holds every known tool and the set that is enabled.  Only
enabled tools run: :meth:`Registry.resolve` refuses an unknown or disabled
name, whatever the model or the user asked for.  :func:`tool_schemas` renders
the enabled tools in the shape ``apply_chat_template(tools=[...])`` expects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ToolFn = Callable[[dict[str, Any]], "str | Awaitable[str]"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list, tuple),
    "null": (type(None),),
}


class ToolError(Exception):
    """A tool could not do what was asked; the message is what the model and the user see."""


@dataclass(frozen=True)
class Tool:
    """One tool.  ``parameters`` is a JSON schema of type ``object``."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn = field(compare=False, repr=False)
    timeout_s: float = 10.0
    source: str = "builtin"  # "builtin" or "mcp:SERVER"

    def schema(self) -> dict[str, Any]:
        """The tool as one entry of a chat template's ``tools`` list."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    def text_argument(self) -> str | None:
        """The argument that plain text after ``/NAME`` goes to.

        The single required string argument; when none is required, the first
        string argument in the schema; ``None`` when there is no such argument.
        """
        props = self.parameters.get("properties") or {}
        required = [n for n in self.parameters.get("required") or () if n in props]
        strings = [n for n, p in props.items() if isinstance(p, Mapping) and p.get("type") == "string"]
        if required:
            return required[0] if len(required) == 1 and required[0] in strings else None
        return strings[0] if strings else None


def check_arguments(schema: Mapping[str, Any], arguments: object) -> list[str]:
    """What is wrong with ``arguments`` for ``schema`` (top-level keys and types only); empty when fine."""
    if not isinstance(arguments, Mapping):
        return [f"arguments must be a JSON object, not {type(arguments).__name__}"]
    props: Mapping[str, Any] = schema.get("properties") or {}
    out = [f"missing argument {n!r}" for n in schema.get("required") or () if n not in arguments]
    for key, value in arguments.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                out.append(f"unknown argument {key!r} (known: {', '.join(props) or 'none'})")
            continue
        kinds = spec.get("type") if isinstance(spec, Mapping) else None
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if kinds and not any(_is_type(value, k) for k in kinds):
            out.append(f"argument {key!r} must be {' or '.join(kinds)}, not {type(value).__name__}")
        elif isinstance(spec, Mapping) and "enum" in spec and value not in spec["enum"]:
            out.append(f"argument {key!r} must be one of {spec['enum']}, not {value!r}")
    return out


def _is_type(value: object, kind: str) -> bool:
    if kind not in _JSON_TYPES:
        return True
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES[kind])


class Registry:
    """Every known tool, and which of them are enabled.  Not thread-safe to change while a turn runs."""

    def __init__(self, tools: Iterable[Tool] = (), enabled: Iterable[str] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._enabled: set[str] = set()
        for tool in tools:
            self.add(tool)
        self.enable(*enabled)

    def add(self, tool: Tool, *, enabled: bool = False, replace: bool = False) -> None:
        """Add ``tool``; a name already taken raises ``ValueError`` unless ``replace``."""
        if not tool.name or any(c.isspace() for c in tool.name):
            raise ValueError(f"a tool name must be one word, not {tool.name!r}")
        if tool.name in self._tools and not replace:
            raise ValueError(f"a tool named {tool.name!r} exists already ({self._tools[tool.name].source})")
        self._tools[tool.name] = tool
        if enabled:
            self._enabled.add(tool.name)

    def remove(self, name: str) -> None:
        self._tools.pop(name, None)
        self._enabled.discard(name)

    def enable(self, *names: str, on: bool = True) -> None:
        """Enable (or with ``on=False`` disable) tools; ``"all"`` means every known tool."""
        for name in names:
            targets = list(self._tools) if name == "all" else [name]
            for target in targets:
                if on:
                    self._enabled.add(target)
                else:
                    self._enabled.discard(target)

    def disable(self, *names: str) -> None:
        self.enable(*names, on=False)

    def only(self, names: Iterable[str]) -> Registry:
        """A new registry with the same tools, where exactly ``names`` (that are known) are enabled."""
        view = Registry(self._tools.values())
        view.enable(*names)
        view._enabled &= set(view._tools)
        return view

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def is_enabled(self, name: str) -> bool:
        return name in self._enabled and name in self._tools

    def names(self) -> list[str]:
        """Every known tool's name, in the order added."""
        return list(self._tools)

    def all(self) -> list[Tool]:
        return list(self._tools.values())

    def enabled(self) -> list[Tool]:
        """The enabled tools, in the order added."""
        return [t for n, t in self._tools.items() if n in self._enabled]

    def resolve(self, name: str) -> Tool:
        """The tool to run for ``name``; raises :class:`ToolError` when unknown or not enabled."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(t.name for t in self.enabled()) or "none"
            raise ToolError(f"there is no tool named {name!r}; the enabled tools are: {known}")
        if name not in self._enabled:
            raise ToolError(f"the tool {name!r} is not enabled; enable it in the tools panel (or --tools {name})")
        return tool


def tool_schemas(registry: Registry) -> list[dict[str, Any]]:
    """The enabled tools for ``tokenizer.apply_chat_template(messages, tools=...)``."""
    return [tool.schema() for tool in registry.enabled()]
