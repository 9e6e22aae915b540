"""A :class:`~engine.api.Backend` over any OpenAI-compatible streaming server (llama.cpp, vLLM, SGLang, Ollama, TGI).

``RemoteBackend(on_event, base_url, model=None, api_key=None, ...)``: every
method returns at once; events come through ``on_event`` from the backend's
own worker thread, in the same order as the local engine's: ``load(spec)``
gives ``Loaded`` (device ``"remote"``) or ``LoadFailed``; each submitted
request gives ``Started``, one ``Token`` per streamed text delta (``ids``
empty: these servers send none), then one ``Done`` (metrics: see
:mod:`engine.remote.metrics`) or one ``Error`` whose ``partial_text`` keeps
what arrived.  Requests are served one at a time, in order.  The protocol's
verbs for Brisk's own caches (``hint``, ``count_tokens``, ``remember_answer``,
``set_prefix_budget``, ``clear_prefix_cache``) do nothing here and say so
(False, or None for a count).

Why the ``openai`` SDK: it is the reference client for this API (auth header,
SSE decoding, error classes with the response, mid-stream error objects), and
its chunk models keep the fields a server adds (llama.cpp's ``timings``) in
``model_extra``.  It is used with ``max_retries=0`` (a retry is the user's
call: a 429 says when) and ``stream_options.include_usage``; a server that
answers that with 400 is asked once more without it, and not again.

Cancel, at once: each request is read by its own reader thread, and the worker
waits on a queue that both the reader and ``cancel`` write to, so ``Done
(finish_reason="cancelled")`` with the partial text goes out as soon as
``cancel`` is called, even while the server sends nothing.  The connection is
closed by shutting its socket down (``shutdown(SHUT_RDWR)`` wakes the reader
blocked in ``recv``), so the server sees the closed connection and stops
generating; a cancel that comes before the response headers closes it as soon
as they arrive.

Bounded, by :class:`~engine.remote.limits.Limits` (defaults there, overrides
from ``BRISK_REMOTE_*``): the worker waits for each event (a chunk, not a
byte) at most ``first_event_s`` for the first and ``event_gap_s`` after, and
``reply_s`` for the whole reply; the :class:`~engine.remote.guard.Guard` under
the SDK refuses an event or a body past its size cap while it arrives, and
any redirect to another server before it is sent.  Each ends the reply with
one ``Error`` that keeps the text so far.  The model listing at load has a
deadline of its own.

The API key is sent only in the ``Authorization`` header, and not at all over
plain http to a host that is not this machine unless allowed
(:func:`engine.remote.guard.check_key`; else ``load`` fails, saying why): it is
never logged, never in ``repr`` and never in a message (see
:func:`engine.remote.errors.redact`), and a reply that echoes it shows
``***`` (:class:`engine.remote.errors.KeyFilter`).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai

from engine.api import (
    Done,
    Error,
    Loaded,
    LoadFailed,
    Metrics,
    ModelInfo,
    ModelSpec,
    OnEvent,
    Request,
    Started,
    Token,
    Warning,
)

from .errors import KeyFilter, RemoteError, check_base_url, describe, redact, secret_key
from .guard import Guard, check_key, shutdown_socket
from .limits import Limits
from .metrics import ReplyStats

_STOP = object()
_KEEP_RESULTS = 64


@dataclass(frozen=True)
class RemoteResult:
    """How one request ended, with the server's own figures (``usage``, ``timings``...) as it reported them."""

    request_id: str
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    metrics: Metrics = field(default_factory=Metrics)
    server: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def make_client(
    base_url: str, api_key: str | None, limits: Limits, read_s: float | None = None
) -> tuple[openai.OpenAI, Guard]:
    """An SDK client for ``base_url`` behind a :class:`Guard`; it never retries and never reads ``OPENAI_*`` keys."""
    where = check_base_url(base_url)
    guard = Guard(where, limits)
    read = read_s if read_s is not None else max(limits.first_event_s, limits.event_gap_s)
    timeout = httpx2.Timeout(read, connect=min(limits.connect_s, read))
    http = openai.DefaultHttpxClient(timeout=timeout, event_hooks=guard.hooks())
    client = openai.OpenAI(
        base_url=where,
        api_key=api_key or "no-key",  # servers without auth ignore the header; the SDK needs some value
        max_retries=0,
        timeout=timeout,
        http_client=http,
    )
    return client, guard


def list_models(
    base_url: str,
    api_key: str | None = None,
    timeout: float = 20.0,
    *,
    client: tuple[openai.OpenAI, Guard] | None = None,
    limits: Limits | None = None,
) -> list[str]:
    """The model ids a server lists at ``/v1/models``, in its order, within ``timeout`` s in all; else RemoteError."""
    where = check_base_url(base_url)
    own = client is None
    if client is None:
        limits = limits or Limits.from_env()
        check_key(where, api_key, limits.allow_insecure_key)
        client = make_client(where, api_key, limits, read_s=timeout)
    sdk, guard = client
    box: queue.Queue[tuple[bool, Any]] = queue.Queue()

    def ask() -> None:
        try:
            page = sdk.models.list()
            box.put((True, [str(m.id) for m in page.data if getattr(m, "id", None)]))
        except BaseException as exc:  # noqa: BLE001 - handed back below, said as one message
            box.put((False, exc))

    threading.Thread(target=ask, name="brisk-remote-models", daemon=True).start()
    try:
        ok, value = box.get(timeout=timeout)
    except queue.Empty:
        guard.shutdown_all()  # a body still dripping in: its reader wakes and ends
        raise RemoteError(
            f"The server at {where} did not list its models (/v1/models) within {timeout:g} s. "
            "It may be overloaded or not an OpenAI-compatible server: check the URL and try again."
        ) from None
    finally:
        if own:
            sdk.close()
    if not ok:
        raise RemoteError(redact(describe(value, where=where, read_timeout=timeout), api_key)) from None
    return list(value)


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


class _Reader:
    """Reads one streamed reply on its own thread into ``items``: ("chunk", chunk, t), ("end",), ("fail", exc)."""

    def __init__(self, client: openai.OpenAI, params: dict[str, Any], items: queue.Queue[tuple[Any, ...]]) -> None:
        self.client = client
        self.params = params
        self.items = items
        self.lock = threading.Lock()
        self.response: httpx2.Response | None = None
        self.closed = False
        self.dropped_usage = False  # the server refused stream_options: sent again without it
        self.thread = threading.Thread(target=self._run, name="brisk-remote-reader", daemon=True)

    def _run(self) -> None:
        try:
            try:
                stream = self.client.chat.completions.create(**self.params)
            except openai.BadRequestError:
                if "stream_options" not in self.params or self.closed:
                    raise
                # an older server that rejects stream_options: ask once more without it (nothing was streamed)
                self.params = {k: v for k, v in self.params.items() if k != "stream_options"}
                self.dropped_usage = True
                stream = self.client.chat.completions.create(**self.params)
            with self.lock:
                self.response = stream.response
                closed = self.closed
            if closed:
                shutdown_socket(stream.response)
                stream.close()
                return
            for chunk in stream:
                self.items.put(("chunk", chunk, time.perf_counter()))
            self.items.put(("end", None, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - handed to the worker, which reports it
            self.items.put(("fail", exc, time.perf_counter()))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            response = self.response
        shutdown_socket(response)


class RemoteBackend:
    """Drives an OpenAI-compatible server; see the module docstring for the contract."""

    def __init__(
        self,
        on_event: OnEvent,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        limits: Limits | None = None,
        include_usage: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = check_base_url(base_url)  # RemoteError for anything but http(s)
        self.on_event = on_event
        self.model = model or ""
        self._api_key = api_key or None
        self.refusal = ""  # set when this server must not be used as configured: load says it, nothing is sent
        try:
            self.limits = limits or Limits.from_env()
            check_key(self.base_url, self._api_key, self.limits.allow_insecure_key)
        except RemoteError as exc:
            self.limits = limits or Limits()
            self.refusal = str(exc)
        self.include_usage = include_usage
        self.extra_body = dict(extra_body or {})
        self.client, self.guard = make_client(self.base_url, None if self.refusal else self._api_key, self.limits)
        self.loaded: Loaded | None = None
        self.last_result: RemoteResult | None = None
        self.results: OrderedDict[str, RemoteResult] = OrderedDict()  # the last few, by request id
        self._jobs: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()
        self._active: dict[str, tuple[_Reader, queue.Queue[tuple[Any, ...]]]] = {}
        self._thread = threading.Thread(target=self._work, name="brisk-remote", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"RemoteBackend({self.base_url!r}, model={self.model!r}, api_key={'set' if self._api_key else 'none'})"

    # -- the Backend protocol ----------------------------------------------------------------------

    def load(self, spec: ModelSpec) -> None:
        self._jobs.put(("load", spec))

    def submit(self, request: Request) -> None:
        if not request.submitted_at:
            request = dataclasses.replace(request, submitted_at=time.perf_counter())
        self._jobs.put(("submit", request))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)
            active = self._active.get(request_id)
        if active is not None:
            reader, items = active
            items.put(("cancel", None, time.perf_counter()))  # the worker ends the reply now...
            reader.close()  # ...and the server sees the connection close

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            active = list(self._active)
        for request_id in active:
            self.cancel(request_id)
        self._jobs.put(_STOP)
        self._thread.join(timeout)
        self.client.close()

    # A server keeps its own caches and memory, out of reach of this API: Brisk's extra verbs do nothing here.

    def hint(self, request: Request) -> bool:
        """No prefill while typing (the API has no such call): False, and no ``DraftPrefill`` follows."""
        return False

    def count_tokens(self, texts: list[str]) -> list[int] | None:
        """None: the server's tokenizer is not reachable through this API."""
        return None

    def remember_answer(self, question: str, answer: str) -> bool:
        """False: the server keeps no answer memory of Brisk's."""
        return False

    def set_prefix_budget(self, budget_bytes: int) -> bool:
        """False: the server's prompt cache is its own (its budget is set where it runs)."""
        return False

    def clear_prefix_cache(self) -> bool:
        """False: the server's prompt cache is its own."""
        return False

    # -- the worker thread -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            assert isinstance(job, tuple)
            kind, payload = job
            if kind == "load":
                self._load(payload)
            else:
                if payload.documents:  # the window greys attaching here; a chat that has documents says so
                    self.on_event(
                        Warning(
                            "documents",
                            f"The server at {self.base_url} is not given this chat's attached documents (only "
                            "Brisk's local model reads them); switch to the local model to ask about them.",
                        )
                    )
                self._serve(payload)

    def _message(self, exc: BaseException) -> str:
        read_s = max(self.limits.first_event_s, self.limits.event_gap_s)
        text = describe(exc, where=self.base_url, model=self.model, read_timeout=read_s)
        return redact(text, self._api_key)

    def _load(self, spec: ModelSpec) -> None:
        t0 = time.perf_counter()
        wanted = spec.source or self.model
        if self.refusal:
            self.on_event(LoadFailed(self.refusal))
            return
        try:
            models = list_models(self.base_url, self._api_key, client=(self.client, self.guard))
        except RemoteError as exc:
            self.on_event(LoadFailed(str(exc)))
            return
        if wanted and wanted not in models:
            listed = ", ".join(models[:10]) or "none"
            self.on_event(
                LoadFailed(
                    f"The server at {self.base_url} has no model {wanted!r}; it lists: {listed}. Pick one of those."
                )
            )
            return
        if not wanted and not models:
            where = self.base_url
            self.on_event(LoadFailed(f"The server at {where} lists no models at /v1/models; load one there first."))
            return
        self.model = wanted or models[0]
        self.loaded = Loaded(self.model, "remote", "", time.perf_counter() - t0, ModelInfo(endpoint=self.base_url))
        self.on_event(self.loaded)

    def _params(self, request: Request) -> dict[str, Any]:
        s = request.sampling
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in request.messages],
            "stream": True,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
        if s.seed is not None:
            params["seed"] = s.seed
        if s.stop:
            params["stop"] = list(s.stop)
        if self.include_usage:
            params["stream_options"] = {"include_usage": True}
        extra = dict(self.extra_body)
        if s.top_k:  # vLLM, SGLang, llama.cpp and TGI read top_k; others ignore it
            extra.setdefault("top_k", s.top_k)
        if s.repetition_penalty != 1.0:  # vLLM/SGLang/TGI name it repetition_penalty, llama.cpp repeat_penalty
            extra.setdefault("repetition_penalty", s.repetition_penalty)
            extra.setdefault("repeat_penalty", s.repetition_penalty)
        if extra:
            params["extra_body"] = extra
        return params

    def _end(
        self, request: Request, stats: ReplyStats, shown: KeyFilter, t: float, reason: str, error: str = ""
    ) -> None:
        t_rel = t - request.submitted_at
        tail = shown.flush()  # a held-back end that turned out not to be the key
        if tail:
            self.on_event(Token(request.id, t_rel, tail))
        metrics = stats.metrics(t)
        result = RemoteResult(request.id, shown.text, reason, metrics, stats.server(), error)
        self.last_result = result
        self.results[request.id] = result
        while len(self.results) > _KEEP_RESULTS:
            self.results.popitem(last=False)
        if error:
            self.on_event(Error(request.id, t_rel, error, shown.text))
        else:
            self.on_event(Done(request.id, t_rel, shown.text, reason, metrics))

    def _serve(self, request: Request) -> None:
        t0 = request.submitted_at
        stats = ReplyStats(t0)
        shown = KeyFilter(secret_key(self._api_key))  # what the user sees: the reply with the key taken out
        self.on_event(Started(request.id, time.perf_counter() - t0))
        with self._lock:
            cancelled = request.id in self._cancelled
        if cancelled:
            self._forget(request.id)
            self._end(request, stats, shown, time.perf_counter(), "cancelled")
            return
        problems = request.sampling.problems()
        if not self.loaded:
            problems = ["no server model is loaded yet: wait for the connection or pick a server in Settings"]
        if problems:
            message = "Cannot send this request: " + "; ".join(problems) + "."
            self._end(request, stats, shown, time.perf_counter(), "error", message)
            return
        items: queue.Queue[tuple[Any, ...]] = queue.Queue()
        reader = _Reader(self.client, self._params(request), items)
        with self._lock:
            self._active[request.id] = (reader, items)
            if request.id in self._cancelled:
                items.put(("cancel", None, time.perf_counter()))
        reader.thread.start()
        try:
            self._pump(request, stats, shown, reader, items)
        finally:
            self._forget(request.id)
            if reader.dropped_usage:
                self.include_usage = False

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._active.pop(request_id, None)
            self._cancelled.discard(request_id)

    def _late(self, first: bool, gap: float, t_sent: float, now: float) -> str:
        """The message for a reply that ran past one of its deadlines (see :mod:`engine.remote.limits`)."""
        if now - t_sent >= self.limits.reply_s:
            return (
                f"The reply from {self.base_url} ran past {self.limits.reply_s:g} s, the most Brisk waits for one "
                "reply; it stopped there and the text so far is kept. Ask for a shorter reply (max tokens), "
                "or raise BRISK_REMOTE_REPLY_S."
            )
        if first:
            return (
                f"The server at {self.base_url} sent nothing of a reply for {gap:g} s after the request; "
                "it stopped there. A big model on a busy server can be slow to start: try again, or wait longer "
                "with --server-timeout (or BRISK_REMOTE_FIRST_EVENT_S)."
            )
        return (
            f"The server at {self.base_url} stopped sending for {gap:g} s in the middle of the reply "
            "(bytes that complete no event do not count); the partial reply is kept. It may be overloaded or "
            "stuck: try again, or allow longer gaps with --server-timeout (or BRISK_REMOTE_EVENT_GAP_S)."
        )

    def _pump(
        self,
        request: Request,
        stats: ReplyStats,
        shown: KeyFilter,
        reader: _Reader,
        items: queue.Queue[tuple[Any, ...]],
    ) -> None:
        """Hand the reader's chunks on as tokens until the reply ends, is cancelled, or runs past a deadline."""
        t0 = request.submitted_at
        t_sent = t_last = time.perf_counter()
        first = True
        while True:
            gap = self.limits.first_event_s if first else self.limits.event_gap_s
            deadline = min(t_last + gap, t_sent + self.limits.reply_s)
            try:
                kind, payload, t = items.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                reader.close()
                now = time.perf_counter()
                self._end(request, stats, shown, now, "error", self._late(first, gap, t_sent, now))
                return
            if kind == "cancel":
                reader.close()
                self._end(request, stats, shown, t, "cancelled")
                return
            if kind == "fail":
                reader.close()
                self._end(request, stats, shown, t, "error", self._message(payload))
                return
            if kind == "end":
                if stats.finish_reason is None:
                    cut = (
                        f"The server at {self.base_url} ended the stream without finishing the reply "
                        f"(after {len(stats.times)} tokens); the partial reply is kept. "
                        "Check the server's log and try again."
                    )
                    self._end(request, stats, shown, t, "error", cut)
                else:
                    self._end(request, stats, shown, t, _finish(stats.finish_reason))
                return
            first, t_last = False, t
            try:
                texts = stats.add(payload, t)
            except Exception as exc:  # a chunk that is not a chat-completion chunk
                reader.close()
                self._end(request, stats, shown, t, "error", self._message(exc))
                return
            for text in texts:
                out = shown.feed(text)
                if out:
                    self.on_event(Token(request.id, t - t0, out))


def remote_backend(
    base_url: str, model: str | None = None, api_key: str | None = None, **options: Any
) -> Callable[[OnEvent], RemoteBackend]:
    """A factory for :class:`engine.client.Client`: ``Client(remote_backend(url, model, key))``.

    What would only fail at load (a bad ``BRISK_REMOTE_*`` value, a key bound for plain http elsewhere) raises
    :class:`RemoteError` here, before anything is started or sent.
    """
    where = check_base_url(base_url)
    limits = options.pop("limits", None) or Limits.from_env()
    check_key(where, api_key, limits.allow_insecure_key)

    def make(on_event: OnEvent) -> RemoteBackend:
        return RemoteBackend(on_event, base_url, model, api_key, limits=limits, **options)

    return make
