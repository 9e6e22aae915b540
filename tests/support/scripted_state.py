"""A KV state for a scripted model's forward (what ``generate_steps`` needs of one): the tokens fed, and
cropping them."""

from __future__ import annotations


class ScriptedState:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def crop(self, length: int) -> None:
        del self.tokens[length:]
