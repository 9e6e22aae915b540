"""A project's warm start on a real engine (tiny model, issue 52): the hint the window sends when a project is
opened (its new chat's prompt with a stand-in first message) prefills the project's prefix, so the first reply
of a new chat in it reuses those tokens, and its greedy tokens are those of a cold chat."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.state.session import ChatSession
from engine.bench.project import WARM_DRAFT
from engine.storage import Settings, Store
from tests.support.engine_runner import EngineRunner, done, settle_hints, token_ids

# about 150 tokens for the tiny model's byte-level tokenizer: the shared prefix of every chat in the project
SYSTEM = "You plan trips for a family of four. " + " ".join(
    f"Rule {i}: trains before planes, {i + 2} nights at most a town." for i in range(2)
)
QUESTION = "Where should we go in May?"


@pytest.fixture(scope="module")
def runner(tiny_dir: Path) -> Iterator[EngineRunner]:
    engine = EngineRunner(str(tiny_dir))
    yield engine
    engine.close()


def test_a_new_chat_in_an_opened_project_starts_from_its_prefilled_prefix(runner: EngineRunner, tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        project_id = store.create_project("Trips", SYSTEM, params={"temperature": 0.0, "max_tokens": 12})
        project = store.get_project(project_id)
        session = ChatSession(store, Settings())
        # what app.window.projects does when the project is opened: its new chat takes its prompt and values
        session.pending_system, session.pending_params = project.system_prompt, project.params
        session.pending_project = project_id
        runner.engine.clear_prefix_cache()  # type: ignore[attr-defined]
        runner.engine.hint(session.draft_request(WARM_DRAFT))  # type: ignore[attr-defined]
        settle_hints(runner)

        turn = session.send(QUESTION)
        warm = list(runner.client.stream(turn.request))
        assert store.get_conversation(turn.reply.conversation_id).project_id == project_id

    runner.engine.clear_prefix_cache()  # type: ignore[attr-defined]
    cold_request = dataclasses.replace(turn.request, id=uuid.uuid4().hex, conversation_id="outside")
    cold = list(runner.client.stream(cold_request))

    m, c = done(warm).metrics, done(cold).metrics
    assert c.cached_tokens == 0 and c.prompt_tokens == m.prompt_tokens
    # all but the question and the turn's end markers came from the project's prefill
    assert m.cached_tokens >= m.prompt_tokens - len(QUESTION.encode()) - 16 and m.cached_tokens > 100
    assert token_ids(warm) == token_ids(cold) and token_ids(warm)
