"""A dismissible message strip shown above the chat (errors, warnings, notices).

``Banner(kind, text, action_text, on_action)``: ``kind`` is ``error``,
``warning`` or ``info`` and picks the colours; the optional action button runs
``on_action``; the close button hides the banner (it is not deleted, so it can
be shown again with new text by :meth:`set_text`).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget


class Banner(QFrame):
    def __init__(
        self,
        kind: str,
        text: str,
        action_text: str | None = None,
        on_action: Callable[[], None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.kind = kind
        self.setObjectName(f"banner_{kind}")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.label, 1)
        self.action: QPushButton | None = None
        if action_text and on_action is not None:
            self.action = QPushButton(action_text)
            self.action.clicked.connect(on_action)
            layout.addWidget(self.action)
        close = QToolButton()
        close.setText("\u2715")
        close.setToolTip("Dismiss")
        close.clicked.connect(self.hide)
        layout.addWidget(close)

    def text(self) -> str:
        return self.label.text()

    def set_text(self, text: str) -> None:
        self.label.setText(text)
        self.show()
