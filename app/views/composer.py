"""The message box: type, Enter to send, Shift+Enter for a new line, Esc to stop.

:class:`Composer` emits ``send_requested(text)`` with the text as typed (the
caller clears the box with :meth:`clear` once the message is safely stored, so
nothing is lost on failure) and ``stop_requested()`` for Esc or the Stop
button.  Empty or whitespace-only text is never sent: a gentle hint appears and
the box keeps what it had.  The button reads Send or Stop (:meth:`set_busy`);
Enter while the reply streams still emits ``send_requested`` (the window
queues the message); :meth:`set_queued` shows "Queued — sends when the reply
ends" above the box with a Cancel button (``queue_cancel_requested``).
Send is disabled with a tooltip while no model is ready (:meth:`set_ready`),
but typing always works.  The box is as tall as its text, 1 to ``MAX_LINES``
lines (wrapped lines count), growing and shrinking as the text does.

The paperclip left of the box attaches documents: a click emits
``attach_requested(False)`` (files), its menu offers a folder too
(``attach_requested(True)``); :meth:`set_attach_available` greys it with the
reason (a remote engine reads no documents).  Above the box, ``chips``
(:class:`~app.views.chips.DocumentChips`) shows the chat's documents and the
indexing progress.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QIcon, QKeyEvent, QPainter, QPixmap, QResizeEvent
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.views import style
from app.views.chips import DocumentChips

HINT_MS = 4000
DRAFT_PAUSE_MS = 150  # the draft goes to the engine this long after typing pauses (prefill while typing)
DRAFT_MAX_WAIT_MS = 300  # and at least this often while keys keep coming (a steady typist never pauses)
PASTE_CHARS = 20  # a change that adds more characters than this at once is a paste: sent at once
EMPTY_HINT = "Type a message first."
BUSY_HINT = "A reply is still streaming. Press Esc to stop it."
QUEUED_TEXT = "Queued \u2014 sends when the reply ends"
MAX_LINES = 8
PLACEHOLDER = "Message Brisk\u2026  (Enter to send, Shift+Enter for a new line)"
SHORT_PLACEHOLDER = "Message Brisk\u2026"  # where the keys would wrap to a second line the box does not show
NOT_READY_TIP = "The model is still loading. You can type; Send unlocks when it is ready."
ATTACH_TIP = "Attach files to this chat (Ctrl+O); the menu attaches a folder. You can also drop files here."
PAPERCLIP = Path(__file__).resolve().parent / "icons" / "paperclip.svg"
ICON_COLOUR = "#4b5563"  # the colour paperclip.svg is drawn in; replaced by the theme's


def tinted_icon(path: Path, colour: str, size: int = 18) -> QIcon:
    """The SVG at ``path`` drawn in ``colour`` (for both scales a screen may ask for)."""
    svg = QSvgRenderer(QByteArray(path.read_text(encoding="utf-8").replace(ICON_COLOUR, colour).encode()))
    icon = QIcon()
    for scale in (1, 2):
        pixmap = QPixmap(size * scale, size * scale)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        svg.render(painter)
        painter.end()
        pixmap.setDevicePixelRatio(scale)
        icon.addPixmap(pixmap)
    return icon


class MessageEdit(QPlainTextEdit):
    """A plain-text editor whose Enter submits and Esc stops.  Its placeholder names the keys where the line
    has room for them, else only "Message Brisk…" (a wrapped placeholder would show half a second line)."""

    enter_pressed = Signal()
    escape_pressed = Signal()
    restyled = Signal()  # the style or font changed: the height must be measured again

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText(PLACEHOLDER)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.StyleChange, QEvent.Type.FontChange):
            self.restyled.emit()
            self._fit_placeholder()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit_placeholder()

    def _fit_placeholder(self) -> None:
        room = self.viewport().width() - 2 * round(self.document().documentMargin())
        text = PLACEHOLDER if self.fontMetrics().horizontalAdvance(PLACEHOLDER) <= room else SHORT_PLACEHOLDER
        if self.placeholderText() != text:
            self.setPlaceholderText(text)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt override)
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.enter_pressed.emit()
            event.accept()
            return
        if key == Qt.Key.Key_Escape:
            self.escape_pressed.emit()
            event.accept()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    draft_changed = Signal(str)  # the draft: DRAFT_PAUSE_MS after typing pauses, DRAFT_MAX_WAIT_MS into steady
    # typing at the latest, at once after a paste
    attach_requested = Signal(bool)  # the paperclip: True for a folder, False for files
    queue_cancel_requested = Signal()  # Cancel beside "Queued": take the waiting message back

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.busy = False
        self.ready = False
        self._not_ready_reason = NOT_READY_TIP
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 6, 16, 12)
        layout.setSpacing(4)
        self.chips = DocumentChips()  # the chat's attached documents, and the indexing progress
        layout.addWidget(self.chips)
        self.queued = QWidget()  # "Queued — sends when the reply ends" and Cancel, while a message waits
        queued_row = QHBoxLayout(self.queued)
        queued_row.setContentsMargins(0, 0, 0, 0)
        self.queued_label = QLabel(QUEUED_TEXT)
        self.queued_label.setObjectName("hint")
        self.queued_cancel = QPushButton("Cancel")
        self.queued_cancel.setToolTip("Take the queued message back into the box; nothing is sent")
        self.queued_cancel.clicked.connect(self.queue_cancel_requested.emit)
        queued_row.addWidget(self.queued_label, 1)
        queued_row.addWidget(self.queued_cancel, 0)
        self.queued.hide()
        layout.addWidget(self.queued)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.attach_button = QToolButton()
        self.attach_button.setObjectName("attachButton")
        self.attach_button.setToolTip(ATTACH_TIP)
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.attach_button.setIconSize(QSize(18, 18))
        self.attach_button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        attach_menu = QMenu(self.attach_button)
        attach_menu.addAction("Attach files\u2026").triggered.connect(lambda: self.attach_requested.emit(False))
        attach_menu.addAction("Attach a folder\u2026").triggered.connect(lambda: self.attach_requested.emit(True))
        self.attach_button.setMenu(attach_menu)
        self.attach_button.clicked.connect(lambda: self.attach_requested.emit(False))
        self._icon_colour = ""
        self._tint_icon()
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        self.editor = MessageEdit()
        self.editor.setTabChangesFocus(True)
        self.editor.enter_pressed.connect(self.submit)
        self.editor.escape_pressed.connect(self._escape)
        self.editor.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.editor.restyled.connect(self._fit_height)
        row.addWidget(self.editor, 1)
        self.button = QPushButton("Send")
        self.button.setObjectName("primary")
        self.button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.button.clicked.connect(self._clicked)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        layout.addLayout(row)
        self.hint = QLabel()
        self.hint.setObjectName("hint")
        self.hint.setWordWrap(True)  # wraps before it widens the window (the context meter beside it is long)
        self.hint.hide()
        self.context = QLabel()  # the context meter: how much of the model's context the chat fills
        self.context.setObjectName("hint")
        self.context.setToolTip("Tokens the open chat fills (system prompt, messages, replies) of the model's context")
        below = QHBoxLayout()
        below.setContentsMargins(0, 0, 0, 0)
        below.addWidget(self.hint, 1)
        below.addStretch(0)
        below.addWidget(self.context, 0, Qt.AlignmentFlag.AlignRight)
        layout.addLayout(below)
        self.prefilled = QLabel()  # how much of the draft the engine has prefilled (prefill while typing)
        self.prefilled.setObjectName("hint")
        self.prefilled.setToolTip("Tokens of this message already prefilled while you typed: the reply starts sooner")
        self.prefilled.hide()
        below.insertWidget(1, self.prefilled, 0, Qt.AlignmentFlag.AlignRight)
        self._hint_timer = QTimer(self)
        self._hint_timer.setSingleShot(True)
        self._hint_timer.timeout.connect(self.hint.hide)
        self._draft_timer = QTimer(self)  # restarted by every keystroke: fires when typing pauses
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(DRAFT_PAUSE_MS)
        self._draft_timer.timeout.connect(self._draft_paused)
        self._draft_deadline = QTimer(self)  # started by the first keystroke not handed over, never restarted
        self._draft_deadline.setSingleShot(True)
        self._draft_deadline.setInterval(DRAFT_MAX_WAIT_MS)
        self._draft_deadline.timeout.connect(self._draft_paused)
        self._draft_length = 0
        self.editor.textChanged.connect(self._draft_edited)
        self._fit_height()
        self._update_button()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.StyleChange, QEvent.Type.PaletteChange):
            self._tint_icon()  # another theme: the paperclip takes its muted colour

    def _tint_icon(self) -> None:
        colour = style.current().muted
        if colour != self._icon_colour:
            self._icon_colour = colour
            self.attach_button.setIcon(tinted_icon(PAPERCLIP, colour))

    # -- state from the window ---------------------------------------------------------
    def set_attach_available(self, available: bool, reason: str = "") -> None:
        """The paperclip works, or is greyed with ``reason`` as its tooltip."""
        self.attach_button.setEnabled(available)
        self.attach_button.setToolTip(ATTACH_TIP if available else reason)

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_button()

    def set_ready(self, ready: bool, reason: str = NOT_READY_TIP) -> None:
        self.ready = ready
        self._not_ready_reason = reason
        self._update_button()

    def set_queued(self, queued: bool) -> None:
        """Show (or hide) that a message waits for the reply to end, with its Cancel."""
        self.queued.setVisible(queued)

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)

    def clear(self) -> None:
        self.editor.clear()
        self.hint.hide()
        self.show_prefilled(0, 0)

    def show_prefilled(self, ready: int, total: int) -> None:
        """The quiet indicator under the composer: ``ready`` of the draft's ``total`` prompt tokens prefilled."""
        if total <= 0 or not self.text().strip():
            self.prefilled.hide()
            return
        noun = "token" if total == 1 else "tokens"
        self.prefilled.setText(f"{ready:,} of {total:,} {noun} ready" if ready < total else f"{total:,} {noun} ready")
        self.prefilled.show()

    def _draft_edited(self) -> None:
        """A keystroke: constant work whatever the draft's length (no copy of it, no tokens counted); the
        draft is copied and handed over once per pause, per ``DRAFT_MAX_WAIT_MS`` of steady typing, or paste."""
        length = self.editor.document().characterCount()  # kept by the document: no copy of a long draft
        pasted = length - self._draft_length > PASTE_CHARS  # a paste (or a big insert): hint at once
        self._draft_length = length
        if pasted:
            self._draft_paused()
            return
        self._draft_timer.start()  # a debounce: typing that pauses is handed over at once...
        if not self._draft_deadline.isActive():
            self._draft_deadline.start()  # ...and a throttle: typing that never pauses, this often

    def _draft_paused(self) -> None:
        self._draft_timer.stop()
        self._draft_deadline.stop()
        self.draft_changed.emit(self.text())

    def show_hint(self, text: str) -> None:
        self.hint.setText(text)
        self.hint.show()
        self._hint_timer.start(HINT_MS)

    # -- user actions ---------------------------------------------------------------------
    def submit(self) -> None:
        text = self.text()
        if not text.strip():
            self.show_hint(EMPTY_HINT)
        elif not self.ready:
            self.show_hint(self._not_ready_reason)
        else:
            self.send_requested.emit(text)

    def _clicked(self) -> None:
        if self.busy:
            self.stop_requested.emit()
        else:
            self.submit()
        self.editor.setFocus()

    def _escape(self) -> None:
        if self.busy:
            self.stop_requested.emit()

    def _update_button(self) -> None:
        if self.busy:
            self.button.setText("Stop")
            self.button.setObjectName("stop")
            self.button.setEnabled(True)
            self.button.setToolTip("Stop the reply (Esc); the text so far is kept. Enter queues a message")
        else:
            self.button.setText("Send")
            self.button.setObjectName("primary")
            self.button.setEnabled(self.ready)
            self.button.setToolTip("Send (Enter)" if self.ready else self._not_ready_reason)
        self.button.style().unpolish(self.button)
        self.button.style().polish(self.button)

    def _fit_height(self) -> None:
        """As tall as the text's lines (wrapped ones included), from 1 to ``MAX_LINES``; it shrinks again too."""
        editor = self.editor
        editor.ensurePolished()  # the stylesheet's padding and font count from the first call on
        lines = max(1, min(MAX_LINES, round(editor.document().size().height())))  # plain-text layout: lines
        margins = editor.contentsMargins()  # the frame and the stylesheet's border and padding
        viewport = editor.viewportMargins()
        chrome = margins.top() + margins.bottom() + viewport.top() + viewport.bottom()
        text = lines * editor.fontMetrics().lineSpacing() + round(editor.document().documentMargin() * 2)
        height = text + chrome + 2
        if editor.height() != height or editor.minimumHeight() != height:
            editor.setFixedHeight(height)
