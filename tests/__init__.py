"""Brisk's tests, one package per package of the code (``tests/engine/<subpackage>/``, ``tests/app/``).

Helpers that tests share live in ``tests/support/``.
"""
