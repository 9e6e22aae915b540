"""llama-server's ``return_progress`` and ``timings_per_token`` (engine.server.live), and the ``brisk`` field's
phases (engine.server.shapes.phases), on the tiny model over real HTTP: raw HTTP for llama.cpp's
``/completion``, the ``openai`` SDK for the OpenAI paths.  The tiny model's tokenizer is byte-level, so a
prompt of 400 characters is about 400 tokens: two prefill chunks of ``PREFILL_CHUNK`` (256)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from engine.runtime.steps import PREFILL_CHUNK
from tests.support.server import Served


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def long_prompt(tag: str, chars: int = 400) -> str:
    """A prompt of ``chars`` characters that no other test's prompt shares a prefix with."""
    text = f"{tag}: " + "the quick brown fox jumps over the lazy dog, " * 20
    return text[:chars]


def sse(served: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", served.root + path, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def check_progress(progress: list[dict[str, Any]], total: int) -> None:
    """Monotonic, ending with the whole prompt read; ``cache`` the same in each."""
    assert progress, "no prompt_progress chunk"
    assert all(p["total"] == total and p["cache"] == progress[0]["cache"] for p in progress)
    assert progress[0]["processed"] == progress[0]["cache"]  # the reading starts with the cached tokens in
    processed = [p["processed"] for p in progress]
    assert processed == sorted(processed) and processed[-1] == total
    times = [p["time_ms"] for p in progress]
    assert times == sorted(times) and times[0] >= 0


def test_completion_streams_progress_before_the_first_token(served: Served) -> None:
    prompt = long_prompt("completion")
    body = {"prompt": prompt, "n_predict": 6, "stream": True, "cache_prompt": False}
    plain = sse(served, "/completion", body)
    chunks = sse(served, "/completion", {**body, "return_progress": True})
    assert not any("prompt_progress" in c for c in plain)  # only a client that asks gets them
    first_token = next(i for i, c in enumerate(chunks) if c["tokens"])
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert all("prompt_progress" in c for c in chunks[:first_token])
    assert all("prompt_progress" not in c for c in chunks[first_token:])
    assert all(c["content"] == "" and c["tokens"] == [] and c["stop"] is False for c in chunks[:first_token])
    total = chunks[-1]["tokens_evaluated"]
    assert total > PREFILL_CHUNK
    check_progress(progress, total)
    assert progress[0]["cache"] == 0  # cache_prompt false: nothing taken from the prefix cache
    # one at the start, one per prefill chunk
    assert [p["processed"] for p in progress] == [0, *range(PREFILL_CHUNK, total, PREFILL_CHUNK), total]
    text = "".join(c["content"] for c in chunks)
    assert text == "".join(c["content"] for c in plain) and text  # greedy: the same reply


def test_a_repeated_prompt_counts_its_prefix_cache_hit(served: Served) -> None:
    body = {"prompt": long_prompt("repeated"), "n_predict": 4, "stream": True, "return_progress": True}
    cold = [c["prompt_progress"] for c in sse(served, "/completion", body) if "prompt_progress" in c]
    chunks = sse(served, "/completion", body)
    warm = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    total = chunks[-1]["tokens_evaluated"]
    check_progress(cold, total)
    check_progress(warm, total)
    assert cold[0]["cache"] == 0
    assert total - PREFILL_CHUNK < warm[0]["cache"] < total  # the prompt's KV but its last token's (its logits)
    assert chunks[-1]["tokens_cached"] == chunks[-1]["timings"]["cache_n"] == warm[0]["cache"]
    assert len(warm) == 2  # the start, and the one chunk left to compute


def test_chat_streams_progress_with_the_same_text(served: Served) -> None:
    api = served.openai()
    messages = [{"role": "user", "content": long_prompt("chat", 300)}]
    asked = {"model": served.service.model, "messages": messages, "max_tokens": 8, "stream": True}
    plain = list(api.chat.completions.create(**asked))
    chunks = list(api.chat.completions.create(**asked, extra_body={"return_progress": True}))
    progress = [c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in (c.model_extra or {})]
    first_text = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    assert progress and all("prompt_progress" not in (c.model_extra or {}) for c in chunks[first_text:])
    check_progress(progress, progress[-1]["total"])
    assert len(progress) >= 2 and progress[-1]["total"] > PREFILL_CHUNK

    def text(stream: list[Any]) -> str:
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert text(chunks) == text(plain) and text(plain)


def test_legacy_completions_stream_progress_before_the_text(served: Served) -> None:
    api = served.openai()
    prompt = long_prompt("legacy", 300)
    legacy = list(
        api.completions.create(
            model=served.service.model, prompt=prompt, max_tokens=6, stream=True, extra_body={"return_progress": True}
        )
    )
    progress = [c.model_extra["prompt_progress"] for c in legacy if "prompt_progress" in (c.model_extra or {})]
    check_progress(progress, progress[-1]["total"])
    assert legacy[len(progress)].choices[0].text  # the first text right after the progress chunks


def test_timings_per_token_are_on_every_chunk(served: Served) -> None:
    body = {"prompt": long_prompt("timings", 200), "n_predict": 6, "stream": True, "timings_per_token": True}
    chunks = sse(served, "/completion", body)
    assert all("timings" in c for c in chunks)
    pieces = [c for c in chunks if c["tokens"]]
    assert [c["timings"]["predicted_n"] for c in pieces] == [c["tokens_predicted"] for c in pieces]
    last = chunks[-1]["timings"]
    assert last["predicted_n"] == 6 and last["prompt_n"] + last["cache_n"] == chunks[-1]["tokens_evaluated"]
    assert all(c["timings"]["prompt_n"] == last["prompt_n"] for c in pieces)
    assert pieces[-1]["timings"]["predicted_ms"] >= pieces[0]["timings"]["predicted_ms"] == 0

    api = served.openai()
    messages = [{"role": "user", "content": "timings, please"}]
    stream = api.chat.completions.create(
        model=served.service.model,
        messages=messages,
        max_tokens=5,
        stream=True,
        extra_body={"timings_per_token": True, "return_progress": True},
    )
    chunks = list(stream)
    role = [bool(c.choices and c.choices[0].delta.role) for c in chunks]  # llama-server's: no timings on these
    assert role[0] and [("timings" in c.model_extra) for c in chunks] == [not r for r in role]
    assert (
        chunks[-1].model_extra["timings"]["predicted_n"]
        == chunks[-1].model_extra["brisk"]["phases"]["decode"]["tokens"]
    )


def test_the_brisk_phases_add_up(served: Served) -> None:
    api = served.openai()
    messages = [{"role": "user", "content": long_prompt("phases", 300)}]
    reply = api.chat.completions.create(model=served.service.model, messages=messages, max_tokens=8)
    phases = reply.model_extra["brisk"]["phases"]
    prefill, decode = phases["prefill"], phases["decode"]
    assert prefill["computed_tokens"] + prefill["cached_tokens"] == reply.usage.prompt_tokens
    assert prefill["cached_tokens"] == reply.usage.prompt_tokens_details.cached_tokens
    assert decode["tokens"] == reply.usage.completion_tokens == 8
    assert prefill["ms"] > 0 and decode["ms"] > 0 and prefill["tokens_per_s"] > 0 and decode["tokens_per_s"] > 0
    assert prefill["ms"] + decode["ms"] <= phases["total_ms"]
    before_first = phases["queue"]["ms"] + phases["prompt"]["ms"] + phases["cache_lookup"]["ms"] + prefill["ms"]
    assert before_first <= phases["ttft_ms"] <= phases["total_ms"]
    assert phases["drafting"]["drafted"] >= phases["drafting"]["accepted"] >= 0


def test_anthropic_answers_carry_the_phases(served: Served) -> None:
    body = {"max_tokens": 6, "messages": [{"role": "user", "content": "phases on the Messages API"}]}
    message = httpx.post(served.root + "/v1/messages", json=body, timeout=120).json()
    phases = message["brisk"]["phases"]
    assert phases["decode"]["tokens"] == message["usage"]["output_tokens"]
    assert phases["prefill"]["computed_tokens"] == message["usage"]["input_tokens"]
    assert phases["prefill"]["ms"] + phases["decode"]["ms"] <= phases["total_ms"]
    with httpx.stream("POST", served.root + "/v1/messages", json={**body, "stream": True}, timeout=120) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["brisk"]["phases"]["decode"]["tokens"] == delta["usage"]["output_tokens"]
