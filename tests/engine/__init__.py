"""Tests of the engine (``engine/``): one package per subpackage; the top-level modules' tests sit here."""
