"""Tests of ``engine.quant``: the modes, kernels, cache and the native decode step."""
