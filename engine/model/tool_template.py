"""Whether a chat template can carry tools: probed once per tokenizer.

Many chat templates (the bundled SmolLM2's among them) ignore the ``tools``
argument: the schemas never reach the prompt and the model never calls a tool.
:func:`template_renders_tools` says whether a tokenizer's template renders
them (a probe tool rendered and not, compared; remembered per tokenizer), and
:func:`template_renders_tool_turns` whether it renders an assistant's tool
calls and a ``tool`` message (many render the ``tool`` role as an unknown
speaker and drop the calls, so the model sees a bare ``14`` and no question).
Where either is false, :mod:`engine.tools.prompt` writes Brisk's own tool prompt.
"""

from __future__ import annotations

import functools
from typing import Any

from engine.model.template import render_chat

PROBE_NAME = "brisk_probe_tool"
PROBE_RESULT = "brisk-probe-result-7q"
_PROBE_SCHEMA = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_PROBE_USER: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]


@functools.lru_cache(maxsize=8)
def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template puts the ``tools`` argument into the prompt: rendered with a probe tool it
    differs from rendered without and names the tool.  A template that raises on either: no."""
    try:
        without = render_chat(tokenizer, _PROBE_USER, True, None)
        with_tool = render_chat(tokenizer, _PROBE_USER, True, [_PROBE_SCHEMA])
    except Exception:  # noqa: BLE001 - a template that cannot render the probe cannot carry tools either
        return False
    return with_tool != without and PROBE_NAME in with_tool


@functools.lru_cache(maxsize=8)
def template_renders_tool_turns(tokenizer: Any) -> bool:
    """Whether the chat template renders an assistant's tool call (its name appears) and a tool result."""
    call: dict[str, Any] = {
        "id": "a1b2c3d4e",
        "type": "function",
        "function": {"name": PROBE_NAME, "arguments": {"x": "y"}},
    }
    messages: list[dict[str, Any]] = [
        *_PROBE_USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": PROBE_NAME, "tool_call_id": "a1b2c3d4e", "content": PROBE_RESULT},
    ]
    try:
        text = render_chat(tokenizer, messages, True, [_PROBE_SCHEMA])
    except Exception:  # noqa: BLE001 - a template that refuses tool turns: they are written as text
        return False
    return PROBE_NAME in text and PROBE_RESULT in text
