"""Structured output: replies under a JSON schema, regex or choice list are valid by construction, and
jump-forward and speculation change no token of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from engine.answer_cache.keys import sampling_dict
from engine.api import Done, Error, Sampling, Token, Warning, reply_format
from engine.runtime import grammar
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.tiny import make_tiny_model

SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "country": {"type": "string", "maxLength": 12}},
        "required": ["city", "country"],
        "additionalProperties": False,
    },
    "nested with enums": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                },
                "required": ["name", "age", "role"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["person", "active"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "minItems": 1,
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "qty": {"enum": [1, 2, 3]}},
            "required": ["sku", "qty"],
            "additionalProperties": False,
        },
    },
    "a tool call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["C", "F"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "Describe it as JSON."}]
OSLO = '{"city": "Oslo", "country": "Norway"}'
QUOTE = [{"role": "user", "content": f"Repeat: {OSLO} {OSLO}"}]


def ask(runner: EngineRunner, fmt: str, messages: list[dict[str, str]] = ASK, **sampling: object) -> list[object]:
    values: dict[str, object] = {"max_tokens": 200, **sampling}
    return runner.run(
        messages, sampling=Sampling(format=fmt, **values), answer_cache=False, prefix_cache=False, speculative="off"
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_reply_under_a_schema_validates(tiny_engine: EngineRunner, name: str, temperature: float) -> None:
    schema = SCHEMAS[name]
    for seed in (1, 2, 3) if temperature else (None,):
        events = ask(tiny_engine, reply_format("json_schema", schema), temperature=temperature, seed=seed)
        end = done(events)
        assert end.finish_reason == "stop", (name, seed, end.text)  # the grammar ended the reply, not the limit
        jsonschema.validate(json.loads(end.text), schema)


def test_a_regex_and_a_choice_list_hold(tiny_engine: EngineRunner) -> None:
    for seed in (1, 2):
        text = done(ask(tiny_engine, reply_format("regex", r"[0-9]{3}-[a-z]{2,4}"), temperature=1.0, seed=seed)).text
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text), text
        choice = done(ask(tiny_engine, reply_format("choice", ["yes", "no", "maybe"]), temperature=1.0, seed=seed))
        assert choice.text in ("yes", "no", "maybe")


def test_the_random_model_breaks_the_format_without_it(tiny_engine: EngineRunner) -> None:
    """What the grammar is for: unconstrained, the same model writes no JSON at all."""
    text = done(ask(tiny_engine, "", max_tokens=40)).text
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_jump_forward_changes_no_token(tiny_engine: EngineRunner, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = reply_format("json_schema", SCHEMAS[name])
    with_forced = ask(tiny_engine, fmt)
    monkeypatch.setattr(grammar, "JUMP_FORWARD", False)
    without = ask(tiny_engine, fmt)
    assert token_ids(with_forced) == token_ids(without)
    assert done(without).metrics.forced == 0
    m = done(with_forced).metrics
    assert m.forced > 0  # key names, braces, quotes: the byte-level tiny tokenizer spells them one by one
    flagged = [e for e in with_forced if isinstance(e, Token) and e.forced]
    assert 0 < sum(len(e.ids) for e in flagged) <= m.forced
    assert m.drafted == 0  # forced tokens are not drafts


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    draft_dir = make_tiny_model(tmp_path_factory.mktemp("draft"), seed=1, layers=1, hidden=32)
    runner = EngineRunner(str(tiny_dir), draft=str(draft_dir))
    yield runner
    runner.close()


@pytest.mark.parametrize("source", ["lookup", "draft", "auto"])
def test_speculation_gives_the_same_constrained_output(tiny_pair: EngineRunner, source: str) -> None:
    fmt = reply_format("json_schema", SCHEMAS["flat"])
    for messages in (QUOTE, ASK):
        plain = tiny_pair.run(
            messages, sampling=Sampling(format=fmt, max_tokens=120), answer_cache=False, speculative="off"
        )
        spec = tiny_pair.run(
            messages, sampling=Sampling(format=fmt, max_tokens=120), answer_cache=False, speculative=source
        )
        assert token_ids(spec) == token_ids(plain)
        assert done(spec).metrics.drafted > 0  # drafts were made, cut to the grammar and checked under it
        jsonschema.validate(json.loads(done(spec).text), SCHEMAS["flat"])


def test_a_bad_format_is_refused_before_the_model_runs(tiny_engine: EngineRunner) -> None:
    for fmt, words in (
        (reply_format("regex", "[a-"), "not valid"),
        (reply_format("json_schema", {"type": "objectx"}), "objectx"),
        (reply_format("choice", []), "one or more"),
    ):
        events = ask(tiny_engine, fmt)
        assert not any(isinstance(e, Token) for e in events)
        errors = [e for e in events if isinstance(e, Error)]
        assert errors and words in errors[0].message, (fmt, errors)
        assert grammar.format_problems(fmt), fmt  # said by the front end's check too, with no model
    assert Sampling(format="{not json").problems()
    assert Sampling(format=json.dumps({"type": "xml"})).problems()
    assert not Sampling(format=reply_format("json_object")).problems()


def test_a_format_cut_by_max_tokens_says_the_output_is_incomplete(tiny_engine: EngineRunner) -> None:
    seen = len(tiny_engine.client.warnings)
    events = ask(tiny_engine, reply_format("json_schema", SCHEMAS["nested with enums"]), max_tokens=6)
    assert done(events).finish_reason == "length"
    warnings = [w for w in tiny_engine.client.warnings[seen:] if isinstance(w, Warning) and w.kind == "format"]
    assert warnings and "incomplete" in warnings[0].message


def test_the_answer_cache_keys_on_the_format() -> None:
    plain, shaped = Sampling(), Sampling(format=reply_format("json_object"))
    assert "format" not in sampling_dict(plain)  # free text keeps the keys answers were kept under
    assert sampling_dict(shaped)["format"] == reply_format("json_object")
    # the order of a schema's properties is the order the reply writes them in: another format
    assert reply_format("json_schema", {"b": 1, "a": 2}) != reply_format("json_schema", {"a": 2, "b": 1})


def test_a_schema_keeps_the_order_of_its_properties(tiny_engine: EngineRunner) -> None:
    names = ["zeta", "alpha", "mid"]
    schema = {
        "type": "object",
        "properties": {name: {"type": "boolean"} for name in names},
        "required": names,
        "additionalProperties": False,
    }
    text = done(ask(tiny_engine, reply_format("json_schema", schema))).text
    assert list(json.loads(text)) == names


def test_bundled_model_gives_a_city_and_its_country(bundled_engine: EngineRunner) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    for question in ("Give me a city and its country", "Name a famous city and the country it is in."):
        events = ask(bundled_engine, reply_format("json_schema", schema), [{"role": "user", "content": question}])
        end = done(events)
        assert end.finish_reason == "stop"
        value = json.loads(end.text)
        jsonschema.validate(value, schema)
        assert value["city"] and value["country"]
        assert end.metrics.forced >= 3  # '{"city": ' at least


def test_bundled_model_keeps_a_schema_it_breaks_unconstrained(bundled_engine: EngineRunner) -> None:
    """Asked for exactly three colours as a JSON list, the bundled model writes prose; under the schema,
    the list."""
    schema = {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 3, "maxItems": 3}
    messages = [{"role": "user", "content": "List three colours as a JSON array of strings."}]
    free = done(ask(bundled_engine, "", messages, max_tokens=60)).text
    with pytest.raises(ValueError):
        jsonschema.validate(json.loads(free), schema)
    end = done(ask(bundled_engine, reply_format("json_schema", schema), messages))
    jsonschema.validate(json.loads(end.text), schema)


def test_bundled_model_tool_call_under_its_schema(bundled_engine: EngineRunner) -> None:
    schema = SCHEMAS["a tool call"]
    messages = [{"role": "user", "content": "What is the weather in Paris? Call the weather tool."}]
    end = done(ask(bundled_engine, reply_format("json_schema", schema), messages))
    call = json.loads(end.text)
    jsonschema.validate(call, schema)
    assert call["name"] == "get_weather"
    assert isinstance(end, Done)


CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 12}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "clock",
        "description": "The time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,  # else a random model may write extra keys to the limit
        },
    },
}


@pytest.fixture(scope="module")
def tiny_model(tiny_dir: Path):  # noqa: ANN201
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_dir)


def test_tool_calls_are_free_text_until_a_call_opens_then_held_to_the_tools(tiny_model) -> None:  # noqa: ANN001
    import torch

    model, tok = tiny_model
    calls = grammar.compile_tool_calls([CALC, CLOCK], tok, model.config.vocab_size, frozenset({tok.eos_token_id}))
    logits = torch.randn(model.config.vocab_size)
    assert torch.equal(calls.masked(logits), logits) and calls.forced() == []  # free text: nothing held
    bad = tok.encode('<tool_call>{"name": "weather"', add_special_tokens=False)
    opener = len(tok.encode("<tool_call>", add_special_tokens=False))
    assert opener < calls.valid_prefix(bad) < len(bad)  # cut inside the name: no such tool
    calls.accept(tok.encode("Sure. <tool_call>", add_special_tokens=False))
    assert not calls.complete
    assert torch.isinf(calls.masked(logits)).sum() > 0  # inside a call only what the schemas allow
    good = tok.encode('{"name": "clock", "arguments": {"zone": "UTC"}}</tool_call>', add_special_tokens=False)
    assert calls.valid_prefix(good) == len(good)
    calls.accept(good)
    assert calls.complete and torch.equal(calls.masked(logits), logits)  # free text again


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_call_the_model_opens_is_written_under_its_tools_schema(tiny_model, temperature: float) -> None:  # noqa: ANN001
    """The random model, made to open a call, writes one the parser takes and whose arguments validate."""
    import torch

    from engine.model.kv import KVState
    from engine.runtime.speculative import Controller, PromptLookup
    from engine.runtime.steps import generate_steps
    from engine.tools.parse import parse_model_output

    model, tok = tiny_model
    for seed in (1, 2, 3):
        calls = grammar.compile_tool_calls([CALC, CLOCK], tok, model.config.vocab_size, frozenset({tok.eos_token_id}))
        prompt = tok.encode("Question: what is 2+2?\nAnswer: <tool_call>", add_special_tokens=False)
        calls.accept(tok.encode("<tool_call>", add_special_tokens=False))  # as if the reply had just opened it
        ids: list[int] = []
        for item in generate_steps(
            model,
            KVState(),
            prompt,
            Sampling(max_tokens=150, temperature=temperature, seed=seed),
            generator=torch.Generator().manual_seed(seed),
            controller=Controller(),
            drafters=[PromptLookup()],
            grammar=calls,
        ):
            ids.extend(getattr(item, "ids", ()))
            if calls.complete or len(ids) >= 150:
                break
        assert calls.complete, tok.decode(ids)
        parsed = parse_model_output("<tool_call>" + tok.decode(ids))
        assert len(parsed.calls) == 1 and not parsed.calls[0].error, tok.decode(ids)
        call = parsed.calls[0]
        tool = {"calculator": CALC, "clock": CLOCK}[call.name]
        jsonschema.validate(dict(call.arguments), tool["function"]["parameters"])
