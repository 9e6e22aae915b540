"""State files in the data folder that are valid JSON of the wrong shape, absurd, or used as a path (issue 22,
defects 6 and 7).

Each case damages one state file Brisk wrote on a first run, then runs the real CLI: it answers (exit 0),
one warning line names the file, the file is at ``NAME.bad`` and the next run answers without a word about
it.  A value in the hash record that is a path never becomes one: a canary folder outside the data folder
survives.  ``settings.json`` is checked through ``Settings.load_with_problems`` (the window's start).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model import dtype_probe
from engine.paths import weights_fingerprint
from engine.storage import Settings
from tests.hostile.conftest import Run, run_cli
from tests.support.tiny import make_tiny_model

HANG_S = 300  # a load on a busy machine takes seconds; a hang is caught well before this
FAST = ("--quant", "none", "--dtype", "float32", "--no-answer-cache")  # no probes: the file alone matters
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
HUGE = b'{"a": "' + b"x" * (20 << 20) + b'"}'

Damage = Callable[[Any], Any]  # the parsed good file -> what is written instead (bytes as they are)


def ask(data: Path, *args: str) -> Run:
    return run_cli("ask", "hi", "--json", "--max-tokens", "2", *args, data_dir=data, timeout=HANG_S)


def answered(run: Run) -> bool:
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode == 0 and any(event.get("type") == "done" for event in lines)


def mentions(run: Run, name: str) -> list[str]:
    return [line for line in (run.stderr + run.stdout).splitlines() if name in line]


def damage(path: Path, how: Damage) -> None:
    """Replace ``path`` (unlinked first: template copies share inodes) with what ``how`` makes of it."""
    value = how(json.loads(path.read_text())) if path.exists() else how(None)
    path.unlink(missing_ok=True)
    path.write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())


def moved_aside(run: Run, path: Path) -> None:
    """The damaged run answered, said so in one line naming the file, and left the file at NAME.bad."""
    assert answered(run), f"exit {run.returncode}: {run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    said = mentions(run, path.name)
    assert len(said) == 1 and "damaged" in said[0], said or run.stderr[-3000:]
    assert path.with_name(path.name + ".bad").is_file()


def clean(run: Run, name: str) -> None:
    assert answered(run), f"exit {run.returncode}: {run.stderr[-3000:]}"
    assert mentions(run, name) == [] and "Traceback" not in run.stderr, run.stderr[-3000:]


def copy_template(template: Path, data: Path) -> None:
    """A copy of a data folder, files hard-linked (cheap); :func:`damage` unlinks before writing."""
    shutil.rmtree(data)
    shutil.copytree(template, data, copy_function=os.link, ignore=shutil.ignore_patterns("locks"))


def records(change: dict[str, Any]) -> Damage:
    """Every record of a records file with ``change`` applied."""
    return lambda good: {key: {**record, **change} for key, record in good.items()}


GENERIC: dict[str, Damage] = {
    "list": lambda _good: [1, 2],
    "deep": lambda _good: DEEP,
    "deep-object": lambda _good: DEEP_OBJECT,
    "huge": lambda _good: HUGE,
    "not-json": lambda _good: b"\xff\xfe{garbage",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def tiny_auto(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> Path:
    """A data folder after a first run with quant auto: cpu_mode.json and the quantized copies."""
    data = tmp_path_factory.mktemp("auto")
    assert answered(first := ask(data, "--model", str(tiny), "--no-answer-cache")), first.stderr[-3000:]
    return data


# -- cache/cpu_mode.json: the weight mode measured by quant=auto ------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        GENERIC["deep"],
        GENERIC["huge"],
        records({"mode": "int9-cpu"}),
        records({"mode": ["fp16-cpu"]}),
        records({"dtype": "float64"}),
        records({"reason": None}),
        lambda good: dict.fromkeys(good, "fp16-cpu"),
    ],
    ids=["deep", "huge", "unknown-mode", "mode-not-text", "unknown-dtype", "no-reason", "record-not-object"],
)
def test_recorded_mode(tiny_auto: Path, data: Path, tiny: Path, how: Damage) -> None:
    copy_template(tiny_auto, data)
    path = data / "cache" / "cpu_mode.json"
    damage(path, how)
    moved_aside(ask(data, "--model", str(tiny), "--no-answer-cache"), path)
    clean(ask(data, "--model", str(tiny), "--no-answer-cache"), path.name)


def test_a_recorded_mode_that_cannot_run_here_is_measured_again(tiny_auto: Path, data: Path, tiny: Path) -> None:
    """A well-formed record naming a mode auto never picks (int4-cpu): not used, measured again."""
    copy_template(tiny_auto, data)
    path = data / "cache" / "cpu_mode.json"
    damage(path, records({"mode": "int4-cpu", "dtype": "float16"}))
    clean(ask(data, "--model", str(tiny), "--no-answer-cache"), path.name)
    assert not any((data / "cache" / "quant").rglob("int4-cpu-*")), "the recorded mode was used"


# -- cache/cpu_dtype.json: float32 against bfloat16 ----------------------------------------------------------

DTYPE_ARGS = ("--quant", "none", "--no-answer-cache")


@pytest.mark.parametrize(
    "how",
    [records({"dtype": "float64"}), records({"dtype": 16}), GENERIC["deep-object"]],
    ids=["unknown-dtype", "dtype-number", "deep-object"],
)
def test_recorded_dtype(data: Path, tiny: Path, how: Damage) -> None:
    """The record is written here (a first run on a busy machine may rightly save none: too noisy)."""
    path = data / "cache" / "cpu_dtype.json"
    path.parent.mkdir()
    key = f"{weights_fingerprint(str(tiny))}|{torch.__version__}"
    path.write_text(json.dumps({key: {"dtype": "float32", "reason": "measured", "probe": dtype_probe.PROBE_VERSION}}))
    clean(ask(data, "--model", str(tiny), *DTYPE_ARGS), path.name)  # the good record is read without a word
    damage(path, how)
    moved_aside(ask(data, "--model", str(tiny), *DTYPE_ARGS), path)
    clean(ask(data, "--model", str(tiny), *DTYPE_ARGS), path.name)


# -- cache/answer-cache-models.json: which model a spec loaded last ----------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        GENERIC["list"],
        lambda good: {key: {k: v for k, v in fields.items() if k != "quant"} for key, fields in good.items()},
        lambda good: {key: {**fields, "weight_hash": 7} for key, fields in good.items()},
    ],
    ids=["list", "missing-field", "number"],
)
def test_answer_cache_identities(data: Path, tiny: Path, how: Damage) -> None:
    args = ("--model", str(tiny), "--quant", "none", "--dtype", "float32")
    assert answered(first := ask(data, *args)), first.stderr[-3000:]
    path = data / "cache" / "answer-cache-models.json"
    assert path.is_file()
    damage(path, how)
    moved_aside(ask(data, *args), path)
    clean(ask(data, *args), path.name)


# -- quant.json in a quantized copy ----------------------------------------------------------------------


def layers(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Damage:
    return lambda good: {**good, "layers": {name: change(spec) for name, spec in good["layers"].items()}}


@pytest.mark.parametrize(
    "how",
    [
        layers(lambda spec: {**spec, "kind": "int9"}),
        layers(lambda spec: {**spec, "in": "64"}),
        layers(lambda spec: {**spec, "out": 10**12}),
        lambda good: {**good, "layers": list(good["layers"])},
        lambda good: {**good, "mode": "int9-cpu"},
    ],
    ids=["unknown-kind", "in-text", "out-huge", "layers-list", "unknown-mode"],
)
def test_quantized_copy_meta(tiny_auto: Path, data: Path, tiny: Path, how: Damage) -> None:
    """The copy is rebuilt (its old folder, NAME.bad with it, is replaced): one line names quant.json."""
    copy_template(tiny_auto, data)
    (path,) = (data / "cache" / "quant").rglob("int8-cpu-*/quant.json")
    damage(path, how)
    run = ask(data, "--model", str(tiny), "--quant", "int8-cpu", "--no-answer-cache")
    assert answered(run), run.stderr[-3000:]
    said = mentions(run, "quant.json")
    assert len(said) == 1 and "damaged" in said[0] and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert json.loads(path.read_text())["mode"] == "int8-cpu"  # rebuilt
    clean(ask(data, "--model", str(tiny), "--quant", "int8-cpu", "--no-answer-cache"), "quant.json")


@pytest.mark.parametrize("what", ["unknown-layer", "truncated-weights"])
def test_quantized_copy_that_does_not_load_is_rebuilt(tiny_auto: Path, data: Path, tiny: Path, what: str) -> None:
    """A quant.json of the right shape naming a layer the model lacks, or cut weights: rebuilt, one line."""
    copy_template(tiny_auto, data)
    (path,) = (data / "cache" / "quant").rglob("int8-cpu-*/quant.json")
    if what == "unknown-layer":
        damage(path, lambda good: {**good, "layers": {"model.nowhere": next(iter(good["layers"].values()))}})
    else:
        weights = path.with_name("model.safetensors")
        cut = weights.read_bytes()[:1000]
        weights.unlink()
        weights.write_bytes(cut)
    run = ask(data, "--model", str(tiny), "--quant", "int8-cpu", "--no-answer-cache")
    assert answered(run) and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(mentions(run, "could not be loaded")) == 1, run.stderr[-3000:]
    rerun = ask(data, "--model", str(tiny), "--quant", "int8-cpu", "--no-answer-cache")
    assert answered(rerun) and mentions(rerun, "could not be loaded") == [], rerun.stderr[-3000:]


# -- saved prompt caches (KV): checksummed already; a damaged file costs a cold start --------------------------


def test_a_truncated_saved_prompt_cache_costs_a_cold_start(data: Path, tiny: Path) -> None:
    args = ("--model", str(tiny), "--system", "Be brief.", *FAST)
    assert answered(first := ask(data, *args)), first.stderr[-3000:]
    (path,) = (data / "cache" / "kv").glob("*.safetensors")
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    run = ask(data, *args)
    assert answered(run) and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert any("cold" in line for line in mentions(run, "prompt cache")), run.stdout[-2000:] + run.stderr[-2000:]
    rerun = ask(data, *args)
    assert answered(rerun) and mentions(rerun, "prompt cache") == [], rerun.stdout[-2000:]


# -- the bundled model: cache/hashes.json and the converted folder's brisk-source.json --------------------------


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder after a first run with the bundled model (its GGUF converted once for the module)."""
    data = tmp_path_factory.mktemp("bundled")
    assert answered(first := ask(data, *FAST)), first.stderr[-3000:]
    return data


def hashes_pointing_at(value: str) -> Damage:
    return lambda good: dict.fromkeys(good, value)


@pytest.mark.parametrize(
    "value",
    ["ABSOLUTE", "../../../canary", "B" * 64, None],
    ids=["absolute-path", "parent-path", "upper-case", "null"],
)
def test_hash_record_values_never_become_paths(bundled: Path, data: Path, tmp_path: Path, value: Any) -> None:
    """A remembered hash that is not a 64-character hex digest is not trusted; the canary outside survives."""
    copy_template(bundled, data)
    canary = tmp_path / "canary"  # where "../../../canary" leads from cache/models
    canary.mkdir()
    (canary / "keep.txt").write_text("not Brisk's")
    path = data / "cache" / "hashes.json"
    damage(path, hashes_pointing_at(str(canary) if value == "ABSOLUTE" else value))
    moved_aside(ask(data, *FAST), path)
    assert (canary / "keep.txt").read_text() == "not Brisk's"
    clean(ask(data, *FAST), path.name)
    assert len(list((data / "cache" / "models").iterdir())) == 1  # the converted copy was found again


def test_hash_record_that_is_a_list(bundled: Path, data: Path) -> None:
    copy_template(bundled, data)
    path = data / "cache" / "hashes.json"
    damage(path, GENERIC["list"])
    moved_aside(ask(data, *FAST), path)
    clean(ask(data, *FAST), path.name)


def test_a_converted_folder_that_links_outside_is_never_emptied(bundled: Path, data: Path, tmp_path: Path) -> None:
    """cache/models/<digest> replaced by a link to a folder outside: the model is converted again, the folder kept."""
    copy_template(bundled, data)
    (converted,) = (data / "cache" / "models").iterdir()
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("not Brisk's")
    shutil.rmtree(converted)
    converted.symlink_to(canary, target_is_directory=True)
    run = ask(data, *FAST)
    assert answered(run) and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert (canary / "keep.txt").read_text() == "not Brisk's"
    assert not converted.is_symlink() and (converted / "model.safetensors").is_file()


@pytest.mark.parametrize("how", [GENERIC["list"], lambda good: {**good, "gguf": 5}], ids=["list", "gguf-number"])
def test_converted_source_record(bundled: Path, data: Path, how: Damage) -> None:
    copy_template(bundled, data)
    (path,) = (data / "cache" / "models").glob("*/brisk-source.json")
    damage(path, how)
    moved_aside(ask(data, *FAST), path)
    clean(ask(data, *FAST), path.name)


# -- settings.json (read by the window at start, and by the CLI) ---------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"[1, 2]", b'"settings"', DEEP, DEEP_OBJECT, HUGE, b"\xff\xfe{", b'{"max_tokens": 1' + b"0" * 5000 + b"}"],
    ids=["list", "string", "deep", "deep-object", "huge", "not-utf8", "huge-number"],
)
def test_settings_file_of_the_wrong_shape_is_moved_aside(data: Path, content: bytes) -> None:
    path = data / "settings.json"
    path.write_bytes(content)
    settings, problems = Settings.load_with_problems(path)
    assert settings == Settings() and len(problems) == 1, problems
    assert "settings.json" in problems[0] and "damaged" in problems[0]
    assert (data / "settings.json.bad").is_file() and not path.exists()
    assert Settings.load_with_problems(path) == (Settings(), [])


def test_a_settings_file_with_one_bad_value_keeps_the_old_rule(data: Path) -> None:
    """Valid JSON with one bad value: that value falls back to its default, said once; the file stays."""
    path = data / "settings.json"
    path.write_text(json.dumps({"max_tokens": [512], "temperature": 0.5}))
    settings, problems = Settings.load_with_problems(path)
    assert (settings.max_tokens, settings.temperature) == (Settings().max_tokens, 0.5)
    assert len(problems) == 1 and "max_tokens" in problems[0] and path.is_file()


def test_a_settings_fifo_is_not_read(data: Path) -> None:
    """A special file in place of settings.json would block the read for ever: it is refused unopened."""
    path = data / "settings.json"
    os.mkfifo(path)
    result: list[tuple[Settings, list[str]]] = []
    reader = threading.Thread(target=lambda: result.append(Settings.load_with_problems(path)), daemon=True)
    reader.start()
    reader.join(30)  # a read of a regular file takes milliseconds; this bound only catches the hang
    if reader.is_alive():
        with open(path, "wb"):  # let the blocked read end, so the thread does not outlive the test
            pass
        pytest.fail("reading a FIFO in place of settings.json blocked")
    settings, problems = result[0]
    assert settings == Settings() and len(problems) == 1 and "not a regular file" in problems[0]
