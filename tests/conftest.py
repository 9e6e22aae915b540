"""Shared test set-up: offscreen Qt, a private data folder, tiny and bundled models."""

from __future__ import annotations

import os
import queue
import sys
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One data folder per test session, so the bundled model is converted once per run.
os.environ["BRISK_DATA_DIR"] = tempfile.mkdtemp(prefix="brisk-test-")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
from tiny import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


class EngineRunner:
    """Drives a real Engine synchronously: submit a request, collect its events."""

    def __init__(
        self, source: str, draft: str = "", draft_quant: str = "none", quant: str = "none", **options: object
    ) -> None:
        from engine.engine import Engine, EngineOptions, ModelSpec
        from engine.events import Loaded, LoadFailed

        self.events: queue.Queue[object] = queue.Queue()
        self.engine = Engine(self.events.put, EngineOptions(**options))  # type: ignore[arg-type]
        spec = ModelSpec(source=source, dtype="float32", quant=quant, draft=draft, draft_quant=draft_quant)
        self.engine.load(spec)
        while True:
            event = self.events.get(timeout=300)
            if isinstance(event, Loaded | LoadFailed):
                self.load_event = event
                break
        self.draft_error = None
        if isinstance(self.load_event, Loaded) and "draft_error" in self.load_event.info:
            self.draft_error = self.events.get(timeout=10)  # the LoadFailed that explains it

    def run(self, messages: list[dict[str, str]], cancel_after: int | None = None, **kwargs: object) -> list[object]:
        from engine.events import Done, Error, Request, Sampling, Token

        sampling = kwargs.pop("sampling", Sampling(max_tokens=24))
        request = Request(id=uuid.uuid4().hex, messages=tuple(messages), sampling=sampling, **kwargs)  # type: ignore[arg-type]
        self.engine.submit(request)
        out: list[object] = []
        tokens = 0
        while True:
            event = self.events.get(timeout=300)
            out.append(event)
            if isinstance(event, Token):
                tokens += 1
                if cancel_after is not None and tokens == cancel_after:
                    self.engine.cancel(request.id)
            if isinstance(event, Done | Error):
                return out

    def close(self) -> None:
        self.engine.shutdown()


def token_ids(events: list[object]) -> list[int]:
    from engine.events import Token

    return [i for e in events if isinstance(e, Token) for i in e.ids]


def done(events: list[object]):  # noqa: ANN201
    from engine.events import Done

    last = events[-1]
    assert isinstance(last, Done), f"expected Done, got {last!r}"
    return last


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir: Path):
    runner = EngineRunner(str(tiny_dir))
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def bundled_engine():
    runner = EngineRunner("")
    yield runner
    runner.close()


@pytest.fixture
def brisk_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder for one test (settings.json, brisk.db); GUI tests use it."""
    data = tmp_path / "brisk-data"
    data.mkdir()
    monkeypatch.setenv("BRISK_DATA_DIR", str(data))
    return data
