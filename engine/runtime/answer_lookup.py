"""The engine's answer cache: looked up when a request arrives, kept after its reply, never waited for.

:class:`AnswerLookup` owns one :class:`~engine.answer_cache.AnswerCache` on the
app database (``engine.paths.database_path()``).  It has no thread of its own:
the scheduler (``engine.runtime.scheduler``) calls it on the engine thread.

* :meth:`AnswerLookup.answer` runs when a request is taken in: the exact match
  (a hash, about 1 ms); a hit is sent at once (``Started``, one ``Token`` with
  the cached ids, ``Done`` whose metrics say ``answer_cache``), even while a
  model loads, since loads are built off the engine thread.  On a miss the
  request goes to the model and, when a stored question could be near, the
  question is embedded on the embedder's own low-priority thread; when its
  vector is ready the embedder posts ``("semantic", request_id)`` to the
  intake and the scheduler calls :meth:`AnswerLookup.semantic` (a dot product
  over the stored vectors) only if the model has not answered yet; a hit then
  ends the model's side (``engine.runtime.reply_events``: muted) and answers.
  A miss so costs the exact match, never the embedding.
* Which model a request will meet is known when it arrives: the identity of
  the model loaded last, or, while a load is under way, the identity this
  :class:`~engine.api.ModelSpec` had the last time it loaded (kept in
  ``cache/answer-cache-models.json``, so a hit is served during the first load
  after a restart too; read through ``engine.datafiles.load_state``, so a file
  of another shape is moved aside with one warning and costs only those hits).
  A spec never loaded before gives no hits until its load ends.
* A request is looked up only when it may be (``request.answer_cache`` and not
  ``request.fresh``, the cache on, its values valid, no slash tool lines); a
  lookup that fails is a miss (and a ``Warning`` once).  The embedder starts
  when a load starts (it loads in about 0.1 s beside a model that takes
  seconds); until it is ready lookups are exact-only.
* :meth:`AnswerLookup.put` keeps a complete reply after its ``Done``, written
  at once without a vector unless its lookup left one; entries without get
  theirs on the embedder's thread (nobody waits for it).  Since the lookup and
  the put both run on the engine thread, a question asked again right after its
  answer finds it.  :meth:`drafts` gives speculative drafts (never embedding),
  :meth:`loaded` follows a load (answers of other models are deleted then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

from engine.api import AnswerCacheSettings, Done, Metrics, ModelSpec, Request, Span, Started, Token, Warning
from engine.datafiles import load_state, string_map
from engine.paths import atomic_write, cache_dir, database_path
from engine.runtime.reply_events import ReplyEvents

log = logging.getLogger("brisk.answers")

IDENTITIES_FILE = "answer-cache-models.json"
KEPT_WAIT_S = 5.0  # longest a fast exit waits for the last answer's vectors (wait_all_kept)
PAUSE_AFTER_ERROR_S = 60.0  # after a failed read or write (a file locked by another program) the cache rests


def expected_failure(exc: BaseException) -> bool:
    """A failure whose message already says what happened (the store's own errors): no traceback for it."""
    from engine.answer_cache.store import CacheError
    from engine.storage.db import StoreError

    return isinstance(exc, CacheError | StoreError)


_SAID: set[str] = set()


def said(exc: BaseException) -> None:
    """Report a failure of the answer cache, which only saves time: the store's own errors (a full disk, a locked
    file) in their one line, once a process for each message; anything else with its traceback (a bug)."""
    if not expected_failure(exc):
        traceback.print_exception(exc)
    elif str(exc) not in _SAID:
        _SAID.add(str(exc))
        log.warning("The answer cache: %s", exc)


_LIVE: weakref.WeakSet[AnswerLookup] = weakref.WeakSet()  # every lookup of this process (wait_all_kept)


def wait_all_kept(timeout: float = KEPT_WAIT_S) -> None:
    """Wait (at most ``timeout`` in all) until every lookup's batch of vectors is kept: a process that ends at
    once after a reply (``brisk ask``) keeps the question's vector, or says that it could not."""
    deadline = time.monotonic() + timeout
    for lookup in list(_LIVE):
        lookup._kept.wait(max(0.0, deadline - time.monotonic()))
        lookup.vectors_kept(max(0.0, deadline - time.monotonic()))


def cache_config(settings: AnswerCacheSettings) -> Any:
    """The answer cache's :class:`~engine.answer_cache.CacheConfig` for these settings."""
    from engine.answer_cache import CacheConfig

    return CacheConfig(
        enabled=settings.enabled,
        semantic=settings.semantic,
        threshold=settings.threshold,
        ttl_s=settings.ttl_s,
        max_entries=settings.max_entries,
        allow_sampled=settings.allow_sampled,
    )


def settings_problems(settings: AnswerCacheSettings) -> list[str]:
    """What is wrong with ``settings``, each said as what to change (empty: all good)."""
    try:
        return [f"answer cache: {p}" for p in cache_config(settings).problems()]
    except (TypeError, ValueError) as exc:
        return [f"answer cache: {exc}"]


def spec_key(spec: ModelSpec) -> str:
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def has_slash_calls(request: Request) -> bool:
    """The last message holds ``/NAME`` lines that would run tools (their results are never cached)."""
    from engine.tools import parse_slash_lines

    if not request.tools or not request.messages:
        return False
    return bool(parse_slash_lines(str(request.messages[-1].get("content", "")), lambda name: None).calls)


@dataclasses.dataclass
class Pending:
    """A request whose question is being embedded for the semantic stage."""

    request: Request
    key: Any  # its CacheKey
    t_taken: float  # seconds from its submission to the lookup


class AnswerLookup:
    def __init__(
        self,
        settings: AnswerCacheSettings,
        on_event: Callable[[object], None],
        valid: Callable[[Request], bool],
    ) -> None:
        self.settings = settings
        self.on_event = on_event
        self.valid = valid
        self._paused_until = 0.0  # monotonic time before which the cache is skipped after a failed read or write
        self.cache: Any = None  # AnswerCache once opened (on the engine thread); None when off or unusable
        self._lock = threading.RLock()  # the cache is used from the engine thread and the embedder's callbacks
        self._known: dict[str, dict[str, str]] = {}  # spec key -> identity fields, from the last load of each
        self._expected: Any = None  # ModelIdentity the next request taken in will meet
        self._loads = 0  # loads taken in so far; the engine reports which one ended
        self._warned = False
        self._vectors_idle = threading.Event()  # clear while a batch of missing vectors is on the embedder's thread
        self._vectors_idle.set()
        self.pending: dict[str, Pending] = {}  # requests whose question is being embedded
        self._kept = threading.Event()  # clear while the engine sends a reply's Done and keeps the reply
        self._kept.set()
        _LIVE.add(self)

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        """Around sending a reply's ``Done`` and keeping the reply (on the engine thread): a process that ends
        on that ``Done`` (:func:`wait_all_kept`) waits until the answer is kept, or its failure said."""
        self._kept.clear()
        try:
            yield
        finally:
            self._kept.set()

    def vectors_kept(self, timeout: float) -> bool:
        """Wait until no batch of missing vectors is being embedded (tests, benchmarks); true when none is."""
        return self._vectors_idle.wait(timeout)

    def open(self) -> None:
        """Open the cache (on the engine thread, before the first item is taken in)."""
        if not self.settings.enabled:
            return
        try:
            from engine.answer_cache import AnswerCache, Embedder, shared_embedder

            embedder = shared_embedder(start=False) if self.settings.semantic else Embedder()
            self.cache = AnswerCache(database_path(), cache_config(self.settings), embedder=embedder)
            self._known = _read_known()
        except Exception as exc:  # the cache only saves time: replies come from the model
            if expected_failure(exc):  # a locked, damaged or foreign file: its message says it all, in one line
                log.warning("The answer cache is off: %s", exc)
            else:
                traceback.print_exc()
            self.on_event(Warning("cache", f"The answer cache is off ({exc}); every reply comes from the model."))

    def load_started(self, spec: ModelSpec) -> int:
        """A load is taken in: start the embedder beside it and expect the identity ``spec`` had last time.
        Returns the load's number (the engine reports which one ended)."""
        try:
            self._start_embedder()  # beside the model's load, so it is ready by the first question
        except Exception as exc:  # only similar-question hits are lost
            said(exc)
        with self._lock:
            self._loads += 1
            known = self._known.get(spec_key(spec))
            self._expected = _identity(known) if known else None
            return self._loads

    def _start_embedder(self) -> None:
        if self.cache is not None and self.settings.semantic and not self.cache.embedder.started:
            self.cache.embedder.import_modules()  # here, before the load's thread starts: no import on two threads
            self.cache.embedder.start()

    def answer(self, request: Request, post: Callable[[tuple[str, Any]], None]) -> bool:
        """Answer ``request`` from the cache now (an exact hit: true), or leave it to the model (false).

        On a miss, when a stored question could be near, the question is embedded on the embedder's
        thread, which posts ``("semantic", request.id)`` when its vector is ready; the scheduler then
        calls :meth:`semantic` if the model has not answered yet.  A lookup that fails is a miss."""
        try:
            return self._answer(request, post)
        except Exception as exc:  # a lookup that fails is a miss; the request goes to the model
            said(exc)
            return False

    def _answer(self, request: Request, post: Callable[[tuple[str, Any]], None]) -> bool:
        with self._lock:
            identity = self._expected
        if self.cache is None or identity is None or not request.answer_cache or request.fresh:
            return False
        # not what an entry's key holds (nor a chat's thinking switch): never answered from it
        if request.raw or request.client_tools or request.thinking != "auto":
            return False
        if request.documents:  # a reply about documents lists its sources, which a cached answer does not hold
            return False
        if time.monotonic() < self._paused_until:  # the file failed a moment ago (locked): do not wait on it again
            return False
        if not self.valid(request) or has_slash_calls(request) or request.messages[-1].get("role") != "user":
            return False
        from engine.answer_cache import CacheKey
        from engine.answer_cache.keys import fold

        t_taken = time.perf_counter() - request.submitted_at
        key = CacheKey.for_request(identity, request)
        hit = self._lookup(key, "exact")
        if hit is not None:
            self.serve_hit(request, hit, t_taken)
            return True
        with self._lock:
            try:  # a batch of vectors being made (the reply just kept) may hold the match
                wanted = not self._vectors_idle.is_set() or self.cache.could_match(key)
            except Exception:  # the index could not be read: the stage below says so (or misses)
                wanted = False
        if not wanted:
            self._lookup(key, "semantic")  # counts the miss (and cannot embed: nothing to compare)
            return False
        # queued after any batch of vectors on the embedder's one thread, so that batch is kept first
        future = self.cache.embedder.submit([fold(key.question)])
        if future is None:  # not ready: exact-only for now
            self._lookup(key, "semantic")
            return False
        self.pending[request.id] = Pending(request, key, t_taken)
        embedder = self.cache.embedder

        def ready(done: Future[Any]) -> None:
            with contextlib.suppress(BaseException):  # a failed embedding: the stage finds no vector and misses
                embedder.keep(fold(key.question), done.result()[0])
            post(("semantic", request.id))

        future.add_done_callback(ready)
        return False

    def semantic(self, request_id: str, answered: bool) -> tuple[Request, Any, float] | None:
        """The semantic stage of a request whose question's vector is ready: ``(request, hit, t_taken)`` to
        answer it with, or None (a miss, or ``answered``: the model's reply is already out, the hit would be late)."""
        pending = self.pending.pop(request_id, None)
        if pending is None:
            return None
        if answered:
            try:
                with self._lock:
                    if self.cache is not None:
                        self.cache.store.record_lookup()  # the lookup counts once, as a miss
            except Exception as exc:  # a counter that cannot be written (a full disk) costs nothing else
                said(exc)
            return None
        try:
            hit = self._lookup(pending.key, "semantic")
        except Exception as exc:  # the model answers
            said(exc)
            return None
        return (pending.request, hit, pending.t_taken) if hit is not None else None

    def _lookup(self, key: Any, stage: str) -> Any:
        with self._lock:
            hit = self.cache.lookup(key, quiet=True, stage=stage)
            error, self.cache.last_error = self.cache.last_error, None
            if error:
                self._paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
        if error and not self._warned:
            self._warned = True
            self.on_event(
                Warning("cache", f"The answer cache could not be read ({error}); replies come from the model.")
            )
        return hit

    def serve_hit(self, request: Request, hit: Any, t_taken: float, started: bool = False) -> None:
        """Send the cached reply; it ends with one ``Done``, or an ``Error`` if sending fails half-way.

        ``started``: the model already sent this request's ``Started`` (it lost the race), so none is sent.
        """
        reply = ReplyEvents(request.id, request.submitted_at, self.on_event)
        try:
            t_lookup = reply.since()
            if not started:
                reply.emit(Started(request.id, t_lookup))
            t_token = reply.since()
            reply.emit(Token(request.id, t_token, hit.answer, tuple(hit.token_ids)))
            total = reply.since()
            semantic = hit.kind == "semantic"
            metrics = Metrics(
                completion_tokens=len(hit.token_ids),
                queue_s=t_taken,
                lookup_s=t_lookup - t_taken,
                ttft_s=t_token,
                total_s=total,
                answer_cache=hit.kind,
                similarity=hit.similarity if semantic else None,
                cached_question=hit.question if semantic else None,
                saved_s=max(0.0, hit.generation_s - total),
                spans=(Span("queue", 0.0, t_taken), Span("answer cache", t_taken, t_lookup)),
            )
            # the key holds max_tokens, so a kept reply that filled it had stopped there: say so again
            finish = "length" if len(hit.token_ids) >= request.sampling.max_tokens else "stop"
            reply.emit(Done(request.id, reply.since(), hit.answer, finish, metrics))
        except Exception as exc:  # a failing event callback: the request still ends with one Error
            traceback.print_exc()
            try:
                reply.fail(f"The cached reply could not be delivered ({type(exc).__name__}: {exc}). Try again.")
            except Exception:  # nothing left to report it to
                traceback.print_exc()

    # -- the engine thread --------------------------------------------------------------------------
    def loaded(self, spec: ModelSpec, load_number: int, identity: Any) -> None:
        """A load ended well: remember ``spec``'s identity, expect it, drop other models' answers.

        Entries kept before the embedder was ready get their vectors here if it is ready now (a few; the
        rest after later replies), so a paraphrase of them can hit from the first question.
        """
        with self._lock:
            if load_number == self._loads:
                self._expected = identity
            if self.cache is None:
                return
            fields = dataclasses.asdict(identity)
            changed = self._known.get(spec_key(spec)) != fields
            self._known[spec_key(spec)] = fields
            known = dict(self._known)
            try:
                self.cache.invalidate_model(identity, keep=True)
            except Exception:  # the file is locked or failing: the first reply must not wait on it again
                self._paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
                raise
            try:  # before Loaded is sent: the first question finds the database read and the vectors in memory
                self.cache.warm(identity)
            except Exception:  # only saves time; a lookup that fails says so itself
                log.debug("answer cache warm-up failed", exc_info=True)
        self._backfill_later(identity)
        if changed:
            try:
                atomic_write(cache_dir() / IDENTITIES_FILE, json.dumps(known))
            except OSError:  # only costs hits during the next first load
                traceback.print_exc()

    def load_failed(self, load_number: int, identity: Any) -> None:
        """A load failed: requests meet the model still loaded (``identity``, or None)."""
        with self._lock:
            if load_number == self._loads:
                self._expected = identity

    def put(self, identity: Any, request: Request, text: str, ids: Sequence[int], generation_s: float) -> bool:
        """Keep a complete reply (the caller checks it finished with "stop" or "length"); true when kept.

        Called after the reply's ``Done``: the entry is written at once (with the vector its lookup left, if
        any); the question's vector, and those of a few older entries without one, follow on the
        embedder's thread (:meth:`_backfill_later`), so the engine never waits for the embedder.
        """
        if self.cache is None or not request.answer_cache or request.messages[-1].get("role") != "user":
            return False
        from engine.answer_cache import CacheKey

        key = CacheKey.for_request(identity, request)
        with self._lock:
            if time.monotonic() < self._paused_until:
                return False
            try:
                kept = self.cache.put(key, text, list(ids), generation_s, embed=False) is not None
            except Exception:
                self._paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
                raise
        self._backfill_later(identity)
        return kept

    def _backfill_later(self, identity: Any) -> None:
        """Give vectors to a few entries kept without one, on the embedder's thread: nobody waits for it.

        The engine used to embed here itself; on a busy machine the embedder (nice 19) got no CPU for
        seconds, the engine thread waited, and the reply's entry was not yet written when a new process
        asked the same question (CI: an exact hit missed).  Now the entry is written first, and its
        vector follows when the embedder has run; one batch at a time.
        """
        with self._lock:
            if self.cache is None or not self._vectors_idle.is_set():
                return
            try:
                missing = self.cache.missing_vectors(identity)
            except Exception as exc:  # only similar-question hits are lost
                said(exc)
                return
            future = self.cache.embedder.submit([q for _, q in missing]) if missing else None
            if future is None:
                return
            self._vectors_idle.clear()

        def keep(done: Future[Any]) -> None:
            try:
                vectors = done.result()
                with self._lock:
                    self.cache.set_vectors(identity, [(i, v) for (i, _), v in zip(missing, vectors, strict=True)])
            except CancelledError:  # the process is ending
                pass
            except Exception as exc:  # a failed write (a full disk): those entries stay exact-only until the next try
                said(exc)
            finally:
                with self._lock:
                    self._vectors_idle.set()

        future.add_done_callback(keep)

    def drafts(self, question: str, identity: Any, limit: int = 3) -> list[list[int]]:
        """Token ids of the earlier answers nearest ``question`` (speculative drafts)."""
        if self.cache is None:
            return []
        with self._lock:
            return self.cache.nearest_drafts(question, identity, limit)

    def clear(self) -> int:
        """Delete every cached answer; returns how many went."""
        if self.cache is None:
            return 0
        with self._lock:
            return int(self.cache.clear())

    def stats(self) -> Any:
        """The cache's :class:`~engine.answer_cache.CacheStats`, or None when it is off."""
        if self.cache is None:
            return None
        with self._lock:
            return self.cache.stats()


def _identity(fields: dict[str, str]) -> Any:
    from engine.answer_cache import ModelIdentity

    return ModelIdentity(**fields)


IDENTITY_FIELDS = frozenset({"name", "weight_hash", "dtype", "quant"})


def check_known(value: Any) -> dict[str, dict[str, str]]:
    """Validator of the identities file: spec key -> {name, weight_hash, dtype, quant}, all texts."""

    def identity(_key: str, fields: Any) -> bool:
        return (
            isinstance(fields, dict)
            and fields.keys() == IDENTITY_FIELDS
            and all(isinstance(v, str) for v in fields.values())
        )

    return string_map(value, identity)


def _read_known() -> dict[str, dict[str, str]]:
    return load_state(cache_dir() / IDENTITIES_FILE, check_known) or {}
