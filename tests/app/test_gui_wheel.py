"""The mouse wheel scrolls Settings and the parameters panel; it changes a value only in a focused box (issue 50).

The walk saw the repetition penalty go from 1.10 to 0.95 while the dialog was scrolled.  Qt hands a wheel
event a widget does not accept on to its parent; :func:`_wheel` does the same for the events a test sends
(Qt propagates only the window system's own), so the scroll area gets what the spin box left.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea, QWidget
from pytestqt.qtbot import QtBot

from app.dialogs.settings import SettingsDialog
from engine.storage import Settings


def _wheel(widget: QWidget, down: bool = True) -> QWidget | None:
    """One wheel notch over ``widget``'s centre, handed up the parents until one accepts it; who did."""
    target: QWidget | None = widget
    pos = QPoint(widget.width() // 2, widget.height() // 2)
    while target is not None:
        event = QWheelEvent(
            QPointF(pos),
            QPointF(target.mapToGlobal(pos)),
            QPoint(0, 0),
            QPoint(0, -120 if down else 120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(target, event)
        if event.isAccepted():
            return target
        pos = target.mapToParent(pos)
        target = None if target.isWindow() else target.parentWidget()
    return None


def _dialog(qtbot: QtBot) -> SettingsDialog:
    dialog = SettingsDialog(Settings(repetition_penalty=1.1), report=lambda: {})
    qtbot.addWidget(dialog)
    dialog.resize(600, 360)  # shorter than the form: the scroll area can scroll
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def test_wheel_over_an_unfocused_spin_box_scrolls_the_dialog(qtbot: QtBot) -> None:
    dialog = _dialog(qtbot)
    spin = dialog.repetition_penalty
    scroll = dialog.findChild(QScrollArea)
    scroll.ensureWidgetVisible(spin)
    assert scroll.verticalScrollBar().maximum() > 0  # there is somewhere to scroll to
    dialog.temperature.setFocus()
    assert not spin.hasFocus()
    bar = scroll.verticalScrollBar()
    before = bar.value()
    assert _wheel(spin) is scroll.viewport()  # the scroll area takes the wheel and scrolls
    assert spin.value() == 1.1
    assert bar.value() != before, "the form scrolled: the scroll area's own bar is not guarded like a value"


def test_wheel_changes_a_focused_spin_box(qtbot: QtBot) -> None:
    dialog = _dialog(qtbot)
    spin = dialog.repetition_penalty
    dialog.findChild(QScrollArea).ensureWidgetVisible(spin)
    dialog.activateWindow()
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus)
    assert _wheel(spin) is spin
    assert round(spin.value(), 2) == 1.05


def test_wheel_spares_the_parameters_panel_and_settings_lists(harness, qtbot: QtBot) -> None:  # noqa: ANN001
    window = harness.open()
    panel = window.parameters.panel
    window.parameters.dock.show()
    window.parameters.dock.raise_()
    spin = panel.fields["temperature"]
    qtbot.waitUntil(spin.isVisible)
    value = spin.value()
    window.composer.editor.setFocus()
    assert _wheel(spin) is not spin
    assert spin.value() == value
    dialog = _dialog(qtbot)
    theme = dialog.theme_combo.currentIndex()
    assert _wheel(dialog.theme_combo) is not dialog.theme_combo
    assert dialog.theme_combo.currentIndex() == theme
