"""Settings: every bad value in settings.json falls back to its default and the load says so."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from engine.api import QUANT_MODES
from engine.storage import Settings

BAD_VALUES = [
    ("max_tokens", "16", 512),
    ("max_tokens", 0, 512),
    ("max_tokens", -1, 512),
    ("max_tokens", 16.5, 512),
    ("prefix_cache_mb", "512", 512),
    ("prefix_cache_mb", -5, 512),
    ("prefix_cache_mb", 0, 512),
    ("prefix_cache_mb", 64.0, 512),
    ("quant", "int3-cpu", "auto"),
    ("draft_quant", 4, "none"),
    ("speculative", "telepathy", "auto"),
    ("dtype", "float8", "auto"),
    ("device", "tpu", "auto"),
    ("temperature", "hot", 0.0),
    ("temperature", -0.5, 0.0),
    ("top_p", 0, 1.0),
    ("top_p", 2, 1.0),
    ("top_k", -3, 0),
    ("repetition_penalty", 0, 1.1),
    ("stop_repeats", 1, 3),
    ("seed", 2**64, None),
    ("seed", "7", None),
    ("prefix_cache", "yes", True),
    ("answer_cache", 1, True),
    ("colour_draft_tokens", None, False),
    ("model", 12, ""),
    ("system_prompt", ["a"], "You are a helpful assistant."),
    ("answer_cache_threshold", 1.5, 0.86),
    ("answer_cache_threshold", "0.9", 0.86),
    ("answer_cache_ttl_days", -1, 30.0),
    ("stream", "off", True),
    ("parallel_tools", 0, True),
    ("tools_enabled", "calculator", []),
    ("tools_enabled", ["calculator", 3], []),
    ("granted_dirs", [""], []),
    ("fetch_allow_private", "no", False),
    ("mcp_servers", {"a": 1}, []),
]


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("key", "value", "default"), BAD_VALUES, ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
def test_a_bad_value_falls_back_and_is_reported(tmp_path: Path, key: str, value: object, default: object) -> None:
    good = ("max_tokens", 5) if key != "max_tokens" else ("top_k", 5)
    path = write(tmp_path / "settings.json", {key: value, good[0]: good[1]})
    settings, problems = Settings.load_with_problems(path)
    assert getattr(settings, key) == default
    assert getattr(settings, good[0]) == good[1], "the good values are kept"
    assert len(problems) == 1
    assert problems[0].startswith(f"settings.json: {key} must be ")
    assert problems[0].endswith(f"; using {json.dumps(default)}")
    assert Settings.load(path) == settings


def test_nan_and_infinity_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"temperature": NaN, "top_p": Infinity, "repetition_penalty": -Infinity}', encoding="utf-8")
    settings, problems = Settings.load_with_problems(path)
    assert (settings.temperature, settings.top_p, settings.repetition_penalty) == (0.0, 1.0, 1.1)
    assert len(problems) == 3 and not any(math.isnan(v) for v in (settings.temperature, settings.top_p))


def test_good_values_load_unchanged_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    good = Settings(
        quant=QUANT_MODES[1], temperature=0.7, top_p=0.9, top_k=40, seed=2**63 - 1, max_tokens=16, speculative="off"
    )
    good.save(path)
    assert Settings.load_with_problems(path) == (good, [])
    assert not path.with_name("settings.json.tmp").exists()
    write(path, {"temperature": 1, "unknown_key": "ignored"})
    settings, problems = Settings.load_with_problems(path)
    assert problems == [] and settings.temperature == 1.0 and isinstance(settings.temperature, float)


def test_missing_file_is_defaults_without_problems(tmp_path: Path) -> None:
    assert Settings.load_with_problems(tmp_path / "none.json") == (Settings(), [])


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "null", "\xff"])
def test_damaged_file_is_moved_aside_and_reported(tmp_path: Path, text: str) -> None:
    path = tmp_path / "settings.json"
    path.write_text(text, encoding="latin-1")
    settings, problems = Settings.load_with_problems(path)
    assert settings == Settings()
    assert len(problems) == 1 and "damaged" in problems[0] and "settings.json.bad" in problems[0]
    assert not path.exists() and (tmp_path / "settings.json.bad").exists()


def test_save_failure_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    Settings(max_tokens=7).save(path)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        Settings(max_tokens=9).save(path)
    monkeypatch.undo()
    assert Settings.load(path).max_tokens == 7
    assert not path.with_name("settings.json.tmp").exists()


def test_tool_and_answer_cache_settings_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    good = Settings(
        tools_enabled=["calculator", "fetch", "demo__echo"],
        granted_dirs=[str(tmp_path)],
        fetch_allow_private=True,
        mcp_servers=["python -m demo", "https://example.com/mcp"],
        parallel_tools=False,
        stream=False,
        answer_cache_threshold=0.93,
        answer_cache_ttl_days=2.5,
    )
    good.save(path)
    assert Settings.load_with_problems(path) == (good, [])
    assert Settings().tools_enabled == [] and Settings().tools_enabled is not Settings().tools_enabled


SERVER = {"name": "gpu box", "base_url": "http://gpu-box:8000/v1", "model": "meta-llama/Llama-3.3-70B-Instruct"}


def test_saved_servers_and_the_engine_choice_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    other = {"name": "laptop", "base_url": "https://127.0.0.1:8080", "model": ""}
    Settings(engine="gpu box", servers=[SERVER, other]).save(path)
    loaded, problems = Settings.load_with_problems(path)
    assert problems == []
    assert loaded.engine == "gpu box" and loaded.servers == [SERVER, other]
    assert Settings().engine == "local" and Settings().servers == []
    assert "key" not in path.read_text().lower()  # a server's API key is never a settings field


@pytest.mark.parametrize(
    "servers",
    [
        "http://gpu-box:8000",
        [{"name": "a", "base_url": "ftp://gpu-box", "model": ""}],
        [{"name": "a", "base_url": "http://", "model": ""}],
        [{"name": "a", "base_url": "http://user:sk-secret@gpu-box", "model": ""}],
        [{"name": "local", "base_url": "http://gpu-box", "model": ""}],
        [{"name": "", "base_url": "http://gpu-box", "model": ""}],
        [SERVER, SERVER],
        [{"name": "a", "base_url": "http://gpu-box", "model": 3}],
        [{"name": "a", "base_url": "http://gpu-box", "model": "", "api_key": "sk-x"}],
    ],
)
def test_bad_servers_fall_back_and_the_engine_goes_local(tmp_path: Path, servers: object) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"engine": "a", "servers": servers}))
    loaded, problems = Settings.load_with_problems(path)
    assert loaded.servers == [] and loaded.engine == "local"
    assert len(problems) == 2, problems
    assert problems[0].startswith("settings.json: ") and "server" in problems[0] and "sk-" not in problems[0]
    assert "engine must be 'local' or the name of a saved server, not 'a'" in problems[1]


def test_an_engine_naming_no_saved_server_is_local(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"engine": "gone", "servers": [SERVER]}))
    loaded, problems = Settings.load_with_problems(path)
    assert loaded.engine == "local" and loaded.servers == [SERVER]
    assert problems == [
        "settings.json: engine must be 'local' or the name of a saved server, not 'gone'; using \"local\""
    ]


def test_the_window_and_the_cli_take_sampling_from_one_place() -> None:
    import argparse

    from engine.api import Sampling
    from engine.cli.common import sampling_from

    settings = Settings(temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1, seed=5, max_tokens=99)
    assert settings.sampling() == Sampling(0.7, 0.9, 40, 1.1, 5, 99, stop_repeats=3)
    cli = sampling_from(argparse.Namespace(top_k=7, stop=["\n\n"]), settings)
    # the CLI is greedy and unseeded unless told; the rest comes from the settings, flags on top
    assert cli == Sampling(0.0, 0.9, 7, 1.1, None, 99, ("\n\n",), stop_repeats=3)
