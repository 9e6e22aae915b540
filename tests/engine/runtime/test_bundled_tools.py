"""Tools on the bundled SmolLM2 model, whose chat template has no tool format: Brisk's own tool prompt."""

from __future__ import annotations

from engine.api import Sampling, Started
from tests.support.engine_runner import EngineRunner

QUESTION = [{"role": "user", "content": "What is 17*23?"}]


def prompt_tokens(engine: EngineRunner, **fields: object) -> int:
    events = engine.run(QUESTION, sampling=Sampling(max_tokens=2), **fields)
    return next(e.prompt_tokens for e in events if isinstance(e, Started))


def test_the_bundled_model_is_given_the_tools_in_brisks_own_prompt(bundled_engine: EngineRunner) -> None:
    assert bundled_engine.load_event.info.tool_template is False  # type: ignore[union-attr]
    plain = prompt_tokens(bundled_engine)
    template_only = prompt_tokens(bundled_engine, tools=("calculator",), tool_prompt=False)
    with_prompt = prompt_tokens(bundled_engine, tools=("calculator",))
    assert template_only == plain, "its template ignores the tools"
    assert with_prompt > plain + 100, "the schemas and the call format are in the prompt"
