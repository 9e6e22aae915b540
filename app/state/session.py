"""The flow of one chat window over the store, in plain Python (no Qt).

:class:`ChatSession` knows which conversation is open and which replies are
streaming: one per chat at most, any number of chats at once (the engine
batches them).  ``active`` is the open chat's streaming reply, ``streaming(id)``
any chat's.  ``send``/``regenerate``/``edit`` write the user's turn and an empty
``"streaming"`` assistant message to the store and return the engine
:class:`~engine.api.Request` (system prompt + history) together with the
:class:`~app.state.reply.ReplyState` that will collect the reply; the caller submits
the request, which carries the enabled tools (``Settings.tools_enabled``) and
the parallel-tools choice.  ``apply(event)`` folds engine events into the
reply they belong to and saves the text through a :class:`~engine.storage.StreamSaver`;
the final status is ``done``, ``cancelled`` or ``error``.  ``stop(id)`` ends a
chat's reply at once with the text so far; the engine's late ``Done(cancelled)``
only adds its metrics.

``regenerate(message_id)`` asks for a new reply in that message's place: the
replies after it go, the old text stays as one of the message's versions
(``Store.new_version``) and the new one streams into the same message.  It is
a new reply, never the same one again: past the answer cache (``fresh``, and
``answer_cache`` off, so the sampled reply is not kept as that question's
answer either) and sampled (:func:`regenerate_sampling`: the chat's
temperature, or ``REGENERATE_TEMPERATURE`` for a greedy chat, and a new seed
each time).  ``show_version(message_id, number)`` picks the version shown, the
one later turns continue from.

A chat's attached documents (``documents``/``set_documents``, kept in the
history file; before a new chat's first message, kept here and written when
it is created) go with every request of that chat as ``Request.documents``,
less the ids in ``skip_documents`` (no longer in the document index).

A message sent while the open chat's reply streams waits (``queue``; one per
chat, kept here, not stored): ``queued(id)`` reads it, ``cancel_queued(id)``
takes it back, and ``send_queued(id)`` sends it once that chat's reply has
ended (the chat need not be open then).

A chat's overflow policy (``params.option(own, "overflow")``: drop the middle
turns, or stop and say so) goes with each of its requests as
``Request.overflow``; ``overflow()``/``set_overflow()`` read and set the open
chat's.

Store failures while setting up a turn raise :class:`~engine.storage.StoreError`
before anything is submitted; failures while streaming go to ``on_store_error``
and the reply carries on on screen.
"""

from __future__ import annotations

import dataclasses
import secrets
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.state.reply import ReplyState
from app.state.tools import enabled_tools
from engine.api import Done, Error, ModelSpec, Request, Sampling, Token
from engine.storage import Message, Settings, Store, StoreError, StreamSaver, params
from engine.storage import chat_documents as storage_documents

DEFAULT_TITLE = "New chat"
QUEUE_FULL = "A message is already queued in this chat; it sends when the reply ends (or cancel it)."
TITLE_CHARS = 40
REGENERATE_TEMPERATURE = 0.8  # a greedy chat's Regenerate samples at this temperature: a new reply, not the same
SEED_LIMIT = 2**63  # Sampling.seed takes 0 to 2**63-1


def regenerate_sampling(sampling: Sampling) -> Sampling:
    """How a Regenerate samples: the chat's values, at its temperature (``REGENERATE_TEMPERATURE`` when the
    chat is greedy), with a seed of its own, so each Regenerate is a new reply."""
    temperature = sampling.temperature if sampling.temperature > 0 else REGENERATE_TEMPERATURE
    return dataclasses.replace(sampling, temperature=temperature, seed=secrets.randbelow(SEED_LIMIT))


def make_title(text: str, limit: int = TITLE_CHARS) -> str:
    """The first ``limit`` characters of a message, on one line, cut at a word."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat or DEFAULT_TITLE
    cut = flat[:limit]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:") + "\u2026"


def model_spec(settings: Settings, model_override: str | None = None) -> ModelSpec:
    """The model to load for these settings (``model_override``: a ``--model`` given for this run)."""
    return ModelSpec(
        source=model_override or settings.model,
        device=settings.device,
        dtype=settings.dtype,
        quant=settings.quant,
        draft=settings.draft_model,
        draft_quant=settings.draft_quant if settings.draft_model else "none",
    )


@dataclass
class Turn:
    """What a send/regenerate/edit produced: submit ``request``, show ``reply``."""

    request: Request
    reply: ReplyState
    user_message_id: int | None
    new_conversation: bool
    version: tuple[int, int] | None = None  # a regenerated reply's (number, of how many versions)


def chat_messages(system_prompt: str, history: Sequence[Message]) -> list[dict[str, str]]:
    """What a request of a chat carries before its new turn: the system prompt (if any), then the stored
    user and assistant messages that have text (a reply still streaming or failed empty is left out)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    kept = [m for m in history if m.role in ("user", "assistant") and m.content]
    return messages + [{"role": m.role, "content": m.content} for m in kept]


class ChatSession:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.conversation_id: str | None = None
        self.on_store_error: Callable[[StoreError], None] | None = None
        self._streaming: dict[str, ReplyState] = {}  # conversation id -> its reply still streaming
        self._savers: dict[str, StreamSaver] = {}  # request id -> the saver of that streaming reply
        self._stopped: dict[str, ReplyState] = {}  # stopped locally, engine's Done still due
        self._queued: dict[str, str] = {}  # conversation id -> the message sent while its reply streamed
        # what the parameters panel set before the chat exists (a new chat): written when it is created
        self.pending_system: str | None = None
        self.pending_params: dict[str, Any] = {}
        self.pending_documents: list[dict[str, Any]] = []  # attached before the new chat's first message
        self.pending_project: str | None = None  # the project the next new chat goes in (app.window.projects)
        self.skip_documents: set[str] = set()  # ids no longer in the document index: kept on the chat, not sent
        self.created: dict[str, str] = {}  # draft id -> the chat its first message made (attaching meanwhile)
        self._draft_id = f"draft-{uuid.uuid4().hex}"  # the next new chat's id for prefill while typing

    # -- conversations ----------------------------------------------------------
    def open(self, conversation_id: str | None) -> list[Message]:
        """Open a chat (None: a new one).  Documents attached to the next new chat stay with it meanwhile."""
        self.conversation_id = conversation_id
        self.pending_system, self.pending_params = None, {}
        self.pending_project = None
        return self.messages()

    @property
    def active(self) -> ReplyState | None:
        """The open chat's reply while it streams (None: the open chat may start a turn)."""
        return self._streaming.get(self.conversation_id) if self.conversation_id is not None else None

    def streaming(self, conversation_id: str) -> ReplyState | None:
        """That chat's reply while it streams."""
        return self._streaming.get(conversation_id)

    def all_streaming(self) -> list[ReplyState]:
        """Every reply still streaming, in any chat."""
        return list(self._streaming.values())

    @property
    def draft_id(self) -> str:
        """The id the next new chat goes by until its first message creates it."""
        return self._draft_id

    # -- the open chat's attached documents --------------------------------------------
    def documents(self) -> list[dict[str, Any]]:
        """The documents attached to the open chat (``engine.storage.chat_documents`` entries), or the next one's."""
        if self.conversation_id is None:
            return [dict(d) for d in self.pending_documents]
        return self.store.get_conversation(self.conversation_id).documents

    def max_tokens(self) -> int:
        """The reply room a request of the open chat (or the next new one) leaves: its ``max_tokens``."""
        return params.sampling(self.settings, self.chat_params()[1]).max_tokens

    def set_documents(self, docs: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        """Keep ``docs`` as the documents of ``conversation_id`` (default: the open chat, or the next new one)."""
        target = conversation_id or self.conversation_id
        if target is None:
            self.pending_documents = storage_documents.checked(docs)
        else:
            self.store.set_documents(target, docs)

    # -- the open chat's own parameters (the parameters panel) -------------------------
    def chat_params(self) -> tuple[str, dict[str, Any]]:
        """(system prompt, the sampling values set for this chat alone) of the open chat, or of the next new one."""
        if self.conversation_id is None:
            system = self.settings.system_prompt if self.pending_system is None else self.pending_system
            return system, dict(self.pending_params)
        conversation = self.store.get_conversation(self.conversation_id)
        return conversation.system_prompt, params.checked(conversation.params)[0]

    def set_chat_params(self, own: dict[str, Any], system_prompt: str | None = None) -> None:
        """Keep ``own`` (and the system prompt, if given) for the open chat, or for the next new one.  The
        chat's options (``params.CHAT_OPTIONS``: its overflow policy...) that ``own`` does not name are kept."""
        options = {k: v for k, v in self.chat_params()[1].items() if k in params.CHAT_OPTIONS}
        good, problems = params.checked({**options, **own})
        if problems:
            raise ValueError("; ".join(problems))
        if self.conversation_id is None:
            self.pending_params = good
            if system_prompt is not None:
                self.pending_system = system_prompt
            return
        self.store.set_params(self.conversation_id, good)
        if system_prompt is not None:
            self.store.set_system_prompt(self.conversation_id, system_prompt)

    def overflow(self) -> str:
        """The open chat's (or the next new one's) overflow policy: ``"drop-middle"`` or ``"stop"``."""
        return params.option(self.chat_params()[1], "overflow")

    def set_overflow(self, policy: str) -> None:
        """Keep ``policy`` (one of ``params.CHAT_OPTIONS["overflow"]``) for the open chat, or the next new one."""
        self.set_chat_params({**self.chat_params()[1], "overflow": policy})

    def messages(self) -> list[Message]:
        if self.conversation_id is None:
            return []
        return self.store.messages(self.conversation_id)

    # -- turns --------------------------------------------------------------------
    def send(self, text: str) -> Turn:
        self._require_idle()
        new = self.conversation_id is None
        if new:
            system, own = self.chat_params()  # what the parameters panel set for the next new chat
            self.conversation_id = self.store.create_conversation(
                make_title(text),
                system_prompt=system,
                params=own,
                attached=self.pending_documents,
                project_id=self.pending_project,
            )
            self.pending_system, self.pending_params, self.pending_documents = None, {}, []
            self.pending_project = None
            self.created[self._draft_id] = self.conversation_id
            self._draft_id = f"draft-{uuid.uuid4().hex}"
        conversation_id = self._current()
        untitled = not new and self.store.get_conversation(conversation_id).title == DEFAULT_TITLE
        if untitled and not self.store.messages(conversation_id):
            self.store.rename_conversation(conversation_id, make_title(text))
        user_id = self.store.add_message(conversation_id, "user", text)
        turn = self._begin(conversation_id)
        turn.user_message_id, turn.new_conversation = user_id, new
        return turn

    # -- a message sent while the reply streams ----------------------------------------
    def queue(self, text: str) -> None:
        """Keep ``text`` to send in the open chat when its streaming reply ends (``send_queued``)."""
        conversation_id = self._current()
        if conversation_id not in self._streaming:
            raise RuntimeError("No reply is streaming in this chat: send the message now.")
        if conversation_id in self._queued:
            raise RuntimeError(QUEUE_FULL)
        self._queued[conversation_id] = text

    def queued(self, conversation_id: str | None = None) -> str | None:
        """The message waiting in that chat (default: the open one), if any."""
        target = conversation_id or self.conversation_id
        return self._queued.get(target) if target is not None else None

    def cancel_queued(self, conversation_id: str | None = None) -> str | None:
        """Take back the message waiting in that chat (default: the open one); its text, or None."""
        target = conversation_id or self.conversation_id
        return self._queued.pop(target, None) if target is not None else None

    def send_queued(self, conversation_id: str) -> Turn | None:
        """Send the message waiting in ``conversation_id`` now that its reply has ended (None: none waits, or a
        reply streams there still); the chat need not be open."""
        if conversation_id in self._streaming or conversation_id not in self._queued:
            return None
        text = self._queued[conversation_id]
        user_id = self.store.add_message(conversation_id, "user", text)  # a StoreError: it stays queued
        del self._queued[conversation_id]
        turn = self._begin(conversation_id)
        turn.user_message_id = user_id
        return turn

    def regenerate(self, message_id: int) -> Turn:
        """Ask for a new reply in place of the assistant reply ``message_id`` (the messages after it go; its
        text stays one of its versions): sampled, never from the answer cache, streamed into the same message."""
        self._require_idle()
        conversation_id = self._current()
        messages = self.store.messages(conversation_id)
        target = next((m for m in messages if m.id == message_id), None)
        if target is None:
            raise ValueError(f"Message {message_id} is not in this conversation.")
        if target.role != "assistant":
            raise ValueError("Only an assistant reply can be regenerated.")
        later = next((m for m in messages if m.id > message_id), None)
        if later is not None:
            self.store.delete_messages_from(conversation_id, later.id)
        number = self.store.new_version(message_id)
        turn = self._begin(conversation_id, reply_id=message_id)
        turn.version = (number, number)
        return turn

    def show_version(self, message_id: int, number: int) -> Message:
        """Show version ``number`` of a reply of the open chat (later turns continue from it); the message now."""
        self._require_idle()
        if self._find(message_id).role != "assistant":
            raise ValueError("Only an assistant reply has versions.")
        return self.store.show_version(message_id, number)

    def edit(self, message_id: int, text: str) -> Turn:
        """Replace user message ``message_id`` with ``text``, drop what followed, ask again."""
        self._require_idle()
        conversation_id = self._current()
        if self._find(message_id).role != "user":
            raise ValueError("Only your own messages can be edited.")
        self.store.delete_messages_from(conversation_id, message_id)
        user_id = self.store.add_message(conversation_id, "user", text)
        turn = self._begin(conversation_id)
        turn.user_message_id = user_id
        return turn

    def draft_request(self, text: str) -> Request:
        """The request Send would make now with ``text`` as the new message, for the engine to prefill while
        it is typed; nothing is stored.  A chat not created yet has a draft id of its own."""
        if self.conversation_id is None:
            system, own = self.chat_params()
            conversation_id, history, docs = self._draft_id, [], self.pending_documents
        else:
            conversation = self.store.get_conversation(self.conversation_id)
            system, own, conversation_id = conversation.system_prompt, conversation.params, self.conversation_id
            history, docs = self.store.messages(self.conversation_id), conversation.documents
        messages = [*chat_messages(system, history), {"role": "user", "content": text}]
        return self._request(tuple(messages), own, conversation_id, docs)

    def _request(
        self,
        messages: tuple[dict[str, str], ...],
        own: dict[str, Any],
        conversation_id: str,
        docs: Sequence[dict[str, Any]] = (),
        regenerated: bool = False,
    ) -> Request:
        sampling = params.sampling(self.settings, own)
        return Request(
            id=uuid.uuid4().hex,
            messages=messages,
            sampling=regenerate_sampling(sampling) if regenerated else sampling,
            conversation_id=conversation_id,
            prefix_cache=self.settings.prefix_cache,
            speculative=self.settings.speculative,
            tools=enabled_tools(self.settings),
            parallel_tools=self.settings.parallel_tools,
            tool_prompt=self.settings.tool_prompt,
            answer_cache=self.settings.answer_cache and not regenerated,
            fresh=regenerated,
            documents=self.sent_ids(docs),
            overflow=params.option(own, "overflow"),
            thinking=params.option(own, "thinking"),  # a thinking model's switch (Request.thinking)
        )

    def sent_ids(self, docs: Sequence[dict[str, Any]] | None = None) -> tuple[str, ...]:
        """The document ids a request of the open chat sends (``docs``: these entries instead): the chat's
        documents less those no longer in the index."""
        entries = self.documents() if docs is None else docs
        return tuple(d["id"] for d in entries if d["id"] not in self.skip_documents)

    def _begin(self, conversation_id: str, reply_id: int | None = None) -> Turn:
        """Start the reply of a turn: a new assistant message, or (``reply_id``, regenerate) that message's
        new version, emptied already, so the history sent stops before it."""
        conversation = self.store.get_conversation(conversation_id)
        messages = chat_messages(conversation.system_prompt, self.store.messages(conversation_id))
        regenerated = reply_id is not None
        if reply_id is None:
            reply_id = self.store.add_message(conversation_id, "assistant", "", status="streaming")
        docs = conversation.documents
        request = self._request(tuple(messages), conversation.params, conversation_id, docs, regenerated)
        reply = ReplyState(request.id, reply_id, conversation_id)
        self._streaming[conversation_id] = reply
        self._savers[request.id] = StreamSaver(self.store, reply_id)
        return Turn(request, reply, None, False)

    # -- events -------------------------------------------------------------------
    def apply(self, event: object) -> ReplyState | None:
        """Fold a request event in; return the reply it changed (None: not ours)."""
        request_id = getattr(event, "request_id", None)
        late = self._stopped.get(request_id) if isinstance(request_id, str) else None
        if late is not None:
            if isinstance(event, (Done, Error)):
                del self._stopped[late.request_id]
                if isinstance(event, Done):
                    late.metrics = event.metrics
                    self._save(
                        lambda: self.store.update_message(late.message_id, late.text, metrics=late.stored_metrics())
                    )
                return late
            return None
        saver = self._savers.get(request_id) if isinstance(request_id, str) else None
        reply = next((r for r in self._streaming.values() if r.request_id == request_id), None)
        if reply is None or not reply.apply(event):
            return None
        if isinstance(event, Token) and saver is not None:
            self._save(lambda: saver.append(event.text))
        if not reply.streaming:
            self._finish(reply)
        return reply

    def stop(self, conversation_id: str | None = None) -> ReplyState | None:
        """End the reply streaming in that chat (default: the open one) now, keeping its text; the caller
        cancels the request."""
        target = conversation_id or self.conversation_id
        reply = self._streaming.get(target) if target is not None else None
        if reply is None:
            return None
        reply.stop()
        self._stopped[reply.request_id] = reply
        self._finish(reply)
        return reply

    def forget(self, conversation_id: str) -> None:
        """The conversation is being deleted (its reply stopped first): late events for its stopped replies are
        dropped, and its queued message with them."""
        self._queued.pop(conversation_id, None)
        for request_id, reply in list(self._stopped.items()):
            if reply.conversation_id == conversation_id:
                del self._stopped[request_id]

    def _finish(self, reply: ReplyState) -> None:
        saver = self._savers.pop(reply.request_id, None)
        if self._streaming.get(reply.conversation_id) is reply:
            del self._streaming[reply.conversation_id]
        metrics = reply.stored_metrics()

        def write() -> None:
            if saver is not None and saver.text == reply.text:
                saver.finish(reply.status, metrics)
            else:
                self.store.update_message(reply.message_id, reply.text, status=reply.status, metrics=metrics)

        self._save(write)

    def _save(self, write: Callable[[], object]) -> None:
        try:
            write()
        except StoreError as exc:
            if self.on_store_error is None:
                raise
            self.on_store_error(exc)

    # -- helpers ------------------------------------------------------------------
    def _current(self) -> str:
        if self.conversation_id is None:
            raise ValueError("No conversation is open.")
        return self.conversation_id

    def _find(self, message_id: int) -> Message:
        for message in self.store.messages(self._current()):
            if message.id == message_id:
                return message
        raise ValueError(f"Message {message_id} is not in this conversation.")

    def _require_idle(self) -> None:
        """The open chat has no reply streaming (other chats may)."""
        if self.active is not None:
            raise RuntimeError("A reply is still streaming in this chat; stop it first.")
