"""The remote backend against a replay server on 127.0.0.1: each engine's recorded stream, and every fault."""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator

import pytest

from engine.api import Done, Error, Loaded, ModelSpec, Request, Sampling, Started, Token
from engine.client import Client, LoadError
from engine.remote import Limits, RemoteBackend, RemoteError, check_base_url, list_models, remote_backend
from tests.support.streams.replay import Handler, ReplayServer, events, models_of

KEY = "sk-brisk-test-0123456789abcdef"
ANSWER = "The capital of France is Paris."
QUESTION = ({"role": "user", "content": "What is the capital of France?"},)


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    s.close()


def connect(url: str, model: str = "", api_key: str | None = KEY, **options: object) -> Client:
    client = Client(remote_backend(url, None, api_key, **options), timeout=20)
    client.load(ModelSpec(source=model))
    return client


def run(client: Client, request_id: str = "r1", sampling: Sampling | None = None, **kw: object) -> list[object]:
    request = Request(id=request_id, messages=QUESTION, sampling=sampling or Sampling(), **kw)  # type: ignore[arg-type]
    return list(client.stream(request))


@pytest.mark.parametrize(
    ("engine", "model", "finish", "prompt", "cached", "has_timings"),
    [
        ("llamacpp", "SmolLM2-135M-Instruct-Q8_0.gguf", "stop", 31, 24, True),
        ("vllm", "meta-llama/Llama-3.3-70B-Instruct", "length", 45, 32, False),
        ("ollama", "smollm2:135m", "stop", 31, 0, False),
    ],
)
def test_replays_each_engines_stream(
    server: ReplayServer, engine: str, model: str, finish: str, prompt: int, cached: int, has_timings: bool
) -> None:
    server.models = models_of(f"{engine}.models.json")
    server.chat = lambda h, body: h.replay(events(f"{engine}.sse"))
    client = connect(server.url)
    assert isinstance(client.loaded, Loaded)
    assert (client.loaded.model_name, client.loaded.device) == (model, "remote")
    seen = run(client)
    assert isinstance(seen[0], Started)
    tokens = [e for e in seen if isinstance(e, Token)]
    assert [t.text for t in tokens] == ["The", " capital", " of", " France", " is", " Paris", "."]
    assert all(t.ids == () for t in tokens)
    done = seen[-1]
    assert isinstance(done, Done) and done.text == ANSWER and done.finish_reason == finish
    m = done.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (prompt, cached, 7)
    assert m.ttft_s is not None and m.total_s is not None and 0 <= m.ttft_s <= m.total_s
    assert m.tpot_p50_s is not None and m.tpot_p95_s is not None and m.tpot_p50_s <= m.tpot_p95_s
    backend = client.backend
    assert isinstance(backend, RemoteBackend) and backend.last_result is not None
    server_figures = backend.last_result.server
    assert server_figures["usage"]["prompt_tokens"] == prompt
    assert ("timings" in server_figures) == has_timings
    if has_timings:
        assert m.prefill_s == pytest.approx(0.01852) and m.computed_tokens == 7
    body = server.requests[-1]
    assert body["model"] == model and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == list(QUESTION)
    client.close()


def test_counts_deltas_when_the_server_reports_no_usage(server: ReplayServer) -> None:
    chunks = [c for c in events("ollama.sse") if b'"usage"' not in c]
    server.chat = lambda h, body: h.replay(chunks)
    client = connect(server.url, include_usage=False)
    done = run(client)[-1]
    assert isinstance(done, Done) and done.metrics.completion_tokens == 7 and done.metrics.prompt_tokens == 0
    assert "stream_options" not in server.requests[-1]
    client.close()


def test_a_server_that_refuses_stream_options_is_asked_without(server: ReplayServer) -> None:
    def chat(h: Handler, body: dict[str, object]) -> None:
        if "stream_options" in body:
            h.json(400, {"error": {"message": "Extra inputs are not permitted: stream_options"}})
        else:
            h.replay(events("ollama.sse"))

    server.chat = chat
    client = connect(server.url)
    for request_id in ("a", "b"):
        done = run(client, request_id)[-1]
        assert isinstance(done, Done) and done.text == ANSWER
    assert ["stream_options" in body for body in server.requests] == [True, False, False]
    client.close()


def test_sampling_and_history_reach_the_server(server: ReplayServer) -> None:
    client = connect(server.url, model="SmolLM2-135M-Instruct-Q8_0.gguf")
    history = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
    )
    sampling = Sampling(
        temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1, seed=5, max_tokens=33, stop=("\n\n",)
    )
    list(client.stream(Request(id="h", messages=history, sampling=sampling)))
    body = server.requests[-1]
    assert body["messages"] == list(history)
    sent = (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["stop"])
    assert sent == (0.7, 0.9, 33, 5, ["\n\n"])
    assert (body["top_k"], body["repetition_penalty"], body["repeat_penalty"]) == (40, 1.1, 1.1)
    run(client, "greedy")
    assert server.requests[-1]["temperature"] == 0 and "top_k" not in server.requests[-1]
    client.close()


def test_load_picks_the_named_model_or_says_which_exist(server: ReplayServer) -> None:
    server.models = models_of("ollama.models.json")
    assert list_models(server.url, KEY) == ["smollm2:135m", "llama3.2:1b"]
    client = connect(server.url, model="llama3.2:1b")
    assert client.loaded is not None and client.loaded.model_name == "llama3.2:1b"
    client.close()
    with pytest.raises(LoadError, match=r"no model 'nope'.*smollm2:135m, llama3\.2:1b"):
        connect(server.url, model="nope")
    server.models = (401, {"error": {"message": f"Invalid API key {KEY}"}})
    with pytest.raises(LoadError, match="401") as info:
        connect(server.url)
    assert KEY not in str(info.value)


def test_only_http_urls_are_taken() -> None:
    assert check_base_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert check_base_url("https://gpu-box.lan/v1/") == "https://gpu-box.lan/v1"
    for bad in ("ftp://host/v1", "file:///etc/passwd", "localhost:8080", "", "http://:80/v1", "http://u:pw@h/v1"):
        with pytest.raises(RemoteError):
            check_base_url(bad)
    with pytest.raises(RemoteError, match="http:// or https://"):
        RemoteBackend(lambda e: None, "ws://127.0.0.1:1/v1")


def test_a_request_before_load_fails_clearly(server: ReplayServer) -> None:
    client = Client(remote_backend(server.url), timeout=20)
    seen = run(client)
    assert isinstance(seen[-1], Error) and "no server model is loaded" in seen[-1].message
    client.close()


# -- faults --------------------------------------------------------------------------------------


def fail(server: ReplayServer, chat: object, **options: object) -> Error:
    server.chat = chat  # type: ignore[assignment]
    client = connect(server.url, **options)  # type: ignore[arg-type]
    seen = run(client)
    client.close()
    assert isinstance(seen[0], Started)
    error = seen[-1]
    assert isinstance(error, Error), error
    assert KEY not in error.message and KEY[:12] not in error.message
    return error


def partial(n: int) -> str:
    return "".join(json.loads(c[6:])["choices"][0]["delta"]["content"] for c in events("llamacpp.sse")[1 : n + 1])


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nothing listens there
    with pytest.raises(LoadError, match="Connection refused.*Is the server running"):
        connect(f"http://127.0.0.1:{port}/v1")


def test_dns_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        if host == "brisk-no-such-host.invalid":  # answered here: the test must not reach a real resolver
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    with pytest.raises(LoadError, match="DNS lookup failed"):
        connect("http://brisk-no-such-host.invalid:8080/v1", api_key=None)  # no key: plain http elsewhere is allowed


@pytest.mark.parametrize(
    ("status", "headers", "expect"),
    [
        (401, {}, r"401 Unauthorized.*API key"),
        (403, {}, r"403 Forbidden.*API key"),
        (404, {}, r"no model .*404 Not Found.*/v1/models"),
        (429, {"Retry-After": "7"}, r"busy \(429 Too Many Requests\); retry in 7 s"),
        (429, {}, r"429.*retry in a little while"),
        (500, {}, r"failed \(500\).*server's log.*CUDA out of memory"),
    ],
)
def test_status_errors(server: ReplayServer, status: int, headers: dict[str, str], expect: str) -> None:
    body = {"error": {"message": f"CUDA out of memory (key {KEY})", "code": status}}
    error = fail(server, lambda h, b: h.json(status, body, headers))
    assert error.partial_text == ""
    assert len(server.requests) == 1  # no silent retries
    assert re.search(expect, error.message), error.message


def test_stream_cut_in_the_middle_keeps_the_partial_reply(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:4]:
            h.send(chunk)
        h.cut()

    error = fail(server, chat)
    assert error.partial_text == partial(3) == "The capital of"
    assert "closed the connection in the middle" in error.message


def test_stream_that_ends_without_finishing(server: ReplayServer) -> None:
    error = fail(server, lambda h, b: h.replay(events("llamacpp.sse")[:3]))
    assert error.partial_text == "The capital" and "without finishing the reply" in error.message


@pytest.mark.parametrize(
    ("bad", "expect"),
    [
        (b'data: {"choices": [{"delta": {"content": "Par\n\n', "not valid JSON"),
        (b'data: {"choices": "Paris"}\n\n', "not a chat-completion chunk"),
        (b'data: {"object": "error", "message": "engine died", "code": 500}\n\n', "engine died"),
        (b'data: {"error": {"message": "KV cache exhausted"}}\n\n', "KV cache exhausted"),
    ],
)
def test_malformed_chunks(server: ReplayServer, bad: bytes, expect: str) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:3]:
            h.send(chunk)
        h.send(bad)
        h.end_stream()

    error = fail(server, chat)
    assert error.partial_text == "The capital" and expect in error.message


def test_server_that_stops_sending(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:3]:
            h.send(chunk)
        h.hold()

    error = fail(server, chat, limits=Limits(event_gap_s=0.5))
    assert error.partial_text == "The capital" and "stopped sending for 0.5 s" in error.message


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_closes_the_stream_at_once_and_keeps_the_text(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:4]:
            h.send(chunk)
        h.hold()  # a server that would go on generating: only the closed connection ends this

    server.chat = chat
    client = connect(server.url)
    request = Request(id="c", messages=QUESTION)
    seen = list(client.stream(request, cancel_after=4))  # Started and three tokens
    done = seen[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and done.text == "The capital of"
    assert server.disconnected.wait(10), "the server never saw the connection close"
    assert client.backend.last_result.finish_reason == "cancelled"  # type: ignore[attr-defined]
    server.chat = lambda h, b: h.replay(events("llamacpp.sse"))
    after = run(client, "next")[-1]  # the backend goes on serving
    assert isinstance(after, Done) and after.text == ANSWER
    client.close()


def test_cancel_before_the_server_answers(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.server.owner.release.wait(30)  # the headers come only when the test says
        h.replay(events("llamacpp.sse"))

    server.chat = chat
    client = connect(server.url)
    seen = list(client.stream(Request(id="early", messages=QUESTION), cancel_after=1))
    assert isinstance(seen[-1], Done) and seen[-1].finish_reason == "cancelled" and seen[-1].text == ""
    assert not server.release.is_set()  # ended while the server still held the headers
    server.release.set()
    client.close()


def test_cancel_of_a_queued_request_never_reaches_the_server(server: ReplayServer) -> None:
    client = connect(server.url)
    backend = client.backend
    backend.cancel("queued")
    seen = run(client, "queued")
    assert [type(e) for e in seen] == [Started, Done] and seen[-1].finish_reason == "cancelled"  # type: ignore[attr-defined]
    assert server.requests == []
    client.close()


# -- the key -------------------------------------------------------------------------------------


def test_the_key_is_sent_but_never_logged_or_shown(server: ReplayServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = connect(server.url)
    run(client)
    sent = [v for h in server.headers_seen for k, v in h.items() if k.lower() == "authorization"]
    assert sent and all(v == f"Bearer {KEY}" for v in sent)
    assert KEY not in repr(client.backend)
    echoed = f"Incorrect API key provided: {KEY[:10]}...{KEY[-4:]}"
    server.chat = lambda h, b: h.json(401, {"error": {"message": echoed}})
    error = run(client)[-1]
    assert isinstance(error, Error) and KEY[:10] not in error.message
    client.close()
    assert KEY not in caplog.text and KEY[:12] not in caplog.text


def test_figures_the_server_reported_are_labelled_as_the_server_s() -> None:
    from engine.remote.metrics import ReplyStats

    stats = ReplyStats(t0=0.0)
    stats.times = [0.1, 0.2, 0.3]
    stats.usage = {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}}
    m = stats.metrics(0.4)
    assert (m.prompt_tokens, m.cached_tokens, m.computed_tokens) == (40, 32, 8)
    assert {"prompt_tokens", "cached_tokens", "computed_tokens", "completion_tokens"} <= set(m.server_reported)
    assert "ttft_s" not in m.server_reported and m.ttft_s == 0.1  # measured here, not reported
    assert m.server is not None and m.server["usage"]["prompt_tokens"] == 40

    bare = ReplyStats(t0=0.0)
    bare.times = [0.1]
    assert bare.metrics(0.2).server_reported == () and bare.metrics(0.2).server is None


def test_a_chat_with_documents_says_the_server_is_not_given_them(server: ReplayServer) -> None:
    from engine.api import Warning

    client = connect(server.url, model="SmolLM2-135M-Instruct-Q8_0.gguf")
    out = run(client, "docs", documents=("a" * 64,))
    assert isinstance(out[-1], Done)
    (warning,) = [w for w in client.warnings if isinstance(w, Warning) and w.kind == "documents"]
    assert server.url in warning.message and "local model" in warning.message
    run(client, "plain")
    assert len([w for w in client.warnings if w.kind == "documents"]) == 1
    client.close()
