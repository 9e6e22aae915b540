"""Tests of ``engine.answer_cache``: exact and semantic answers, the store and its guard."""
