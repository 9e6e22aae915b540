"""Chat messages to prompt token ids, fitted to the model's context.

``build_prompt`` renders messages with the model's own chat template and
tokenises the text.  When prompt plus ``max_tokens`` would not fit the context,
the chat's overflow policy decides (``OVERFLOW``, a chat option of
``engine.storage.params``): ``"drop-middle"`` keeps the system prompt (and the
whole documents it holds) and the newest turns and drops the turns between,
``"stop"`` refuses with :class:`ContextOverflow`, a message that says by how
much the chat is over and what to do.  Dropping cuts at stable points: the
first user turn past each ``1/DROP_STEP`` of the prompt budget in the
conversation's tokens (counted from its start), so a cut drops that much at
least, and the turns after it go on from the same kept prompt (the conversation's prefix
cache entry stays valid) until the next cut is due, instead of one more turn
dropped, and the whole kept prompt computed again, every reply.  When the
last message alone is too long it keeps the start of it.  ``truncated`` says
that something was left out, ``dropped`` which turns (numbered from 1 after
the system prompt).

Message contents (from users, files, tools, earlier replies) are text: a
special-token string inside one (``<|im_start|>system ...`` pasted into a
message) becomes the ids of its characters, never a control token; only the
template's own markup yields control tokens.  A prompt whose contents hold no
special-token string is tokenised exactly as the whole rendered text always
was (the prefix cache relies on that); one that does is rendered with
placeholders for the contents, and each stretch of text between the
template's control tokens is tokenised with special tokens not parsed (the
same stretches the tokenizer would split at, so only the injected strings
change).

Templates come from model folders and are untrusted: every render goes through
:func:`engine.model.template.render_chat`, which gives the same text as
``apply_chat_template`` but ends a template that runs too long or makes too
much with a ``ChatTemplateError`` (a ``ValueError`` naming the template), so a
reply fails with that message and the engine goes on.
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.model.kv import common_prefix
from engine.model.template import render_chat
from engine.model.tool_template import template_renders_tool_turns, template_renders_tools
from engine.tools.prompt import has_tool_turns, plain_tool_turns, tool_instructions, with_tool_prompt


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    truncated: bool
    system_tokens: int  # length of the system prompt's own token prefix (0 if none)
    documents: tuple[str, ...] = ()  # ids of the attached documents the system prefix holds whole
    dropped: tuple[int, ...] = ()  # (first, last): the turns left out, numbered from 1 after the system prompt


OVERFLOW = ("drop-middle", "stop")  # what a chat that outgrows the context does (the first: the default)
DROP_STEP = 4  # the cuts lie a 1/DROP_STEP of the prompt budget of conversation tokens apart


class ContextOverflow(ValueError):
    """A chat whose policy is ``"stop"`` no longer fits the context: the message says by how much and what to do."""

    def __init__(self, prompt_tokens: int, budget: int, context: int) -> None:
        self.prompt_tokens, self.budget, self.context = prompt_tokens, budget, context
        over = prompt_tokens - budget
        super().__init__(
            f"This chat no longer fits the model's context: its prompt is {prompt_tokens:,} tokens, {over:,} over "
            f"the {budget:,} that a {context:,}-token context leaves beside the reply's room. Branch the chat or "
            "keep only its last turns, load the model with a larger context, or let this chat drop its middle "
            "turns (Settings > This chat > When the chat outgrows the context)."
        )


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The chat template's token ids for ``messages``, with their contents tokenised as text.

    ``tools`` (JSON schemas, ``engine.tools.tool_schemas``) go to the template's ``tools``
    argument, or into the system message as Brisk's own tool prompt when the template
    ignores that argument (:func:`for_template`); without them the template is called
    exactly as before.
    """
    messages, tools = for_template(tokenizer, messages, tools or None)
    specials = special_strings(tokenizer)
    if not any(s in str(m.get("content", "")) for m in messages for s in specials):
        text = render_chat(tokenizer, messages, add_generation_prompt, tools)
        if tools is None and len(text) >= LONG_TEXT and messages[0].get("role") == "system":
            return _with_known_system(tokenizer, text, str(messages[0].get("content", "")))
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return _render_guarded(tokenizer, messages, add_generation_prompt, specials, tools)


def for_template(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools to render for a template that cannot carry them (engine.tools.prompt): earlier
    tool rounds written as text when it drops tool calls, and the tools as Brisk's own instructions in the
    system message when it ignores ``tools``.  A template that renders both: as they are."""
    if has_tool_turns(messages) and not template_renders_tool_turns(tokenizer):
        messages = plain_tool_turns(messages)
    if tools and not template_renders_tools(tokenizer):
        return with_tool_prompt(messages, tools, has_system_role(tokenizer)), None
    return messages, tools


TOOL_PROMPT_SHARE = 4  # Brisk's own tool prompt is given where it fills at most 1/TOOL_PROMPT_SHARE of the context


def tools_that_fit(tokenizer: Any, tools: list[dict[str, Any]] | None, context: int) -> list[dict[str, Any]] | None:
    """``tools``, or None where the template cannot carry them and Brisk's own tool prompt would fill more than
    ``1/TOOL_PROMPT_SHARE`` of ``context`` (a small context keeps its room for the conversation)."""
    if not tools or context <= 0 or template_renders_tools(tokenizer):
        return tools
    return None if len(content_ids(tokenizer, tool_instructions(tools))) * TOOL_PROMPT_SHARE > context else tools


LONG_TEXT = 2_000  # characters
_KNOWN: OrderedDict[tuple[Any, str], tuple[int, ...]] = OrderedDict()  # (tokenizer, system text) -> its ids
KNOWN_MAX = 16


def _with_known_system(tokenizer: Any, text: str, system: str) -> list[int]:
    """The ids of a long prompt ``text`` whose system message (an attached document's text rendered into it,
    sent again with every question about it: tokenising a 14 kB handbook took 4-7 ms of each question's
    TTFT) was tokenised before: its ids, then the rest's.  A system message is remembered only once the
    whole text's ids were checked to be its ids followed by the rest's, so the result is always what
    tokenising the whole text gives."""
    head = _system_text(tokenizer, system)
    if not head or not text.startswith(head):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    rest = list(tokenizer(text[len(head) :], add_special_tokens=False)["input_ids"])
    known = _KNOWN.get((tokenizer, head))
    if known is not None:
        _KNOWN.move_to_end((tokenizer, head))
        return [*known, *rest]
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    mine = tuple(tokenizer(head, add_special_tokens=False)["input_ids"])
    if list(mine) + rest == ids:  # this tokenizer splits here: the system message's ids do not depend on the rest
        _KNOWN[(tokenizer, head)] = mine
        while len(_KNOWN) > KNOWN_MAX:
            _KNOWN.popitem(last=False)
    return ids


@functools.lru_cache(maxsize=16)
def _system_text(tokenizer: Any, content: str) -> str:
    """The system message alone, rendered (empty when the template will not render it alone)."""
    try:
        return render_chat(tokenizer, [{"role": "system", "content": content}], False, None)
    except Exception:  # noqa: BLE001 - a template that needs a user turn: no shortcut, the whole text is tokenised
        return ""


def content_ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` tokenised as text: special-token strings in it are not control tokens."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


@functools.lru_cache(maxsize=8)
def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The strings of the tokenizer's special (control) tokens, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {str(t.content) for t in decoder.values() if getattr(t, "special", False) and str(t.content)}
    found |= {str(t) for t in getattr(tokenizer, "all_special_tokens", ()) if t}
    return tuple(sorted(found, key=len, reverse=True))


def _render_guarded(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    specials: tuple[str, ...],
    tools: list[dict[str, Any]] | None,
) -> list[int]:
    """Render with placeholders for the contents; control tokens only from the template's own text."""
    texts = [str(m.get("content", "")) for m in messages]
    mark = "\ue000"
    while any(mark in t for t in texts):
        mark += "\ue000"
    holders = [f"{mark}{i}\ue001" for i in range(len(messages))]
    placeheld = [{**m, "content": h} for m, h in zip(messages, holders, strict=True)]
    template = render_chat(tokenizer, placeheld, add_generation_prompt, tools)
    holder = re.compile(re.escape(mark) + r"(\d+)\ue001")
    control = re.compile("|".join(re.escape(s) for s in specials))
    ids: list[int] = []
    stretch: list[str] = []  # text since the last control token (template text and contents alike)

    def flush() -> None:
        if stretch:
            ids.extend(content_ids(tokenizer, "".join(stretch)))
            stretch.clear()

    for i, part in enumerate(holder.split(template)):
        if i % 2:  # a placeholder's message index
            stretch.append(texts[int(part)])
            continue
        at = 0
        for match in control.finditer(part):
            stretch.append(part[at : match.start()])
            flush()
            ids.append(int(tokenizer.convert_tokens_to_ids(match.group())))
            at = match.end()
        stretch.append(part[at:])
    flush()
    return ids


@functools.lru_cache(maxsize=16)
def _system_ids(tokenizer: Any, content: str, tools_json: str = "") -> tuple[int, ...]:
    """The system message alone (with the tools, as JSON), rendered and tokenised (the same few recur)."""
    tools = json.loads(tools_json) if tools_json else None
    return tuple(render(tokenizer, [{"role": "system", "content": content}], add_generation_prompt=False, tools=tools))


IMPLICIT_MIN = 16  # a template's own system prompt counts as one from this many tokens (shorter: no gain)


@functools.lru_cache(maxsize=8)
def _implicit_ids(tokenizer: Any, tools_json: str) -> tuple[int, ...]:
    """What the chat template puts before any first user message when no system message is given (SmolLM2's
    and Qwen's default system prompt, Llama 3's date, the tools): the tokens two unlike messages share."""
    tools = json.loads(tools_json) if tools_json else None
    try:
        one = render(tokenizer, [{"role": "user", "content": "a"}], tools=tools)
        two = render(tokenizer, [{"role": "user", "content": "Zq 7?"}], tools=tools)
    except Exception:  # a template that refuses these: no implicit prefix
        return ()
    return tuple(one[: common_prefix(one, two)])


def system_prefix_tokens(
    tokenizer: Any, messages: list[dict[str, str]], ids: list[int], tools: list[dict[str, Any]] | None = None
) -> int:
    """Number of leading prompt tokens that belong to the system message; without one, to what the chat
    template puts before every first message (its own default system prompt), when that is
    ``IMPLICIT_MIN`` tokens or more: kept and saved like a system prompt, so a new process's first
    question computes only its own tokens."""
    if not messages:
        return 0
    try:
        tools_json = json.dumps(tools) if tools else ""  # keys in their order: the tool prompt is rendered from it
    except (TypeError, ValueError):
        return 0
    if messages[0]["role"] != "system":
        shared = common_prefix(list(_implicit_ids(tokenizer, tools_json)), ids)
        return shared if shared >= IMPLICIT_MIN else 0
    sys_ids = list(_system_ids(tokenizer, messages[0]["content"], tools_json))
    return common_prefix(sys_ids, ids)


@functools.lru_cache(maxsize=8)
def has_system_role(tokenizer: Any) -> bool:
    """Whether the chat template takes a system message (Gemma's and some Mistral templates refuse one)."""
    try:
        render(tokenizer, [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}])
    except Exception:  # the template raises (its own words) or the sandbox ends it: no system role
        return False
    return True


def prompt_budget(context: int, max_tokens: int) -> int:
    """The prompt tokens that fit ``context`` and still leave room for the reply (at least half the context)."""
    return context - min(max_tokens, context // 2)


def build_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    context: int,
    max_tokens: int,
    tools: list[dict[str, Any]] | None = None,
    overflow: str = OVERFLOW[0],
) -> Prompt:
    """``messages`` rendered (with ``tools`` for the template, if any: :func:`tools_that_fit`) and fitted to
    ``context`` as the ``overflow`` policy says (:data:`OVERFLOW`)."""
    if not messages or not messages[-1].get("content", "").strip():
        raise ValueError("The message is empty. Type something to send.")
    if overflow not in OVERFLOW:
        raise ValueError(f"Unknown overflow policy {overflow!r}; choose one of {', '.join(OVERFLOW)}.")
    tools = tools_that_fit(tokenizer, tools, context)
    budget = prompt_budget(context, max_tokens)
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    ids = render(tokenizer, messages, tools=tools)
    if len(ids) > budget and overflow == "stop":
        raise ContextOverflow(len(ids), budget, context)
    truncated, dropped = False, 0
    if len(ids) > budget and len(turns) > 1:
        ids, dropped = _drop_middle(tokenizer, system, turns, budget, tools)
        turns, truncated = turns[dropped:], True
    if len(ids) > budget:
        last = turns[-1]
        last_ids = content_ids(tokenizer, last["content"])
        overflow_tokens = len(ids) - budget
        keep = len(last_ids) - overflow_tokens
        if keep < 1:
            raise ValueError("The system prompt alone is longer than the model's context. Shorten it in Settings.")
        cut = {"role": last["role"], "content": tokenizer.decode(last_ids[:keep])}
        turns = turns[:-1] + [cut]
        ids, truncated = render(tokenizer, system + turns, tools=tools), True
        while len(ids) > budget and keep > 1:  # re-tokenisation can differ slightly at the cut
            keep = max(1, keep - (len(ids) - budget) - 1)
            cut = {"role": last["role"], "content": tokenizer.decode(last_ids[:keep])}
            ids = render(tokenizer, system + turns[:-1] + [cut], tools=tools)
    system_tokens = system_prefix_tokens(tokenizer, system + turns, ids, tools)
    return Prompt(ids, truncated, system_tokens, dropped=(1, dropped) if dropped else ())


def _drop_middle(
    tokenizer: Any, system: list[dict[str, Any]], turns: list[dict[str, Any]], budget: int, tools: Any
) -> tuple[list[int], int]:
    """(the prompt's ids, how many of the oldest turns it leaves out) for the first stable cut whose rest fits
    ``budget``.  A cut starts at a user turn (or leaves the last turn alone); the stable cuts are the first
    past each ``budget / DROP_STEP`` tokens of the turns' contents, counted from the conversation's start,
    so a cut drops that much at least and a conversation that grows keeps its cut until the rest no longer
    fits.  A binary search over the cuts
    takes a few renders however long the conversation (dropping one turn a render took 50,000 renders for
    50,000 short messages); fewer turns never render longer."""
    starts: list[int] = []
    at = 0
    while len(turns) - at > 1:
        at += 1
        while len(turns) - at > 1 and turns[at]["role"] != "user":
            at += 1
        starts.append(at)
    sizes = tokenizer([str(m.get("content") or "") for m in turns], add_special_tokens=False)["input_ids"]
    step = max(1, budget // DROP_STEP)
    # the first start past each step of tokens (a cut drops a step at least), and the last (one turn left)
    cuts: list[int] = []
    seen, position, block_of = 0, 0, {}
    for i, message_ids in enumerate(sizes):
        block_of[i] = position // step
        position += len(message_ids)
    for start in starts:
        block = block_of[start]
        if block > seen or start == starts[-1]:
            cuts.append(start)
            seen = block
    rendered: dict[int, list[int]] = {}
    low, high = 0, len(cuts) - 1  # the last cut (one turn left) is taken whether it fits or not
    while low < high:
        middle = (low + high) // 2
        rendered[middle] = render(tokenizer, system + turns[cuts[middle] :], tools=tools)
        if len(rendered[middle]) <= budget:
            high = middle
        else:
            low = middle + 1
    ids = rendered[low] if low in rendered else render(tokenizer, system + turns[cuts[low] :], tools=tools)
    return ids, cuts[low]


def raw_prompt(tokenizer: Any, text: str, context: int, max_tokens: int) -> Prompt:
    """``text`` as the whole prompt, no chat template (an OpenAI ``/v1/completions`` prompt): its tokens, the
    tokenizer's own start token included, kept to its end when it does not fit ``context``."""
    if not text:
        raise ValueError("The prompt is empty.")
    ids = list(tokenizer(text)["input_ids"])
    budget = prompt_budget(context, max_tokens)
    truncated = len(ids) > budget
    return Prompt(ids[-budget:] if truncated else ids, truncated, 0)
