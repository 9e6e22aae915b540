"""Drives a real Engine through the shared synchronous client, for the engine tests: ``EngineRunner``, and
readers of the events it collects (``token_ids``, ``done``), and ``settle_hints`` (wait for queued hints' prefill)."""

from __future__ import annotations

import threading
import time
import uuid


class EngineRunner:
    """Drives a real Engine through the shared synchronous client: submit a request, collect its events."""

    def __init__(
        self, source: str, draft: str = "", draft_quant: str = "none", quant: str = "none", **options: object
    ) -> None:
        from engine.api import AnswerCacheSettings, Loaded, LoadFailed, ModelSpec
        from engine.client import Client, LoadError, local_backend

        # Engine tests compare replies of the model itself: the answer cache (and its embedding
        # model) stays off unless a test asks for it.
        options.setdefault("answer_cache", AnswerCacheSettings(enabled=False))
        self.client = Client(local_backend(**options), timeout=300)
        self.engine = self.client.backend
        spec = ModelSpec(source=source, dtype="float32", quant=quant, draft=draft, draft_quant=draft_quant)
        self.load_event: Loaded | LoadFailed
        try:
            self.load_event = self.client.load(spec)
        except LoadError as exc:
            self.load_event = LoadFailed(str(exc))
        self.draft_error = next((w for w in self.client.warnings if w.kind == "draft"), None)

    def run(self, messages: list[dict[str, str]], cancel_after: int | None = None, **kwargs: object) -> list[object]:
        from engine.api import Request, Sampling, Token

        sampling = kwargs.pop("sampling", Sampling(max_tokens=24))
        request = Request(id=uuid.uuid4().hex, messages=tuple(messages), sampling=sampling, **kwargs)  # type: ignore[arg-type]
        out: list[object] = []
        tokens = 0
        for event in self.client.stream(request):
            out.append(event)
            if isinstance(event, Token):
                tokens += 1
                if cancel_after is not None and tokens == cancel_after:
                    self.engine.cancel(request.id)
        return out

    def close(self) -> None:
        self.client.close()


def token_ids(events: list[object]) -> list[int]:
    from engine.api import Token

    return [i for e in events if isinstance(e, Token) for i in e.ids]


def done(events: list[object]):  # noqa: ANN201
    from engine.api import Done

    last = events[-1]
    assert isinstance(last, Done), f"expected Done, got {last!r}"
    return last


def settle_hints(runner: EngineRunner, limit_s: float = 60.0) -> None:
    """Wait until the engine has taken the hints queued and prefilled all they ask."""
    engine = runner.engine

    def turn() -> None:  # an item queued after the hints: run once they are taken
        reached = threading.Event()
        engine.call(lambda _engine: reached.set())  # type: ignore[attr-defined]
        assert reached.wait(limit_s), "the engine did not get to the end of its queue"

    turn()
    began = time.monotonic()
    while engine.hints.pending():  # type: ignore[attr-defined]
        assert time.monotonic() - began < limit_s, "the hint did not finish"
        time.sleep(0.01)
    turn()  # the last chunk's step has returned (its entry is in the cache)
