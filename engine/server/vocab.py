"""The loaded model's tokenizer and chat template, for what the server answers without running the model.

:class:`Vocab` reads the backend the server submits to (``engine.client.Router``
hands :class:`~engine.server.control.LocalServer` a callable that gives it) and
keeps a private copy of the loaded model's tokenizer, made once per load: a
call sets options on the tokenizer it uses, so sharing the engine's would let a
count on the server's thread change how the engine tokenises a prompt at that
moment (``Engine.count_tokens`` copies it for the same reason).  A backend with
no tokenizer of its own (a remote server, none loaded yet) gives ``None``, and
each caller says what that means for its answer.

What it serves, each blocking (run it with ``asyncio.to_thread``):

* :meth:`Vocab.prompt_ids` -- a request's prompt as the engine builds it
  (``engine.runtime.prompt``: the chat template with the client's tools, fitted
  to the context; or a raw ``/v1/completions`` prompt): the ``usage`` of a reply
  the answer cache gave, which ran no prefill;
* :meth:`Vocab.tokenize`, :meth:`Vocab.detokenize`, :meth:`Vocab.template_text`
  -- llama.cpp's ``/tokenize``, ``/detokenize`` and ``/apply-template``
  (``engine.server.llama_api``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.api import Request
from engine.runtime.token_bytes import piece_bytes


@dataclass(frozen=True)
class Model:
    """What the server reads of the loaded model: a private tokenizer, where it came from, its context."""

    tokenizer: Any
    source: str  # the folder the model was loaded from
    context: int
    eos_ids: frozenset[int]


class Vocab:
    def __init__(self, backend: Callable[[], Any]) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._copy: tuple[Any, Model] | None = None  # (the engine's LoadedModel, the copy made of it)

    def model(self) -> Model | None:
        """The loaded model's copy, made at the first call after each load; None without a local model."""
        backend = self._backend()
        loaded = getattr(backend, "loaded", None) if backend is not None else None
        if loaded is None or getattr(loaded, "tokenizer", None) is None:  # a remote backend's Loaded has none
            return None
        with self._lock:
            if self._copy is None or self._copy[0] is not loaded:
                model = Model(
                    copy.deepcopy(loaded.tokenizer),
                    str(getattr(loaded, "source", "")),
                    int(getattr(loaded, "context_length", 0)),
                    frozenset(getattr(loaded, "eos_ids", ())),
                )
                self._copy = (loaded, model)
            return self._copy[1]

    def copied(self) -> bool:
        """Whether the copy of the model loaded now is made (without making it)."""
        backend = self._backend()
        loaded = getattr(backend, "loaded", None) if backend is not None else None
        with self._lock:
            return loaded is not None and self._copy is not None and self._copy[0] is loaded

    def prompt_ids(self, request: Request) -> list[int] | None:
        """The prompt the engine builds for ``request`` (a server request: the client's messages and tools,
        no documents, no Brisk tools), or None without a local model or when it cannot be built."""
        from engine.runtime.prompt import build_prompt, raw_prompt

        model = self.model()
        if model is None:
            return None
        max_tokens = request.sampling.max_tokens
        try:
            if request.raw and request.prompt_ids:
                return list(request.prompt_ids)
            if request.raw:
                return raw_prompt(model.tokenizer, request.messages[0]["content"], model.context, max_tokens).ids
            tools = [dict(tool) for tool in request.client_tools] or None
            return build_prompt(model.tokenizer, list(request.messages), model.context, max_tokens, tools).ids
        except ValueError:  # the engine refused it the same way; nothing to count
            return None

    @staticmethod
    def tokenize(model: Model, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """``text``'s ids: with the tokenizer's own start token when ``add_special``; a special token's text
        in it as that token when ``parse_special``, else as the ids of its characters."""
        encoded = model.tokenizer(text, add_special_tokens=add_special, split_special_tokens=not parse_special)
        return list(encoded["input_ids"])

    @staticmethod
    def piece(model: Model, token_id: int) -> str | list[int]:
        """One token's text as llama.cpp's ``/tokenize`` gives it: a string when its bytes are whole UTF-8,
        else the list of its bytes (a byte-level BPE token that holds part of a character)."""
        raw = piece_bytes(model.tokenizer, token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    @staticmethod
    def detokenize(model: Model, ids: list[int]) -> str:
        return str(model.tokenizer.decode(ids, skip_special_tokens=False))

    @staticmethod
    def template_text(
        model: Model, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool = True
    ) -> str:
        """The chat template's text for ``messages``, with the generation prompt (unless not ``generation``),
        as a reply renders it (tools the template cannot carry go in as Brisk's own tool prompt,
        ``engine.runtime.prompt``)."""
        from engine.model.template import render_chat
        from engine.runtime.prompt import for_template

        messages, tools = for_template(model.tokenizer, messages, tools)
        return render_chat(model.tokenizer, messages, generation, tools)
