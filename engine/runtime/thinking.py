"""A reply's thinking apart from its answer, as the text streams: ``<think>...</think>``.

Qwen3, DeepSeek-R1's distills and SmolLM3 write their reasoning first, between
``<think>`` and ``</think>``, then the answer.  :class:`ThinkingSplit` is fed the
reply's text as it becomes final (``engine.runtime.detokenize.StreamText``'s
deltas, cut anywhere: a tag may arrive over several tokens) and returns each
piece as ``(thinking, answer)``.  The concatenation of all the thinking pieces is
the text between the tags, of all the answer pieces the text after the closing
tag, its leading whitespace dropped (the models write ``</think>\\n\\n``).

Thinking is only ever at the start of a reply: text that starts with anything
but (whitespace and) ``<think>`` is all answer, passed through as it comes after
the first characters that decide it.  A reply whose prompt already opened the
thinking (the template's generation prompt ends with ``<think>``: DeepSeek-R1's
distills, see :func:`prompt_opens_thinking`) starts inside it.  A reply that
ends inside its thinking (cut by max tokens) has no answer; ``flush()`` gives
what was held back.

:func:`prompt_opens_thinking` reads the end of a rendered prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPEN = "<think>"
CLOSE = "</think>"

UNDECIDED, INSIDE, ANSWER = "undecided", "inside", "answer"


@dataclass
class ThinkingSplit:
    """Splits streamed reply text into thinking and answer; ``opened``: the prompt ends inside ``<think>``."""

    opened: bool = False
    enabled: bool = True  # False: all the text is answer (a raw prompt's completion)
    state: str = UNDECIDED
    held: str = ""  # text not given out yet: a tag may be starting
    pieces: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))  # (thinking, answer) given out
    thought: bool = False  # the reply had a thinking part (it may still be inside it)

    def __post_init__(self) -> None:
        if not self.enabled:
            self.state = ANSWER
        elif self.opened:
            self.state, self.thought = INSIDE, True

    @property
    def thinking(self) -> str:
        """All the thinking given out so far."""
        return "".join(self.pieces[0])

    @property
    def answer(self) -> str:
        """All the answer given out so far."""
        return "".join(self.pieces[1])

    @property
    def inside(self) -> bool:
        """The text is (or may still be) thinking: the answer has not begun."""
        return self.state != ANSWER

    def add(self, text: str) -> tuple[str, str]:
        """Take the next piece of the reply's text; return the (thinking, answer) text that is final now."""
        if self.state == ANSWER and (self.pieces[1] or not self.thought):  # the answer, as it comes
            if text:
                self.pieces[1].append(text)
            return "", text
        self.held += text
        thinking = answer = ""
        if self.state == UNDECIDED:
            lead = self.held.lstrip()
            if lead.startswith(OPEN):
                self.state, self.thought, self.held = INSIDE, True, lead[len(OPEN) :].lstrip("\n")
            elif OPEN.startswith(lead):  # only whitespace or a part of "<think>" so far: wait for more
                return "", ""
            else:
                self.state, answer, self.held = ANSWER, self.held, ""
                return self._give("", answer)
        if self.state == INSIDE:
            at = self.held.find(CLOSE)
            if at >= 0:
                thinking, rest = self.held[:at], self.held[at + len(CLOSE) :]
                self.state, self.held = ANSWER, rest
                thinking = thinking.rstrip()
            else:
                # held: a part of "</think>" at the end, and the whitespace before it (none ends the thinking)
                thinking = self.held[: len(self.held) - _partial_tail(self.held, CLOSE)].rstrip()
                self.held = self.held[len(thinking) :]
                return self._give(thinking, "")
        if self.state == ANSWER and self.held:  # the whitespace after "</think>" is no part of the answer
            if not self.pieces[1]:
                self.held = self.held.lstrip()
            answer, self.held = self.held, ""
        return self._give(thinking, answer)

    def flush(self) -> tuple[str, str]:
        """The text held back, at the end of the reply."""
        held, self.held = self.held, ""
        if self.state == INSIDE:
            return self._give(held.rstrip(), "")
        return self._give("", held if self.pieces[1] or self.state == UNDECIDED else held.lstrip())

    def _give(self, thinking: str, answer: str) -> tuple[str, str]:
        if not self.pieces[0]:
            thinking = thinking.lstrip("\n")
        for kept, piece in zip(self.pieces, (thinking, answer), strict=True):
            if piece:  # only pieces with text: an empty list is "none given out yet"
                kept.append(piece)
        return thinking, answer


def _partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag`` (held until the next piece)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def prompt_opens_thinking(tokenizer: Any, prompt_ids: list[int], tail: int = 8) -> bool:
    """Whether the prompt's last tokens leave a ``<think>`` open: the reply starts inside its thinking."""
    if not prompt_ids:
        return False
    try:
        text = str(tokenizer.decode(prompt_ids[-tail:], skip_special_tokens=False))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode these ids: no thinking assumed
        return False
    return text.rstrip().endswith(OPEN)
