"""Tests of ``engine.runtime``: the engine thread, prompt, prefix cache, steps, decode, speculative, threads."""
