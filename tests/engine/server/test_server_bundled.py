"""The server on the real bundled model: greedy replies equal to the engine's own, token for token, streamed
through the official SDK; a client that leaves mid-reply cancels it (the bundled model is slow enough to leave
in the middle)."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx2 as httpx
import pytest

from engine.api import Done, Request, Sampling
from tests.support.server import Served

pytestmark = pytest.mark.bundled
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


@pytest.fixture(scope="module")
def served():
    server = Served("")
    yield server
    server.close()


def ended_cancelled(served: Served):  # noqa: ANN201
    """The last request, once nothing is in flight: it must have ended cancelled, by the engine."""
    deadline = time.monotonic() + 10
    while served.hub.log.snapshot()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    running, recent, _ = served.hub.log.snapshot()
    assert not running
    assert recent[0].status == "cancelled" and recent[0].finish == "cancelled"
    return recent[0]


def test_streamed_reply_is_the_engines_own(served: Served) -> None:
    messages = [{"role": "user", "content": "Name three uses of copper."}]
    events = list(served.client.stream(Request(uuid.uuid4().hex, tuple(messages), Sampling(max_tokens=48))))
    expected = events[-1]
    assert isinstance(expected, Done)
    stream = served.openai().chat.completions.create(
        model=served.service.model,
        messages=messages,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == expected.metrics.completion_tokens


def test_a_client_that_leaves_cancels_its_request(served: Served) -> None:
    body = {"messages": LONG, "max_tokens": 1500, "stream": True}
    with httpx.stream("POST", served.url + "/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    assert ended_cancelled(served).completion_tokens < 1500


def test_non_streamed_client_that_leaves_cancels(served: Served) -> None:
    body = json.dumps({"messages": LONG, "max_tokens": 1500}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", served.thread.port)) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 10
        while not served.hub.log.snapshot()[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
    ended_cancelled(served)


def test_llama_cpps_completion_is_the_same_reply(served: Served) -> None:
    """On the real model: /completion equals /v1/completions, and /completion on /apply-template's prompt
    equals /v1/chat/completions (greedy, token for token)."""
    prompt = "The three primary colours are"
    openai_style = httpx.post(served.url + "/completions", json={"prompt": prompt, "max_tokens": 24}, timeout=120)
    llama_style = httpx.post(served.root + "/completion", json={"prompt": prompt, "n_predict": 24}, timeout=120)
    assert llama_style.json()["content"] == openai_style.json()["choices"][0]["text"]
    assert llama_style.json()["tokens_evaluated"] == openai_style.json()["usage"]["prompt_tokens"]
    messages = [{"role": "user", "content": "Name three uses of copper."}]
    chat = httpx.post(served.url + "/chat/completions", json={"messages": messages, "max_tokens": 24}, timeout=120)
    templated = httpx.post(served.root + "/apply-template", json={"messages": messages}).json()["prompt"]
    again = httpx.post(served.root + "/completion", json={"prompt": templated, "n_predict": 24}, timeout=120)
    assert again.json()["content"] == chat.json()["choices"][0]["message"]["content"]
