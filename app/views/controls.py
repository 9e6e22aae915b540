"""Form controls that behave inside scrolled forms: rows of widgets, and value widgets that ignore the wheel.

:func:`form_row` puts widgets side by side as one row of a ``QFormLayout``.
The row's layout is added to the form *before* its widgets: PySide 6 does not
hand the ownership of widgets already in a bare ``QHBoxLayout`` to Qt when
that layout goes into ``QFormLayout.addRow``, so Python would still own
widgets that Qt has parented, and delete them a second time (a crash on
exit, "shared QObject was deleted directly").

:func:`guard_wheel` makes every spin box, combo box and slider under a
widget take the mouse wheel only once it has focus (a click or Tab): the
wheel over an unfocused one scrolls the form around it instead of changing
its value.  A scroll area's own scroll bars are left alone: they are what
scrolls the form.

:func:`scrolling_page` fills a dialog with a frameless, vertically scrolling page
(dialogs taller than small screens: Settings, Tools).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import (
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QScrollArea,
    QScrollBar,
    QVBoxLayout,
    QWidget,
)

WHEEL_GUARDED = (QAbstractSpinBox, QComboBox, QAbstractSlider)


def form_row(form: QFormLayout, label: str, *widgets: QWidget) -> QHBoxLayout:
    """Add ``widgets`` side by side as a row of ``form`` under ``label``; the first one stretches."""
    row = QHBoxLayout()
    form.addRow(label, row)  # in the form first, so Qt owns what is added next
    for i, widget in enumerate(widgets):
        row.addWidget(widget, 1 if i == 0 else 0)
    return row


class _WheelGuard(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            event.ignore()  # not accepted: Qt hands the wheel on to the parent (the scroll area)
            return True
        return False


def guard_wheel(root: QWidget) -> None:
    """Spin boxes, combo boxes and sliders under ``root`` (now) change with the wheel only when focused."""
    guard = root.findChild(_WheelGuard, "wheelGuard", Qt.FindChildOption.FindDirectChildrenOnly)
    if guard is None:
        guard = _WheelGuard(root)
        guard.setObjectName("wheelGuard")
    for kind in WHEEL_GUARDED:
        for widget in root.findChildren(kind):
            if isinstance(widget, QScrollBar):  # a scroll area's bar takes the wheel it is handed, focused or not
                continue
            widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel never gives focus
            widget.installEventFilter(guard)


def scrolling_page(dialog: QWidget) -> tuple[QVBoxLayout, QWidget, QVBoxLayout]:
    """``dialog``'s area as a page that scrolls up and down (never sideways), without a frame: the dialog's
    own column (for what stays below the page, such as its buttons), the page, and the page's column."""
    outer = QVBoxLayout(dialog)
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    page = QWidget()
    column = QVBoxLayout(page)
    column.setContentsMargins(0, 0, 0, 0)
    scroll.setWidget(page)
    outer.addWidget(scroll, 1)
    return outer, page, column
