"""Brisk's desktop GUI (PySide6).

The modules here only present state and forward user intent: ``bridge`` is the
one door to the engine, ``session`` and ``reply`` hold the plain-Python state of
a conversation and of a streaming reply, ``answer_seed`` picks earlier answers
from the history for the engine's answer memory, and the widget modules
(``chat_view``, ``composer``, ``sidebar``, ``settings_dialog``,
``speed_section``, ``about_dialog``, ``main_window``) turn that state into
pixels.  ``launch.run_gui`` starts the whole thing.

Importing this package imports no Qt, so headless tools stay fast.
"""
