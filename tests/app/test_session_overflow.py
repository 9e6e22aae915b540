"""A chat's overflow policy on the session: kept with the chat, carried by every request, never lost when the
parameters panel saves the sampling values."""

from __future__ import annotations

from pathlib import Path

from app.state.session import ChatSession
from engine.storage import Settings, Store


def test_the_policy_goes_with_each_request_and_survives_other_parameters(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        session = ChatSession(store, Settings())
        assert session.overflow() == "drop-middle"
        session.set_overflow("stop")  # a new chat: kept until its first message creates it
        turn = session.send("Hello")
        assert turn.request.overflow == "stop" and session.overflow() == "stop"
        session.stop()
        session.set_chat_params({"temperature": 0.3})  # what the parameters panel saves: sampling values only
        assert session.overflow() == "stop"
        assert session.draft_request("Next").overflow == "stop"
        session.set_overflow("drop-middle")
        assert session.draft_request("Next").overflow == "drop-middle"
        assert session.chat_params()[1]["temperature"] == 0.3
