"""Tests of ``engine.remote``: the OpenAI-compatible backend against the replay server, API keys, a live server."""
