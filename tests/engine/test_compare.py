"""``brisk compare``: configurations replayed on the real CLI (tiny model), and bad configurations refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.api import QUANT_MODES, SOURCES
from engine.compare import Config, ConfigError, parse_config
from tests.support.brisk_cli import brisk, events

EXIT_REQUEST = 3
KEYS = ("type", "config", "ttft_s", "tpot_s", "total_s", "tokens_per_s", "acceptance", "cached_tokens", "identical")


def test_parse_config_applies_keys_to_the_base() -> None:
    base = Config(quant="fp16-cpu")
    assert parse_config("prefix_cache=off", base) == Config(prefix_cache=False, quant="fp16-cpu")
    assert parse_config("speculative=lookup, stream=off,quant=none", base) == Config(
        speculative="lookup", stream=False, quant="none"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("colour=red", "keys are prefix_cache, speculative, quant, stream"),
        ("prefix_cache=maybe", "one of on, off"),
        ("speculative=psychic", "one of " + ", ".join(SOURCES)),
        ("quant=int3-cpu", "one of " + ", ".join(QUANT_MODES)),
        ("stream", "expected KEY=VALUE"),
        ("", "expected KEY=VALUE"),
    ],
)
def test_parse_config_names_the_choices(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, Config())


def test_compare_configurations_give_identical_greedy_text(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "compare", "tell me a story", "--model", str(tiny_dir), "--system", "Be brief.", "--json",
        "--runs", "2", "--max-tokens", "12",
        "--config", "prefix_cache=on", "--config", "prefix_cache=off,stream=off", "--config", "speculative=lookup",
        data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = events(run.stdout)
    assert len(rows) == 3
    for row in rows:
        assert all(key in row for key in KEYS) and row["type"] == "compare"
        assert row["identical"] is True
        assert row["total_s"] > 0 and row["ttft_s"] > 0
    assert len({row["text"] for row in rows}) == 1 and rows[0]["text"]
    cached, uncached, lookup = rows
    assert cached["config"] == {
        "prefix_cache": "on", "speculative": "off", "quant": "none", "stream": "on", "typing": "off"
    }  # fmt: skip
    assert cached["cached_tokens"] > 10, "warm: the replayed prompt is reused"
    assert uncached["cached_tokens"] == 0
    assert uncached["ttft_s"] == uncached["total_s"], "without streaming the text arrives at the end"
    assert cached["ttft_s"] <= cached["total_s"]
    assert lookup["config"]["speculative"] == "lookup"


def test_cold_compare_computes_the_whole_prompt(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "compare", "hello there", "--model", str(tiny_dir), "--cold", "--runs", "1", "--max-tokens", "4",
        "--config", "prefix_cache=on", "--config", "stream=off",
        data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = run.stdout.splitlines()
    assert table[0].startswith("| configuration | TTFT s")
    rows = [line for line in table if line.startswith("| prefix_cache=")]
    assert len(rows) == 2
    assert all(row.split("|")[7].strip() == "0" for row in rows), "cold: nothing reused"
    assert all(row.split("|")[8].strip() == "yes" for row in rows)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--config", "turbo=on"], "keys are prefix_cache, speculative, quant, stream"),
        (["--config", "stream=sometimes"], "stream must be one of on, off"),
        (["--config", "quant=int3-cpu"], "quant must be one of none, fp16-cpu"),
        (["--config", "speculative=draft"], "needs a draft model"),
        ([], "at least one --config"),
        (["--config", "stream=off", "--runs", "0"], "--runs must be 1 or more"),
        (["--config", "stream=off", "--max-tokens", "0"], "--max-tokens"),
    ],
)
def test_bad_configurations_fail_cleanly(args: list[str], expected: str, tmp_path: Path) -> None:
    run = brisk("compare", "hi", "--model", str(tmp_path / "no-model.gguf"), *args)
    assert run.returncode == EXIT_REQUEST, run.stderr
    assert expected in run.stderr and "Traceback" not in run.stderr


def test_cold_compare_shows_what_prefill_while_typing_saves(tiny_dir: Path, tmp_path: Path) -> None:
    """The message prefilled as if typed (typing=on) against sent at once, cold: same text, prompt reused."""
    long = "Please read this carefully. " * 12
    run = brisk(
        "compare", long, "--model", str(tiny_dir), "--cold", "--runs", "1", "--max-tokens", "4", "--json",
        "--config", "typing=off", "--config", "typing=on",
        data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    off, on = events(run.stdout)
    assert (off["config"]["typing"], on["config"]["typing"]) == ("off", "on")
    assert on["identical"] is True
    assert off["cached_tokens"] < 10  # cold: nothing but the template's start
    assert on["cached_tokens"] > 100  # the typed message was prefilled before it was sent
