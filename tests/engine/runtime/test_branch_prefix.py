"""A branched chat's first reply (issue 52) starts from its parent's cached KV and answers as a cold chat would.

The chat and its branch live in a real history file (``Store.branch_conversation``); the engine sees only
the messages each sends, under each chat's own conversation id, so the reuse comes from the prefix cache
matching tokens, not from any id.
"""

from __future__ import annotations

from pathlib import Path

from engine.api import Sampling
from engine.storage import Store
from tests.support.engine_runner import EngineRunner, done, token_ids

GREEDY = Sampling(max_tokens=8)
SYSTEM = "You answer in one short sentence. " * 4


def _history(store: Store, conversation_id: str) -> list[dict[str, str]]:
    """What the window sends before a new turn: the system prompt, then the stored turns."""
    messages = [{"role": m.role, "content": m.content} for m in store.messages(conversation_id)]
    return [{"role": "system", "content": store.get_conversation(conversation_id).system_prompt}, *messages]


def _turn(runner: EngineRunner, store: Store, conversation_id: str, text: str) -> list[object]:
    """Send ``text`` in the chat (greedy, past the answer cache) and keep both messages; the reply's events."""
    store.add_message(conversation_id, "user", text)
    messages = _history(store, conversation_id)
    events = runner.run(messages, sampling=GREEDY, answer_cache=False, conversation_id=conversation_id)
    store.add_message(conversation_id, "assistant", done(events).text)
    return events


def test_a_branchs_first_reply_reuses_the_parents_prefix_and_matches_a_cold_chat(
    tiny_engine: EngineRunner, tmp_path: Path
) -> None:
    with Store(tmp_path / "brisk.db") as store:
        parent = store.create_conversation("Parent", system_prompt=SYSTEM)
        _turn(tiny_engine, store, parent, "Name a colour.")
        _turn(tiny_engine, store, parent, "Name a fruit.")
        branch = store.branch_conversation(parent, store.messages(parent)[1].id)  # after the first reply
        store.add_message(branch, "user", "Name a river instead.")
        messages = _history(store, branch)
        assert [m["content"] for m in messages[1:4:2]] == ["Name a colour.", "Name a river instead."]

        warm = tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id=branch)
        cold = tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, prefix_cache=False)

    m = done(warm).metrics
    assert m.cached_tokens + m.computed_tokens == m.prompt_tokens
    assert m.cached_tokens > 0, "the branch's first reply must start from the parent's cached prefix"
    new_turn = len("Name a river instead.") + 16  # byte-level tokens of the new message and its template
    assert m.computed_tokens <= new_turn, f"only the new turn is computed, not the history ({m.computed_tokens})"
    assert done(cold).metrics.cached_tokens == 0
    assert token_ids(warm) == token_ids(cold), "the same greedy tokens as a cold chat with the same history"
