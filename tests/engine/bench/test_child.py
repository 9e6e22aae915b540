"""``engine.bench.child``: a benchmark column's engine in a process of its own answers as a Client does."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.api import ModelSpec, Sampling
from engine.bench.child import ChildEngine


def test_a_child_engine_loads_answers_and_says_why_a_load_failed(tiny_dir: Path) -> None:
    child = ChildEngine()
    try:
        loaded = child.load(ModelSpec(source=str(tiny_dir)))
        assert loaded.info.quant == "none" and loaded.model_name
        done = child.ask(
            [{"role": "user", "content": "Hello"}],
            Sampling(max_tokens=6, stop=("zz",)),
            conversation_id="child-test",
            speculative="off",
            answer_cache=False,
        )
        assert done.metrics.ttft_s is not None and done.metrics.ttft_s > 0
        with pytest.raises(RuntimeError, match="child engine failed: .*no-such-model"):
            child.load(ModelSpec(source="/no/such/dir/no-such-model"))
        again = child.ask([{"role": "user", "content": "Hi"}], Sampling(max_tokens=2), speculative="off")
        assert again.metrics.ttft_s is not None  # a failed load leaves it serving the model it has
    finally:
        child.close()
    assert child.proc.poll() == 0
