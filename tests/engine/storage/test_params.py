"""Tests for engine.storage.params: a chat's own sampling values in the history file, and presets."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest
import sqlite_utils

from engine.storage import Settings, Store, params
from engine.storage import store as store_module
from engine.storage.params import BUILTIN_PRESETS, Preset, PresetFile


def test_a_chats_own_values_are_kept_and_the_rest_follow_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    with Store(path) as store:
        cid = store.create_conversation("Tuned", "Be brief.", params={"temperature": 0.7, "max_tokens": 64})
        plain = store.create_conversation("Plain")
    with Store(path) as store:  # a restart reads them back
        tuned = store.get_conversation(cid)
        assert tuned.params == {"temperature": 0.7, "max_tokens": 64}
        assert store.get_conversation(plain).params == {}
        settings = Settings(top_p=0.9, max_tokens=512, temperature=0.0)
        sampling = params.sampling(settings, tuned.params)
        assert (sampling.temperature, sampling.max_tokens, sampling.top_p) == (0.7, 64, 0.9)
        assert params.sampling(settings, {}) == settings.sampling()
        store.set_params(cid, {})
        assert store.get_conversation(cid).params == {}
        assert [c.params for c in store.list_conversations()] == [{}, {}]


def test_bad_values_are_dropped_each_with_a_problem() -> None:
    good, problems = params.checked({"temperature": -1, "top_k": 5, "nonsense": 1, "top_p": 1, "seed": "x"})
    assert good == {"top_k": 5, "top_p": 1.0}
    assert len(problems) == 3
    assert any("temperature" in p for p in problems) and any("nonsense" in p for p in problems)
    assert params.checked([1, 2])[0] == {}
    assert "JSON object" in params.checked("oops")[1][0]
    # a value a request could not use never reaches one
    assert params.sampling(Settings(), {"max_tokens": 0}).max_tokens == Settings().max_tokens


def test_damaged_params_in_the_file_read_as_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    with Store(path) as store:
        cid = store.create_conversation("Hand-edited")
    raw = sqlite3.connect(path)
    raw.execute("UPDATE conversations SET params = '{not json' WHERE id = ?", [cid])
    raw.commit()
    raw.close()
    with Store(path) as store:
        assert store.get_conversation(cid).params == {}
        assert [m.content for m in store.messages(cid)] == []


def test_an_older_history_gains_the_column_and_keeps_its_chats(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    db = sqlite_utils.Database(path)
    store_module.MIGRATIONS[0](db)
    store_module.MIGRATIONS[1](db)
    db.execute("PRAGMA user_version = 2")
    db.execute(
        "INSERT INTO conversations (id, title, system_prompt, created, updated) VALUES ('c1', 'Old', 'Hi', 1, 1)"
    )
    db.close()
    with Store(path) as store:
        old = store.get_conversation("c1")
        assert (old.title, old.system_prompt, old.params) == ("Old", "Hi", {})
        store.set_params("c1", {"top_k": 40})
        assert store.get_conversation("c1").params == {"top_k": 40}


def test_set_params_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid = store.create_conversation()
        with pytest.raises(ValueError):
            store.set_params(cid, {"temperature": float("nan")})
        assert store.get_conversation(cid).params == {}


def test_presets_are_saved_replaced_and_deleted(brisk_data_dir: Path) -> None:
    presets = PresetFile()
    assert [p.name for p in presets.presets()] == [p.name for p in BUILTIN_PRESETS]
    presets.save(Preset("Terse", "One sentence only.", {"max_tokens": 48, "temperature": 0}))
    presets.save(Preset("terse", "Two sentences.", {"max_tokens": 96}))  # the same name replaces it
    again = PresetFile()  # another window reads the file
    mine = [p for p in again.presets() if not p.builtin]
    assert [(p.name, p.system_prompt, p.params) for p in mine] == [("terse", "Two sentences.", {"max_tokens": 96})]
    assert again.find("TERSE") == mine[0]
    again.delete("Terse")
    assert [p for p in PresetFile().presets() if not p.builtin] == []


def test_presets_refuse_bad_names_and_values_and_builtins_stay(brisk_data_dir: Path) -> None:
    presets = PresetFile()
    for bad, words in (
        (Preset("  ", "x"), "needs a name"),
        (Preset("Brisk default", "x"), "built-in"),
        (Preset("x" * 61, "x"), "at most"),
        (Preset("Hot", "x", {"temperature": -2}), "temperature"),
    ):
        with pytest.raises(ValueError, match=words):
            presets.save(bad)
    with pytest.raises(ValueError, match="cannot be deleted"):
        presets.delete("Creative writing")
    assert not (brisk_data_dir / "presets.json").exists()


def test_a_damaged_presets_file_is_moved_aside_and_builtins_remain(brisk_data_dir: Path) -> None:
    (brisk_data_dir / "presets.json").write_text("{broken")
    presets = PresetFile()
    assert [p.name for p in presets.presets()] == [p.name for p in BUILTIN_PRESETS]
    assert (brisk_data_dir / "presets.json.bad").read_text() == "{broken"
    # one bad entry costs only itself
    entries = [{"name": "Good", "system_prompt": "ok", "params": {"top_k": 3}}, {"name": 5}, "junk"]
    (brisk_data_dir / "presets.json").write_text(json.dumps({"version": 1, "presets": entries}))
    assert [p.name for p in PresetFile().presets() if not p.builtin] == ["Good"]


def test_two_windows_saving_at_once_lose_neither_preset(brisk_data_dir: Path) -> None:
    errors: list[BaseException] = []

    def save(name: str) -> None:
        try:
            for i in range(10):
                PresetFile().save(Preset(f"{name} {i}", name))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(name,)) for name in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len([p for p in PresetFile().presets() if not p.builtin]) == 20


def test_chat_options_are_kept_checked_and_never_reach_sampling() -> None:
    own = {"overflow": "stop", "thinking": "off", "temperature": 0.5}
    good, problems = params.checked(own)
    assert good == own and problems == []
    assert params.sampling(Settings(), good).temperature == 0.5  # the options are not sampling values
    assert params.option(good, "overflow") == "stop" and params.option(good, "thinking") == "off"
    bad, problems = params.checked({"overflow": "wrap", "thinking": True})
    assert bad == {} and len(problems) == 2 and "'drop-middle'" in problems[0]
    assert params.option({}, "overflow") == "drop-middle" and params.option({"thinking": 3}, "thinking") == "auto"
