"""Drop-downs and spin boxes under both themes' stylesheets (issue 50): the drop-down's current item shows its text
(it drew as an empty box), and the dark theme's spin arrows stand out from their buttons (they were dark grey on
dark grey).  Real widgets under the real stylesheet, rendered offscreen, their pixels read."""

from __future__ import annotations

from collections import Counter

import pytest
from PySide6.QtCore import QRect
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QStyle, QStyleOptionButton, QVBoxLayout, QWidget
from pytestqt.qtbot import QtBot

from app.views import style


def contrast(a: QColor, b: QColor) -> float:
    la, lb = (style.luminance(c.name()) for c in (a, b))
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def ink(image: QImage, rect: QRect) -> tuple[QColor, list[QColor]]:
    """The area's background (its commonest colour) and every pixel that differs from it."""
    assert image.rect().contains(rect), f"{rect} is not all inside the image ({image.rect()})"
    pixels = [
        image.pixelColor(x, y) for x in range(rect.left(), rect.right()) for y in range(rect.top(), rect.bottom())
    ]
    background = QColor.fromRgb(Counter(p.rgb() for p in pixels).most_common(1)[0][0])
    return background, [p for p in pixels if p.rgb() != background.rgb()]


@pytest.fixture(autouse=True)
def light_again():  # noqa: ANN201
    yield
    style.apply(style.LIGHT)


def themed(qtbot: QtBot, theme: style.Theme, *widgets: QWidget) -> QWidget:
    window = QWidget()
    qtbot.addWidget(window)
    style.apply(theme, window)
    column = QVBoxLayout(window)
    for widget in widgets:
        column.addWidget(widget)
    window.resize(260, 110)
    window.show()
    qtbot.waitExposed(window)
    return window


@pytest.mark.parametrize("theme", [style.LIGHT, style.DARK], ids=lambda t: t.name)
def test_the_current_item_of_an_open_drop_down_shows_its_text(qtbot: QtBot, theme: style.Theme) -> None:
    box = QComboBox()
    box.addItems(["Auto", "Prompt lookup", "Draft model", "Off"])
    box.setCurrentIndex(1)
    window = themed(qtbot, theme, box)  # noqa: F841 (kept: the widget lives in it)
    box.showPopup()
    view = box.view()
    qtbot.waitUntil(view.isVisible)
    try:
        shot = view.viewport().grab().toImage()
        row = view.visualRect(box.model().index(1, 0)).intersected(shot.rect())
        row = row.adjusted(4, 3, -4, -3)  # inside any frame the item gets
        background, text = ink(shot, row)
        assert len(text) > 40, f"{theme.name}: the current item's row is one colour ({background.name()}): no text"
        assert max(contrast(p, background) for p in text) >= 4.5, "its text reads at AA contrast"
    finally:
        box.hidePopup()


@pytest.mark.parametrize("theme", [style.LIGHT, style.DARK], ids=lambda t: t.name)
def test_spin_arrows_stand_out_from_their_buttons(qtbot: QtBot, theme: style.Theme) -> None:
    spin = QDoubleSpinBox()
    spin.setRange(0.0, 2.0)
    spin.setValue(1.1)  # both arrows enabled
    window = themed(qtbot, theme, spin)  # noqa: F841 (kept: the widget lives in it)
    shot = spin.grab().toImage()
    width, height = shot.width(), shot.height()
    for button in (QRect(width - 19, 3, 16, height // 2 - 4), QRect(width - 19, height // 2 + 1, 16, height // 2 - 4)):
        background, arrow = ink(shot, button)
        assert arrow, f"{theme.name}: no arrow drawn"
        best = max(contrast(p, background) for p in arrow)
        assert best >= 3.0, f"{theme.name}: the arrow's contrast on its button is {best:.1f}:1 (WCAG asks 3:1)"


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("theme", [style.LIGHT, style.DARK], ids=lambda t: t.name)
def test_check_boxes_stand_out_from_the_window(qtbot: QtBot, theme: style.Theme, checked: bool) -> None:
    """The walk in the dark theme: the Tools dialog's unchecked boxes were dark grey squares on dark grey."""
    box = QCheckBox("calculator")
    box.setChecked(checked)
    window = themed(qtbot, theme, box)
    shot = window.grab().toImage()
    option = QStyleOptionButton()
    option.initFrom(box)
    option.text = box.text()
    indicator = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, option, box)
    area = QRect(box.mapTo(window, indicator.topLeft()), indicator.size()).adjusted(-2, -2, 2, 2)
    background, marks = ink(shot, area)
    assert marks, f"{theme.name}: no box drawn"
    best = max(contrast(p, background) for p in marks)
    assert best >= 3.0, f"{theme.name}: the box's contrast on the window is {best:.1f}:1 (WCAG asks 3:1)"
