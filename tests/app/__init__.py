"""GUI tests (``app/``) with pytest-qt: real windows over a scripted FakeEngine, and a few on the real engine."""
