"""Brisk's engine: model loading, decoding, caches and storage. Never imports Qt."""
