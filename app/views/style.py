"""The stylesheet, colours and palette of the light and the dark theme, and which one is in use.

:class:`Theme` names every colour the window uses; :data:`LIGHT` and
:data:`DARK` are the two themes, both with text at WCAG AA contrast (4.5:1 or
more) on the backgrounds it sits on.  :func:`apply` makes one the theme in
use: the application's palette (for the widgets the stylesheet leaves alone:
menus, tabs, dock titles, dialogs) and the window's stylesheet.  Code that
paints reads :func:`current` when it paints, so a change shows at the next
repaint.  :func:`theme_for` picks the theme for the ``theme`` setting
("system", "light", "dark") and whether the system's colour scheme is dark.

Spin boxes get their own buttons and arrow images (``icons/``; the dark
theme's have light strokes, ``Theme.arrows``): a styled frame makes Qt draw
the buttons from the stylesheet too, and without an ``image`` their arrows
would be empty boxes.  A drop-down's list gets the theme's colours and the
accent for its current item, which a styled QComboBox otherwise draws as an
empty box.  Check boxes get a drawn box (the muted colour's border, at 3:1 or
more on either theme's backgrounds) and the accent with ``icons/check.svg``
when checked: the dark palette's own box was dark grey on dark grey.  The
sidebar's rename editor has a slim padding so the title fits in the row's
height.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from app.views import markdown_render

ICONS = (Path(__file__).resolve().parent / "icons").as_posix()
THEME_CHOICES = ("system", "light", "dark")


@dataclass(frozen=True)
class Theme:
    name: str
    window: str  # the chat's background, inputs and buttons
    side: str  # the sidebar and the status bar
    text: str
    muted: str  # secondary text: labels, stats, hints (AA on window and side)
    border: str
    border_soft: str  # the sidebar's edge and its selected row
    hover: str
    button_bg: str  # spin box buttons
    accent: str
    accent_hover: str
    accent_disabled: str
    stop_bg: str
    stop_fg: str
    error: str
    warning: str
    user_bubble: str
    bubble_border: str
    code_bg: str
    draft: str  # drafted tokens in a reply
    forced: str  # tokens of a reply that its format forced
    link: str  # a code block's "Copy code"
    badge: str  # the answer-cache badge
    tools_fg: str
    disabled: str
    unavailable: str  # a figure a remote server does not report
    banner_error_bg: str
    banner_error_border: str
    banner_warning_bg: str
    banner_warning_border: str
    banner_info_bg: str
    banner_info_border: str
    chart_bg: str
    chart_axis: str
    pygments: str  # the Pygments style of code blocks
    arrows: str = ""  # the arrow images' suffix in icons/ ("-dark": light strokes that show on dark buttons)

    @property
    def dark(self) -> bool:
        return self.name == "dark"


LIGHT = Theme(
    name="light",
    window="#ffffff",
    side="#f7f7f8",
    text="#111827",
    muted="#636a76",
    border="#d1d5db",
    border_soft="#e5e7eb",
    hover="#f3f4f6",
    button_bg="#f9fafb",
    accent="#2563eb",
    accent_hover="#1d4ed8",
    accent_disabled="#9db7f0",
    stop_bg="#111827",
    stop_fg="#ffffff",
    error="#b91c1c",
    warning="#92400e",
    user_bubble="#eef4ff",
    bubble_border="#eceef1",
    code_bg="#f3f4f6",
    draft="#2f7d6d",
    forced="#6d28d9",
    link="#4b5563",
    badge="#1b67cc",
    tools_fg="#4b5563",
    disabled="#c7cbd1",
    unavailable="#9ca3af",
    banner_error_bg="#fef2f2",
    banner_error_border="#fecaca",
    banner_warning_bg="#fffbeb",
    banner_warning_border="#fde68a",
    banner_info_bg="#eff6ff",
    banner_info_border="#bfdbfe",
    chart_bg="#ffffff",
    chart_axis="#5f6368",
    pygments="friendly",
)

DARK = Theme(
    name="dark",
    window="#1e1f22",
    side="#26282c",
    text="#e5e7eb",
    muted="#a1a1aa",
    border="#44474d",
    border_soft="#3a3d43",
    hover="#2f3136",
    button_bg="#2b2d31",
    accent="#2563eb",
    accent_hover="#1d4ed8",
    accent_disabled="#2a3b5c",
    stop_bg="#e5e7eb",
    stop_fg="#111827",
    error="#f87171",
    warning="#fbbf24",
    user_bubble="#1f2a40",
    bubble_border="#34373c",
    code_bg="#2b2d31",
    draft="#5eead4",
    forced="#c4b5fd",
    link="#a1a1aa",
    badge="#7cb1ff",
    tools_fg="#b4b8bf",
    disabled="#5b5f66",
    unavailable="#80848c",
    banner_error_bg="#3b1d1f",
    banner_error_border="#7f2a2a",
    banner_warning_bg="#33290f",
    banner_warning_border="#7a5c14",
    banner_info_bg="#172036",
    banner_info_border="#2b4a86",
    chart_bg="#1e1f22",
    chart_axis="#b4b8bf",
    pygments="monokai",
    arrows="-dark",
)

_SHEET = """
QMainWindow, QWidget#chatPanel {{ background: {t.window}; }}
QWidget#sidebar {{ background: {t.side}; border-right: 1px solid {t.border_soft}; }}
QWidget#sidebar QListView, QWidget#sidebar QListWidget {{
    background: transparent; border: none; outline: none;
}}
QWidget#sidebar QListView::item, QWidget#sidebar QListWidget::item {{
    padding: 7px 8px; border-radius: 6px; color: {t.text};
}}
QWidget#sidebar QListView::item:selected, QWidget#sidebar QListWidget::item:selected {{
    background: {t.border_soft}; color: {t.text};
}}
QWidget#sidebar QListView::item:hover, QWidget#sidebar QListWidget::item:hover {{ background: {t.hover}; }}
QLineEdit, QPlainTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
    border: 1px solid {t.border}; border-radius: 8px; padding: 5px 8px; background: {t.window};
}}
QLineEdit:focus, QPlainTextEdit:focus {{ border-color: {t.accent}; }}
QComboBox {{ selection-background-color: {t.accent}; selection-color: #ffffff; }}
QComboBox QAbstractItemView {{
    background: {t.window}; color: {t.text}; border: 1px solid {t.border}; outline: none;
    selection-background-color: {t.accent}; selection-color: #ffffff;
}}
QSpinBox, QDoubleSpinBox {{ padding-right: 24px; }}
QSpinBox::up-button, QDoubleSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::down-button {{
    subcontrol-origin: border; width: 20px; border-left: 1px solid {t.border}; background: {t.button_bg};
}}
QSpinBox::up-button, QDoubleSpinBox::up-button {{ subcontrol-position: top right; border-top-right-radius: 8px; }}
QSpinBox::down-button, QDoubleSpinBox::down-button {{
    subcontrol-position: bottom right; border-bottom-right-radius: 8px;
}}
QSpinBox::up-button:hover, QDoubleSpinBox::up-button:hover,
QSpinBox::down-button:hover, QDoubleSpinBox::down-button:hover {{ background: {t.hover}; }}
QSpinBox::up-arrow, QDoubleSpinBox::up-arrow {{ image: url({ICONS}/arrow-up{t.arrows}.svg); width: 9px; height: 9px; }}
QSpinBox::down-arrow, QDoubleSpinBox::down-arrow {{
    image: url({ICONS}/arrow-down{t.arrows}.svg); width: 9px; height: 9px;
}}
QSpinBox::up-arrow:disabled, QSpinBox::up-arrow:off, QDoubleSpinBox::up-arrow:disabled,
QDoubleSpinBox::up-arrow:off, QSpinBox::down-arrow:disabled, QSpinBox::down-arrow:off,
QDoubleSpinBox::down-arrow:disabled, QDoubleSpinBox::down-arrow:off {{ image: none; }}
QWidget#sidebar QListView QLineEdit {{ padding: 0px 6px; border-radius: 4px; background: {t.window}; }}
QPushButton {{
    border: 1px solid {t.border}; border-radius: 8px; padding: 6px 14px; background: {t.window};
}}
QPushButton:hover {{ background: {t.hover}; }}
QPushButton#primary {{ background: {t.accent}; color: white; border: none; font-weight: 600; }}
QPushButton#primary:hover {{ background: {t.accent_hover}; }}
QPushButton#primary:disabled {{ background: {t.accent_disabled}; }}
QPushButton#stop {{ background: {t.stop_bg}; color: {t.stop_fg}; border: none; font-weight: 600; }}
QFrame#userBubble {{ background: {t.user_bubble}; border-radius: 12px; }}
QFrame#assistantBubble {{ background: {t.window}; border: 1px solid {t.bubble_border}; border-radius: 12px; }}
QLabel#role {{ color: {t.muted}; font-weight: 600; }}
QLabel#stats {{ color: {t.muted}; font-size: 11px; }}
QLabel#hint {{ color: {t.muted}; font-size: 11px; }}
QLabel#panelLabel {{ color: {t.muted}; }}
QLabel#panelLabelOff {{ color: {t.unavailable}; }}
QLabel#replyError {{ color: {t.error}; }}
QLabel#notice {{ color: {t.warning}; font-size: 11px; }}
QToolButton {{ border: none; color: {t.muted}; padding: 2px 6px; border-radius: 6px; }}
QToolButton:hover {{ background: {t.hover}; color: {t.text}; }}
QFrame#banner_error {{
    background: {t.banner_error_bg}; border: 1px solid {t.banner_error_border}; border-radius: 8px;
}}
QFrame#banner_warning {{
    background: {t.banner_warning_bg}; border: 1px solid {t.banner_warning_border}; border-radius: 8px;
}}
QFrame#banner_info {{
    background: {t.banner_info_bg}; border: 1px solid {t.banner_info_border}; border-radius: 8px;
}}
QFrame#docChip, QFrame#docChipGone {{
    background: {t.hover}; border: 1px solid {t.border}; border-radius: 11px;
}}
QLabel#docChipText {{ color: {t.text}; }}
QFrame#docChipGone QLabel#docChipText {{ color: {t.muted}; }}
QToolButton#docChipClose {{ padding: 0px 5px; border-radius: 9px; font-size: 14px; }}
QToolButton#docChipMore {{ padding: 3px 8px; }}
QToolButton#attachButton {{ padding: 5px 18px 5px 5px; border-radius: 8px; }}
QToolButton#attachButton::menu-button {{ border: none; width: 16px; border-radius: 8px; }}
QToolButton#attachButton::menu-button:hover {{ background: {t.border_soft}; }}
QToolButton#attachButton::menu-arrow {{ image: url({ICONS}/arrow-down{t.arrows}.svg); width: 9px; height: 9px; }}
QStatusBar {{ background: {t.side}; color: {t.muted}; }}
QProgressBar {{ border: 1px solid {t.border}; border-radius: 4px; background: {t.window}; max-height: 8px; }}
QProgressBar::chunk {{ background: {t.accent}; border-radius: 3px; }}
QPushButton:focus, QComboBox:focus, QSpinBox:focus, QDoubleSpinBox:focus {{ border: 2px solid {t.accent}; }}
QPushButton#primary:focus {{ border: 2px solid {t.text}; }}
QToolButton:focus {{ border: 2px solid {t.accent}; }}
QCheckBox:focus, QRadioButton:focus {{ border: 1px solid {t.accent}; border-radius: 4px; }}
QCheckBox::indicator {{
    width: 13px; height: 13px; border: 1px solid {t.muted}; border-radius: 3px; background: {t.window};
}}
QCheckBox::indicator:checked {{ background: {t.accent}; border-color: {t.accent}; image: url({ICONS}/check.svg); }}
QCheckBox::indicator:disabled {{ border-color: {t.disabled}; background: {t.hover}; }}
QCheckBox::indicator:checked:disabled {{ background: {t.accent_disabled}; border-color: {t.accent_disabled}; }}
QListView:focus, QListWidget:focus, QTreeWidget:focus, QTableWidget:focus {{ border: 1px solid {t.accent}; }}
"""

_current = LIGHT


def current() -> Theme:
    """The theme in use (read it when painting)."""
    return _current


def theme_for(setting: str, system_dark: bool) -> Theme:
    """The theme for the ``theme`` setting: "dark", "light", or "system" (dark when the system's scheme is)."""
    if setting == "dark" or (setting == "system" and system_dark):
        return DARK
    return LIGHT


def stylesheet(theme: Theme) -> str:
    return _SHEET.format(t=theme, ICONS=ICONS)


def palette(theme: Theme) -> QPalette:
    """The palette of ``theme`` for what the stylesheet does not style (menus, tabs, dock titles, dialogs)."""
    pal = QPalette()
    roles = QPalette.ColorRole
    for role, colour in (
        (roles.Window, theme.side),
        (roles.WindowText, theme.text),
        (roles.Base, theme.window),
        (roles.AlternateBase, theme.hover),
        (roles.Text, theme.text),
        (roles.Button, theme.side),
        (roles.ButtonText, theme.text),
        (roles.ToolTipBase, theme.window),
        (roles.ToolTipText, theme.text),
        (roles.PlaceholderText, theme.muted),
        (roles.Highlight, theme.accent),
        (roles.HighlightedText, "#ffffff"),
        (roles.Link, theme.accent),
        (roles.BrightText, theme.error),
    ):
        pal.setColor(role, QColor(colour))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(theme.disabled))
    return pal


def apply(theme: Theme, window: QWidget | None = None) -> None:
    """Make ``theme`` the one in use: the application's palette, and ``window``'s stylesheet."""
    global _current
    _current = theme
    markdown_render.use_colours(theme.draft, theme.link, theme.code_bg, theme.pygments, theme.forced)
    app = QApplication.instance()
    if isinstance(app, QApplication):
        app.setPalette(palette(theme))
    if window is not None:
        window.setStyleSheet(stylesheet(theme))


def luminance(colour: str) -> float:
    """Relative luminance (WCAG) of ``#rrggbb``: 0 black, 1 white."""

    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


# The light theme's colours by their old names, for code that needs a colour outside painting (tests).
ACCENT, MUTED, ERROR, WARNING = LIGHT.accent, LIGHT.muted, LIGHT.error, LIGHT.warning
STYLESHEET = stylesheet(LIGHT)
