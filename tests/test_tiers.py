"""The tiers' rule for ``slow``: tests/conftest.py reads the recorded durations and marks what took SLOW_S or more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import conftest


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid, self.fspath, self.fixturenames, self.function = nodeid, Path("tests/x/test_a.py"), (), None
        self.marks: list[str] = []

    def add_marker(self, mark: Any) -> None:
        self.marks.append(mark.name)


def test_tests_that_took_slow_s_are_marked_slow_and_a_bad_file_marks_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = tmp_path / "durations.json"
    recorded.write_text(json.dumps({"seconds": {"a::slow": conftest.SLOW_S, "a::quick": 0.6, "a::bad": "x"}}))
    monkeypatch.setattr(conftest, "DURATIONS", recorded)
    assert conftest.recorded_durations(recorded) == {"a::slow": conftest.SLOW_S, "a::quick": 0.6}
    items = [_Item("a::slow"), _Item("a::quick"), _Item("a::new")]
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.marks for item in items] == [["slow"], [], []]
    for damaged in ("{", "[1, 2]", '{"seconds": 3}'):
        recorded.write_text(damaged)
        assert conftest.recorded_durations(recorded) == {}
    assert conftest.recorded_durations(tmp_path / "missing.json") == {}
