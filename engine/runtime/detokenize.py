"""Incremental detokenising with stop strings: text that is final, as tokens arrive.

``StreamText(tokenizer, stop)``: ``add(ids)`` appends token ids and returns the
new text that can be shown now; ``flush()`` returns the rest at the end.  Text
is held back while it ends in an incomplete multi-byte character (``\\ufffd``)
or could still be the start of a stop string.  When a stop string appears,
``text`` is cut before it, ``stopped`` becomes True, and nothing after it is
ever returned.  The concatenation of everything returned equals ``text``.

``text`` is always what decoding all ids at once gives, but without decoding all
ids on every token (which grows with the reply: about 0.2 ms a token at 300
tokens): every ``CHECKPOINT`` tokens, when decoding the ids up to ``WINDOW``
tokens back and the ids after that separately gives exactly the whole text, the
first part's text is kept and later tokens decode only the ids after it.  A
tokenizer for which a split changes the text (one that drops a leading space
when decoding from the middle) never gets a checkpoint and decodes everything,
as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHECKPOINT = 32  # tokens between attempts to move the checkpoint
WINDOW = 8  # tokens kept after a checkpoint when it is set (their text already checked against the split)
GIVE_UP = 4  # refused checkpoints in a row after which a reply decodes everything every token


@dataclass
class StreamText:
    """Incremental detokenizer with stop strings; returns only text that is final."""

    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    stopped: bool = False
    settled_ids: int = 0  # ids[:settled_ids] decode to settled_text, and a split there changes nothing
    settled_text: str = ""
    next_try: int = CHECKPOINT + WINDOW  # when to try to move the checkpoint
    failures: int = 0  # checkpoints refused in a row; at GIVE_UP this tokenizer decodes everything

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def add(self, ids: list[int]) -> str:
        """Append token ids; return the new text that can be shown now."""
        self.ids.extend(ids)
        self.text = self.settled_text + self._decode(self.ids[self.settled_ids :])
        if len(self.ids) >= self.next_try and self.failures < GIVE_UP:
            self._checkpoint()
        safe = len(self.text)
        for stop in self.stop:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.stopped, safe = self.text[:at], True, at
                break
        if not self.stopped:
            if self.text.endswith("\ufffd"):  # a multi-byte character is not complete yet
                safe = len(self.text.rstrip("\ufffd"))
            hold = max((len(s) - 1 for s in self.stop), default=0)
            safe = max(self.emitted, min(safe, len(self.text) - hold))
        return self.flush(safe)

    def _checkpoint(self) -> None:
        """Settle the ids up to ``WINDOW`` tokens back, if splitting there leaves the text as it is."""
        split = len(self.ids) - WINDOW
        head = self.settled_text + self._decode(self.ids[self.settled_ids : split])
        if not head.endswith("\ufffd") and head + self._decode(self.ids[split:]) == self.text:
            self.settled_ids, self.settled_text, self.failures = split, head, 0
        else:
            self.failures += 1
        self.next_try = len(self.ids) + CHECKPOINT

    def flush(self, upto: int | None = None) -> str:
        """The text not returned yet, up to ``upto`` (default: all of it)."""
        upto = len(self.text) if upto is None else upto
        delta = self.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return delta
