"""Tests of ``engine.model``: loading and conversion, the dtype and mode probes, the fast forward, packed linears."""
