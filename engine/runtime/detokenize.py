"""Incremental detokenising with stop strings: text that is final, as tokens arrive.

``StreamText(tokenizer, stop)``: ``add(ids)`` appends token ids and returns the
new text that can be shown now; ``flush()`` returns the rest at the end.  Text
is held back while it ends in an incomplete multi-byte character (``\\ufffd``)
or could still be the start of a stop string.  When a stop string appears,
``text`` is cut before it, ``stopped`` becomes True, and nothing after it is
ever returned.  The concatenation of everything returned equals ``text``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamText:
    """Incremental detokenizer with stop strings; returns only text that is final."""

    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    stopped: bool = False

    def add(self, ids: list[int]) -> str:
        """Append token ids; return the new text that can be shown now."""
        self.ids.extend(ids)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
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

    def flush(self, upto: int | None = None) -> str:
        """The text not returned yet, up to ``upto`` (default: all of it)."""
        upto = len(self.text) if upto is None else upto
        delta = self.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return delta
