"""Tests of the headless CLI (``engine.cli``, started as ``python -m app.cli``): the JSON contract and its commands."""
