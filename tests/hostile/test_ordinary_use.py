"""Ordinary set-ups that the hostile fixes must not refuse or change: a placeholder API key on a local
server, a server address of 0.0.0.0, a window system prompt that starts with "@", and a cache folder moved to
another disk with a link."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.remote.errors import KeyFilter, secret_key
from engine.remote.guard import check_key, is_loopback
from tests.support.streams.replay import ReplayServer


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    s.close()


@pytest.mark.parametrize("placeholder", ["ollama", "EMPTY", "lm-studio", "none"])
def test_a_placeholder_key_is_not_filtered_from_replies(placeholder: str) -> None:
    shown = KeyFilter(secret_key(placeholder))
    text = f"Install {placeholder}, then check the list is {placeholder}."
    assert "".join(shown.feed(ch) for ch in text) + shown.flush() == text


def test_a_real_key_is_still_filtered() -> None:
    key = "sk-proj-0123456789abcdefXYZ"
    shown = KeyFilter(secret_key(key))
    for ch in f"your key is {key}!":
        shown.feed(ch)
    shown.flush()
    assert key not in shown.text and key[:8] not in shown.text


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "127.0.0.1", "[::1]", "localhost", "api.localhost"])
def test_addresses_of_this_machine_take_a_key_over_http(host: str) -> None:
    assert is_loopback(host.strip("[]"))
    check_key(f"http://{host}:8000/v1", "sk-proj-0123456789abcdefXYZ")  # no RemoteError


def test_a_system_prompt_from_the_settings_is_text_even_with_an_at_sign(server: ReplayServer, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    prompt = "@everyone: answer in one line."
    settings = {"system_prompt": prompt, "repetition_penalty": 1.3}
    (data / "settings.json").write_text(json.dumps(settings))
    run = cli("ask", "Hi", "--base-url", server.url, "--json", data_dir=data, timeout=60)
    assert run.returncode == 0, run.stderr
    body = server.requests[-1]
    assert body["messages"][0] == {"role": "system", "content": prompt}


def test_a_cache_folder_moved_to_another_disk_by_a_link_still_works(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from engine.quant.cache import remove_tree

    data = tmp_path / "data"
    elsewhere = tmp_path / "bigdisk" / "models"
    elsewhere.mkdir(parents=True)
    (data / "cache").mkdir(parents=True)
    os.symlink(elsewhere, data / "cache" / "models")
    monkeypatch.setenv("BRISK_DATA_DIR", str(data))
    leftover = data / "cache" / "models" / ("ab" * 32 + ".tmp")
    leftover.mkdir()
    (leftover / "x").write_text("half a conversion")
    remove_tree(leftover)  # inside cache/ by name: removed, although the link leads to another disk
    assert not (elsewhere / leftover.name).exists()
    remove_tree(data / "cache" / "models" / "never-made")  # nothing there: no work, no error
    with pytest.raises(ValueError):
        remove_tree(tmp_path / "bigdisk")  # outside cache/ by name: refused
    assert elsewhere.is_dir()
