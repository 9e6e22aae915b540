"""The status bar's content: which model, on what device, and how loading goes.

:class:`StatusArea` shows the model name and device/dtype once ``Loaded``
arrives, a progress bar with the loader's message while ``LoadProgress``
events come in, and a red message after ``LoadFailed``.
"""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.style import ERROR
from engine.api import Loaded


class StatusArea(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 0, 6, 0)
        layout.setSpacing(10)
        self.model_label = QLabel("No model loaded")
        layout.addWidget(self.model_label)
        self.device_label = QLabel()
        layout.addWidget(self.device_label)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(160)
        self.progress.hide()
        layout.addWidget(self.progress)
        self.message_label = QLabel()
        layout.addWidget(self.message_label, 1)

    def loading(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(round(max(0.0, min(1.0, fraction)) * 100)))
        self.progress.show()
        self.message_label.setStyleSheet("")
        self.message_label.setText(message)

    def loaded(self, event: Loaded) -> None:
        self.progress.hide()
        self.model_label.setText(event.model_name)
        self.device_label.setText(f"{event.device} \u00b7 {event.dtype}")
        self.message_label.setStyleSheet("")
        self.message_label.setText(f"Loaded in {event.load_s:.1f} s")

    def failed(self, message: str) -> None:
        self.progress.hide()
        self.model_label.setText("No model loaded")
        self.device_label.setText("")
        self.message_label.setStyleSheet(f"color: {ERROR};")
        self.message_label.setText(f"Loading failed: {message}")
