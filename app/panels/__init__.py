"""Dock panels beside the chat (the latency panel goes here).

A panel is a widget that reads only engine events (through the bridge's
``event`` signal) and the plain-Python state in :mod:`app.state`; the window
adds it as a ``QDockWidget`` with :meth:`app.window.main_window.MainWindow.add_panel`.
"""
