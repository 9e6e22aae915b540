"""llama.cpp's ``/infill`` (engine.server.llama_api, engine.server.infill): the prompt laid out token for token
as llama-server's ``format_infill`` lays it out, over real HTTP on a tiny model given Qwen2.5-Coder's FIM
tokens; the request llama.vim sends answered (its ``samplers``, ``n_indent``, time limits and
``response_fields``); a model without FIM tokens refused with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from engine.server.infill import FAMILIES, Chunk, cut_indent, fim_ids, fim_tokens
from tests.support.server import Served
from tests.support.tiny import make_tiny_model

QWEN = list(FAMILIES[0]) + ["<|fim_pad|>"]


def merging_tokenizer() -> Any:
    """A byte-level BPE with Qwen's FIM tokens and two merges across what llama-server tokenises apart
    (two newlines; a space and ``x``), so a prompt tokenised as one text differs from llama-server's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {name: i for i, name in enumerate(QWEN)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    vocab["ĊĊ"], vocab["Ġx"] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ċ", "Ċ"), ("Ġ", "x")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(QWEN)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_fim_ids_are_llama_servers_format_infill() -> None:
    tokenizer = merging_tokenizer()
    fim = fim_tokens(tokenizer)
    assert fim is not None and fim.repo and fim.sep
    v = tokenizer.get_vocab()

    def t(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    prefix, prompt, suffix = "a = 1\ny = ", "x", "\n\nprint(y)\n"
    extra = [Chunk("tmp", "\nz = 2\n"), Chunk("util.py", "w = '<|fim_middle|>'\n")]
    # format_infill: each piece tokenised alone, chunk text and code with control text read as text
    expected = [v["<|repo_name|>"], *t("myproject\n"), v["<|file_sep|>"], *t("tmp\n"), *t("\nz = 2\n")]
    expected += [v["<|file_sep|>"], *t("util.py\n"), *t("w = '<|fim_middle|>'\n")]
    expected += [v["<|file_sep|>"], *t("filename\n")]
    expected += [v["<|fim_prefix|>"], *t(prefix), *t(prompt), v["<|fim_suffix|>"], *t(suffix), v["<|fim_middle|>"]]
    got = fim_ids(tokenizer, fim, prefix, suffix, prompt, extra, 8192)
    assert got == expected
    assert got.count(v["<|fim_middle|>"]) == 1  # the chunk's control text stayed text
    joined = tokenizer.decode(expected)
    assert list(tokenizer(joined, add_special_tokens=False)["input_ids"]) != expected  # one text would merge
    # llama-server keeps the chunks' last (context - 2048 + 2) tokens, the prefix's last 1536, the
    # suffix's first 512 - 2 - len(prompt)
    short = fim_ids(tokenizer, fim, prefix, suffix, prompt, extra, 2051)
    start = expected.index(v["<|fim_prefix|>"])
    assert short == expected[start - 5 :]
    long = fim_ids(tokenizer, fim, "p" * 2000, "s" * 1000, prompt, [], 512)
    assert long.count(t("p")[0]) == 1536 and long.count(t("s")[0]) == 512 - 2 - 1


def test_n_indent_cuts_like_llama_server() -> None:
    text = "x = 1\n    y = 2\n  z = 3\n    w = 4\n"
    assert cut_indent(text, 4) == ("x = 1\n    y = 2\n  ", True)
    assert cut_indent(text, 2) == (text, False)
    assert cut_indent("  \n", 4) == ("  \n", False)  # a line of only indent does not end it
    assert cut_indent(text, 0) == (text, False)


@pytest.fixture(scope="module")
def coder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with Qwen2.5-Coder's FIM tokens added to its vocabulary (and embedding rows for them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-coder"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN})
    model = AutoModelForCausalLM.from_pretrained(path)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def coder(coder_dir: Path):
    server = Served(str(coder_dir))
    yield server
    server.close()


def post(server: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.root + path, json=body, timeout=120)


def test_infill_reads_the_ids_llama_server_builds(coder: Served, coder_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(coder_dir)
    v = tokenizer.get_vocab()
    body = {
        "input_prefix": "def area(r):\n    x = '<|fim_suffix|>'\n    return ",
        "input_suffix": "\n\nprint(area(2))\n",
        "prompt": "3.14",
        "input_extra": [{"filename": "util.py", "text": "PI = 3.14159\n", "time": 12.5}],
        "n_predict": 6,
        "temperature": 0,
    }
    answer = post(coder, "/infill", body)
    assert answer.status_code == 200, answer.text
    got = answer.json()

    def t(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    # the tiny model's context is 512, so llama-server keeps none of the chunks (512 - 2048 + 2 < 0)
    expected = [v["<|fim_prefix|>"], *t(body["input_prefix"]), *t("3.14"), v["<|fim_suffix|>"]]
    expected += [*t(body["input_suffix"]), v["<|fim_middle|>"]]
    assert got["tokens_evaluated"] == len(expected)
    assert got["prompt"] == tokenizer.decode(expected)
    streamed = post(coder, "/infill", {**body, "stream": True})
    assert streamed.status_code == 200 and '"stop": true' in streamed.text


def test_a_llama_vim_request_is_answered(coder: Served) -> None:
    fields = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/predicted_n", "truncated", "tokens_cached"]
    request = {  # the field set of llama.vim's llama#fim (autoload/llama.vim)
        "id_slot": 0,
        "input_prefix": "import os\n\ndef main():\n",
        "input_suffix": "\n    return 0\n",
        "input_extra": [{"text": "def helper():\n    pass\n", "time": 1.5, "filename": "helper.py"}],
        "prompt": "    pa",
        "n_predict": 16,
        "stop": [],
        "n_indent": 4,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250,
        "response_fields": fields,
    }
    answer = post(coder, "/infill", request)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert set(got) == set(fields) and isinstance(got["content"], str)
    assert got["timings/prompt_n"] > 0 and got["timings/predicted_n"] >= 1
    ignored = answer.headers["x-brisk-ignored"]
    assert "t_max_predict_ms" in ignored and "samplers: infill" in ignored
    ring = {  # llama.vim's ring update: read the chunks into the cache, write nothing
        **request,
        "input_prefix": "",
        "input_suffix": "",
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "samplers": [],
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
        "response_fields": [""],
    }
    warmed = post(coder, "/infill", ring)
    assert warmed.status_code == 200, warmed.text
    assert warmed.json() == {}
    whole = post(coder, "/infill", {**ring, "response_fields": None}).json()
    assert whole["content"] == "" and whole["tokens_predicted"] == 0
    lacking = post(coder, "/infill", {**request, "samplers": ["top_k", "min_p"]})
    assert lacking.status_code == 400 and "'min_p'" in lacking.json()["error"]["message"]


def test_infill_refuses_what_it_cannot_read(coder: Served) -> None:
    bad_extra = post(coder, "/infill", {"input_prefix": "x", "input_extra": "util.py", "n_predict": 2})
    assert bad_extra.status_code == 400 and bad_extra.json()["error"]["param"] == "input_extra"
    not_text = post(coder, "/infill", {"input_prefix": 5, "n_predict": 2})
    assert not_text.status_code == 400 and not_text.json()["error"]["param"] == "input_prefix"


def test_a_model_without_fim_tokens_cannot_infill(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    assert fim_tokens(AutoTokenizer.from_pretrained(tiny_dir)) is None
    plain = Served(str(tiny_dir))
    try:
        refused = post(plain, "/infill", {"input_prefix": "def f():", "input_suffix": "", "n_predict": 4})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "model_cannot_infill" and "fill-in-the-middle" in error["message"]
    finally:
        plain.close()


# --cache-reuse (engine.runtime.prefix_cache.reuse_moves): a long prompt, then the same with a piece deleted in
# the middle, as an editor's window moving down drops the lines at its top
HEAD = "# settings\n" * 4
MIDDLE = "".join(f"old_{i} = {i * 7}\n" for i in range(12))
TAIL = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(8)) + "result = "


@pytest.fixture(scope="module")
def reusing(coder_dir: Path):
    server = Served(str(coder_dir), cache_reuse=64)
    yield server
    server.close()


def complete(server: Served, prompt: str, cache_prompt: bool = True) -> dict:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": cache_prompt, "return_tokens": True}
    answer = post(server, "/completion", body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_cache_reuse_is_off_by_default(coder: Served) -> None:
    complete(coder, HEAD + MIDDLE + TAIL)
    edited = complete(coder, HEAD + TAIL)
    assert edited["tokens_cached"] == edited["timings"]["cache_n"] == len(HEAD)  # the common prefix alone
    assert edited["timings"]["prompt_n"] == len(TAIL)  # the byte-level tokenizer: a token a character
    cold = complete(coder, HEAD + TAIL, cache_prompt=False)
    assert edited["tokens"] == cold["tokens"] and len(cold["tokens"]) == 8 and edited["content"] == cold["content"]


def test_cache_reuse_moves_the_text_after_an_edit_instead_of_computing_it(reusing: Served) -> None:
    first = complete(reusing, HEAD + MIDDLE + TAIL)
    assert first["timings"]["prompt_n"] == len(HEAD + MIDDLE + TAIL)
    edited = complete(reusing, HEAD + TAIL)
    # all but the last token reused, as llama-server's reuse leaves one to compute
    assert edited["timings"]["prompt_n"] == 1
    assert edited["tokens_cached"] == edited["timings"]["cache_n"] == len(HEAD + TAIL) - 1
    assert edited["tokens_predicted"] == 8 and isinstance(edited["content"], str)
    # characters typed in the middle are computed, the text after them moved
    typed = complete(reusing, HEAD + "xy" + TAIL)
    assert typed["timings"]["prompt_n"] == 3 and typed["tokens_cached"] == len(HEAD + "xy" + TAIL) - 3
    # a run shorter than --cache-reuse is computed
    short = complete(reusing, HEAD + MIDDLE[:20] + "x = 1\n" + TAIL[-40:])
    assert short["tokens_cached"] < len(HEAD + MIDDLE[:20]) + 6
    # a chat does not move KV: only raw prompts do
    client = reusing.openai()
    for text in (HEAD + MIDDLE + TAIL, HEAD + TAIL):
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": text}], max_tokens=4, temperature=0
        )
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens - chat.usage.prompt_tokens_details.cached_tokens >= len(TAIL)


def test_an_infill_after_the_window_moves_reuses_the_code_below(reusing: Served) -> None:
    lines = [f"value_{i} = compute({i}, {i * 3})\n" for i in range(16)]
    below = "\n" + "".join(f"after_{i} = {i}\n" for i in range(10))
    body = {"input_suffix": below, "prompt": "    ", "n_predict": 4, "temperature": 0}
    first = post(reusing, "/infill", {**body, "input_prefix": "".join(lines[:12])}).json()
    moved = post(reusing, "/infill", {**body, "input_prefix": "".join(lines[3:12])}).json()
    assert moved["timings"]["prompt_n"] < first["timings"]["prompt_n"] // 4, (first, moved)
    assert moved["tokens_cached"] > 300
    # a keystroke: the two characters computed (and <|fim_suffix|>), the code below the cursor moved
    typed = post(reusing, "/infill", {**body, "input_prefix": "".join(lines[3:12]), "prompt": "    re"}).json()
    assert typed["timings"]["prompt_n"] <= 4, typed


def test_bench_infill_sends_each_request_to_every_server_in_turn(coder: Served, reusing: Served) -> None:
    from engine.bench import infill as bench

    lines = [f"v{i} = {i}" for i in range(40)]
    requests = bench.session(lines, "f.py", 2)[:5]
    results = bench.replay([("off", coder.root), ("reuse", reusing.root)], requests)
    assert [r["kind"] for r in results["off"]] == [r["kind"] for r in results["reuse"]] == [k for k, _ in requests]
    assert all(r["prompt_n"] > 0 for r in results["reuse"] if r["kind"] != "ring")
    assert {row["requests"] for row in bench.summary("reuse", results["reuse"])} == {"all", "key", "move"}
