"""API keys: kept in the system keyring where one exists, else in memory only; never in a file."""

from __future__ import annotations

from collections.abc import Iterator

import keyring
import pytest
from keyring.backends import fail

from engine.remote import keys
from tests.support.keyring_support import DictKeyring


@pytest.fixture
def system_keyring() -> Iterator[DictKeyring]:
    before = keyring.get_keyring()
    ring = DictKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring() -> Iterator[None]:
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


def test_keys_go_to_the_system_keyring(system_keyring: DictKeyring) -> None:
    assert keys.persistent()
    assert keys.save_key("http://gpu-box:8000", "sk-one") is True
    assert system_keyring.store == {("brisk", "http://gpu-box:8000/v1"): "sk-one"}
    assert keys.load_key("http://gpu-box:8000/v1/") == "sk-one"  # the same server, however its URL is written
    assert keys.load_key("http://other:8000/v1") is None
    keys.delete_key("http://gpu-box:8000/v1")
    assert keys.load_key("http://gpu-box:8000/v1") is None and system_keyring.store == {}


def test_without_a_keyring_keys_live_in_memory_only(no_keyring: None) -> None:
    assert not keys.persistent()
    assert keys.save_key("http://127.0.0.1:8080/v1", "sk-two") is False
    assert keys.load_key("http://127.0.0.1:8080/v1") == "sk-two"
    keys.delete_key("http://127.0.0.1:8080/v1")
    assert keys.load_key("http://127.0.0.1:8080/v1") is None


def test_a_refusing_keyring_falls_back_to_memory(system_keyring: DictKeyring, monkeypatch: pytest.MonkeyPatch) -> None:
    def locked(*args: object) -> None:
        raise keyring.errors.KeyringLocked("locked")

    monkeypatch.setattr(system_keyring, "set_password", locked)
    assert keys.save_key("http://locked:1/v1", "sk-three") is False
    assert keys.load_key("http://locked:1/v1") == "sk-three"
    keys.delete_key("http://locked:1/v1")
