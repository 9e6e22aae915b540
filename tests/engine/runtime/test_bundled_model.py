"""The real bundled SmolLM2-135M-Instruct: a stable greedy reply, the decode loop equal to
transformers' generate, and cancel mid-stream; nothing that depends on this CPU's kernels."""

from __future__ import annotations

import torch

from engine.api import Sampling
from engine.runtime.prompt import build_prompt
from tests.support.engine_runner import EngineRunner, done, token_ids

pytestmark = __import__("pytest").mark.bundled

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_greedy_reply_is_stable(bundled_engine: EngineRunner) -> None:
    # Not which words: float32 sums round differently on different CPUs' kernels, and a test
    # must pass on every x86 CPU.  What the reply says is for `brisk bench`.
    first = bundled_engine.run(QUESTION, sampling=Sampling(max_tokens=30), prefix_cache=False)
    second = bundled_engine.run(QUESTION, sampling=Sampling(max_tokens=30), prefix_cache=False)
    assert done(first).text.strip() and token_ids(first)
    assert token_ids(first) == token_ids(second) and done(first).text == done(second).text


def test_decode_loop_equals_generate(bundled_engine: EngineRunner) -> None:
    loaded = bundled_engine.engine.loaded
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    ours = token_ids(bundled_engine.run(messages, sampling=Sampling(max_tokens=40), prefix_cache=False))
    ids = torch.tensor([build_prompt(loaded.tokenizer, messages, loaded.context_length, 40).ids])
    with torch.inference_mode():
        ref = loaded.model.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :].tolist()
    assert ours == [t for t in ref if t not in loaded.eos_ids][: len(ours)]
    assert len(ours) == 40 or ref[len(ours)] in loaded.eos_ids


def test_cancel_mid_stream(bundled_engine: EngineRunner) -> None:
    messages = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    events = bundled_engine.run(messages, sampling=Sampling(max_tokens=300), cancel_after=5)
    final = done(events)
    assert final.finish_reason == "cancelled"
    # At least the 5 before the cancel; how many more the engine made before it saw the flag
    # depends on thread timing, so only that it stopped well before max_tokens.
    assert 5 <= len(token_ids(events)) < 300
    assert final.text.strip()
