"""The light stylesheet and the few colours the widgets share.

Spin boxes get their own buttons and arrow images (``icons/``): a styled
frame makes Qt draw the buttons from the stylesheet too, and without an
``image`` their arrows would be empty boxes.  The sidebar's rename editor has
a slim padding so the title fits in the row's height.
"""

from __future__ import annotations

from pathlib import Path

ICONS = (Path(__file__).resolve().parent / "icons").as_posix()

ACCENT = "#2563eb"
MUTED = "#6b7280"
ERROR = "#b91c1c"
WARNING = "#92400e"

STYLESHEET = f"""
QMainWindow, QWidget#chatPanel {{ background: #ffffff; }}
QWidget#sidebar {{ background: #f7f7f8; border-right: 1px solid #e5e7eb; }}
QWidget#sidebar QListView, QWidget#sidebar QListWidget {{
    background: transparent; border: none; outline: none;
}}
QWidget#sidebar QListView::item, QWidget#sidebar QListWidget::item {{
    padding: 7px 8px; border-radius: 6px; color: #111827;
}}
QWidget#sidebar QListView::item:selected, QWidget#sidebar QListWidget::item:selected {{
    background: #e5e7eb; color: #111827;
}}
QWidget#sidebar QListView::item:hover, QWidget#sidebar QListWidget::item:hover {{ background: #eef0f3; }}
QLineEdit, QPlainTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
    border: 1px solid #d1d5db; border-radius: 8px; padding: 5px 8px; background: #ffffff;
}}
QLineEdit:focus, QPlainTextEdit:focus {{ border-color: {ACCENT}; }}
QSpinBox, QDoubleSpinBox {{ padding-right: 24px; }}
QSpinBox::up-button, QDoubleSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::down-button {{
    subcontrol-origin: border; width: 20px; border-left: 1px solid #d1d5db; background: #f9fafb;
}}
QSpinBox::up-button, QDoubleSpinBox::up-button {{ subcontrol-position: top right; border-top-right-radius: 8px; }}
QSpinBox::down-button, QDoubleSpinBox::down-button {{
    subcontrol-position: bottom right; border-bottom-right-radius: 8px;
}}
QSpinBox::up-button:hover, QDoubleSpinBox::up-button:hover,
QSpinBox::down-button:hover, QDoubleSpinBox::down-button:hover {{ background: #eef0f3; }}
QSpinBox::up-arrow, QDoubleSpinBox::up-arrow {{ image: url({ICONS}/arrow-up.svg); width: 9px; height: 9px; }}
QSpinBox::down-arrow, QDoubleSpinBox::down-arrow {{ image: url({ICONS}/arrow-down.svg); width: 9px; height: 9px; }}
QSpinBox::up-arrow:disabled, QSpinBox::up-arrow:off, QDoubleSpinBox::up-arrow:disabled,
QDoubleSpinBox::up-arrow:off, QSpinBox::down-arrow:disabled, QSpinBox::down-arrow:off,
QDoubleSpinBox::down-arrow:disabled, QDoubleSpinBox::down-arrow:off {{ image: none; }}
QWidget#sidebar QListView QLineEdit {{ padding: 0px 6px; border-radius: 4px; background: #ffffff; }}
QPushButton {{
    border: 1px solid #d1d5db; border-radius: 8px; padding: 6px 14px; background: #ffffff;
}}
QPushButton:hover {{ background: #f3f4f6; }}
QPushButton#primary {{ background: {ACCENT}; color: white; border: none; font-weight: 600; }}
QPushButton#primary:hover {{ background: #1d4ed8; }}
QPushButton#primary:disabled {{ background: #9db7f0; }}
QPushButton#stop {{ background: #111827; color: white; border: none; font-weight: 600; }}
QFrame#userBubble {{ background: #eef4ff; border-radius: 12px; }}
QFrame#assistantBubble {{ background: #ffffff; border: 1px solid #eceef1; border-radius: 12px; }}
QLabel#role {{ color: {MUTED}; font-weight: 600; }}
QLabel#stats {{ color: {MUTED}; font-size: 11px; }}
QLabel#hint {{ color: {MUTED}; font-size: 11px; }}
QLabel#replyError {{ color: {ERROR}; }}
QLabel#notice {{ color: {WARNING}; font-size: 11px; }}
QToolButton {{ border: none; color: {MUTED}; padding: 2px 6px; border-radius: 6px; }}
QToolButton:hover {{ background: #f3f4f6; color: #111827; }}
QFrame#banner_error {{ background: #fef2f2; border: 1px solid #fecaca; border-radius: 8px; }}
QFrame#banner_warning {{ background: #fffbeb; border: 1px solid #fde68a; border-radius: 8px; }}
QFrame#banner_info {{ background: #eff6ff; border: 1px solid #bfdbfe; border-radius: 8px; }}
QStatusBar {{ background: #f7f7f8; color: {MUTED}; }}
QProgressBar {{ border: 1px solid #d1d5db; border-radius: 4px; background: #ffffff; max-height: 8px; }}
QProgressBar::chunk {{ background: {ACCENT}; border-radius: 3px; }}
QPushButton:focus, QComboBox:focus, QSpinBox:focus, QDoubleSpinBox:focus {{ border: 2px solid {ACCENT}; }}
QPushButton#primary:focus {{ border: 2px solid #111827; }}
QToolButton:focus {{ border: 2px solid {ACCENT}; }}
QCheckBox:focus, QRadioButton:focus {{ border: 1px solid {ACCENT}; border-radius: 4px; }}
QListView:focus, QListWidget:focus, QTreeWidget:focus, QTableWidget:focus {{ border: 1px solid {ACCENT}; }}
"""
