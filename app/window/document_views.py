"""A reply's sources and the Documents view: the parts of the window's documents that read the index back.

:class:`LibraryViews` is a mixin of
:class:`~app.window.document_controller.DocumentsController` (it holds no state of its
own beyond the dialogs it opened): ``show_source`` opens the passage a reply
cites (:class:`~app.dialogs.passage.PassageDialog`; its text read on a
worker), ``open_view`` the Documents view (Tools > Documents…,
:class:`~app.dialogs.documents_view.DocumentsDialog`) filled on a worker with every
document in the index, its KV on disk and the chats holding it; its Remove
(index rows and KV files: chats holding it then say it is gone) and Re-index
(a changed file replaces the document in every chat holding it) go through
the index on a worker too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtWidgets import QMessageBox

from app.dialogs.documents_view import DocumentsDialog, document_rows
from app.dialogs.passage import PassageDialog
from app.state.attachments import entry
from engine.storage import StoreError


class LibraryViews:
    """Mixed into DocumentsController, which provides these attributes and the methods called below."""

    window: Any
    counts: dict[str, int]
    dialog: DocumentsDialog | None
    passage: PassageDialog | None
    library: Callable[[], Any]
    run: Callable[[Callable[[], Any], Callable[[Any], None], Callable[[Exception], None]], None]
    show_chat: Callable[..., None]
    count: Callable[[Sequence[str]], None]
    replace_everywhere: Callable[[str, dict[str, Any]], None]
    _check_notice: Callable[[], None]
    _failed: Callable[[str], Callable[[Exception], None]]

    # -- a reply's sources -------------------------------------------------------------------------------------
    def show_source(self, message_id: int, number: int) -> PassageDialog | None:
        item = self.window.chat_view.chat_model.item(message_id)
        if item is None or not 0 <= number < len(item.sources):
            return None
        source = item.sources[number]
        if self.passage is not None:
            self.passage.close()
        dialog = PassageDialog(source, self.window)
        self.passage = dialog
        dialog.show()
        doc_id = str(source["doc_id"])
        name = str(source.get("name") or "This document")

        def read() -> tuple[str, str]:
            """(the document's text, "text"), or ("", "replaced") when a newer text of its file took its place in
            the index (Re-index, or the file attached again after it changed), or ("", "removed")."""
            store = self.library().store
            try:
                return store.text(doc_id), "text"
            except KeyError:  # NotFoundError: the document left the index
                newer = store.by_path(source["path"]) if source.get("path") else None
                return "", "replaced" if newer is not None and newer.id != doc_id else "removed"

        def missing(exc: Exception) -> None:
            if self.passage is dialog:
                dialog.show_missing(f"The passage could not be read: {exc}")

        def shown(found: tuple[str, str]) -> None:
            text, state = found
            if self.passage is not dialog:
                return
            if state == "text":
                dialog.show_text(text)
            elif state == "replaced":
                dialog.show_missing(
                    f"{name} changed on disk after this reply and was read again, so the text this reply cited is "
                    "no longer kept. Its new text is in the index; ask again to cite it."
                )
            else:
                dialog.show_missing(
                    f"{name} is no longer in the document index (it was removed), so the passage cannot be shown. "
                    "Attach the file again to read it."
                )

        self.run(read, shown, missing)
        return dialog

    # -- the Documents view --------------------------------------------------------------------------------------
    def open_view(self) -> DocumentsDialog:
        if self.dialog is None:
            dialog = DocumentsDialog(self.window)
            dialog.remove_requested.connect(self.remove)
            dialog.reindex_requested.connect(self.reindex)
            self.dialog = dialog
        self.dialog.show()
        self.dialog.raise_()
        self.refresh_view()
        return self.dialog

    def refresh_view(self, status: str = "") -> None:
        def work() -> tuple[list[Any], dict[str, int]]:
            library = self.library()
            infos = library.list()
            return infos, library.kv_bytes_all()  # every KV file's header read once, not once per document

        def then(found: tuple[list[Any], dict[str, int]]) -> None:
            self._check_notice()
            if self.dialog is None:
                return
            infos, kv = found
            chats: dict[str, list[str]] = {}
            tokens: dict[str, int] = {}
            try:
                for chat in self.window.store.list_conversations():
                    for doc in chat.documents:
                        chats.setdefault(doc["id"], []).append(chat.title)
                        if isinstance(doc.get("tokens"), int):
                            tokens.setdefault(doc["id"], doc["tokens"])
            except StoreError as exc:
                self.window._store_error(exc)
            self.dialog.show_rows(document_rows(infos, kv, chats, tokens | self.counts), status)

        self.run(work, then, self._failed("The document index could not be read"))

    def remove(self, doc_id: str, confirm: bool = True) -> None:
        """Remove a document from the index with its KV files (chats holding it then say it is gone)."""
        row = next((r for r in self.dialog.rows if r["id"] == doc_id), None) if self.dialog is not None else None
        name = row["name"] if row else doc_id[:12]
        if confirm:
            held = f" It is attached to {len(row['chats'])} chat(s), which will no longer send it." if row else ""
            answer = QMessageBox.question(
                self.dialog or self.window,
                "Remove document",
                f"Remove \u201c{name}\u201d from the document index, with its KV on disk?{held} "
                "The file itself is not touched; attach it again to use it.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return

        def then(_: object) -> None:
            self.window.session.skip_documents.add(doc_id)
            self.counts.pop(doc_id, None)
            self.show_chat(check=False)
            self.refresh_view(f"Removed {name} and its KV.")

        self.run(lambda: self.library().remove(doc_id), then, self._failed(f"{name} could not be removed"))

    def reindex(self, doc_id: str) -> None:
        """Read a document's file again; a changed file replaces the document in every chat holding it."""

        def work() -> tuple[list[str], list[str], Any]:
            library = self.library()
            ids, notes = library.refresh([doc_id], retry_vectors=True)  # and vectors that were never made
            info = library.store.get(ids[0]) if ids and ids[0] != doc_id else None
            return ids, notes, info

        def then(found: tuple[list[str], list[str], Any]) -> None:
            ids, notes, info = found
            if info is not None:
                self.replace_everywhere(doc_id, entry(info.id, info.name, info.path, info.chars))
                self.show_chat(check=False)
                self.count([info.id])
            elif not ids:
                self.window.session.skip_documents.add(doc_id)
                self.show_chat(check=False)
            status = " ".join(notes) or "The file has not changed since it was read; nothing to do."
            self.refresh_view(status)

        self.run(work, then, self._failed("The document could not be read again"))
