"""Documents in the window: attach files and folders to a chat, their chips, a reply's sources, the Documents view.

:class:`DocumentsController` is the window's one door to the document index
(``engine.client.document_library()``, or the factory the window was given).
Every call into the index blocks (reading a PDF, a folder of notes, the
tokenizer), so it runs on a worker thread (:meth:`DocumentsController.run`,
through :func:`app.background.in_background`) and its result comes back on the
GUI thread; the chat stays usable throughout.

* **Attach** (the composer's paperclip, File > Attach files… Ctrl+O, File >
  Attach a folder… Ctrl+Shift+O, or files dropped anywhere on the window):
  the library reads and indexes the files on a worker while the chat stays
  usable; the line above the composer says which file (and page, or passage
  being indexed) it is on, with Cancel (which ends quietly, keeping what was
  read before it).  The documents read go to the chat that was open when they were
  asked for (kept in the history file, or for a new chat until its first
  message creates it) and are sent with each of its requests; each file that
  could not be read is named in a banner in the library's words.  A file that
  changed since it was attached before is read again, and every chat holding
  its older text now holds the new one (as Re-index does).  A remote engine
  reads no documents: the paperclip is greyed with the reason.
* **Chips** show the open chat's documents with the loaded model's token count
  (counted on a worker when a local model is loaded; "≈" from the characters
  until then), kept in the chat's entries so the context meter and the next
  start know them; one too long to go whole into the prompt says "searched".
  × detaches one.  Opening a chat checks its documents on a worker: a file
  that changed on disk is read again (the chat then holds the new text's id),
  one removed from the index is greyed and no longer sent, unless its file was
  read again since (in another chat, or by ``brisk documents add``): the chat
  then holds that newer text.
* **Sources** and the **Documents view** (Tools > Documents…, Ctrl+Shift+D):
  :class:`~app.window.document_views.LibraryViews`, mixed in here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QFileDialog, QWidget

from app.background import in_background
from app.dialogs.documents_view import DocumentsDialog
from app.dialogs.passage import PassageDialog
from app.engines import active_server
from app.state.attachments import entry, merged, problems_text, progress_text, searched_ids
from app.window.document_views import LibraryViews
from engine import client
from engine.api import Loaded
from engine.storage import StoreError

REMOTE_TIP = (
    "The server chosen in Settings > Engines does not read attached documents; "
    "choose the local model there to attach files."
)
FILE_FILTER = (
    "Documents (*.txt *.md *.markdown *.rst *.pdf *.docx *.html *.htm *.csv *.json *.py *.js *.ts *.c *.cpp *.h "
    "*.java *.go *.rs *.rb *.sh *.toml *.yaml *.yml *.xml *.tex *.log);;All files (*)"
)
PROGRESS_MS = 100  # the progress line is redrawn at most this often, however fast files go by
COUNT_BATCH = 16  # documents counted per call of the tokenizer
Library = Callable[[], Any]
# the name the library's progress gives while a file's passages are indexed (engine.documents.library.indexing_name;
# matched here so that the window imports none of the document converters before a file is attached)
INDEXING = re.compile(r"(?P<name>.+) \((?P<done>\d+) of (?P<of>\d+) passages\)")


@dataclass
class AttachJob:
    """Files being read for one chat: ``target`` is its id (or the new chat's draft id)."""

    target: str
    cancel: threading.Event = field(default_factory=threading.Event)
    latest: tuple[int, int, str] = (0, 0, "")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, done: int, total: int, name: str) -> None:  # called on the worker thread
        with self.lock:
            self.latest = (done, total, name)


def local_paths(event: QDropEvent) -> list[str]:
    """The local files and folders a drag carries (none for text or web links)."""
    mime = event.mimeData()
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


class DocumentsController(LibraryViews, QObject):
    def __init__(self, window: Any, library: Library | None = None) -> None:
        super().__init__(window)
        self.window = window
        self._factory = library or client.document_library
        self._library: Any = None
        self._library_lock = threading.Lock()
        self.pending = 0  # calls into the index not answered yet (tests wait for 0)
        self.job: AttachJob | None = None
        self.counts: dict[str, int] = {}  # document id -> tokens in the loaded model's tokenizer
        self._model = ""  # the model those counts are for
        self._counting: set[str] = set()
        self._said: set[str] = set()  # notes already shown this session (a moved file, said once)
        self._notice_shown = False
        self.dialog: DocumentsDialog | None = None
        self.passage: PassageDialog | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(PROGRESS_MS)
        self._timer.timeout.connect(self._show_progress)
        composer = window.composer
        composer.attach_requested.connect(self.choose)
        composer.chips.detach_requested.connect(self.detach)
        composer.chips.cancel_requested.connect(self.cancel)
        window.chat_view.source_requested.connect(self.show_source)
        # the window too: a drop on the sidebar, the panels or the status bar reaches it (Qt hands a drag to
        # the nearest widget under the cursor that accepts drops); and every widget that takes drops of its own
        # (the system prompt's editor, the search box), which would insert the files' paths as text
        for target in (window.chat_view.viewport(), composer.editor.viewport(), composer, window):
            target.setAcceptDrops(True)
            target.installEventFilter(self)
        for widget in window.findChildren(QWidget):
            if widget.acceptDrops() and widget is not window:
                widget.installEventFilter(self)  # a drag of text still goes to it (eventFilter takes files only)
        self.settings_changed()

    # -- the index, opened on a worker (its converters are imported then) ----------------------------------
    def library(self) -> Any:
        with self._library_lock:
            if self._library is None:
                self._library = self._factory()
            return self._library

    def run(self, work: Callable[[], Any], then: Callable[[Any], None], failed: Callable[[Exception], None]) -> None:
        """``work()`` on a worker thread; ``then(result)``, or ``failed(exc)``, back on the GUI thread."""
        self.pending += 1

        def done(owner: DocumentsController, result: Any) -> None:
            owner.pending -= 1
            if isinstance(result, Exception):
                failed(result)
            else:
                then(result)

        in_background(self, work, done)

    def _check_notice(self) -> None:
        """A damaged index moved aside: said once."""
        notice = getattr(getattr(self._library, "store", None), "notice", None)
        if notice and not self._notice_shown:
            self._notice_shown = True
            self.window.show_banner("documents-index", "warning", str(notice))

    def _failed(self, what: str) -> Callable[[Exception], None]:
        def say(exc: Exception) -> None:
            self.window.show_banner("documents", "error", f"{what}: {exc}")

        return say

    # -- availability ----------------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Documents are read by the local engine only."""
        return active_server(self.window.settings) is None

    def settings_changed(self) -> None:
        self.window.composer.set_attach_available(self.available, REMOTE_TIP)
        action = getattr(self.window, "attach_action", None)
        if action is not None:
            action.setEnabled(self.available)
            self.window.attach_folder_action.setEnabled(self.available)

    # -- attaching ---------------------------------------------------------------------------------------------
    def choose(self, folder: bool = False) -> bool:
        """Ask for files (or a folder) with the system's dialog, then attach them."""
        if not self.available:
            self.window.composer.show_hint(REMOTE_TIP)
            return False
        start = str(Path.home())
        if folder:
            chosen = QFileDialog.getExistingDirectory(self.window, "Attach a folder", start)
            paths = [chosen] if chosen else []
        else:
            paths, _ = QFileDialog.getOpenFileNames(self.window, "Attach files", start, FILE_FILTER)
        return bool(paths) and self.attach(paths)

    def attach(self, paths: Sequence[str]) -> bool:
        """Read and index ``paths`` (files and folders) in the background for the open chat."""
        window = self.window
        if not self.available:
            window.composer.show_hint(REMOTE_TIP)
            return False
        if self.job is not None:
            window.composer.show_hint("Brisk is still reading files; wait for it or press Cancel.")
            return False
        session = window.session
        job = AttachJob(session.conversation_id or session.draft_id)
        self.job = job
        window.composer.chips.show_progress(progress_text(0, 0, ""))
        self._timer.start()
        wanted = [str(p) for p in paths]

        def work() -> list[Any]:
            return list(self.library().attach(wanted, progress=job.report, cancel=job.cancel.is_set))

        self.run(work, lambda results: self._attached(job, results), lambda exc: self._attach_failed(job, exc))
        return True

    def reading_for_open_chat(self) -> bool:
        """Whether files are being read for the chat now open (or for the next new chat): a Send now would
        go without them."""
        session = self.window.session
        return self.job is not None and self.job.target == (session.conversation_id or session.draft_id)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
            self.window.composer.chips.show_progress("Stopping\u2026")
            self.window.composer.chips.cancel_button.setEnabled(False)

    @property
    def indexing(self) -> bool:
        return self.job is not None

    def _show_progress(self) -> None:
        job = self.job
        if job is None or job.cancel.is_set():
            return
        with job.lock:
            done, total, name = job.latest
        self.window.composer.chips.show_progress(progress_line(done, total, name), done, total)

    def _end_job(self) -> None:
        self.job = None
        self._timer.stop()
        self.window.composer.chips.hide_progress()

    def _attach_failed(self, job: AttachJob, exc: Exception) -> None:
        self._end_job()
        self.window.show_banner("documents", "error", f"No file was attached: {exc}")

    def _attached(self, job: AttachJob, results: list[Any]) -> None:
        self._end_job()
        self._check_notice()
        window = self.window
        good = [r for r in results if getattr(r, "ok", False)]
        # the file being read when Cancel was pressed says it was cancelled: not a problem with it
        problems = [str(r.problem) for r in results if not getattr(r, "ok", False) and not r.cancelled]
        entries = [entry(r.doc_id, r.name, str(r.path), int(r.chars), self.counts.get(r.doc_id)) for r in good]
        window.session.skip_documents.difference_update(e["id"] for e in entries)
        added, where = self._add_to_chat(job.target, entries)
        for r, new in zip(good, entries, strict=True):  # a changed file: chats holding its older text get this one
            old = getattr(r, "replaced", "")
            if old and old != r.doc_id:
                self.replace_everywhere(old, new)
        if problems:
            window.show_banner("documents", "warning", problems_text(problems, len(good)))
        else:
            window.hide_banner("documents")
        self._say_notes(note for r in good for note in getattr(r, "notes", ()))
        if where is None and entries:
            window.show_banner(
                "documents", "warning", "The chat these files were attached for was deleted; attach them again."
            )
        elif job.cancel.is_set():
            window.composer.show_hint(f"Stopped reading files; {added:,} attached{where}.")
        elif entries:
            noun = "document" if added == 1 else "documents"
            window.composer.show_hint(f"Attached {added:,} {noun}{where}." if added else "Already attached.")
        self.show_chat(check=False)
        self.count([e["id"] for e in entries])
        window.typing.chat_changed()  # the draft's request now carries the documents

    def _add_to_chat(self, target: str, entries: list[dict[str, Any]]) -> tuple[int, str | None]:
        """Add ``entries`` to the chat ``target`` names; (how many were new, " to “title”" or "" for the open
        chat; None when that chat is gone)."""
        session = self.window.session
        conversation: str | None
        if target == session.draft_id and session.conversation_id is not None:  # the next new chat's, not open now
            docs, added = merged(session.pending_documents, entries)
            session.pending_documents = docs
            return added, " to the new chat"
        if target == session.conversation_id or (session.conversation_id is None and target == session.draft_id):
            conversation, where = session.conversation_id, ""
        else:
            conversation = session.created.get(target, target)
            try:
                title = self.window.store.get_conversation(conversation).title
            except StoreError:
                return 0, None
            where = "" if conversation == session.conversation_id else f" to \u201c{title}\u201d"
        try:
            docs = self._documents_of(conversation)
            docs, added = merged(docs, entries)
            session.set_documents(docs, conversation)
        except StoreError as exc:
            self.window._store_error(exc)
            return 0, where
        return added, where

    def _documents_of(self, conversation: str | None) -> list[dict[str, Any]]:
        session = self.window.session
        if conversation is None or conversation == session.conversation_id:
            return session.documents()
        return list(self.window.store.get_conversation(conversation).documents)

    def _say_notes(self, notes: Iterable[str]) -> None:
        new = [n for n in dict.fromkeys(notes) if n not in self._said]
        if new:
            self._said.update(new)
            self.window.show_banner("documents-notes", "info", "\n".join(new[:6]))

    def detach(self, doc_id: str) -> None:
        """Take a document off the open chat (it stays in the index, for other chats and the Documents view)."""
        session = self.window.session
        try:
            docs = session.documents()
            session.set_documents([d for d in docs if d["id"] != doc_id])
        except StoreError as exc:
            self.window._store_error(exc)
            return
        name = next((d["name"] for d in docs if d["id"] == doc_id), "the document")
        self.window.composer.show_hint(f"Detached {name} from this chat.")
        self.show_chat(check=False)
        self.window.typing.chat_changed()

    # -- the open chat's chips --------------------------------------------------------------------------------
    def show_chat(self, check: bool = True, messages: list[Any] | None = None) -> None:
        """Show the open chat's documents and the context meter (the window calls it when a chat is opened or
        made; ``messages``: the chat's, when already read); ``check``: look for files changed on disk and
        documents gone from the index."""
        window = self.window
        session = window.session
        try:
            docs = session.documents()
            counted = [d | {"tokens": self.counts[d["id"]]} if d["id"] in self.counts else d for d in docs]
            if counted != docs:
                session.set_documents(counted)  # the chips, the meter and the next start know the count
                docs = counted
        except StoreError as exc:
            window._store_error(exc)
            docs = []
        ids = [d["id"] for d in docs]
        window.composer.chips.set_documents(docs, session.skip_documents & set(ids), self.searched(docs))
        window.show_context(messages)
        if check and ids and session.conversation_id is not None:
            self._check(session.conversation_id, ids, {d["id"]: str(d.get("path") or "") for d in docs})
        self.count(ids)  # in this model's tokens (a count kept from another model is shown until then)

    def searched(self, docs: list[dict[str, Any]]) -> set[str]:
        """The ids of ``docs`` too long to go whole into the loaded model's prompt (searched for passages)."""
        loaded = self.window.loaded
        length = loaded.info.context_length if loaded is not None else 0
        if not length or not docs:
            return set()
        sent = [d for d in docs if d["id"] not in self.window.session.skip_documents]
        try:
            return searched_ids(sent, length, self.window.session.max_tokens())
        except StoreError:
            return set()

    def _check(self, conversation: str, ids: list[str], paths: dict[str, str] | None = None) -> None:
        """Look for files changed on disk and documents gone from the index (``paths``: each id's file, whose
        newer text may have been attached since, in another chat or by ``brisk documents add``)."""
        where = paths or {}

        def work() -> tuple[set[str], dict[str, dict[str, Any]], list[str]]:
            library = self.library()
            gone: set[str] = set()
            replaced: dict[str, dict[str, Any]] = {}
            notes: list[str] = []
            for doc_id in ids:
                now, said = library.refresh([doc_id])
                if not now:
                    newer = library.store.by_path(Path(where[doc_id]).resolve()) if where.get(doc_id) else None
                    if newer is not None and newer.id != doc_id:  # its file was read again since: that text now
                        now, _ = library.refresh([newer.id])
                        said = [f"{newer.name} changed on disk and was read again; this chat now uses the new text."]
                if not now:  # no longer in the index: its chip says so
                    gone.add(doc_id)
                    continue
                notes += said
                if now[0] != doc_id:
                    info = library.store.get(now[0])
                    if info is not None:
                        replaced[doc_id] = entry(info.id, info.name, info.path, info.chars)
            return gone, replaced, notes

        def then(found: tuple[set[str], dict[str, dict[str, Any]], list[str]]) -> None:
            gone, replaced, notes = found
            self._check_notice()
            session = self.window.session
            session.skip_documents |= gone
            for old, new in replaced.items():
                self.replace_everywhere(old, new)
            self._say_notes(notes)
            if conversation == session.conversation_id:
                self.show_chat(check=False)

        self.run(work, then, self._failed("The chat's documents could not be checked"))

    def replace_everywhere(self, old: str, new: dict[str, Any]) -> None:
        """A document was read again (its file changed): every chat holding ``old`` now holds ``new``."""
        session, store = self.window.session, self.window.store
        try:
            chats = [c for c in store.list_conversations() if any(d["id"] == old for d in c.documents)]
            for chat in chats:
                store.set_documents(chat.id, _swapped(chat.documents, old, new))
        except StoreError as exc:
            self.window._store_error(exc)
        if any(d["id"] == old for d in session.pending_documents):
            session.pending_documents = _swapped(session.pending_documents, old, new)
        self.counts.pop(old, None)
        session.skip_documents.discard(new["id"])

    # -- token counts of the loaded model --------------------------------------------------------------------
    def model_loaded(self, loaded: Loaded) -> None:
        if loaded.device == "remote":
            return
        if loaded.model_name != self._model:
            self._model, self.counts = loaded.model_name, {}
        self.show_chat(check=False)  # which documents fit this model's context whole; their counts follow

    def count(self, ids: Sequence[str]) -> None:
        """Count the tokens of these documents with the loaded local model, on a worker; chips update after."""
        window = self.window
        if not window.model_ready or not self.available or getattr(window.loaded, "device", "") == "remote":
            return
        todo = [i for i in dict.fromkeys(ids) if i not in self.counts and i not in self._counting]
        todo = [i for i in todo if i not in window.session.skip_documents]
        if not todo:
            return
        self._counting.update(todo)
        model, bridge = self._model, window.bridge

        def work() -> dict[str, int]:
            library, counted = self.library(), dict[str, int]()
            for start in range(0, len(todo), COUNT_BATCH):
                batch = todo[start : start + COUNT_BATCH]
                texts = [library.store.text(doc_id) for doc_id in batch]
                numbers = bridge.count_tokens(texts)
                if numbers is None:  # no model now (a reload): the estimates stay
                    break
                counted.update(zip(batch, numbers, strict=True))
            return counted

        def then(counted: dict[str, int]) -> None:
            self._counting.difference_update(todo)
            if model == self._model:
                self.counts.update(counted)
                self.show_chat(check=False)

        def failed(exc: Exception) -> None:  # a document gone meanwhile: its chip says so after the next check
            self._counting.difference_update(todo)
            window.composer.show_hint(f"Could not count the documents' tokens: {exc}")

        self.run(work, then, failed)

    # -- drag and drop ------------------------------------------------------------------------------------------
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and isinstance(event, QDropEvent):
            if local_paths(event):  # taken even for a remote engine: the drop then says why nothing is read
                event.acceptProposedAction()
                return True
            return False
        if kind == QEvent.Type.Drop and isinstance(event, QDropEvent):
            paths = local_paths(event)
            if not paths:
                return False
            event.acceptProposedAction()
            self.attach(paths)
            return True
        return False

    def shutdown(self) -> None:
        """The window closes: a reading in progress stops (nothing half-indexed is kept)."""
        if self.job is not None:
            self.job.cancel.set()


def progress_line(done: int, total: int, name: str) -> str:
    """The line above the composer for the library's ``progress(done, total, name)``: ``Indexing big.pdf: 96
    of 800 passages…`` while a file's passages are indexed, else :func:`~app.state.attachments.progress_text`."""
    part = INDEXING.fullmatch(name)
    if part is None:
        return progress_text(done, total, name)
    of = int(part.group("of"))
    line = f"Indexing {part.group('name')}: {int(part.group('done')):,} of {of:,} passage{'' if of == 1 else 's'}\u2026"
    return line + (f" (file {min(done + 1, total):,} of {total:,})" if total > 1 else "")


def _swapped(docs: Iterable[dict[str, Any]], old: str, new: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        out.append(new | {"tokens": None} if doc["id"] == old else doc)
    return merged([], out)[0]  # the new text may already be attached: once
