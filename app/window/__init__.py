"""The main window, split by subject: ``main_window`` (layout, model, settings, banners),
``turns`` (send, stop, regenerate, edit) and ``conversations`` (open, rename, delete, export, search)."""

from app.window.main_window import MainWindow

__all__ = ["MainWindow"]
