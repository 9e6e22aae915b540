"""Tests of ``engine.storage``: the database, the history store and the settings file."""
