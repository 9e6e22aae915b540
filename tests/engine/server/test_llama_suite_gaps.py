"""What llama.cpp's own server tests (``brisk bench peer-suite``) found missing on the OpenAI chat path, on
the tiny model over real HTTP: llama-server's ``grammar`` / ``json_schema``, ``verbose``, ``id_slot``,
``/chat/completions/input_tokens`` and ``/apply-template``'s ``add_generation_prompt``; a stream's role chunk
with ``content: null`` and no ``timings``; two assistant messages ending the list refused; and a request
that asks for ``return_progress`` read from its prompt, never from the answer cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from engine.api import Sampling
from engine.server import shapes
from tests.support.server import Served

HELLO = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def chat(served: Served, body: dict[str, Any], path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(served.root + path, json={"messages": HELLO, "max_tokens": 6, **body}, timeout=120)


def sse(served: Served, body: dict[str, Any]) -> list[dict[str, Any]]:
    full = {"messages": HELLO, "max_tokens": 4, "stream": True, **body}
    with httpx.stream("POST", served.root + "/chat/completions", json=full, timeout=120) as response:
        assert response.status_code == 200, response.read()
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_chat_takes_llama_cpps_grammar_and_json_schema(served: Served) -> None:
    constrained = chat(served, {"grammar": 'root ::= "a"{5,5}'})
    assert constrained.status_code == 200, constrained.text
    assert constrained.json()["choices"][0]["message"]["content"] == "aaaaa"
    schema = chat(served, {"json_schema": {"const": "42"}, "max_tokens": 8})
    assert schema.status_code == 200 and schema.json()["choices"][0]["message"]["content"] == '"42"'
    broken = chat(served, {"grammar": "root ::= this is (not valid GBNF"})
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "grammar"
    both = chat(served, {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}})
    assert both.status_code == 400 and both.json()["error"]["param"] == "grammar"


def test_id_slot_is_taken_and_said_with_several_choices(served: Served) -> None:
    answer = chat(served, {"n": 2, "id_slot": 0})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"]) == 2 and answer.headers["x-brisk-ignored"] == "id_slot"


def test_input_tokens_counts_the_prompt_a_reply_reads(served: Served) -> None:
    usage = chat(served, {"max_tokens": 2}).json()["usage"]
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        counted = httpx.post(served.root + path, json={"messages": HELLO})
        assert counted.status_code == 200, counted.text
        assert counted.json() == {"input_tokens": usage["prompt_tokens"]}
    refused = httpx.post(served.root + "/chat/completions/input_tokens", json={"messages": []})
    assert refused.status_code == 400


def test_two_assistant_messages_ending_the_list_are_refused(served: Served) -> None:
    turns = [{"role": "user", "content": "test"}, {"role": "assistant", "content": "test"}]
    refused = httpx.post(served.url + "/chat/completions", json={"messages": [*turns, turns[1]]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[2]"
    assert httpx.post(served.url + "/chat/completions", json={"messages": turns, "max_tokens": 2}).status_code == 200


def test_the_role_chunk_has_null_content_and_no_timings(served: Served) -> None:
    chunks = sse(served, {"timings_per_token": True, "stream_options": {"include_usage": True}})
    first = chunks[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None} and "timings" not in first
    assert all("timings" in c for c in chunks[1:]) and chunks[-1]["usage"]["completion_tokens"] == 4


def test_verbose_gives_the_prompt_as_rendered(served: Served) -> None:
    template = httpx.post(served.root + "/apply-template", json={"messages": HELLO}).json()["prompt"]
    answer = chat(served, {"verbose": True}).json()
    assert answer["__verbose"]["prompt"] == template  # the prompt the model read: "Book" in the system turn
    assert answer["__verbose"]["content"] == answer["choices"][0]["message"]["content"]
    assert "__verbose" not in chat(served, {"verbose": False}).json()
    last = [c for c in sse(served, {"verbose": True}) if c["choices"]][-1]
    assert last["choices"][0]["finish_reason"] and last["__verbose"]["prompt"] == template


def test_apply_template_can_leave_out_the_generation_prompt(served: Served) -> None:
    def prompt(body: dict[str, Any]) -> str:
        answer = httpx.post(served.root + "/apply-template", json={"messages": HELLO, **body})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["prompt"])

    with_it, without = prompt({}), prompt({"add_generation_prompt": False})
    assert prompt({"add_generation_prompt": True}) == with_it
    assert with_it.startswith(without) and len(with_it) > len(without)


def test_return_progress_reads_the_prompt_not_the_answer_cache() -> None:
    body = {"messages": HELLO, "stream": True}
    plain, _ = shapes.chat_request(body, "m", Sampling(), 2048, "off")
    watched, _ = shapes.chat_request({**body, "return_progress": True}, "m", Sampling(), 2048, "off")
    assert plain.answer_cache and not watched.answer_cache


def test_completion_takes_llama_servers_json_prompt(served: Served) -> None:
    def completion(prompt: Any) -> httpx.Response:
        return httpx.post(served.root + "/completion", json={"prompt": prompt, "n_predict": 4}, timeout=120)

    plain = completion("The cat sat on the").json()["content"]
    assert completion({"prompt_string": "The cat sat on the"}).json()["content"] == plain
    assert completion([{"prompt_string": "The cat sat on the"}]).json()["content"] == plain
    vision = completion({"prompt_string": "a <__media__>", "multimodal_data": "iVBORw0KGgo="})
    assert vision.status_code == 400 and vision.json()["error"]["param"] == "prompt"
    assert completion({"text": "The cat"}).status_code == 400


def test_slots_shows_the_batch_and_what_runs_in_it(served: Served) -> None:
    from engine.runtime.batching import MAX_ACTIVE

    slots = httpx.get(served.root + "/slots").json()
    assert [s["id"] for s in slots] == list(range(MAX_ACTIVE))
    assert not any(s["is_processing"] for s in slots) and slots[0]["n_ctx"] > 0
    body = {"messages": HELLO, "max_tokens": 24, "stream": True}
    with httpx.stream("POST", served.root + "/chat/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        next(lines)  # the reply has started: its request is in flight
        busy = httpx.get(served.root + "/slots").json()
        list(lines)
    assert [s["is_processing"] for s in busy] == [True] + [False] * (MAX_ACTIVE - 1)


def test_completion_bias_by_text_and_every_field_for_an_empty_list(served: Served) -> None:
    def completion(extra: dict[str, Any]) -> dict[str, Any]:
        body = {"prompt": "The cat sat on the", "n_predict": 4, "temperature": 0, **extra}
        answer = httpx.post(served.root + "/completion", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    plain = completion({})
    first = plain["content"][:1]  # the tiny model's tokens are bytes: this text is its first token
    ids = httpx.post(served.root + "/tokenize", json={"content": first}).json()["tokens"]
    by_text = completion({"logit_bias": [[first, -100]]})["content"]
    assert by_text == completion({"logit_bias": [[i, -100] for i in ids]})["content"] != plain["content"]
    assert not by_text.startswith(first)
    every = completion({"response_fields": []})
    assert every["content"] == plain["content"] and "generation_settings" in every
