"""One message bubble: role, rendered content, and the grey line under a reply.

``MessageWidget(role, message_id)`` shows HTML given to :meth:`set_content`
(with the plain text kept for Copy), an optional amber notice (older turns
dropped), an optional red error, and the stats line.  Its buttons only emit
signals (``copy_clicked``, ``regenerate_clicked``, ``edit_clicked``); the chat
view decides what they do.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl, Signal, SignalInstance
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.views.markdown_render import safe_url

ROLE_NAMES = {"user": "You", "assistant": "Brisk", "system": "System"}


def _small_label(name: str) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setWordWrap(True)
    label.hide()
    return label


class MessageWidget(QFrame):
    copy_clicked = Signal()
    regenerate_clicked = Signal()
    edit_clicked = Signal()

    def __init__(self, role: str, message_id: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.message_id = message_id
        self.plain_text = ""
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 10, 14, 10)
        outer.setSpacing(6)

        header = QHBoxLayout()
        header.setSpacing(2)
        role_label = QLabel(ROLE_NAMES.get(role, role.title()))
        role_label.setObjectName("role")
        header.addWidget(role_label)
        header.addStretch(1)
        self.copy_button = self._button(header, "Copy", "Copy this message to the clipboard", self.copy_clicked)
        self.regenerate_button: QToolButton | None = None
        self.edit_button: QToolButton | None = None
        if role == "assistant":
            self.regenerate_button = self._button(
                header, "Regenerate", "Ask again for this reply with the same history", self.regenerate_clicked
            )
        elif role == "user":
            self.edit_button = self._button(
                header, "Edit", "Edit this message; the replies after it are replaced", self.edit_clicked
            )
        outer.addLayout(header)

        self.notice = _small_label("notice")
        outer.addWidget(self.notice)
        self.content = QLabel()
        self.content.setObjectName("content")
        self.content.setTextFormat(Qt.TextFormat.RichText)
        self.content.setWordWrap(True)
        self.content.setOpenExternalLinks(False)  # only web links open, through _open_link
        self.content.linkActivated.connect(_open_link)
        self.content.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
            | Qt.TextInteractionFlag.TextSelectableByKeyboard
            | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        self.content.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        outer.addWidget(self.content)
        self.error = _small_label("replyError")
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.error)
        self.stats = _small_label("stats")
        outer.addWidget(self.stats)

    def _button(self, layout: QHBoxLayout, text: str, tip: str, signal: SignalInstance) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(lambda: signal.emit())
        layout.addWidget(button)
        return button

    def set_content(self, html: str, plain: str) -> None:
        self.plain_text = plain
        self.content.setText(html)

    def set_stats(self, text: str) -> None:
        _set(self.stats, text)

    def set_notice(self, text: str) -> None:
        _set(self.notice, text)

    def set_error(self, text: str) -> None:
        _set(self.error, text)

    def set_actions_enabled(self, enabled: bool) -> None:
        for button in (self.regenerate_button, self.edit_button):
            if button is not None:
                button.setEnabled(enabled)


def _open_link(url: str) -> None:
    if safe_url(url):
        QDesktopServices.openUrl(QUrl(url))


def _set(label: QLabel, text: str) -> None:
    if label.text() != text:
        label.setText(text)
    label.setVisible(bool(text))
