"""Answer cache: replies served from SQLite for repeated and paraphrased questions.  Imports no Qt.

Import from this package; the modules inside may move.  ``AnswerCache`` (cache.py) is the
front; ``CacheKey``/``ModelIdentity`` (keys.py) say what an answer is keyed on; ``Embedder``
(embed.py) loads the sentence-embedding model in the background; ``mismatch`` (guard.py) keeps
look-alike questions with another meaning apart; ``PARAPHRASES``/``NEAR_MISSES`` (pairs.py)
measure it.  Importing this package loads neither torch nor sentence-transformers.
"""

from engine.answer_cache.cache import KINDS, AnswerCache, CacheConfig, CacheHit, CacheStats
from engine.answer_cache.embed import Embedder, shared_embedder
from engine.answer_cache.guard import mismatch
from engine.answer_cache.keys import (
    CacheKey,
    ModelIdentity,
    context_hash,
    is_deterministic,
    normalise,
    weights_fingerprint,
)
from engine.answer_cache.pairs import NEAR_MISSES, PARAPHRASES
from engine.answer_cache.store import CacheError, CacheStore, Entry

__all__ = [
    "KINDS",
    "NEAR_MISSES",
    "PARAPHRASES",
    "AnswerCache",
    "CacheConfig",
    "CacheError",
    "CacheHit",
    "CacheKey",
    "CacheStats",
    "CacheStore",
    "Embedder",
    "Entry",
    "ModelIdentity",
    "context_hash",
    "is_deterministic",
    "mismatch",
    "normalise",
    "shared_embedder",
    "weights_fingerprint",
]
