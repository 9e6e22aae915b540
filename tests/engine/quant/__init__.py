"""Tests of ``engine.quant``: the modes, kernels, cache and the scripted step."""
