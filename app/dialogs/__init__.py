"""Dialogs: ``settings`` (with its ``speed`` group) and ``about`` ("About this machine")."""
