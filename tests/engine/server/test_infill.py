"""llama.cpp's ``/infill`` (engine.server.llama_api, engine.server.infill) over real HTTP on a tiny model given
Qwen2.5-Coder's fill-in-the-middle tokens: the prompt laid out as llama-server lays it out, answered as
``/completion`` would answer that prompt; a model without FIM tokens refused with the reason."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest

from engine.server.infill import FAMILIES, fim_tokens
from tests.support.server import Served
from tests.support.tiny import make_tiny_model

QWEN = list(FAMILIES[0]) + ["<|fim_pad|>"]


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


def test_infill_reads_the_prompt_llama_server_builds(coder: Served) -> None:
    body = {
        "input_prefix": "def area(r):\n    return ",
        "input_suffix": "\n\nprint(area(2))\n",
        "prompt": "3.14",
        "input_extra": [{"filename": "util.py", "text": "PI = 3.14159\n", "time": 12.5}],
        "n_predict": 6,
    }
    answer = post(coder, "/infill", body)
    assert answer.status_code == 200, answer.text
    expected_prompt = (
        "<|repo_name|>myproject\n<|file_sep|>util.py\nPI = 3.14159\n<|file_sep|>filename\n"
        "<|fim_prefix|>def area(r):\n    return 3.14<|fim_suffix|>\n\nprint(area(2))\n<|fim_middle|>"
    )
    same = post(coder, "/completion", {"prompt": expected_prompt, "n_predict": 6}).json()
    got = answer.json()
    assert got["prompt"] == expected_prompt
    assert got["content"] == same["content"] and got["tokens_evaluated"] == same["tokens_evaluated"]
    ids = post(coder, "/tokenize", {"content": expected_prompt}).json()["tokens"]
    assert len(ids) == got["tokens_evaluated"]
    fim_ids = post(coder, "/tokenize", {"content": "".join(FAMILIES[0])}).json()["tokens"]
    assert len(fim_ids) == 5 and set(fim_ids) <= set(ids)  # each FIM token one control token in the prompt
    streamed = post(coder, "/infill", {**body, "stream": True})
    assert streamed.status_code == 200 and '"stop": true' in streamed.text


def test_infill_refuses_code_that_spells_a_control_token(coder: Served) -> None:
    refused = post(coder, "/infill", {"input_prefix": "x = '<|fim_middle|>'", "input_suffix": "", "n_predict": 2})
    assert refused.status_code == 400 and "<|fim_middle|>" in refused.json()["error"]["message"]
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
