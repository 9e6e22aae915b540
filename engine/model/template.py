"""A model folder's chat template, rendered within bounds and tried once at load.

:func:`render_chat` renders messages exactly as ``tokenizer.apply_chat_template(..., tokenize=False)``
does (the same inputs: messages normalised, the tokenizer's special tokens as variables, ``tools``;
the same sandbox, globals and filters), on the calling thread, in a
:class:`~engine.model.template_budget.BoundedEnvironment`: about a second (``LIMITS.deadline_s``),
a bounded number of steps, and text of at most ``LIMITS.base_chars`` plus ``LIMITS.input_factor``
times the size of the messages and tools, for the output and for any single value the template
makes.  A template that goes past a bound, or fails, raises :class:`ChatTemplateError` (a
``ValueError``) naming the template's file and saying what it did; its checks end the render from
inside, so no thread is left running.  Compiled templates are kept by their text.

:func:`check_template`, called when a model loads, notes which file the template came from
(:func:`template_file`) and renders a few trial conversations: a template that cannot render a
plain question, or that goes past a bound on any trial (with and without tools, with a system
prompt and a reply), refuses the model with :class:`~engine.model.source.ModelLoadError`.
Errors a template raises on purpose for richer conversations (a system role it does not take)
are left for the reply that meets them.

A thinking model's switch: :func:`takes_thinking_switch` says whether the template reads
``enable_thinking`` (Qwen3's and SmolLM3's do); :func:`thinking_switches` turns a chat's choice
("auto" | "on" | "off") into the variables to render with, and :func:`template_switches` sets them
for every render inside its ``with`` (a context variable: each request's greenlet has its own), as
``apply_chat_template(..., enable_thinking=False)`` passes its extra keywords to the template.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jinja2

from engine.model.source import ModelLoadError
from engine.model.template_budget import BoundedEnvironment, Budget, TemplateBudgetError, budgeted

UNNAMED = "the model's chat template"
_SWITCHES: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar("template_switches", default=())
_origins: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Limits:
    deadline_s: float = 1.0
    max_steps: int = 2_000_000  # loop rounds, calls, operators and written values
    base_chars: int = 256_000  # the largest text or list any conversation may make...
    input_factor: int = 8  # ...plus this many times the characters of the messages and tools
    made_factor: int = 16  # all values made together: this many times the largest
    max_template_chars: int = 256_000  # the template's own source


LIMITS = Limits()


class ChatTemplateError(ValueError):
    """A chat template failed or went past its bounds; the message names the template and what to do."""

    def __init__(self, message: str, stopped: bool) -> None:
        super().__init__(message)
        self.stopped = stopped  # a bound stopped it (rather than an error of its own)


def template_file(location: str | Path, source: str = "") -> str:
    """Which file of the model folder ``location`` transformers reads the chat template from, as words."""
    folder = Path(location)
    if (folder / "chat_template.jinja").is_file():
        where = str(folder / "chat_template.jinja")
    else:
        where = f"the chat_template field of {folder / 'tokenizer_config.json'}"
    return f"{where}, converted from {source}" if source.lower().endswith(".gguf") else where


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    limits: Limits = LIMITS,
) -> str:
    """The chat template's text for ``messages`` (as ``apply_chat_template(tokenize=False)``), bounded."""
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    from transformers.utils import chat_template_utils as hf  # the same inputs transformers renders with

    source = tokenizer.get_chat_template(None, tools)
    chat = hf._alias_reasoning_fields(hf._plain_template_data(hf._normalize_chat_messages(messages)))
    schemas = hf._plain_template_data(tools)
    variables = hf._plain_template_data(dict(tokenizer.special_tokens_map))
    try:
        template = _compile(source, limits.max_template_chars)
        budget = Budget(limits.deadline_s, limits.max_steps)
        largest = limits.base_chars + limits.input_factor * _characters(chat, schemas, variables)
        budget.bound_values(largest, limits.made_factor * largest)
        with budgeted(budget):
            return _generate(
                template,
                budget,
                largest,
                variables,
                messages=chat,
                tools=schemas,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **dict(_SWITCHES.get()),
            )
    except TemplateBudgetError as exc:
        raise ChatTemplateError(_message(tokenizer, f"was stopped: {exc}"), stopped=True) from None
    except RecursionError:
        raise ChatTemplateError(_message(tokenizer, "was stopped: it nests too deeply"), stopped=True) from None
    except MemoryError:
        raise ChatTemplateError(_message(tokenizer, "was stopped: it ran out of memory"), stopped=True) from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(_message(tokenizer, f"failed: {exc}"), stopped=False) from exc
    except Exception as exc:  # a template raises what its operations raise (TypeError, KeyError, ...)
        raise ChatTemplateError(_message(tokenizer, f"failed ({type(exc).__name__}: {exc})"), stopped=False) from exc


@contextlib.contextmanager
def template_switches(switches: Mapping[str, Any]) -> Iterator[None]:
    """Render every chat template inside this ``with`` with ``switches`` as extra variables."""
    token = _SWITCHES.set(tuple(switches.items()))
    try:
        yield
    finally:
        _SWITCHES.reset(token)


def takes_thinking_switch(tokenizer: Any) -> bool:
    """Whether the chat template reads ``enable_thinking`` (a thinking model whose thinking can be turned off)."""
    try:
        return "enable_thinking" in str(tokenizer.get_chat_template(None, None))
    except Exception:  # noqa: BLE001 - no template (refused elsewhere) or a tokenizer without one: no switch
        return False


def thinking_switches(tokenizer: Any, choice: str) -> dict[str, bool]:
    """The variables a chat's thinking ``choice`` renders with: ``enable_thinking`` for "on"/"off" where the
    template reads it; none for "auto" (the template's default) or a template without the switch."""
    if choice not in ("on", "off") or not takes_thinking_switch(tokenizer):
        return {}
    return {"enable_thinking": choice == "on"}


def _generate(template: jinja2.Template, budget: Budget, largest: int, variables: dict[str, Any], **inputs: Any) -> str:
    """The template's output, chunk by chunk: each chunk a step, the whole at most ``largest`` characters."""
    chunks = cast(Generator[str, None, None], template.generate(**inputs, **variables))
    parts: list[str] = []
    written = 0
    try:
        for chunk in chunks:
            budget.step()
            written += len(chunk)
            if written > largest:
                raise TemplateBudgetError(f"it wrote more than {largest:,} characters")
            parts.append(chunk)
    finally:
        chunks.close()
    return "".join(parts)


def _characters(*inputs: Any) -> int:
    """The size of a template's inputs (as JSON: they are plain data once transformers has converted them)."""
    return len(json.dumps(inputs, ensure_ascii=False, default=str))


def _message(tokenizer: Any, what: str) -> str:
    """The user's message: which template, what it did, what to do."""
    return (
        f"The chat template ({origin(tokenizer)}) {what}. Fix or replace that template, "
        "shorten the conversation if only long ones fail, or pick another model."
    )


def origin(tokenizer: Any) -> str:
    """Where ``tokenizer``'s template came from, as noted by :func:`check_template`."""
    try:
        return _origins.get(tokenizer, UNNAMED)
    except TypeError:  # a tokenizer that cannot be weakly referenced
        return UNNAMED


@functools.cache
def _environment() -> BoundedEnvironment:
    """transformers' chat-template environment (options, globals, filters, extensions), bounded."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return BoundedEnvironment(_compile_jinja_template("").environment)


@functools.lru_cache(maxsize=8)
def _compile(source: str, max_chars: int) -> jinja2.Template:
    if len(source) > max_chars:
        raise TemplateBudgetError(f"it is {len(source):,} characters long (at most {max_chars:,})")
    return _environment().from_string(source)


TRIAL_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 2 * (3 + 4)"}},
                "required": ["expression"],
            },
        },
    }
]
TRIAL_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3?"},
]


def check_template(tokenizer: Any, where: str, limits: Limits = LIMITS) -> None:
    """Note where the template came from, and refuse (``ModelLoadError``) one that fails its trials."""
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced keeps no name
        _origins[tokenizer] = where
    if tokenizer.chat_template is None:
        return  # refused with its own message by engine.model.facts
    try:
        render_chat(tokenizer, TRIAL_CHAT[1:2], True, None, limits)
    except ChatTemplateError as exc:
        raise ModelLoadError(f"This model cannot be used: {exc}") from None
    for chat, tools in ((TRIAL_CHAT, None), (TRIAL_CHAT, TRIAL_TOOLS), (TRIAL_CHAT[1:], TRIAL_TOOLS)):
        try:
            render_chat(tokenizer, chat, True, tools, limits)
            render_chat(tokenizer, chat, False, tools, limits)
        except ChatTemplateError as exc:
            if exc.stopped:
                raise ModelLoadError(f"This model cannot be used: {exc}") from None
