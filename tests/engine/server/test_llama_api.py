"""llama.cpp's own endpoints (engine.server.llama_api) on the tiny model over real HTTP, as its clients call
them (raw HTTP): ``/completion`` against ``/v1/completions``, streamed in llama.cpp's shape; ``/tokenize``,
``/detokenize``, ``/apply-template`` and ``/props`` against the model's own tokenizer; fields refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.support.server import Served

PROMPT = "The cat sat on the"


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def post(served: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.root + path, json=body, timeout=120)


def completion(served: Served, body: dict) -> dict:
    response = post(served, "/completion", body)
    assert response.status_code == 200, response.text
    return response.json()


def sse(served: Served, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", served.root + path, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        return [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]


def test_completion_is_v1_completions_in_llama_cpps_shape(served: Served) -> None:
    openai_style = post(served, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10}).json()
    answer = completion(served, {"prompt": PROMPT, "n_predict": 10, "return_tokens": True})
    assert answer["content"] == openai_style["choices"][0]["text"]  # greedy: the same reply
    assert answer["stop"] is True and answer["stop_type"] == "limit" and answer["stopping_word"] == ""
    assert answer["tokens_predicted"] == openai_style["usage"]["completion_tokens"] == len(answer["tokens"]) == 10
    assert answer["tokens_evaluated"] == openai_style["usage"]["prompt_tokens"]
    assert answer["model"] == served.service.model and answer["prompt"] == PROMPT
    assert answer["generation_settings"]["n_predict"] == 10 and answer["generation_settings"]["n_ctx"] > 0
    timings = answer["timings"]
    assert timings["predicted_n"] == 10 and timings["prompt_n"] + timings["cache_n"] == answer["tokens_evaluated"]
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0
    detokenized = post(served, "/detokenize", {"tokens": answer["tokens"]}).json()["content"]
    assert detokenized == answer["content"]


def test_streamed_completion_sends_pieces_then_one_last_object(served: Served) -> None:
    expected = completion(served, {"prompt": PROMPT, "n_predict": 6})
    lines = sse(served, "/completion", {"prompt": PROMPT, "n_predict": 6, "stream": True})
    assert "[DONE]" not in lines  # llama.cpp sends none on /completion
    chunks = [json.loads(line) for line in lines]
    pieces, last = chunks[:-1], chunks[-1]
    assert pieces and all(p["stop"] is False and isinstance(p["tokens"], list) for p in pieces)
    assert "".join(p["content"] for p in pieces) == expected["content"]
    assert [p["tokens_predicted"] for p in pieces] == list(
        range(len(pieces[0]["tokens"]), len(pieces[0]["tokens"]) * len(pieces) + 1, len(pieces[0]["tokens"]))
    )
    assert last["stop"] is True and last["content"] == ""
    assert last["tokens_predicted"] == 6 and last["tokens_evaluated"] == expected["tokens_evaluated"]
    assert last["timings"]["predicted_n"] == 6 and last["stop_type"] == "limit"


def test_a_stop_text_ends_the_reply_and_is_named(served: Served) -> None:
    free = completion(served, {"prompt": PROMPT, "n_predict": 8})["content"]
    stop = free[3:5]
    answer = completion(served, {"prompt": PROMPT, "n_predict": 8, "stop": [stop]})
    assert answer["content"] == free[: free.find(stop)]
    assert answer["stop_type"] == "word" and answer["stopping_word"] == stop


def test_a_prompt_of_token_ids_is_the_same_prompt(served: Served) -> None:
    ids = post(served, "/tokenize", {"content": PROMPT}).json()["tokens"]
    assert (
        completion(served, {"prompt": ids, "n_predict": 6})["content"]
        == (completion(served, {"prompt": PROMPT, "n_predict": 6})["content"])
    )
    # ids the tokenizer would not make of their own text (a control token spelled out in characters)
    spelled = post(served, "/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
    refused = post(served, "/completion", {"prompt": spelled, "n_predict": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"


def test_tokenize_and_detokenize_use_the_models_tokenizer(served: Served, tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Hello world <|im_start|> é"
    ids = post(served, "/tokenize", {"content": text}).json()["tokens"]
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert special in ids
    plain = post(served, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert special not in plain and post(served, "/detokenize", {"tokens": plain}).json()["content"] == text
    pieces = post(served, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert joined.decode() == text
    assert any(isinstance(p["piece"], list) for p in pieces)  # "é" is two byte tokens: each a list of bytes
    assert post(served, "/detokenize", {"tokens": ids}).json()["content"] == text
    assert post(served, "/detokenize", {"tokens": [10**9]}).status_code == 400


def test_apply_template_gives_the_prompt_a_chat_reply_reads(served: Served) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = post(served, "/apply-template", {"messages": messages}).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.") and prompt.endswith("<|im_start|>assistant\n")
    chat = post(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 8}).json()
    answer = completion(served, {"prompt": prompt, "n_predict": 8})
    assert answer["content"] == chat["choices"][0]["message"]["content"]
    assert answer["tokens_evaluated"] == chat["usage"]["prompt_tokens"]


def test_props_describe_the_loaded_model(served: Served, tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    props = httpx.get(served.root + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == served.service.context > 0
    assert props["default_generation_settings"]["params"]["n_predict"] == served.service.defaults.max_tokens
    assert Path(props["model_path"]).resolve() == tiny_dir.resolve()
    assert props["model_alias"] == served.service.model and props["total_slots"] >= 1
    assert props["chat_template"] == AutoTokenizer.from_pretrained(tiny_dir).chat_template


def test_grammar_and_json_schema_constrain_the_reply(served: Served) -> None:
    answer = completion(served, {"prompt": PROMPT, "grammar": 'root ::= "yes" | "no"', "n_predict": -1})
    assert answer["content"] in ("yes", "no") and answer["stop_type"] == "eos"
    # n_predict -1: up to the rest of the context
    assert answer["generation_settings"]["n_predict"] == served.service.context - answer["tokens_evaluated"]
    lark = completion(served, {"prompt": PROMPT, "grammar": 'start: "maybe"', "n_predict": 8})
    assert lark["content"] == "maybe"
    schema = {"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"]}
    shaped = completion(served, {"prompt": PROMPT, "json_schema": schema, "n_predict": 30})
    assert json.loads(shaped["content"])["a"] in (1, 2)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completion", {"prompt": PROMPT, "n_probs": 21}, "n_probs"),
        ("/completion", {"prompt": PROMPT, "logit_bias": [[1, 500]]}, "logit_bias"),
        ("/completion", {"prompt": PROMPT, "min_p": 0.05}, "min_p"),
        ("/completion", {"prompt": PROMPT, "samplers": ["top_k", "min_p"]}, "samplers"),
        ("/completion", {"prompt": PROMPT, "mirostat": 2}, "mirostat"),
        ("/completion", {"prompt": PROMPT, "grammar": "root ::= (", "n_predict": 2}, "grammar"),
        ("/completion", {"prompt": PROMPT, "grammar": 'root ::= "a"', "json_schema": {}}, "grammar"),
        ("/completion", {"prompt": PROMPT, "n_predict": 0}, "n_predict"),
        ("/completion", {"prompt": ["one", "two"]}, "prompt"),
        ("/tokenize", {"content": "hi", "bos": True}, "bos"),
        ("/detokenize", {"tokens": "hi"}, "tokens"),
        ("/apply-template", {"messages": [], "continue_final_message": True}, "continue_final_message"),
    ],
)
def test_what_brisk_lacks_is_refused_by_name(served: Served, path: str, body: dict, param: str) -> None:
    refused = post(served, path, body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param


def test_llama_cpps_defaults_for_what_brisk_lacks_are_taken(served: Served) -> None:
    offs = {"min_p": 0, "typical_p": 1.0, "n_probs": 0, "mirostat": 0, "ignore_eos": False, "repeat_last_n": 64}
    assert completion(served, {"prompt": PROMPT, "n_predict": 4, "seed": -1, "cache_prompt": True, **offs})
