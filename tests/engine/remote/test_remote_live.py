"""Opt-in: the remote backend against a live OpenAI-compatible server (docs/SCALE.md says how to start one).

Skipped unless ``BRISK_TEST_SERVER_URL`` is set (for example ``http://127.0.0.1:8080/v1``);
``BRISK_TEST_SERVER_MODEL`` picks the server's model (default: the first it lists) and
``BRISK_API_KEY`` is sent as the key when set.  Asserts only what any model must do.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from engine.api import Done, ModelSpec, Request, Sampling, Token
from engine.client import Client
from engine.remote import list_models, remote_backend

URL = os.environ.get("BRISK_TEST_SERVER_URL", "")
pytestmark = pytest.mark.skipif(not URL, reason="set BRISK_TEST_SERVER_URL to run against a live server")


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    c = Client(remote_backend(URL, None, os.environ.get("BRISK_API_KEY") or None), timeout=300)
    c.load(ModelSpec(source=os.environ.get("BRISK_TEST_SERVER_MODEL", "")))
    yield c
    c.close()


def test_lists_models() -> None:
    assert list_models(URL, os.environ.get("BRISK_API_KEY") or None)


def test_ask_and_chat_with_history(client: Client) -> None:
    first = client.ask([{"role": "user", "content": "Say hello."}], Sampling(max_tokens=16))
    assert first.text and first.metrics.completion_tokens > 0 and first.metrics.ttft_s is not None
    history = [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Now say it again."},
    ]
    second = client.ask(history, Sampling(max_tokens=16))
    assert second.text and second.finish_reason in ("stop", "length")
    assert second.metrics.prompt_tokens == 0 or second.metrics.prompt_tokens > first.metrics.prompt_tokens


def test_cancel_keeps_the_partial_reply(client: Client) -> None:
    request = Request(
        id=uuid.uuid4().hex,
        messages=({"role": "user", "content": "Count from 1 to 500, one number per line."},),
        sampling=Sampling(max_tokens=400),
    )
    events = list(client.stream(request, cancel_after=4))  # Started and three tokens
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert done.text == "".join(e.text for e in events if isinstance(e, Token)) and done.text
