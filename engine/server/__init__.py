"""Brisk as a server for other programs: an OpenAI-compatible HTTP API over the engine the window uses.

``Hub`` routes the engine's events to the HTTP handlers (``engine.server.hub``),
``build_app``/``Service`` are the Starlette app (``engine.server.app``; the
shapes of requests and answers in ``engine.server.shapes``), ``ServerThread``
runs it with uvicorn (``engine.server.run``).  ``brisk serve`` is
``engine.cli.serve``; the window's Server switch drives the same pieces.
"""

from engine.server.app import EMBED_MODEL, Service, build_app, model_id
from engine.server.hub import Entry, Hub, Log
from engine.server.run import DEFAULT_HOST, DEFAULT_PORT, ServeError, ServerThread, is_loopback, serve_problems

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "EMBED_MODEL",
    "Entry",
    "Hub",
    "Log",
    "ServeError",
    "ServerThread",
    "Service",
    "build_app",
    "is_loopback",
    "model_id",
    "serve_problems",
]
