"""llguidance against xgrammar on this CPU, briefly: tokenizer set-up, schema compile, mask time, forced tokens.

Run in a scratch environment that has both (xgrammar pulls triton and a TVM runtime, which Brisk does not
install): ``pip install llguidance xgrammar`` beside torch and transformers, then, from the repository
root, ``python -m engine.bench.grammar_libraries``.  Uses the bundled model's converted tokenizer from the
data folder (start Brisk once first).  A one-off: the result and the choice are in docs/PERFORMANCE.md
(issue 27).
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

from engine.bench.common import markdown_table, median

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                },
                "required": ["name", "age", "role"],
            },
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["person", "tags"],
    },
}
SAMPLES = {
    "flat": {"city": "Paris", "country": "France"},
    "nested": {"person": {"name": "Ada Lovelace", "age": 36, "role": "admin"}, "tags": ["math", "poetry"]},
}


def tokenizer() -> Any:
    from transformers import AutoTokenizer

    data = os.environ.get("BRISK_DATA_DIR", os.path.expanduser("~/.local/share/brisk"))
    return AutoTokenizer.from_pretrained(glob.glob(os.path.join(data, "cache", "models", "*"))[0])


def llguidance_numbers(tok: Any) -> dict[str, Any]:
    import llguidance
    import llguidance.hf
    import torch

    out: dict[str, Any] = {}
    began = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok, slices=[])
    out["tokenizer set-up s"] = time.perf_counter() - began
    for name, schema in SCHEMAS.items():
        began = time.perf_counter()
        options: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # a TypedDict
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options))
        out[f"compile {name} ms"] = (time.perf_counter() - began) * 1e3
        words = torch.zeros((lltok.vocab_size + 31) // 32, dtype=torch.int32)
        times, forced = [], 0
        for token in tok.encode(json.dumps(SAMPLES[name]), add_special_tokens=False):
            began = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
            times.append(time.perf_counter() - began)
            forced += bool(matcher.compute_ff_tokens())
            assert matcher.consume_token(token), matcher.get_error()
        out[f"mask {name} us (median)"] = median(times) * 1e6
        out[f"steps with forced tokens, {name}"] = f"{forced}/{len(times)}"
    return out


def xgrammar_numbers(tok: Any) -> dict[str, Any]:
    import xgrammar as xg

    out: dict[str, Any] = {}
    began = time.perf_counter()
    info = xg.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiler = xg.GrammarCompiler(info)
    out["tokenizer set-up s"] = time.perf_counter() - began
    for name, schema in SCHEMAS.items():
        began = time.perf_counter()
        matcher = xg.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))
        out[f"compile {name} ms"] = (time.perf_counter() - began) * 1e3
        bitmask = xg.allocate_token_bitmask(1, info.vocab_size)
        times, forced = [], 0
        for token in tok.encode(json.dumps(SAMPLES[name]), add_special_tokens=False):
            began = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - began)
            forced += bool(matcher.find_jump_forward_string())
            if not matcher.accept_token(token):
                break
        out[f"mask {name} us (median)"] = median(times) * 1e6
        out[f"steps with forced tokens, {name}"] = f"{forced}/{len(times)}"
    return out


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def main() -> None:
    tok = tokenizer()
    ours, theirs = llguidance_numbers(tok), xgrammar_numbers(tok)
    body = [[key, _cell(ours[key]), _cell(theirs.get(key, "-"))] for key in ours]
    print(markdown_table(["measure", "llguidance", "xgrammar"], body))


if __name__ == "__main__":
    main()
