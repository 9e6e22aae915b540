"""Tests of ``engine.bench``: the benchmark against a peer server."""
